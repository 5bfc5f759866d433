"""big_vision's ViT options: MAP-head pooling, fixed 2-D sin-cos position embeddings, no class
token. Files written here by hand in big_vision's layout load into the model the shapes imply,
whose logits equal big_vision's equations written in numpy; the image tower of an image-text
file loads alone, and what was left out is named."""

import numpy as np
import pytest
from numpy_models import big_vision_vit, gelu_exact, sincos2d

import vit_jax
from vit_jax import checkpoint, families
from vit_jax.checkpoint import tree
from vit_jax.inference import model as inference_model
from vit_jax.models import get_config, get_model, model_from_config, posemb, stats

WIDTH, DEPTH, HEADS, MLP, PATCH, SIZE = 32, 2, 4, 64, 8, 32
GRID = (SIZE // PATCH) ** 2
CLASSIFIER = {'map': 'map', 'gap': 'gap', 'tok': 'token'}


def _attention(prefix):
  hd = WIDTH // HEADS
  return {
    **{f'{prefix}/{n}/kernel': (WIDTH, HEADS, hd) for n in ('query', 'key', 'value')},
    **{f'{prefix}/{n}/bias': (HEADS, hd) for n in ('query', 'key', 'value')},
    f'{prefix}/out/kernel': (HEADS, hd, WIDTH),
    f'{prefix}/out/bias': (WIDTH,),
  }


def _mlp(prefix):
  return {
    f'{prefix}/Dense_0/kernel': (WIDTH, MLP),
    f'{prefix}/Dense_0/bias': (MLP,),
    f'{prefix}/Dense_1/kernel': (MLP, WIDTH),
    f'{prefix}/Dense_1/bias': (WIDTH,),
  }


def _norm(prefix):
  return {f'{prefix}/scale': (WIDTH,), f'{prefix}/bias': (WIDTH,)}


def big_vision_params(pool, posemb='learn', rep=None, classes=5, seed=0) -> dict:
  """A big_vision ViT (`models/vit.py` names and shapes, unscanned, no prefix), random values:
  N(0, 0.2), LayerNorm scales N(1, 0.1)."""
  shapes = {'embedding/kernel': (PATCH, PATCH, 3, WIDTH), 'embedding/bias': (WIDTH,)}
  if posemb == 'learn':
    shapes['pos_embedding'] = (1, GRID, WIDTH)  # no class row: added before the token
  if pool == 'tok':
    shapes['cls'] = (1, 1, WIDTH)
  for i in range(DEPTH):
    b = f'Transformer/encoderblock_{i}'
    shapes |= _norm(f'{b}/LayerNorm_0') | _attention(f'{b}/MultiHeadDotProductAttention_0')
    shapes |= _norm(f'{b}/LayerNorm_1') | _mlp(f'{b}/MlpBlock_0')
  shapes |= _norm('Transformer/encoder_norm')
  if pool == 'map':
    shapes['MAPHead_0/probe'] = (1, 1, WIDTH)
    shapes |= _attention('MAPHead_0/MultiHeadDotProductAttention_0')
    shapes |= _norm('MAPHead_0/LayerNorm_0') | _mlp('MAPHead_0/MlpBlock_0')
  if rep:
    shapes |= {'pre_logits/kernel': (WIDTH, rep), 'pre_logits/bias': (rep,)}
  shapes |= {'head/kernel': (rep or WIDTH, classes), 'head/bias': (classes,)}
  rng = np.random.default_rng(seed)
  one = lambda k: float(k.endswith('/scale'))
  return {k: (one(k) + 0.2 * rng.standard_normal(s)).astype(np.float32) for k, s in shapes.items()}


def on_disk(params, prefix='params/', scan=False) -> dict:
  """big_vision's checkpoint: a prefix, and with `scan` the blocks stacked on a depth axis."""
  flat = dict(params)
  if scan:
    for key in [k for k in flat if k.startswith('Transformer/encoderblock_0/')]:
      rest = key.split('/', 2)[2]
      layers = [flat.pop(f'Transformer/encoderblock_{i}/{rest}') for i in range(DEPTH)]
      flat[f'Transformer/encoderblock/{rest}'] = np.stack(layers)
  return {prefix + k: v for k, v in flat.items()}


def _images(n=2, seed=1):
  return np.random.default_rng(seed).uniform(-1, 1, (n, SIZE, SIZE, 3)).astype(np.float32)


def _oracle(params, pool, images):
  as64 = {k: v.astype(np.float64) for k, v in params.items()}
  return big_vision_vit(as64, images.astype(np.float64), pool)


def _logits(tree_, config, images):
  model = model_from_config(config)
  return np.asarray(model.apply({'params': tree_}, images, train=False))


@pytest.mark.parametrize('h, w, width', [(4, 4, 32), (3, 5, 16), (14, 14, 384)])
def test_sincos2d_is_big_vision_formula(h, w, width):
  got = np.asarray(posemb.posemb_sincos_2d(h, w, width))
  assert got.shape == (1, h * w, width) and got.dtype == np.float32
  np.testing.assert_allclose(got, sincos2d(h, w, width), atol=2e-6, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize(
  'pool, posemb, rep, scan',
  [
    ('map', 'learn', None, False),
    ('map', 'learn', None, True),
    ('map', 'sincos2d', None, False),
    ('gap', 'sincos2d', WIDTH, True),  # big_vision's ViT-S/16 ImageNet recipe's options
    ('tok', 'sincos2d', None, False),
  ],
)
def test_file_loads_into_the_inferred_model_with_big_vision_logits(
  tmp_path, pool, posemb, rep, scan
):
  params = big_vision_params(pool, posemb, rep)
  np.savez(tmp_path / 'bv.npz', **on_disk(params, scan=scan))
  loaded, description = checkpoint.read(tmp_path / 'bv.npz')
  assert description.startswith('npz (big_vision')
  config = tree.infer_config(loaded)
  assert config.classifier == CLASSIFIER[pool]
  assert config.get('posemb', 'learn') == posemb
  assert config.representation_size == rep
  images = _images()
  want = _oracle(params, pool, images)
  assert np.abs(want).max() > 0.3 and np.abs(want[0] - want[1]).max() > 0.1  # worth comparing
  np.testing.assert_allclose(_logits(loaded, config, images), want, atol=1e-5, rtol=0)


def test_exact_gelu_reaches_the_encoder_and_the_map_head(tmp_path):
  """`gelu_approximate=False`: every MLP (blocks and MAP head) computes x Phi(x)."""
  params = big_vision_params('map')
  np.savez(tmp_path / 'bv.npz', **on_disk(params))
  loaded = checkpoint.load(tmp_path / 'bv.npz')
  config = tree.infer_config(loaded)
  config.gelu_approximate = False
  images = _images()
  as64 = {k: v.astype(np.float64) for k, v in params.items()}
  want = big_vision_vit(as64, images.astype(np.float64), 'map', gelu=gelu_exact)
  assert np.abs(want - _oracle(params, 'map', images)).max() > 1e-4  # 10x the tolerance
  np.testing.assert_allclose(_logits(loaded, config, images), want, atol=1e-5, rtol=0)


def test_image_tower_of_an_image_text_file_loads_alone(tmp_path):
  img = big_vision_params('map', classes=WIDTH)  # SigLIP-like: MAP head, head = embedding
  rng = np.random.default_rng(5)
  text = {
    'params/txt/Embed_0/embedding': rng.standard_normal((50, WIDTH)),
    'params/txt/Encoder_0/encoder_norm/scale': np.ones(WIDTH),
    'params/txt/head/kernel': rng.standard_normal((WIDTH, WIDTH)),
    'params/t': np.array([2.3]),
    'params/b': np.array([-10.0]),
  }
  text = {k: v.astype(np.float32) for k, v in text.items()}
  np.savez(tmp_path / 'siglip.npz', **on_disk(img, 'params/img/'), **text)
  loaded, description = checkpoint.read(tmp_path / 'siglip.npz')
  assert "prefix 'params/img/'" in description
  assert "ignored 5 arrays outside 'params/img/' (params/b, params/t, params/txt)" in description
  assert tree.flatten(loaded).keys() == img.keys() - {'pos_embedding'} | {
    'Transformer/posembed_input/pos_embedding'
  }
  images = _images()
  np.testing.assert_allclose(
    _logits(loaded, tree.infer_config(loaded), images),
    _oracle(img, 'map', images),
    atol=1e-5,
    rtol=0,
  )


def test_inline_map_head_of_early_checkpoints_moves_into_maphead(tmp_path):
  params = big_vision_params('map')
  inline = {k.removeprefix('MAPHead_0/'): v for k, v in params.items()}
  np.savez(tmp_path / 'old.npz', **on_disk(inline))
  loaded, description = checkpoint.read(tmp_path / 'old.npz')
  assert 'inline MAP head moved to MAPHead_0' in description
  flat = tree.flatten(loaded)
  for key in [k for k in params if k.startswith('MAPHead_0/')]:
    np.testing.assert_array_equal(flat[key], params[key], err_msg=key)


def test_model_names_and_no_position_parameter():
  model = get_model('ViT-B_16', num_classes=1000, classifier='map', posemb='sincos2d')
  flat = tree.flatten(families.param_shapes(model, 224))
  assert 'cls' not in flat and tree.POSEMB not in flat
  assert flat['MAPHead_0/probe'].shape == (1, 1, 768)
  assert flat['MAPHead_0/MultiHeadDotProductAttention_0/query/kernel'].shape == (768, 12, 64)
  assert flat['MAPHead_0/MultiHeadDotProductAttention_0/out/kernel'].shape == (12, 64, 768)
  assert flat['MAPHead_0/LayerNorm_0/scale'].shape == (768,)
  assert flat['MAPHead_0/MlpBlock_0/Dense_0/kernel'].shape == (768, 3072)
  # B/16 minus cls and the 197 position rows, plus probe, attention (4 D^2 + 4 D), LN, MLP.
  d, m = 768, 3072
  expected = 86_567_656 - d - 197 * d + d + 4 * d * d + 4 * d + 2 * d + 2 * d * m + m + d
  assert stats.count_params(flat) == expected


def test_analytic_flops_of_the_map_head_match_xla():
  config = get_config('ViT-B_16')
  config.classifier = 'map'
  analytic = families.forward_flops(config, 224, 1000)
  xla = families.xla_forward_flops(model_from_config(config, num_classes=1000), 224)
  assert 0.99 < analytic / xla <= 1.0


def test_predict_needs_a_resolution_only_for_sincos2d(tmp_path):
  np.savez(tmp_path / 'map.npz', **on_disk(big_vision_params('map')))
  assert vit_jax.load(tmp_path / 'map.npz').resolution == SIZE
  params = big_vision_params('gap', 'sincos2d', classes=4)
  np.savez(tmp_path / 'sincos.npz', **on_disk(params))
  with pytest.raises(ValueError, match='pass --resolution'):
    vit_jax.load(tmp_path / 'sincos.npz')
  loaded = vit_jax.load(tmp_path / 'sincos.npz', resolution=SIZE)
  images = _images(3, seed=7)
  _, logits = inference_model.run_padded(loaded.features_and_logits, images, 3)
  want = _oracle(params, 'gap', images)
  np.testing.assert_allclose(logits, want, atol=1e-5)
