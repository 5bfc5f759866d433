"""Call-time resolution (`posemb_grid`) and intermediate features (`intermediate_blocks`)."""

import functools

import jax
import numpy as np
import pytest
import scipy.ndimage
from conftest import NARROW

from vit_jax import checkpoint, families
from vit_jax.models import blocks, get_config, get_model
from vit_jax.models.posemb import resize_posemb_grid

# Patch 4: 56 px is a 14x14 grid, 96 px 24x24, 64x40 px 16x10.
SMALL = {
  **NARROW,
  'patches': {'size': (4, 4)},
  'transformer': {**NARROW['transformer'], 'dropout_rate': 0.0},
}


def _images(h, w, seed=1):
  return np.random.default_rng(seed).uniform(-1, 1, (2, h, w, 3)).astype(np.float32)


@functools.cache
def _apply(model, blocks=None):
  return jax.jit(
    lambda p, x: model.apply({'params': p}, x, train=False, intermediate_blocks=blocks)
  )


def _model(**overrides):
  return get_model('testing', **{'num_classes': 5, **SMALL, **overrides})


def _config(**overrides):
  config = get_config('testing')
  config.update({**SMALL, **overrides})
  return config


# ---------------------------------------------------------------------------------------------
# Any resolution at call time.


@pytest.mark.parametrize(
  ('old', 'new', 'prefix'),
  [((14, 14), (24, 24), 1), ((14, 14), (16, 10), 1), ((14, 14), (7, 9), 0), ((3, 5), (1, 4), 2)],
)
def test_call_time_resize_equals_scipy_zoom(old, new, prefix):
  posemb = np.random.default_rng(0).standard_normal((1, prefix + old[0] * old[1], 8))
  posemb = posemb.astype(np.float32)
  grid = posemb[0, prefix:].reshape(*old, 8)
  zoomed = scipy.ndimage.zoom(grid, (new[0] / old[0], new[1] / old[1], 1), order=1)
  expected = np.concatenate([posemb[:, :prefix], zoomed.reshape(1, -1, 8)], axis=1)
  resize = jax.jit(resize_posemb_grid, static_argnums=(1, 2, 3))
  got = np.asarray(resize(posemb, old, new, prefix))
  assert got.shape == expected.shape
  np.testing.assert_allclose(got, expected, atol=1e-6, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize('classifier', ['token', 'gap'])
@pytest.mark.parametrize('size', [(96, 96), (64, 40)])
def test_model_applied_at_another_size_equals_the_load_pretrained_resized_model(
  random_params, classifier, size
):
  trained = _model(classifier=classifier)
  params = random_params(families.param_shapes(trained, 56), scale=0.3)
  # The reference: the checkpoint fitted to a model built for `size`, as fine-tuning does.
  resized, report = checkpoint.merge_pretrained(
    params,
    families.param_shapes(trained, size),
    _config(classifier=classifier),
    keep_head=True,
    image_size=size,
  )
  assert [key for key, _, _ in report.resized] == [checkpoint.tree.POSEMB]
  images = _images(*size)
  expected = np.asarray(_apply(trained)(resized, images))

  dynamic = _model(classifier=classifier, posemb_grid=(14, 14))
  got = np.asarray(_apply(dynamic)(params, images))
  assert np.abs(expected).max() > 0.1
  np.testing.assert_allclose(got, expected, atol=1e-6, rtol=0)


def test_posemb_grid_at_the_trained_size_is_the_default_model_bit_for_bit(random_params):
  trained = _model()
  params = random_params(families.param_shapes(trained, 56))
  dynamic = _model(posemb_grid=(14, 14))
  assert jax.tree.map(np.shape, families.param_shapes(dynamic, 96)) == jax.tree.map(
    np.shape, params
  )
  images = _images(56, 56)
  np.testing.assert_array_equal(_apply(dynamic)(params, images), _apply(trained)(params, images))


def test_the_default_model_still_refuses_another_size(random_params):
  trained = _model()
  params = random_params(families.param_shapes(trained, 56))
  with pytest.raises(Exception, match=r'pos_embedding.*\(1, 577, 16\).*\(1, 197, 16\)'):
    trained.apply({'params': params}, _images(96, 96), train=False)


# ---------------------------------------------------------------------------------------------
# Intermediate features.


def _layer_norm(x, scale, bias, eps=1e-6):
  x = x.astype(np.float64)
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * scale + bias


def _truncated(params, num_blocks):
  """The first `num_blocks` blocks of `params` with everything else."""
  transformer = {
    k: v
    for k, v in params['Transformer'].items()
    if not k.startswith('encoderblock_') or int(k.rsplit('_', 1)[1]) < num_blocks
  }
  return {**params, 'Transformer': transformer}


@pytest.mark.parametrize('block', [0, 1])
def test_block_output_equals_a_model_truncated_after_that_block(random_params, block):
  model = _model()
  params = random_params(families.param_shapes(model, 56))
  images = _images(56, 56)
  features = _apply(model, (block,))(params, images)
  tokens = np.concatenate(
    [
      features[f'encoderblock_{block}/prefix'],
      features[f'encoderblock_{block}'].reshape(2, -1, 16),
    ],
    axis=1,
  )
  # The truncated model ends in the final LayerNorm, applied here by hand to our raw output.
  short = _model(
    num_classes=None,
    classifier='token_unpooled',
    transformer={**SMALL['transformer'], 'num_layers': block + 1},
  )
  expected = np.asarray(_apply(short)(_truncated(params, block + 1), images))
  norm = params['Transformer']['encoder_norm']
  assert expected.shape == (2, 197, 16)
  np.testing.assert_allclose(
    _layer_norm(tokens, norm['scale'], norm['bias']), expected, atol=1e-5, rtol=0
  )


def test_embedding_is_the_patch_grid_and_encoded_the_unpooled_output(random_params):
  model = _model(classifier='token')
  params = random_params(families.param_shapes(model, 56))
  images = _images(56, 56)
  features = _apply(model, (-1,))(params, images)
  assert sorted(features) == [
    'embedding',
    'encoded',
    'encoded/prefix',
    'encoderblock_2',
    'encoderblock_2/prefix',
    'output',
  ]
  # With the whole encoder run, `output` is the model's own output: the logits (the plain call
  # runs the last block for the class token alone, other matmul shapes: float32 rounding).
  np.testing.assert_allclose(features['output'], _apply(model)(params, images), atol=1e-6)
  patches = images.reshape(2, 14, 4, 14, 4, 3)
  kernel = params['embedding']
  expected = np.einsum('bhpwqc,pqcd->bhwd', patches, kernel['kernel']) + kernel['bias']
  np.testing.assert_allclose(features['embedding'], expected, atol=1e-5, rtol=0)

  unpooled = _model(num_classes=None, classifier='token_unpooled')
  tokens = np.asarray(_apply(unpooled)({k: v for k, v in params.items() if k != 'head'}, images))
  np.testing.assert_array_equal(features['encoded/prefix'], tokens[:, :1])
  np.testing.assert_array_equal(features['encoded'], tokens[:, 1:].reshape(2, 14, 14, 16))


def test_one_pass_runs_neither_later_blocks_nor_the_head(random_params):
  model = _model()
  params = random_params(families.param_shapes(model, 56))
  images = _images(56, 56)
  full = _apply(model, (0, 1))(params, images)
  without_rest = _truncated({k: v for k, v in params.items() if k != 'head'}, 2)
  del without_rest['Transformer']['encoder_norm']
  cut = _apply(model, (0, 1))(without_rest, images)  # would fail if anything else ran
  assert sorted(cut) == sorted(full) and 'encoded' not in cut
  for key in full:
    np.testing.assert_array_equal(cut[key], full[key], err_msg=key)


def test_scanned_blocks_give_the_same_features(random_params):
  model = _model(classifier='gap')
  params = random_params(families.param_shapes(model, 56))
  images = _images(56, 56)
  unrolled = _apply(model, (0, 2))(params, images)
  scanned = _apply(_model(classifier='gap', scan_layers=True), (0, -1))(
    blocks.stack_encoder_blocks(params), images
  )
  assert (
    sorted(scanned)
    == sorted(unrolled)
    == ['embedding', 'encoded', 'encoderblock_0', 'encoderblock_2', 'output']
  )
  for key in unrolled:
    np.testing.assert_allclose(scanned[key], unrolled[key], atol=1e-5, rtol=0, err_msg=key)


@pytest.mark.slow
@pytest.mark.parametrize(
  ('options', 'prefix'),
  [
    ({'distilled': True}, 2),  # DeiT: cls and dist_token, each with a position row
    ({'classifier': 'map'}, 0),  # big_vision: no class token
    ({'classifier': 'gap', 'posemb': 'sincos2d'}, 0),
  ],
)
def test_prefix_tokens_and_big_vision_options(random_params, options, prefix):
  """Features split off every prefix token; a posemb_grid model applied at another size equals
  the model fitted to that size (sincos2d, without a learned embedding, fits any size as is)."""
  trained = _model(**options)
  params = random_params(families.param_shapes(trained, 56), scale=0.3)
  images = _images(64, 40)
  dynamic = _model(posemb_grid=(14, 14), **options)
  features = _apply(dynamic, (0, -1))(params, images)
  assert features['encoderblock_0'].shape == features['encoded'].shape == (2, 16, 10, 16)
  assert ('encoderblock_0/prefix' in features) == bool(prefix)
  if prefix:
    assert features['encoderblock_0/prefix'].shape == (2, prefix, 16)

  resized, _ = checkpoint.merge_pretrained(
    params, families.param_shapes(trained, (64, 40)), _config(**options), True, image_size=(64, 40)
  )
  expected = np.asarray(_apply(trained)(resized, images))
  assert np.abs(expected).max() > 0.1
  np.testing.assert_allclose(features['output'], expected, atol=1e-6, rtol=0)
  np.testing.assert_allclose(_apply(dynamic)(params, images), expected, atol=1e-6, rtol=0)


def test_features_at_another_size_with_posemb_grid(random_params):
  model = _model(posemb_grid=(14, 14))
  params = random_params(families.param_shapes(model, 56))
  features = _apply(model, (1,))(params, _images(64, 40))
  assert features['encoderblock_1'].shape == (2, 16, 10, 16)
  assert features['encoderblock_1/prefix'].shape == (2, 1, 16)


@pytest.mark.parametrize(
  ('blocks', 'match'),
  [
    ((3,), r'3 is not a block index of a model with 3 blocks'),
    ((-4,), '-4'),
    (2, 'sequence'),
    ((), 'sequence'),
  ],
)
def test_bad_block_indices_are_one_line_errors(random_params, blocks, match):
  model = _model()
  params = random_params(families.param_shapes(model, 56))
  with pytest.raises(ValueError, match=match) as e:
    model.apply({'params': params}, _images(56, 56), train=False, intermediate_blocks=blocks)
  assert '\n' not in str(e.value)


@pytest.mark.parametrize('overrides', [{}, {'distilled': True, 'num_classes': None}])
def test_a_class_token_readout_computes_the_last_block_for_its_tokens_alone(
  random_params, overrides
):
  """Inference reads the class (and distillation) token: the last block's queries, MLP and
  the final norm run on those rows alone. The output equals the full computation (recording
  attention maps keeps every token), and XLA counts the FLOPs of the rows left out."""
  model = _model(**overrides)
  params = random_params(families.param_shapes(model, 56))
  images = _images(56, 56)

  def full(p, x):
    return model.apply({'params': p}, x, train=False, mutable=['intermediates'])[0]

  def readout(p, x):
    return model.apply({'params': p}, x, train=False)

  full, readout = (jax.jit(f).lower(params, images).compile() for f in (full, readout))
  np.testing.assert_allclose(readout(params, images), full(params, images), atol=1e-6)
  # Left out per image: the queries, attention, out projection and MLP of 196 (195 with a
  # distillation token) of 197 tokens, at D=16, MLP 32, a 14x14 grid: 2 FLOPs a multiply-add.
  rows, tokens, d, mlp = 197 - (2 if overrides.get('distilled') else 1), 197, 16, 32
  left_out = 2 * rows * (d * d + 2 * tokens * d + d * d + 2 * d * mlp) * len(images)
  saved = full.cost_analysis()['flops'] - readout.cost_analysis()['flops']
  assert left_out <= saved < 1.2 * left_out
