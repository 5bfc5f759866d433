"""The released-checkpoint catalogue: every entry names a registered model, and its published
file size equals float32 x the parameter count of that model at that resolution, with that
head and representation layer (so the fields a user converts with are the right ones)."""

import functools
import re

import pytest

from vit_jax import families
from vit_jax.checkpoint import catalog
from vit_jax.models import MODEL_CONFIGS, get_model, stats

UNITS = {'MiB': 2**20, 'GiB': 2**30, 'MB': 1e6, 'GB': 1e9}


@functools.cache
def _param_count(model: str, resolution: int, num_classes: int, pre_logits: bool) -> int:
  representation = {'representation_size': MODEL_CONFIGS[model].hidden_size} if pre_logits else {}
  net = get_model(model, num_classes=num_classes or None, **representation)
  return stats.count_params(families.param_shapes(net, resolution))


# What was released, from the published listings (not from the catalogue): the bucket listing
# of gs://vit_models/imagenet21k and .../imagenet21k+imagenet2012 stored in the original
# notebook, the AugReg README's table of recommended checkpoints, and the google/vit-* hub repos.
IMAGENET21K = ['ViT-B_16', 'ViT-B_32', 'ViT-B_8', 'ViT-L_16', 'ViT-L_32', 'ViT-H_14']
IMAGENET21K += ['R50+ViT-B_16', 'R26+ViT-B_32', 'R50+ViT-L_32']
IMAGENET21K_1K = ['ViT-B_16', 'ViT-B_16-224', 'ViT-B_32', 'ViT-B_8', 'ViT-L_16', 'ViT-L_16-224']
IMAGENET21K_1K += ['ViT-L_32', 'R50+ViT-B_16']
AUGREG_RECOMMENDED = ['L_16', 'B_16', 'S_16', 'R50_L_32', 'R26_S_32', 'Ti_16', 'B_32', 'S_32']
AUGREG_RECOMMENDED += ['R_Ti_16']
HUB = [f'vit-{size}-patch{p}-{res}' for size, p, res in [('base', 16, 224), ('base', 16, 384)]]
HUB += ['vit-base-patch32-384', 'vit-large-patch16-224', 'vit-large-patch16-384']
HUB += ['vit-large-patch32-384', 'vit-base-patch16-224-in21k', 'vit-base-patch32-224-in21k']
HUB += ['vit-large-patch16-224-in21k', 'vit-large-patch32-224-in21k', 'vit-huge-patch14-224-in21k']
# The `gsutil ls gs://mixer_models/*` output stored in the original vit_jax.ipynb.
MIXER = [f'imagenet1k/Mixer-{m}' for m in ('B_16', 'L_16')]
MIXER += [f'imagenet21k/Mixer-{m}' for m in ('B_16', 'L_16')]
MIXER += [f'sam/Mixer-{m}' for m in ('B_16', 'B_32')]
MIXER += [f'gsam/Mixer-{m}' for m in ('B_16', 'B_32', 'S_16', 'S_32', 'S_8')]


def test_entries_are_the_published_files_and_name_registered_models():
  expected = [f'imagenet21k/{m}' for m in IMAGENET21K]
  expected += [f'imagenet21k+imagenet2012/{m}' for m in IMAGENET21K_1K]
  # Each recommended upstream file and its ImageNet fine-tune at 384 px.
  expected += [
    f'augreg/{m}-i21k{tune}' for m in AUGREG_RECOMMENDED for tune in ('', '-imagenet2012-384')
  ]
  expected += [f'hf/{repo}' for repo in HUB]
  expected += MIXER
  names = [e.name for e in catalog.CATALOG]
  assert len(names) == len(set(names))
  assert sorted(names) == sorted(expected)
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


@pytest.mark.slow
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
