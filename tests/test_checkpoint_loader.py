"""checkpoint.fit: any checkpoint into a runnable model, for predict, convert and fine-tuning."""

import chex
import jax
import numpy as np
import pytest
import scipy.ndimage

from vit_jax import checkpoint, families
from vit_jax.models import get_config, get_model, model_from_config

POSEMB = 'Transformer/posembed_input/pos_embedding'


@pytest.fixture
def testing_npz(tmp_path, random_params):
  """The registered 'testing' architecture (hidden 10, patch 16, 7 classes) at 32 px."""
  params = random_params(families.param_shapes(get_model('testing', num_classes=7), 32))
  checkpoint.save_npz(params, tmp_path / 'testing.npz')
  return tmp_path / 'testing.npz', params


def _images(resolution, n=2):
  return np.random.default_rng(0).uniform(-1, 1, (n, resolution, resolution, 3)).astype(np.float32)


def test_by_default_the_model_the_weights_describe(testing_npz):
  path, params = testing_npz
  fitted = checkpoint.fit(path)
  assert (fitted.name, fitted.resolution, fitted.config.num_classes) == ('testing', 32, 7)
  assert (fitted.grid, fitted.patch_pixels) == ((2, 2), 16)
  assert (fitted.found.arrays, fitted.found.parameters) == (24, 8547)
  chex.assert_trees_all_equal(fitted.params, params)
  # The built model is the registry's: its logits are those of get_model on the same weights.
  ours = fitted.model().apply({'params': fitted.params}, _images(32), train=False)
  theirs = get_model('testing', num_classes=7).apply({'params': params}, _images(32), train=False)
  chex.assert_trees_all_close(ours, theirs, atol=0, rtol=0)


def test_another_head_and_resolution(testing_npz):
  path, params = testing_npz
  fitted = checkpoint.fit(path, 'testing', num_classes=3, resolution=64)
  assert fitted.config.num_classes == 3 and fitted.grid == (4, 4)
  chex.assert_trees_all_equal(
    fitted.params['head'], {'kernel': np.zeros((10, 3)), 'bias': np.zeros(3)}
  )
  old = params['Transformer']['posembed_input']['pos_embedding']
  grid = scipy.ndimage.zoom(old[0, 1:].reshape(2, 2, 10), (2, 2, 1), order=1)
  expected = np.concatenate([old[:, :1], grid.reshape(1, 16, 10)], axis=1)
  np.testing.assert_array_equal(
    fitted.params['Transformer']['posembed_input']['pos_embedding'], expected
  )
  chex.assert_trees_all_equal(
    fitted.params['Transformer']['encoderblock_0'], params['Transformer']['encoderblock_0']
  )
  assert fitted.report.resized == [(POSEMB, (1, 5, 10), (1, 17, 10))]
  assert fitted.report.dropped == fitted.report.fresh == ['head/kernel', 'head/bias']
  headless = checkpoint.fit(path, num_classes=0)
  assert 'head' not in headless.params and headless.config.num_classes is None
  assert headless.model().apply({'params': headless.params}, _images(32), train=False).shape == (
    2,
    10,
  )


def test_a_named_model_is_checked_against_the_checkpoint(testing_npz):
  path, _ = testing_npz
  with pytest.raises(
    checkpoint.CheckpointError,
    match=r'--model ViT-Ti_16 does not fit the checkpoint, which holds testing \(hidden_size 10,',
  ):
    checkpoint.fit(path, 'ViT-Ti_16')
  with pytest.raises(checkpoint.CheckpointError, match="Unknown model 'ViT-B16'"):
    checkpoint.fit(path, 'ViT-B16')
  with pytest.raises(
    checkpoint.CheckpointError,
    match='--resolution 40 is not a positive multiple of the patch stride 16',
  ):
    checkpoint.fit(path, resolution=40)


@pytest.mark.slow
def test_fine_tuning_fits_an_initialised_tree_of_its_config(tmp_path, random_params):
  # An imagenet21k-like file (pre_logits, 21843 classes) into a fine-tuning model without a
  # representation layer, 4 classes, head bias -10, at 48 px: the trainer's pretrained path.
  upstream = get_model('testing', num_classes=21843, representation_size=10)
  source = random_params(families.param_shapes(upstream, 32))
  checkpoint.save_npz(source, tmp_path / 'in21k.npz')
  config = get_config('testing')
  config.head_bias_init = -10.0
  model = model_from_config(config, num_classes=4)
  init = model.init(jax.random.key(0), np.zeros((1, 48, 48, 3), np.float32), train=False)['params']
  fitted = checkpoint.fit(tmp_path / 'in21k.npz', config, init_params=init, keep_head=False)
  assert fitted.config.num_classes == 4 and fitted.resolution == 48
  assert 'pre_logits' not in fitted.params
  chex.assert_trees_all_equal(
    fitted.params['head'], {'kernel': np.zeros((10, 4)), 'bias': np.full(4, -10.0)}
  )
  chex.assert_trees_all_equal(fitted.params['embedding'], source['embedding'])
  chex.assert_trees_all_equal_shapes_and_dtypes(fitted.params, init)
  # The shapes alone (jax.eval_shape) give the same tree: the fresh head is the model's init.
  abstract = checkpoint.fit(tmp_path / 'in21k.npz', config, 4, 48, keep_head=False)
  chex.assert_trees_all_equal(abstract.params, fitted.params)
  # load_pretrained, the original's interface, is this path.
  chex.assert_trees_all_equal(
    checkpoint.load_pretrained(tmp_path / 'in21k.npz', init, config), fitted.params
  )


def test_a_hybrid_resolution_counts_the_stem(tmp_path, random_params):
  overrides = {'hidden_size': 16, 'transformer': {'num_layers': 1, 'num_heads': 2, 'mlp_dim': 32}}
  model = get_model('R+ViT-Ti_16', num_classes=3, **overrides)  # /32: 64 px -> 2x2 tokens
  checkpoint.save_npz(random_params(families.param_shapes(model, 64)), tmp_path / 'r.npz')
  fitted = checkpoint.fit(tmp_path / 'r.npz')
  assert (fitted.name, fitted.resolution, fitted.patch_pixels, fitted.grid) == (
    None,
    64,
    32,
    (2, 2),
  )
  assert fitted.found.config.resnet.num_layers == ()
  bigger = checkpoint.fit(tmp_path / 'r.npz', resolution=96)
  assert bigger.grid == (3, 3) and bigger.report.resized[0][2] == (1, 10, 16)
