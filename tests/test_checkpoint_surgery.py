"""load_pretrained: the original fine-tuning surgery (head, pre_logits, position-embedding
resize with scipy.ndimage.zoom), FlexiViT patch resize, and one-line errors for misfits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.ndimage
from conftest import NARROW

from vit_jax import checkpoint, families
from vit_jax.checkpoint import surgery
from vit_jax.models import get_config, get_model

POSEMB = 'Transformer/posembed_input/pos_embedding'


def _zoom_reference(posemb, old, new):
  """The original vit_jax code path, written out: class row kept, grid zoomed with order 1."""
  tok, grid = posemb[:, :1], posemb[0, 1:].reshape(old[0], old[1], -1)
  grid = scipy.ndimage.zoom(grid, (new[0] / old[0], new[1] / old[1], 1), order=1)
  return np.concatenate([tok, grid.reshape(1, new[0] * new[1], -1)], axis=1)


def test_posemb_resize_is_scipy_zoom_from_224_to_384_and_back():
  posemb = np.random.default_rng(0).standard_normal((1, 197, 64)).astype(np.float32)
  up = surgery.resize_posemb(posemb, (24, 24))
  assert up.shape == (1, 577, 64) and up.dtype == np.float32
  np.testing.assert_array_equal(up, _zoom_reference(posemb, (14, 14), (24, 24)))
  np.testing.assert_array_equal(up[:, 0], posemb[:, 0])  # class row kept
  down = surgery.resize_posemb(up, (14, 14))
  assert down.shape == (1, 197, 64)
  np.testing.assert_array_equal(down, _zoom_reference(up, (24, 24), (14, 14)))
  # Corners of the grid are sampled exactly (order-1 zoom aligns the corners).
  np.testing.assert_array_equal(down[0, 1], posemb[0, 1])
  np.testing.assert_array_equal(down[0, -1], posemb[0, -1])


def test_posemb_resize_is_bilinear_with_aligned_corners():
  """An independent implementation: torch's bilinear interpolation with align_corners=True."""
  import torch  # a test requirement (requirements/test.in)

  posemb = np.random.default_rng(1).standard_normal((1, 197, 8)).astype(np.float32)
  grid = torch.from_numpy(posemb[0, 1:].reshape(14, 14, 8).transpose(2, 0, 1)[None].copy())
  for new in ((24, 24), (10, 10), (24, 16)):
    theirs = torch.nn.functional.interpolate(grid, size=new, mode='bilinear', align_corners=True)
    theirs = theirs[0].numpy().transpose(1, 2, 0).reshape(-1, 8)
    ours = surgery.resize_posemb(posemb, new)[0, 1:]
    np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)


def test_posemb_resize_non_square_grids():
  posemb = np.random.default_rng(2).standard_normal((1, 1 + 12 * 20, 8)).astype(np.float32)
  out = surgery.resize_posemb(posemb, (6, 10), old_grid=(12, 20))
  np.testing.assert_array_equal(out, _zoom_reference(posemb, (12, 20), (6, 10)))
  with pytest.raises(checkpoint.CheckpointError, match='pretrained_grid'):
    surgery.resize_posemb(posemb, (6, 10))  # 240 rows: not a square, so the grid must be given


def _in21k_file(tmp_path, random_params, size=32, **overrides):
  """An imagenet21k-style checkpoint of a small ViT: pre_logits and a zero 21843-class head."""
  model = get_model('testing', num_classes=21843, representation_size=16, **{**NARROW, **overrides})
  params = random_params(families.param_shapes(model, size))
  params['head'] = jax.tree.map(np.zeros_like, params['head'])
  checkpoint.save_npz(params, tmp_path / 'in21k.npz')
  return tmp_path / 'in21k.npz', checkpoint.flatten(params)


def _init(model, size):
  images = jnp.zeros((1, size, size, 3))
  return jax.jit(lambda: model.init(jax.random.key(0), images, train=False))()['params']


@pytest.mark.slow
def test_fine_tuning_surgery_follows_the_original(tmp_path, random_params):
  path, ckpt = _in21k_file(tmp_path, random_params)
  model = get_model('testing', num_classes=10, **NARROW)
  init = _init(model, 48)  # 3x3 grid of 16-px patches; the checkpoint's is 2x2
  params = checkpoint.load_pretrained(path, init, get_config('testing'))

  flat, init_flat = checkpoint.flatten(params), checkpoint.flatten(init)
  assert flat.keys() == init_flat.keys()
  assert 'pre_logits/kernel' not in flat  # the drop-head variant
  np.testing.assert_array_equal(flat['head/kernel'], init_flat['head/kernel'])  # fresh head
  assert flat['head/kernel'].shape == (16, 10)
  np.testing.assert_array_equal(flat[POSEMB], _zoom_reference(ckpt[POSEMB], (2, 2), (3, 3)))
  for key in flat.keys() - {POSEMB, 'head/kernel', 'head/bias'}:
    np.testing.assert_array_equal(flat[key], ckpt[key], err_msg=key)
  logits = jax.jit(lambda p: model.apply({'params': p}, jnp.ones((1, 48, 48, 3)), train=False))(
    params
  )
  assert logits.shape == (1, 10)


def test_report_lists_every_decision(tmp_path, random_params):
  path, ckpt = _in21k_file(tmp_path, random_params)
  init = families.param_shapes(get_model('testing', num_classes=10, **NARROW), 48)
  params, report = checkpoint.merge_pretrained(checkpoint.load(path), init, get_config('testing'))
  assert sorted(report.fresh) == ['head/bias', 'head/kernel']
  assert sorted(report.dropped) == [
    'head/bias',
    'head/kernel',
    'pre_logits/bias',
    'pre_logits/kernel',
  ]
  assert report.resized == [(POSEMB, (1, 5, 16), (1, 10, 16))]
  assert len(report.loaded) == len(ckpt) - 4 and not report.missing and not report.unexpected
  # Abstract init (jax.eval_shape): the fresh head is what the model initialises, zeros.
  np.testing.assert_array_equal(params['head']['kernel'], np.zeros((16, 10), np.float32))
  assert 'resized Transformer/posembed_input/pos_embedding: (1, 5, 16) -> (1, 10, 16)' in str(
    report
  )


def test_head_bias_init_for_an_abstract_init(tmp_path, random_params):
  path, _ = _in21k_file(tmp_path, random_params)
  config = get_config('testing')
  config.head_bias_init = -10.0
  init = families.param_shapes(
    get_model('testing', num_classes=4, head_bias_init=-10.0, **NARROW), 32
  )
  params, _ = checkpoint.merge_pretrained(checkpoint.load(path), init, config)
  np.testing.assert_array_equal(params['head']['bias'], np.full(4, -10.0, np.float32))


def test_keep_head_and_representation_layer(tmp_path, random_params):
  path, ckpt = _in21k_file(tmp_path, random_params)
  model = get_model('testing', num_classes=21843, representation_size=16, **NARROW)
  params, report = checkpoint.merge_pretrained(
    checkpoint.load(path), families.param_shapes(model, 32), get_config('testing'), keep_head=True
  )
  flat = checkpoint.flatten(params)
  assert flat.keys() == ckpt.keys() and not report.fresh and not report.dropped
  for key in flat:
    np.testing.assert_array_equal(flat[key], ckpt[key])


def _misfit(path, init, config=None, **kw) -> str:
  with pytest.raises(checkpoint.CheckpointError) as e:
    checkpoint.merge_pretrained(
      checkpoint.load(path), init, config or get_config('testing'), source='ckpt.npz', **kw
    )
  assert '\n' not in str(e.value)
  return str(e.value)


def test_keep_head_with_another_class_count_fails(tmp_path, random_params):
  path, _ = _in21k_file(tmp_path, random_params)
  init = families.param_shapes(get_model('testing', num_classes=10, **NARROW), 32)
  message = _misfit(path, init, keep_head=True)
  assert 'head/kernel (16, 21843)' in message and "model's (16, 10)" in message
  assert 'keep_head=False' in message


def test_missing_representation_layer_names_the_fix(tmp_path, random_params):
  model = get_model('testing', num_classes=3, **NARROW)
  checkpoint.save_npz(random_params(families.param_shapes(model, 32)), tmp_path / 'c.npz')
  init = families.param_shapes(
    get_model('testing', num_classes=3, representation_size=16, **NARROW), 32
  )
  message = _misfit(tmp_path / 'c.npz', init)
  assert 'pre_logits/' in message and 'representation_size=None' in message


def test_layer_count_mismatch_is_reported_both_ways(tmp_path, random_params):
  path, _ = _in21k_file(tmp_path, random_params)
  fewer = families.param_shapes(
    get_model(
      'testing',
      num_classes=3,
      transformer={'num_layers': 2, 'num_heads': 2, 'mlp_dim': 32},
      hidden_size=16,
    ),
    32,
  )
  message = _misfit(path, fewer)
  assert 'no place in the model' in message and 'encoderblock_2' in message
  assert 'strict=False' in message
  more = families.param_shapes(
    get_model(
      'testing',
      num_classes=3,
      transformer={'num_layers': 4, 'num_heads': 2, 'mlp_dim': 32},
      hidden_size=16,
    ),
    32,
  )
  message = _misfit(path, more)
  assert 'lacks 16 model parameter(s)' in message and 'encoderblock_3' in message

  params, report = checkpoint.merge_pretrained(
    checkpoint.load(path), fewer, get_config('testing'), strict=False
  )
  assert len(report.unexpected) == 16 and 'encoderblock_2' not in params['Transformer']


def test_wrong_model_names_the_checkpoints_model(tmp_path, random_params):
  # A checkpoint of the registered 'testing' architecture read into ViT-Ti/16.
  model = get_model('testing', num_classes=5)
  checkpoint.save_npz(random_params(families.param_shapes(model, 32)), tmp_path / 't.npz')
  init = families.param_shapes(get_model('ViT-Ti_16', num_classes=5), 224)
  message = _misfit(tmp_path / 't.npz', init, get_config('ViT-Ti_16'))
  assert 'embedding/kernel has shape (16, 16, 3, 10) in the checkpoint but (16, 16, 3, 192)' in (
    message
  )
  assert 'the checkpoint is a testing: choose that model' in message


def test_dont_load_keeps_initial_values(tmp_path, random_params):
  path, ckpt = _in21k_file(tmp_path, random_params)
  model = get_model('testing', num_classes=10, **NARROW)
  init = random_params(families.param_shapes(model, 32), seed=5)
  params, report = checkpoint.merge_pretrained(
    checkpoint.load(path), init, get_config('testing'), dont_load=[r'encoder_norm/']
  )
  np.testing.assert_array_equal(
    params['Transformer']['encoder_norm']['scale'], init['Transformer']['encoder_norm']['scale']
  )
  assert 'Transformer/encoder_norm/scale' in report.fresh
  np.testing.assert_array_equal(params['cls'], ckpt['cls'])


def test_token_unpooled_keeps_its_class_row(tmp_path, random_params):
  # The original treated only 'token' as having a class row; ours follows the tree.
  path, ckpt = _in21k_file(tmp_path, random_params)
  init = families.param_shapes(
    get_model('testing', num_classes=None, classifier='token_unpooled', **NARROW), 48
  )
  config = get_config('testing')
  config.classifier = 'token_unpooled'
  params, _ = checkpoint.merge_pretrained(checkpoint.load(path), init, config)
  got = params['Transformer']['posembed_input']['pos_embedding']
  np.testing.assert_array_equal(got, _zoom_reference(ckpt[POSEMB], (2, 2), (3, 3)))


def test_hybrid_posemb_on_a_non_square_image(tmp_path, random_params):
  overrides = {'num_classes': 3, **NARROW}
  model = get_model('R+ViT-Ti_16', **overrides)  # /32: 64 px -> 2x2 tokens
  ckpt = random_params(families.param_shapes(model, 64))
  checkpoint.save_npz(ckpt, tmp_path / 'r.npz')
  config = get_config('R+ViT-Ti_16')
  init = families.param_shapes(model, (96, 160))  # 3x5 tokens
  params, _ = checkpoint.merge_pretrained(
    checkpoint.load(tmp_path / 'r.npz'), init, config, keep_head=True, image_size=(96, 160)
  )
  expected = _zoom_reference(ckpt['Transformer']['posembed_input']['pos_embedding'], (2, 2), (3, 5))
  np.testing.assert_array_equal(params['Transformer']['posembed_input']['pos_embedding'], expected)
  with pytest.raises(checkpoint.CheckpointError, match='image_size=\\(height, width\\)'):
    checkpoint.merge_pretrained(checkpoint.load(tmp_path / 'r.npz'), init, config, keep_head=True)


def test_linear_resize_matrix_is_jax_image_resize_without_antialias():
  for old, new in ((8, 16), (16, 8), (5, 12), (12, 7)):
    basis = np.eye(old, dtype=np.float64)
    theirs = np.stack(
      [np.asarray(jax.image.resize(b, (new,), 'linear', antialias=False)) for b in basis], axis=1
    )
    np.testing.assert_allclose(surgery.linear_resize_matrix(old, new), theirs, atol=1e-6)


def test_flexivit_patch_resize_keeps_embeddings_of_resized_patches():
  """big_vision's property: embedding a bilinearly upsampled patch with the resampled kernel
  gives the embedding of the original patch."""
  rng = np.random.default_rng(0)
  for old, new in (((8, 8), (16, 16)), ((8, 6), (15, 9))):
    kernel = rng.standard_normal((*old, 3, 5))
    patches = rng.standard_normal((10, *old, 3))
    resized = np.asarray(
      jax.image.resize(patches, (10, *new, 3), 'linear', antialias=False), np.float64
    )
    new_kernel = surgery.resample_patch_embedding(kernel, new)
    assert new_kernel.shape == (*new, 3, 5)
    np.testing.assert_allclose(
      np.einsum('nhwc,hwcd->nd', resized, new_kernel),
      np.einsum('nhwc,hwcd->nd', patches, kernel),
      atol=1e-4,
    )


def test_patch_size_change_needs_resize_patch_embedding(tmp_path, random_params):
  model = get_model('testing', num_classes=3, patches={'size': (16, 16)}, **NARROW)
  checkpoint.save_npz(random_params(families.param_shapes(model, 32)), tmp_path / 'p16.npz')
  init = families.param_shapes(
    get_model('testing', num_classes=3, patches={'size': (8, 8)}, **NARROW), 16
  )
  message = _misfit(tmp_path / 'p16.npz', init, keep_head=True)
  assert '(16, 16, 3, 16)' in message and '(8, 8, 3, 16)' in message
  assert 'resize_patch_embedding=True' in message
  params, report = checkpoint.merge_pretrained(
    checkpoint.load(tmp_path / 'p16.npz'),
    init,
    get_config('testing'),
    keep_head=True,
    resize_patch_embedding=True,
  )
  assert params['embedding']['kernel'].shape == (8, 8, 3, 16)
  assert ('embedding/kernel', (16, 16, 3, 16), (8, 8, 3, 16)) in report.resized


def test_load_pretrained_reads_a_bare_safetensors_with_the_models_heads(tmp_path, random_params):
  model = get_model('testing', num_classes=3, **NARROW)
  params = random_params(families.param_shapes(model, 32))
  checkpoint.export_hf(params, None, tmp_path / 'hf')
  (tmp_path / 'hf' / 'config.json').unlink()  # the heads now come from model_config
  config = get_config('testing')
  config.transformer.update(NARROW['transformer'])
  loaded = checkpoint.load_pretrained(
    tmp_path / 'hf' / 'model.safetensors', families.param_shapes(model, 32), config, keep_head=True
  )
  for key, value in checkpoint.flatten(params).items():
    np.testing.assert_array_equal(checkpoint.flatten(loaded)[key], value, err_msg=key)
