"""The released-checkpoint catalogue: every entry names a registered model, and its published
file size equals float32 x the parameter count of that model at that resolution, with that
head and representation layer (so the fields a user converts with are the right ones)."""

import functools
import re

import pytest

from vit_jax.checkpoint import catalog
from vit_jax.models import MODEL_CONFIGS, get_model, stats

UNITS = {'MiB': 2**20, 'GiB': 2**30, 'MB': 1e6, 'GB': 1e9}


@functools.cache
def _param_count(model: str, resolution: int, num_classes: int, pre_logits: bool) -> int:
  representation = {'representation_size': MODEL_CONFIGS[model].hidden_size} if pre_logits else {}
  net = get_model(model, num_classes=num_classes or None, **representation)
  return stats.count_params(stats.param_shapes(net, resolution))


def test_entries_are_unique_and_name_registered_models():
  names = [e.name for e in catalog.CATALOG]
  # original in21k + in1k, AugReg, Mixer (imagenet1k 2, imagenet21k 2, sam 2, gsam 5), hub.
  assert len(names) == len(set(names)) == 9 + 8 + 18 + 11 + 11
  for entry in catalog.CATALOG:
    assert entry.model in MODEL_CONFIGS, entry.name
    assert entry.url.endswith(entry.file), entry.name
    assert entry.url.startswith(
      (
        'https://storage.googleapis.com/vit_models/',
        'https://storage.googleapis.com/mixer_models/',
        'https://huggingface.co/',
      )
    )


def test_augreg_file_names_follow_the_grammar():
  grammar = re.compile(
    r'(Ti|S|B|L|R_Ti|R26_S|R50_L)_(16|32)-i21k-300ep-lr_0\.001-aug_\w+-wd_[\d.]+-do_[\d.]+-sd_[\d.]+'
    r'(--imagenet2012-steps_20k-lr_0\.0[13]-res_384)?\.npz'
  )
  augreg = [e for e in catalog.CATALOG if e.family == 'augreg']
  assert len(augreg) == 18
  for entry in augreg:
    assert grammar.fullmatch(entry.file), entry.file
    short = entry.model.replace('ViT-', '').replace('+', '_')
    assert entry.file.startswith(short + '-')  # vit_jax's name -> AugReg name mapping


@pytest.mark.parametrize(
  'entry',
  [e for e in catalog.CATALOG if e.size and e.num_classes is not None],
  ids=lambda e: e.name,
)
def test_published_size_is_float32_times_the_parameter_count(entry):
  value, unit = entry.size.split()
  decimals = len(value.split('.')[1]) if '.' in value else 0
  published = float(value) * UNITS[unit]
  # Rounding of the published figure, plus the container's per-array headers (< 0.25 MiB).
  tolerance = 0.5 * 10**-decimals * UNITS[unit] + 0.25 * 2**20
  computed = 4 * _param_count(entry.model, entry.resolution, entry.num_classes, entry.pre_logits)
  assert abs(published - computed) <= tolerance, (entry.name, published / 2**20, computed / 2**20)


def test_find_and_table():
  assert {e.model for e in catalog.find('vit-b_16')} == {'ViT-B_16', 'R50+ViT-B_16'}
  assert len(catalog.find()) == len(catalog.CATALOG)
  table = catalog.format_table(catalog.find('augreg/R_Ti_16'))
  assert table.splitlines()[1].split()[:5] == [
    'augreg/R_Ti_16-i21k',
    'R+ViT-Ti_16',
    '224',
    '21843',
    'no',
  ]
