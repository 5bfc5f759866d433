"""`vit-models --describe FILE` on a Hugging Face ViT, a LiT and a SigLIP 2 NaFlex file, written
in their released layouts by tests/test_load.py's cases: the counts summed from the files' own
arrays, the class names and tokenizer settings the cases wrote, the resolution or patch budget
and the preprocessing each family states, and the settings the format says it computes
otherwise, line by line."""

import dataclasses
import json

import numpy as np
import pytest
from absl import flags
from safetensors.numpy import load_file
from test_load import CASES, NAFLEX_MAX_PATCHES, SIGLIP_LEN
from text_vocabs import BERT_VOCAB

from vit_jax.checkpoint import formats
from vit_jax.cli import models as models_cli
from vit_jax.families.preprocessing import Preprocessing

TINY = 'hidden_size 32, 1 layers, 4 heads, mlp_dim 64'  # every case's (image tower's) blocks
GEMMA_PIECES = 320  # the NaFlex case's vocabulary (tests/test_load.py's `_spm`)
LIT_BERT_LEN = 16  # LiT's BERT texts, as the original LiT code tokenizes them


def _describe(capsys, *argv) -> tuple[int, str, str]:
  """vit-models in this process: its flags parsed on their own FlagValues, then run."""
  flag_values = flags.FlagValues()
  models_cli.define_flags(flag_values)
  flag_values(['vit-models', *map(str, argv)])
  status = models_cli.run(flag_values)
  out, err = capsys.readouterr()
  return status, out, err


def _file_arrays(path) -> list[np.ndarray]:
  """The arrays of the file itself, read without the project's readers."""
  if path.is_dir():
    return list(load_file(path / 'model.safetensors').values())
  with np.load(path, allow_pickle=False) as f:
    return [f[k] for k in f.files]


def _lines(out: str) -> dict[str, str]:
  """The description's `subject: value` lines, by subject."""
  subjects = [line.partition(':') for line in out.splitlines() if not line.startswith('  ')]
  return {subject: value.strip() for subject, _, value in subjects}


@pytest.fixture
def cases(tmp_path):
  """Each described case written into its own folder."""

  def write(name):
    (tmp_path / name).mkdir()
    return CASES[name](tmp_path / name)

  return write


def test_a_hugging_face_vit_with_its_names_and_what_its_format_computes_otherwise(
  cases, capsys, monkeypatch
):
  case = cases('vit_token')
  stated = ['layer_norm_eps=1e-12 as stated, computed with 1e-6', 'the exact GELU, computed tanh']
  said = lambda f: dataclasses.replace(f, unlike=lambda path: stated) if f.name == 'hf' else f
  monkeypatch.setattr(formats, 'FORMATS', [said(f) for f in formats.FORMATS])
  status, out, err = _describe(capsys, '--describe', case.path)
  assert status == 0, err
  arrays = _file_arrays(case.path)
  lines = _lines(out)
  assert lines['checkpoint'] == str(case.path) and lines['format'].startswith('hf (')
  assert (lines['kind'], lines['model']) == ('ViT', 'unregistered')
  assert lines['architecture'].startswith(f'{TINY}, patch 8x8, classifier token')
  assert lines['counts'] == f'{len(arrays)} arrays, {sum(a.size for a in arrays):,} parameters'
  assert lines['resolution'] == '32 px'
  assert lines['preprocessing'] == Preprocessing(size=(32, 32)).describe()
  assert 'tokenizer' not in lines
  names = ', '.join(f'"{name}"' for name in case.class_names)
  assert lines['classes'] == f'5, names from {case.path / "config.json"}: {names}'
  assert out.splitlines()[-3:] == ['computed unlike the file:', *[f'  {s}' for s in stated]]


def test_a_lit_file_with_its_vocabulary_beside_it(cases, capsys):
  case = cases('lit')
  status, out, err = _describe(capsys, '--describe', case.path)
  assert status == 0, err
  arrays = _file_arrays(case.path)
  lines = _lines(out)
  assert lines['format'].startswith('npz (image-text model')
  assert (lines['kind'], lines['model']) == ('LiT (image tower: ViT)', 'unregistered')
  assert lines['architecture'].startswith(f'image tower ({TINY}, patch 8x8')
  assert 'text tower (BERT hidden_size 128, 1 layers, 2 heads' in lines['architecture']
  assert lines['counts'] == f'{len(arrays)} arrays, {sum(a.size for a in arrays):,} parameters'
  assert lines['resolution'] == '32 px'  # the original LiT code's uint8 cast:
  assert lines['preprocessing'] == Preprocessing(size=(32, 32), round_to_uint8=True).describe()
  vocab = case.path.with_suffix('.txt')
  pieces = len(BERT_VOCAB)
  assert (
    lines['tokenizer']
    == f'bert, {LIT_BERT_LEN} tokens a text; vocabulary {vocab} ({pieces} pieces)'
  )
  assert lines['classes'].startswith('none (an image-text model')
  assert lines['computed unlike the file'] == 'none'


def test_a_naflex_file_as_json_with_its_patch_budget(cases, capsys):
  case = cases('naflex')
  status, out, err = _describe(capsys, '--describe', case.path, '--json')
  assert status == 0, err
  arrays = _file_arrays(case.path)
  d = json.loads(out)
  assert (d['kind'], d['image_tower'], d['model']) == ('SigLIP', 'NaFlex ViT', None)
  assert d['architecture'].startswith(f'image tower (NaFlex, {TINY}, patch 4')
  # the file's blocks are scan-stacked: one layer, so one array a key as in our tree
  assert (d['arrays'], d['parameters']) == (len(arrays), sum(a.size for a in arrays))
  assert (d['resolution'], d['max_patches']) == (None, NAFLEX_MAX_PATCHES)
  spec = Preprocessing(patch_size=4, max_patches=NAFLEX_MAX_PATCHES, antialias=True)
  assert d['preprocessing'] == spec.describe()
  vocab = str(case.path.with_suffix('.model'))
  assert d['tokenizer'] == {
    'name': 'gemma', 'max_len': SIGLIP_LEN, 'vocab': vocab, 'pieces': GEMMA_PIECES, 'missing': ''
  }  # fmt: skip
  assert (d['num_classes'], d['class_names'], d['unlike']) == (None, None, [])


def test_a_missing_file_is_one_line_and_table_flags_are_usage_errors(tmp_path, capsys):
  missing = tmp_path / 'missing.npz'
  status, out, err = _describe(capsys, '--describe', missing)
  assert (status, out, err.count('\n')) == (1, '', 1) and str(missing) in err
  status, out, err = _describe(capsys, '--describe', missing, '--resolution', '384')
  assert (status, out) == (2, '') and err.startswith('error: --resolution')
  status, out, err = _describe(capsys, '--json')
  assert (status, out) == (2, '') and '--describe' in err
