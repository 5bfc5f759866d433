"""Hugging Face `Siglip2Model` (SigLIP 2's NaFlex) both ways: a directory transformers writes
reads into our image-text tree with a NaFlex image tower and gives transformers' embeddings and
logits; a big_vision NaFlex file converts to a directory `AutoModel` and `AutoProcessor` load,
giving transformers' outputs and our token ids, and reads back bit-equal. Tiny towers as
tests/test_naflex.py's; expected numbers come from transformers."""

import json
import shutil

import jax
import numpy as np
import pytest
import tensorflow as tf
import torch
import transformers
from PIL import Image
from test_hf_siglip import TEXTS, _spm
from test_naflex import (
  GRID,
  GRIDS,
  HEADS,
  LAYERS,
  MLP,
  PATCH,
  SLOTS,
  WIDTH,
  _inputs,
  _siglip2_to_big_vision,
)
from test_text import GEMMA_SETTINGS
from test_two_towers import _hf_randomize
from transformers.models.siglip2.image_processing_siglip2 import (
  get_image_size_for_max_num_patches,
)

from vit_jax import checkpoint, families
from vit_jax.checkpoint import hf_siglip, tree
from vit_jax.cli import convert
from vit_jax.data import naflex as naflex_data
from vit_jax.data import preprocess
from vit_jax.families import two_towers
from vit_jax.models import get_config, model_from_config, naflex

LEN, VOCAB = 16, two_towers.GEMMA_VOCAB  # Gemma's 256,000 rows: the tokenizer is Gemma's
TOWER = {'hidden_size': WIDTH, 'num_hidden_layers': LAYERS, 'num_attention_heads': HEADS}
TOWER['intermediate_size'] = MLP


def _siglip2(seed: int) -> transformers.Siglip2Model:
  config = transformers.Siglip2Config(
    text_config={**TOWER, 'vocab_size': VOCAB, 'max_position_embeddings': LEN},
    vision_config={**TOWER, 'patch_size': PATCH, 'num_patches': GRID * GRID},
  )
  config.text_config._attn_implementation = config.vision_config._attn_implementation = 'eager'
  return _hf_randomize(transformers.Siglip2Model(config), seed=seed)


def _assert_ours_equal_theirs(fitted, hf, seed):
  """Embeddings and logits of three aspect ratios batched with padding (test_naflex's GRIDS
  in SLOTS slots) and three texts: ours equal transformers' (float64) to 1e-5."""
  x = _inputs(GRIDS, SLOTS, seed=seed)
  tokens = np.random.default_rng(seed).integers(5, VOCAB, (3, LEN)).astype(np.int32)
  zimg, ztxt, out = jax.jit(fitted.model().apply)(
    {'params': fitted.params}, images=x, tokens=tokens
  )
  with torch.no_grad():
    want = hf.double()(
      input_ids=torch.tensor(tokens).long(),
      pixel_values=torch.tensor(x['patches']).double(),
      pixel_attention_mask=torch.tensor(x['ptype']),
      spatial_shapes=torch.tensor(GRIDS),
    )
  logits = out['t'] * zimg @ ztxt.T + out['b']
  theirs = (want.image_embeds, want.text_embeds, want.logits_per_image)
  for ours, expected in zip((zimg, ztxt, logits), theirs, strict=True):
    np.testing.assert_allclose(ours, expected.numpy(), atol=1e-5, rtol=0)


@pytest.fixture(scope='module')
def saved(tmp_path_factory):
  """transformers' Siglip2Model (random, float32) as `save_pretrained` writes it, with its
  image processor's preprocessor_config.json (at most 64 patches of 4)."""
  hf = _siglip2(seed=1).float()
  path = tmp_path_factory.mktemp('siglip2') / 'hf'
  hf.save_pretrained(path)
  transformers.Siglip2ImageProcessor(patch_size=PATCH, max_num_patches=64).save_pretrained(path)
  return hf, path


def test_a_directory_transformers_writes_gives_its_embeddings_and_logits(saved):
  hf, path = saved
  assert checkpoint.detect_format(path).name == 'hf_siglip'
  assert checkpoint.holds_image_text(path)
  fitted = checkpoint.fit(path)
  assert fitted.found.description == (
    'hf_siglip (model.safetensors, 88 tensors, Siglip2Model, SigLIP 2 (Gemma vocabulary))'
  )
  assert fitted.config.image_model == 'naflex' and fitted.config.image.posemb_grid == GRID
  assert fitted.config.pp.to_dict() == {
    'tokenizer_name': 'gemma', 'max_len': LEN, 'lower_case': True, 'max_patches': 64,
  }  # fmt: skip
  _assert_ours_equal_theirs(fitted, hf, seed=2)


def test_a_bare_weights_file_is_told_from_siglip_model_by_its_2d_patch_embedding(saved, tmp_path):
  """Without config.json: SiglipModel's names, but the patch embedding a (D, p * p * 3)
  Linear, SiglipModel's a 4-D conv: a Siglip2Model, read as the directory is."""
  _, path = saved
  shutil.copy(path / 'model.safetensors', tmp_path / 'siglip2.safetensors')
  bare = tmp_path / 'siglip2.safetensors'
  assert hf_siglip.variant_of(bare) == 'siglip2'
  ours, want = (tree.flatten(checkpoint.load(p, num_heads=HEADS)) for p in (bare, path))
  assert ours.keys() == want.keys()
  for key, value in want.items():
    np.testing.assert_array_equal(ours[key], value, err_msg=key)


def test_config_json_gives_the_registered_naflex_model(tmp_path):
  """SigLIP2-B16-naflex's shapes and the config.json we write for them (which transformers'
  Siglip2Config reads as a 16 x 16 grid of patches of 16), beside an image processor's
  config of 1,024 patches: the registered name, its text length and those patches."""
  name = 'SigLIP2-B16-naflex'
  shapes = families.param_shapes(model_from_config(get_config(name)))
  config = hf_siglip.siglip_config(shapes, get_config(name).pp)
  theirs = transformers.Siglip2Config(**config)
  assert (theirs.vision_config.num_patches, theirs.vision_config.patch_size) == (256, 16)
  theirs.save_pretrained(tmp_path)
  transformers.Siglip2ImageProcessor(max_num_patches=1024).save_pretrained(tmp_path)
  found = two_towers.infer_config(shapes)
  found.update(hf_siglip.model_fields(tmp_path))
  assert found.image_model == 'naflex' and two_towers.match_registry(found) == name
  assert (found.pp.max_len, found.pp.max_patches) == (64, 1024)


@pytest.fixture(scope='module')
def converted(tmp_path_factory):
  """(.npz, vocabulary, converted directory, convert's lines): transformers' Siglip2Model
  (random, float64) as a big_vision NaFlex .npz (test_naflex's
  map of its names, not ours) with a Gemma-style vocabulary beside it, converted --to=hf."""
  hf = _siglip2(seed=3)
  folder = tmp_path_factory.mktemp('naflex')
  npz = folder / 'siglip2_naflex.npz'
  np.savez(npz, **_siglip2_to_big_vision({k: v.numpy() for k, v in hf.state_dict().items()}))
  vocab = _spm(folder / 'siglip2_naflex.model', 320, **GEMMA_SETTINGS)
  lines = []
  convert.convert(str(npz), str(folder / 'hf'), 'hf', out=lines.append)
  return npz, vocab, folder / 'hf', lines


def test_naflex_file_converts_to_siglip2_model_and_back_bit_equal(converted):
  npz, vocab, path, lines = converted
  assert lines[1].startswith(
    f'wrote {path}: hf (Siglip2Model, config.json + model.safetensors +'
    ' preprocessor_config.json + tokenizer.model + tokenizer_config.json)'
  )
  loaded = transformers.AutoModel.from_pretrained(path)
  assert type(loaded) is transformers.Siglip2Model
  fitted = checkpoint.fit(npz)
  _assert_ours_equal_theirs(fitted, loaded, seed=4)
  original, back = tree.flatten(checkpoint.load(npz)), tree.flatten(checkpoint.load(path))
  assert back.keys() == original.keys()
  for key, value in original.items():
    assert back[key].dtype == value.dtype and back[key].shape == value.shape, key
    np.testing.assert_array_equal(back[key], value, err_msg=key)
  processor = transformers.AutoProcessor.from_pretrained(path)
  assert type(processor) is transformers.Siglip2Processor
  # transformers 5 loads Gemma's tokenizer beside a Siglip2Model as Siglip2Tokenizer, which
  # lower-cases as ours does: the texts as they are.
  ids = processor(text=TEXTS, padding='max_length', truncation=True)['input_ids']
  np.testing.assert_array_equal(ids, two_towers.tokenizer(fitted.config.pp, vocab)(TEXTS))


def test_siglip2_image_processor_against_our_patch_sequence(converted):
  """`AutoProcessor` of the converted directory on a 37 x 23 image (at most 256 patches of 4)
  against our `patch_sequence`. The sizes are the same: transformers'
  `get_image_size_for_max_num_patches` is big_vision's binary search (ceil to whole patches,
  scales from 1e-6 to 100 until 1e-5 apart), in float64 where ours is float32, and the two
  agree on every size tried here (and on 3,321 shapes from 8 to 300 px, patches of 4 and 16,
  64 and 256 of them). So do the mask and the (row, column, channel) order of a patch. The
  pixels differ by at most one uint8 step (2/255 in [-1, 1]): both resizes are antialiased
  bilinear, but transformers resizes the uint8 image and rounds to uint8, ours resizes in
  float32 (measured: max 0.0076, mean 0.0023 for this noise image)."""
  path = converted[2]
  processor = transformers.AutoProcessor.from_pretrained(path)
  image = np.random.default_rng(7).integers(0, 256, (37, 23, 3), dtype=np.uint8)
  theirs = processor(images=Image.fromarray(image), return_tensors='np')
  ours = naflex.inputs(preprocess.patch_sequence(tf.constant(image), PATCH, 256).numpy()[None])
  rows, cols = int(ours['yidx'].max()) + 1, int(ours['xidx'].max()) + 1
  assert theirs['spatial_shapes'].tolist() == [[rows, cols]] == [[20, 12]]
  np.testing.assert_array_equal(theirs['pixel_attention_mask'], ours['ptype'])
  diff = np.abs(theirs['pixel_values'] - ours['patches'])
  assert diff.max() <= 2 / 255 and diff.mean() < 0.003
  for shape in [(h, w) for h in range(8, 300, 37) for w in range(8, 300, 29)]:
    for patch, max_patches in ((4, 256), (16, 64)):
      want = get_image_size_for_max_num_patches(*shape, patch, max_patches)
      assert naflex_data.sequence_size(*shape, patch, max_patches) == tuple(want), shape
  config = json.loads((path / 'preprocessor_config.json').read_text())
  assert (config['patch_size'], config['max_num_patches']) == (PATCH, 256)
