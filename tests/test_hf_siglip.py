"""Hugging Face `SiglipModel` both ways: a directory transformers writes reads into our
image-text tree with transformers' embeddings and logits; SigLIP and SigLIP 2 files convert to
a directory `AutoModel` and `AutoProcessor` load, giving transformers' outputs, our pixels and
our token ids; converted back, the tree is bit-equal. Expected numbers come from transformers."""

import io
import json

import jax
import numpy as np
import pytest
import sentencepiece
import torch
import transformers
from conftest import big_vision_siglip, randomize
from PIL import Image
from test_text import GEMMA_SETTINGS
from test_two_towers import _hf_randomize

import vit_jax
from vit_jax import checkpoint, families
from vit_jax.checkpoint import hf_siglip, tree
from vit_jax.cli import convert
from vit_jax.families import two_towers
from vit_jax.models import get_config, model_from_config

SIZE, PATCH, LEN, VOCAB = 32, 8, 16, 64
TOWER = {'hidden_size': 32, 'num_hidden_layers': 2, 'num_attention_heads': 2}
TOWER['intermediate_size'] = 64
CORPUS = ['a photo of a cat', 'two dogs on the beach', 'a red apple', 'the cat sat'] * 20
TEXTS = ['a photo of a cat', 'Two Dogs on the beach', 'the red cat sat on a photo of two dogs']


def _inputs(seed=0):
  rng = np.random.default_rng(seed)
  images = rng.uniform(-1, 1, (2, SIZE, SIZE, 3)).astype(np.float32)
  return images, rng.integers(0, VOCAB, (3, LEN)).astype(np.int32)


def _theirs(hf, images, tokens):
  """transformers' (image_embeds, text_embeds, logits_per_image), float64."""
  with torch.no_grad():
    out = hf.double()(
      input_ids=torch.tensor(tokens).long(),
      pixel_values=torch.tensor(images).permute(0, 3, 1, 2).double(),
    )
  return out.image_embeds.numpy(), out.text_embeds.numpy(), out.logits_per_image.numpy()


def _assert_ours_equal_theirs(fitted, hf, images, tokens):
  zimg, ztxt, out = jax.jit(fitted.model().apply)(
    {'params': fitted.params}, images=images, tokens=tokens
  )
  logits = out['t'] * zimg @ ztxt.T + out['b']
  for ours, want in zip((zimg, ztxt, logits), _theirs(hf, images, tokens), strict=True):
    np.testing.assert_allclose(ours, want, atol=1e-5, rtol=0)


def test_a_directory_transformers_writes_gives_its_embeddings_and_logits(tmp_path):
  """Each tower's layer_norm_eps (SiglipConfig's default is ours, 1e-6) is the model's."""
  config = transformers.SiglipConfig(
    text_config={**TOWER, 'vocab_size': VOCAB, 'max_position_embeddings': LEN},
    vision_config={**TOWER, 'image_size': SIZE, 'patch_size': PATCH, 'layer_norm_eps': 1e-12},
  )
  hf = _hf_randomize(transformers.SiglipModel(config), seed=1).float()
  hf.save_pretrained(tmp_path / 'hf')
  assert checkpoint.detect_format(tmp_path / 'hf').name == 'hf_siglip'
  assert checkpoint.holds_image_text(tmp_path / 'hf')
  fitted = checkpoint.fit(tmp_path / 'hf')
  assert fitted.found.description == (
    'hf_siglip (model.safetensors, 88 tensors, SiglipModel, layer_norm_eps=1e-12,1e-06)'
  )
  assert fitted.config.image.layer_norm_epsilon == 1e-12
  assert 'layer_norm_epsilon' not in fitted.config.text
  written = hf_siglip.siglip_config(fitted.params, fitted.config.pp, fitted.config)
  assert (written['vision_config']['layer_norm_eps'], written['text_config']['layer_norm_eps']) == (
    1e-12,
    1e-6,
  )
  assert fitted.config.pp.to_dict() == {
    'tokenizer_name': 'sentencepiece', 'size': SIZE, 'max_len': LEN, 'lower_case': True,
    'round_to_uint8': True,
  }  # fmt: skip
  assert fitted.config.image.classifier == 'map' and tuple(fitted.config.out_dim) == (None, 32)
  _assert_ours_equal_theirs(fitted, hf, *_inputs())


def test_config_json_gives_the_registered_model_and_its_image_size(tmp_path):
  """So400m/14 at 384 px: 27 x 27 patches, which the shapes alone read as 378 px; its
  config.json (as we write it) says 384, and the model is the registered one."""
  name = 'SigLIP-So400m14-384'
  model = model_from_config(get_config(name))
  shapes = families.param_shapes(model, 384, 64)
  config = hf_siglip.siglip_config(shapes, get_config(name).pp)
  assert (config['vision_config']['image_size'], config['text_config']['vocab_size']) == (
    384,
    32_000,
  )
  (tmp_path / 'config.json').write_text(json.dumps(config))
  found = two_towers.infer_config(shapes)
  found.update(hf_siglip.model_fields(tmp_path))
  assert found.pp.size == 384 and two_towers.match_registry(found) == name


def _spm(path, vocab_size=40, **settings) -> str:
  """A tiny sentencepiece model trained on CORPUS, written at `path`."""
  model = io.BytesIO()
  sentencepiece.SentencePieceTrainer.train(
    sentence_iterator=iter(CORPUS), model_writer=model, vocab_size=vocab_size,
    hard_vocab_limit=False, minloglevel=2, **settings,
  )  # fmt: skip
  path.write_bytes(model.getvalue())
  return str(path)


def _siglip_tree(name, vocab, seed):
  """A tiny random tree of the registered model `name` (its text tower of `vocab` pieces)."""
  config = get_config(name)
  config.image.update({'patches': {'size': (PATCH, PATCH)}, 'hidden_size': 32})
  config.image.transformer.update({'num_layers': 2, 'mlp_dim': 64, 'num_heads': 2})
  config.text.update({'width': 32, 'num_layers': 2, 'mlp_dim': 64, 'num_heads': 2})
  config.text.vocab_size, config.out_dim, config.pp.size = vocab, (None, 32), SIZE
  model = model_from_config(config)
  return randomize(families.param_shapes(model, SIZE, LEN), seed)


def test_siglip2_file_converts_to_hf_and_back_bit_equal(tmp_path):
  """A SigLIP 2 file in big_vision's layout (256,000 embedding rows, a narrow tower) with
  Gemma's vocabulary beside it: `convert --to=hf` writes a SiglipModel directory that
  transformers loads with our outputs, and a GemmaTokenizer; read back, the tree is the file's."""
  params = _siglip_tree('SigLIP2-B16-224', two_towers.GEMMA_VOCAB, seed=2)
  np.savez(tmp_path / 'siglip2.npz', **big_vision_siglip(params))
  vocab = _spm(tmp_path / 'siglip2.model', 320, **GEMMA_SETTINGS)  # Gemma's settings and ids
  lines = []
  convert.convert(str(tmp_path / 'siglip2.npz'), str(tmp_path / 'hf'), 'hf', out=lines.append)
  assert lines[1].startswith(
    f'wrote {tmp_path}/hf: hf (SiglipModel, config.json + model.safetensors +'
    ' preprocessor_config.json + tokenizer.model + tokenizer_config.json)'
  )
  hf = transformers.AutoModel.from_pretrained(tmp_path / 'hf')
  assert type(hf) is transformers.SiglipModel
  fitted = checkpoint.fit(tmp_path / 'siglip2.npz')
  _assert_ours_equal_theirs(fitted, hf, *_inputs(3))
  original, back = (
    tree.flatten(checkpoint.load(tmp_path / 'siglip2.npz')),
    tree.flatten(checkpoint.load(tmp_path / 'hf')),
  )
  assert back.keys() == original.keys()
  for key, value in original.items():
    assert back[key].dtype == value.dtype and back[key].shape == value.shape, key
    np.testing.assert_array_equal(back[key], value, err_msg=key)
  processor = transformers.AutoProcessor.from_pretrained(tmp_path / 'hf')
  # HF's Gemma tokenizer does not lower-case: SigLIP 2's texts are lower-cased by the caller.
  texts = [t.lower() for t in TEXTS]
  ids = processor(text=texts, padding='max_length', truncation=True)['input_ids']
  np.testing.assert_array_equal(ids, two_towers.tokenizer(fitted.config.pp, vocab)(TEXTS))


def test_siglip_processor_gives_our_pixels_and_token_ids(tmp_path):
  """`AutoProcessor` of a converted SigLIP file with its sentencepiece vocabulary beside it:
  its pixel values are our preprocessing's, its ids our tokenizer's (texts without
  punctuation, which SiglipTokenizer strips and ours keeps)."""
  params = _siglip_tree('SigLIP-B16-224', VOCAB, seed=4)
  checkpoint.save_npz(params, tmp_path / 'siglip.npz')
  # SigLIP's c4_en ids: padding 0, </s> 1 (big_vision pads with 1), <unk> 2.
  vocab = _spm(tmp_path / 'siglip.model', pad_id=0, eos_id=1, unk_id=2, bos_id=-1)
  convert.convert(str(tmp_path / 'siglip.npz'), str(tmp_path / 'hf'), 'hf', out=lambda _: None)
  processor = transformers.AutoProcessor.from_pretrained(tmp_path / 'hf')
  assert type(processor.tokenizer).__name__ == 'SiglipTokenizer'
  image = np.random.default_rng(5).integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)
  got = processor(images=Image.fromarray(image), text=TEXTS, padding='max_length', truncation=True)
  pixels = np.asarray(got['pixel_values'])[0].transpose(1, 2, 0)
  ours = vit_jax.load(tmp_path / 'siglip.npz').preprocess(image)[0]
  np.testing.assert_allclose(pixels, ours, atol=1e-6, rtol=0)
  pp = checkpoint.fit(tmp_path / 'siglip.npz').config.pp
  np.testing.assert_array_equal(got['input_ids'], two_towers.tokenizer(pp, vocab)(TEXTS))


def test_a_lit_model_has_no_siglip_model_and_nothing_is_written(tmp_path):
  params = _siglip_tree('SigLIP-B16-224', VOCAB, seed=6)
  lit = {k: v for k, v in params.items() if k != 'b'}
  with pytest.raises(checkpoint.CheckpointError, match='a LiT model') as error:
    checkpoint.export_hf(lit, None, tmp_path / 'hf')
  assert '\n' not in str(error.value) and not (tmp_path / 'hf').exists()
