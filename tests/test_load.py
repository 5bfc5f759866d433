"""`vit_jax.load` on one file of each family, written in its released layout with random weights
(a ViT pooled by its class token and by GAP, a hybrid, DeiT, Mixer, LiT, SigLIP, SigLIP 2 and a
NaFlex SigLIP 2): `preprocess` of PNG files, PNG bytes, a PIL image and a uint8 array equals
the preprocessing computed here in numpy (and PIL), and `logits`, `features`, `embed_images`
and `embed_texts` of those inputs (and `similarity`) equal the independent oracles the suite
already uses (transformers, timm, tests/numpy_models.py; the hybrid: timm's hybrid ViT through
timm's own reader of the original .npz files), each on the weights as it reads the file and
configured as `load` computes: to 1e-5 in float32; in bfloat16 within the bound of the
benchmark's agreement check (tests/test_benchmark.py: 0 < max error < 5% of the largest
value)."""

import dataclasses
import functools
import io
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import scipy.special
import torch
import transformers
from conftest import big_vision_siglip, randomize
from numpy_models import l2_normalize, vit
from numpy_models import mixer as numpy_mixer
from PIL import Image
from test_checkpoint_npz import released_layout
from test_checkpoint_timm import TIMM_SMALL, _timm_model
from test_hf_siglip import _spm
from test_mixer import SIZE as MIXER_SIZE
from test_mixer import released_layout as mixer_layout
from test_naflex import GRID, WIDTH, _naflex_embeddings
from test_naflex import PATCH as NAFLEX_PATCH
from test_text import GEMMA_SETTINGS
from test_two_towers import _hf_randomize, bert_from_hf, tiny_config
from text_vocabs import BERT_VOCAB, write_bert_vocab
from transformers.models.siglip2.image_processing_siglip2 import (
  get_image_size_for_max_num_patches,
)

import vit_jax
from vit_jax import families
from vit_jax.checkpoint import hf_siglip, tree
from vit_jax.families import two_towers
from vit_jax.models import get_model, model_from_config

# The images: (height, width) of each, fed as a PNG file, PNG bytes, a PIL image, an array.
SHAPES = ((37, 23), (50, 41), (19, 64), (29, 45))
TEXTS = ['a photo of a cat', 'the cat sat on a mat', 'Two DOGS on the beach!']
ATOL = 1e-5  # the tolerance of every oracle test this file's cases come from
PIXELS_ATOL = 1e-6  # tests/test_hf_siglip.py's (transformers' SigLIP pixels against ours)
# TensorFlow's antialiased resize computes its sample positions in float32: up to 7e-6 from
# the exact resize here (tests/test_hf_siglip2.py allows transformers' 2 / 255).
PATCHES_ATOL = 1e-5
BF16_BOUND = 0.05  # tests/test_benchmark.py: 0 < max |error| < 0.05 * max |value|


@dataclasses.dataclass
class Case:
  """A file written in its released layout and how to check `vit_jax.load` of it."""

  path: Any
  kind: str  # `Model.kind`
  pixels: Callable[[list[np.ndarray]], np.ndarray]  # uint8 images -> the model's inputs
  outputs: Callable[[np.ndarray, np.ndarray | None], dict[str, np.ndarray]]  # the oracle's
  class_names: list[str] | None = None  # a classifier's, where its file names them
  tokenizer: str | None = None  # an image-text model's (`pp.tokenizer_name`)
  scalars: tuple[float, float | None] | None = None  # its exp(t) and SigLIP's bias b
  pixels_atol: float = PIXELS_ATOL


def _torch(x: np.ndarray) -> torch.Tensor:
  return torch.from_numpy(np.ascontiguousarray(x, np.float64))


def _nchw(x: np.ndarray) -> torch.Tensor:
  return _torch(x.transpose(0, 3, 1, 2))


# --- the preprocessing, computed here -------------------------------------------------------


def _bilinear(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
  """tf.image.resize's bilinear without antialiasing, in float64: the output pixel i of n
  samples the input at (i + 0.5) * m / n - 0.5, linear between its two neighbours, clamped
  to the edge pixels."""
  out = image.astype(np.float64)
  for axis, n in enumerate(size):
    m = out.shape[axis]
    x = np.clip((np.arange(n) + 0.5) * m / n - 0.5, 0, m - 1)
    low = np.floor(x).astype(int)
    high = np.minimum(low + 1, m - 1)
    frac = (x - low).reshape([-1 if a == axis else 1 for a in range(3)])
    a, b = np.take(out, low, axis=axis), np.take(out, high, axis=axis)
    out = a + (b - a) * frac
  return out


def square(size: int, round_to_uint8: bool = False):
  """A classifier's (and LiT's, SigLIP's) inputs: a bilinear resize to size x size, cast to
  uint8 (truncating) where the original code does, then (x - 127.5) / 127.5."""

  def pixels(images):
    resized = [_bilinear(image, (size, size)) for image in images]
    if round_to_uint8:  # every sample here is exact in float32 too (weights k / 64): no tie
      resized = [np.floor(r) for r in resized]
    return np.stack([(r - 127.5) / 127.5 for r in resized])

  return pixels


def _grid(image: np.ndarray, patch: int, max_patches: int) -> tuple[int, int]:
  """transformers' Siglip2ImageProcessor's size in patches (big_vision's search)."""
  height, width = get_image_size_for_max_num_patches(*image.shape[:2], patch, max_patches)
  return height // patch, width // patch


def _antialiased(channel: np.ndarray, size: tuple[int, int]) -> np.ndarray:
  """Pillow's bilinear resize of float pixels (a triangle filter widened by the scale when
  it shrinks: antialiased), in float32 without rounding."""
  resized = Image.fromarray(channel.astype(np.float32)).resize(size, Image.BILINEAR)
  return np.asarray(resized, np.float64)


def naflex_patches(patch: int, max_patches: int):
  """A NaFlex tower's inputs: the image resized to transformers' size (Pillow's antialiased
  bilinear on float pixels, no rounding), (x - 127.5) / 127.5, patches in (row, column,
  channel) order, then each slot's ptype, row and column; unused slots zero."""

  def pixels(images):
    out = np.zeros((len(images), max_patches, patch * patch * 3 + 3))
    for i, image in enumerate(images):
      rows, cols = _grid(image, patch, max_patches)
      size = (cols * patch, rows * patch)  # Pillow's (width, height)
      resized = np.stack([_antialiased(image[..., c], size) for c in range(3)], axis=-1)
      values = (resized - 127.5) / 127.5
      grid = values.reshape(rows, patch, cols, patch, 3).transpose(0, 2, 1, 3, 4)
      n = rows * cols
      out[i, :n, :-3] = grid.reshape(n, -1)
      out[i, :n, -3] = 1
      out[i, :n, -2], out[i, :n, -1] = np.divmod(np.arange(n), cols)
    return out

  return pixels


# --- the cases: each file and its oracle ----------------------------------------------------


def vit_token(folder) -> Case:
  """A ViT pooled by its class token as transformers writes it (`save_pretrained`: config.json
  with id2label, model.safetensors); the oracle is transformers' ViTForImageClassification."""
  labels = ['tabby', 'tiger cat', 'sail boat', 'fox', 'okapi']
  config = transformers.ViTConfig(
    hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
    image_size=32, patch_size=8, num_labels=5, id2label=dict(enumerate(labels)),
    label2id={n: i for i, n in enumerate(labels)}, hidden_act='gelu_pytorch_tanh',
    layer_norm_eps=1e-6, qkv_bias=True,
  )  # fmt: skip
  hf = _hf_randomize(transformers.ViTForImageClassification(config), seed=1)
  hf.float().save_pretrained(folder)
  hf.double()

  def outputs(x, tokens):
    with torch.no_grad():
      tokens_out = hf.vit(pixel_values=_nchw(x)).last_hidden_state[:, 0]
      logits = hf.classifier(tokens_out)
    return {'logits': logits.numpy(), 'features': tokens_out.numpy()}

  return Case(folder, 'ViT', square(32), outputs, labels)


def _timm_outputs(theirs, features: Callable):
  theirs = theirs.double().eval()

  def outputs(x, tokens):
    with torch.no_grad():
      tokens_out = theirs.forward_features(_nchw(x))
      return {
        'logits': theirs.forward_head(tokens_out).numpy(),
        'features': features(theirs, tokens_out).numpy(),
      }

  return outputs


TIMM_ONE = {**TIMM_SMALL, 'depth': 1}  # 32 px, patches of 8, width 32, 4 heads, one block


def vit_gap(folder) -> Case:
  """A ViT pooled by GAP as timm writes it (`save_for_hf`: config.json, model.safetensors; no
  class token, the mean of the normalised tokens); the oracle is timm's VisionTransformer."""
  theirs = _timm_model(
    num_classes=6, class_token=False, global_pool='avg', fc_norm=False, scale=0.3, **TIMM_ONE
  )
  timm_save(theirs, folder)
  pre_logits = lambda model, t: model.forward_head(t, pre_logits=True)
  return Case(folder, 'ViT', square(32), _timm_outputs(theirs, pre_logits))


def timm_save(model, folder) -> None:
  import timm

  timm.models.save_for_hf(model, folder, safe_serialization=True)


def deit(folder) -> Case:
  """DeiT (distilled, timm's default exact GELU) as timm writes it; the oracle is timm's
  model: its logits the mean of its two heads, the features its two tokens side by side."""
  theirs = _timm_model(
    'deit_tiny_distilled_patch16_224', act_layer=None, scale=0.3, num_classes=4, **TIMM_ONE
  )
  timm_save(theirs, folder)
  both = lambda model, t: torch.cat([t[:, 0], t[:, 1]], dim=-1)
  return Case(folder, 'DeiT (distilled)', square(32), _timm_outputs(theirs, both))


# The hybrid: R50's stem with one unit in each of its first two stages (the second strides by
# 2) at 32 px: a 4 x 4 grid of its 512 channels.
HYBRID = {
  'num_classes': 7,
  'hidden_size': 32,
  'representation_size': None,
  'resnet': {'num_layers': (1, 1), 'width_factor': 1},
  'transformer': {'num_layers': 1, 'num_heads': 4, 'mlp_dim': 64},
}


def hybrid(folder) -> Case:
  """R50+ViT-B_16 (tiny) in the original release's .npz layout (pre-Linen names, GroupNorm
  parameters (1, 1, 1, C)); the oracle is timm's hybrid ViT (ResNetV2 stem, `HybridEmbed`)
  with timm's own reader of those files (`load_pretrained`)."""
  from timm.layers import HybridEmbed, StdConv2dSame
  from timm.models.resnetv2 import ResNetV2
  from timm.models.vision_transformer import VisionTransformer

  shapes = families.param_shapes(get_model('R50+ViT-B_16', **HYBRID), 32)
  params = tree.flatten(randomize(shapes, seed=2, scale=0.3))
  for key in params:  # the convs N(0, 1): weight standardisation makes the eps of their std
    if re.search(r'(conv_root|conv\d|conv_proj)/kernel$', key):  # (ours 1e-5, timm's 1e-8)
      params[key] = params[key] / 0.3  # negligible
  path = folder / 'R50+ViT-B_16.npz'
  np.savez(path, **released_layout(tree.unflatten(params)))

  # The backbone as timm's `_resnetv2` builds it, with 1, 1 units.
  backbone = ResNetV2(
    layers=(1, 1), num_classes=0, global_pool='', preact=False, stem_type='same',
    conv_layer=functools.partial(StdConv2dSame, eps=1e-8),
  )  # fmt: skip
  theirs = VisionTransformer(
    img_size=32, patch_size=1, embed_dim=32, depth=1, num_heads=4, mlp_ratio=2.0, num_classes=7,
    act_layer='gelu_tanh', embed_layer=functools.partial(HybridEmbed, backbone=backbone),
  )  # fmt: skip
  theirs.load_pretrained(str(path))
  for module in theirs.modules():  # flax's GroupNorm epsilon (timm's default is 1e-5)
    if isinstance(module, torch.nn.GroupNorm):
      module.eps = 1e-6
  pre_logits = lambda model, t: model.forward_head(t, pre_logits=True)
  return Case(path, 'ViT hybrid', square(32), _timm_outputs(theirs, pre_logits))


def mixer(folder) -> Case:
  """MLP-Mixer in the released .npz layout (tests/test_mixer.py's, spelled out by hand: 64 px
  in patches of 16); the oracle is the Mixer equations in numpy (its features: those with an
  identity head)."""
  flat = mixer_layout(7, seed=4, blocks=1)
  path = folder / 'Mixer.npz'
  np.savez(path, **flat)
  p = {k: v.astype(np.float64) for k, v in flat.items()}
  width = p['head/kernel'].shape[0]
  identity = {**p, 'head/kernel': np.eye(width), 'head/bias': np.zeros(width)}

  def outputs(x, tokens):
    return {'logits': numpy_mixer(p, x), 'features': numpy_mixer(identity, x)}

  return Case(path, 'MLP-Mixer', square(MIXER_SIZE), outputs)


def _tower(flat, prefix):
  return {k.removeprefix(prefix): np.float64(v) for k, v in flat.items() if k.startswith(prefix)}


def lit(folder) -> Case:
  """LiT-B16B's layout (`img/` ViT with a head, `txt/` flaxformer's BERT with a head, `t`)
  with its WordPiece vocabulary beside it (FILE.txt); the oracles are transformers' BertModel
  (the padding masked) for the texts and the ViT equations in numpy for the images. BERT's
  heads are its width / 64, as the file cannot say."""
  from transformers import BertConfig, BertModel

  config = BertConfig(
    vocab_size=len(BERT_VOCAB), hidden_size=128, num_hidden_layers=1, num_attention_heads=2,
    intermediate_size=128, max_position_embeddings=512, type_vocab_size=2,
    hidden_act='gelu_new', layer_norm_eps=1e-12, attn_implementation='eager',
  )  # fmt: skip
  bert = _hf_randomize(BertModel(config, add_pooling_layer=False), seed=5).float().double()
  sd = {k: v.numpy() for k, v in bert.state_dict().items()}  # float32 values, as the file's
  rng = np.random.default_rng(6)
  head = {'head/kernel': 0.2 * rng.standard_normal((128, 24)), 'head/bias': rng.normal(size=24)}
  flat = {f'txt/{k}': v for k, v in {**bert_from_hf(sd, 1), **head}.items()}
  image = tiny_config('LiT-B16B', (24, 24)).image  # patches of 8, width 32, 4 heads
  image.transformer.num_layers = 1
  shapes = families.param_shapes(model_from_config(image.to_dict(), num_classes=24), 32)
  flat |= {f'img/{k}': v for k, v in tree.flatten(randomize(shapes, seed=7)).items()}
  flat['t'] = np.array([2.5])
  flat = {k: np.float32(v) for k, v in flat.items()}
  path = folder / 'LiT-B16B.npz'
  np.savez(path, **flat)
  write_bert_vocab(folder / 'LiT-B16B.txt')
  img = _tower(flat, 'img/')
  headless = {k: v for k, v in img.items() if not k.startswith('head/')}
  txt_head = _tower(flat, 'txt/head/')

  def outputs(x, tokens):
    with torch.no_grad():
      ids = torch.tensor(tokens).long()
      hidden = bert(input_ids=ids, attention_mask=(ids != 0).long()).last_hidden_state
    text = hidden[:, 0].numpy() @ txt_head['kernel'] + txt_head['bias']
    return {
      'features': vit(headless, x),
      'embed_images': l2_normalize(vit(img, x)),
      'embed_texts': l2_normalize(text),
    }

  pixels = square(32, round_to_uint8=True)
  return Case(path, 'LiT', pixels, outputs, tokenizer='bert', scalars=(np.exp(2.5), None))


def _siglip_outputs(hf, naflex: bool = False):
  """transformers' SiglipModel / Siglip2Model (float64) on the model's inputs: the image
  tower's pooled output and both normalised embeddings."""
  hf = hf.double().eval()

  def outputs(x, tokens):
    if naflex:
      patches, index = x[..., :-3], x[..., -3:].astype(int)
      rows, cols = index[..., 1].max(1) + 1, index[..., 2].max(1) + 1
      images = {
        'pixel_values': _torch(patches),
        'pixel_attention_mask': torch.tensor(index[..., 0]),
        'spatial_shapes': torch.tensor(np.stack([rows, cols], -1)),
      }
    else:
      images = {'pixel_values': _nchw(x)}
    with torch.no_grad():
      pooled = hf.vision_model(**images).pooler_output
      out = hf(input_ids=torch.tensor(tokens).long(), **images)
    return {
      'features': pooled.numpy(),
      'embed_images': out.image_embeds.numpy(),
      'embed_texts': out.text_embeds.numpy(),
    }

  return outputs


# SigLIP's towers (both generations): one block, width 32, 4 heads; 16 text tokens. SigLIP's
# and SigLIP 2's image towers are the same, and so are SigLIP 2's and NaFlex's text towers.
SIGLIP_TOWER = {'hidden_size': 32, 'num_hidden_layers': 1, 'num_attention_heads': 4}
SIGLIP_TOWER['intermediate_size'] = 64
SIGLIP_LEN = 16


def _scalars(hf) -> tuple[float, float]:
  """A SiglipModel's exp(t) and b."""
  return float(np.exp(hf.logit_scale.item())), float(hf.logit_bias.item())


def _siglip_model(cls, config_cls, vocab: int, seed: int, **vision):
  """transformers' `cls` (SiglipModel or Siglip2Model) with SIGLIP_TOWER towers, random
  (float32: the values the files hold)."""
  config = config_cls(
    text_config={**SIGLIP_TOWER, 'vocab_size': vocab, 'max_position_embeddings': SIGLIP_LEN},
    vision_config={**SIGLIP_TOWER, **vision},
  )
  config.text_config._attn_implementation = config.vision_config._attn_implementation = 'eager'
  return _hf_randomize(cls(config), seed=seed).float()


def siglip(folder) -> Case:
  """SigLIP as transformers writes it (`save_pretrained` of a SiglipModel) with its
  sentencepiece vocabulary (c4_en's ids) as spiece.model; the oracle is that SiglipModel."""
  hf = _siglip_model(
    transformers.SiglipModel, transformers.SiglipConfig, 64, 8, image_size=32, patch_size=8
  )
  hf.save_pretrained(folder)
  _spm(folder / 'spiece.model', pad_id=0, eos_id=1, unk_id=2, bos_id=-1)
  pixels = square(32, round_to_uint8=True)
  outputs = _siglip_outputs(hf)
  return Case(folder, 'SigLIP', pixels, outputs, tokenizer='sentencepiece', scalars=_scalars(hf))


def siglip2(folder) -> Case:
  """SigLIP 2 in big_vision's .npz layout (`params/`, scan-stacked blocks; a narrow text tower
  keeping Gemma's 256,000 rows), as tests/test_two_towers.py writes it from a SiglipModel,
  with a Gemma-style vocabulary beside it (FILE.model); the oracle is that SiglipModel."""
  hf = _siglip_model(
    transformers.SiglipModel, transformers.SiglipConfig, two_towers.GEMMA_VOCAB, 10,
    image_size=32, patch_size=8,
  )  # fmt: skip
  sd = {k: v.numpy() for k, v in hf.state_dict().items()}
  path = folder / 'siglip2.npz'
  np.savez(path, **big_vision_siglip(hf_siglip.from_state_dict(sd, lambda name: 4)))
  _spm(folder / 'siglip2.model', 320, **GEMMA_SETTINGS)
  pixels = square(32, round_to_uint8=True)
  outputs = _siglip_outputs(hf)
  return Case(path, 'SigLIP', pixels, outputs, tokenizer='gemma', scalars=_scalars(hf))


NAFLEX_MAX_PATCHES = 256  # a big_vision NaFlex file's own (its pp.max_patches)


def naflex(folder) -> Case:
  """SigLIP 2 NaFlex in big_vision's .npz layout (tests/test_naflex.py's map of transformers'
  names: its vision embeddings by hand, the rest through `hf_siglip`'s map) with a Gemma-style
  vocabulary beside it; the oracle is transformers' Siglip2Model on the patch sequences, each
  image at its own aspect ratio, batched with padding."""
  hf = _siglip_model(
    transformers.Siglip2Model, transformers.Siglip2Config, two_towers.GEMMA_VOCAB, 9,
    patch_size=NAFLEX_PATCH, num_patches=GRID * GRID,
  )  # fmt: skip
  assert SIGLIP_TOWER['hidden_size'] == WIDTH  # test_naflex's position grid's width
  sd = {k: v.numpy() for k, v in hf.state_dict().items()}
  layers = SIGLIP_TOWER['num_hidden_layers']
  keys = hf_siglip.key_map(layers, layers)
  keys = {k: v for k, v in keys.items() if not k.startswith('vision_model.embeddings.')}
  heads = SIGLIP_TOWER['num_attention_heads']
  flat = hf_siglip.to_flat({k: sd[k] for k in keys}, keys, lambda name: heads, 'siglip2')
  flat |= _naflex_embeddings(sd, 'vision_model.', 'img/')
  path = folder / 'siglip2_naflex.npz'
  np.savez(path, **big_vision_siglip(tree.unflatten(flat)))
  _spm(folder / 'siglip2_naflex.model', 320, **GEMMA_SETTINGS)
  pixels = naflex_patches(NAFLEX_PATCH, NAFLEX_MAX_PATCHES)
  outputs = _siglip_outputs(hf, naflex=True)
  return Case(
    path, 'SigLIP', pixels, outputs, tokenizer='gemma', scalars=_scalars(hf),
    pixels_atol=PATCHES_ATOL,
  )  # fmt: skip


CASES = {
  'vit_token': vit_token,
  'vit_gap': vit_gap,
  'hybrid': hybrid,
  'deit': deit,
  'mixer': mixer,
  'lit': lit,
  'siglip': siglip,
  'siglip2': siglip2,
  'naflex': naflex,
}


def _images(folder) -> tuple[list[Any], list[np.ndarray]]:
  """The images in each form `preprocess` takes (a PNG file's path, PNG bytes, a PIL image, a
  uint8 array), and their uint8 pixels."""
  rng = np.random.default_rng(0)
  arrays = [rng.integers(0, 256, (*shape, 3), dtype=np.uint8) for shape in SHAPES]
  Image.fromarray(arrays[0]).save(folder / 'first.png')
  encoded = io.BytesIO()
  Image.fromarray(arrays[1]).save(encoded, 'PNG')
  inputs = [str(folder / 'first.png'), encoded.getvalue(), Image.fromarray(arrays[2]), arrays[3]]
  return inputs, arrays


@pytest.mark.parametrize('name', CASES)
def test_load_equals_the_oracle(name, tmp_path):
  """`vit_jax.load(FILE)`: its inputs and outputs are the oracle's to 1e-5 (the inputs of a
  resize to 1e-6), its family, tokenizer, scalars and class names the file's;
  `dtype='bfloat16'` within the benchmark's bound of them."""
  (tmp_path / 'model').mkdir()
  case = CASES[name](tmp_path / 'model')
  inputs, arrays = _images(tmp_path)
  model = vit_jax.load(case.path)
  assert model.kind == case.kind and model.dtype == 'float32'
  assert model.class_names == case.class_names

  x = model.preprocess(inputs)
  assert x.dtype == np.float32
  np.testing.assert_allclose(x, case.pixels(arrays), atol=case.pixels_atol, rtol=0)
  tokens = model.tokenize(TEXTS) if model.image_text else None
  if tokens is not None:
    assert (tokens != tokens[:, -1:]).any(axis=1).all()  # every text more than padding
  want = case.outputs(x.astype(np.float64), tokens)
  texts = {'embed_texts': TEXTS}
  for method, expected in want.items():
    assert np.abs(expected).max() > 0.1, method  # a real signal, not zeros against zeros
    if method != 'embed_texts':
      assert np.abs(expected[0] - expected[1]).max() > 1e-2, method  # the images differ
    got = getattr(model, method)(texts.get(method, inputs))
    assert got.shape == expected.shape, method
    np.testing.assert_allclose(got, expected, atol=ATOL, rtol=0, err_msg=method)
  if model.image_text:  # LiT's softmax over the texts, SigLIP's sigmoid of each pair
    assert model.config['pp']['tokenizer_name'] == case.tokenizer
    t, b = case.scalars
    np.testing.assert_allclose(model.t, t, rtol=1e-6)
    assert (model.b is None) == (b is None)
    logits = t * want['embed_images'] @ want['embed_texts'].T
    probs = scipy.special.softmax(logits, axis=1) if b is None else scipy.special.expit(logits + b)
    np.testing.assert_allclose(model.similarity(inputs, TEXTS), probs, atol=ATOL, rtol=0)

  # bfloat16: the class logits and features (one program), or both towers' embeddings.
  half = vit_jax.load(case.path, dtype='bfloat16')
  assert half.dtype == 'bfloat16'
  np.testing.assert_array_equal(half.preprocess(inputs), x)
  for method, expected in want.items():
    if model.image_text and method == 'features':
      continue
    error = np.abs(getattr(half, method)(texts.get(method, x)) - expected).max()
    assert 0 < error < BF16_BOUND * np.abs(expected).max(), (method, error)
