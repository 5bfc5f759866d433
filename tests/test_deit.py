"""DeiT's distilled ViT: the names and shapes agreed for checkpoints, logits of both heads
against the DeiT equations in numpy, the fine-tuning surgery with two prefix tokens,
training through the trainer, and predict's mean of the two heads."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import scipy.ndimage
from conftest import SMALL, assert_run_reads_back
from numpy_models import deit as numpy_deit
from numpy_models import gelu_exact

import vit_jax
from configs import digits as digits_config
from vit_jax import checkpoint, families, train
from vit_jax.checkpoint import tree
from vit_jax.inference import model as inference_model
from vit_jax.inference import predict
from vit_jax.models import get_config, get_model, model_from_config
from vit_jax.tasks import distillation_losses as losses

POSEMB = 'Transformer/posembed_input/pos_embedding'


def _config(**overrides):
  config = get_config('DeiT-B_16-distilled')
  config.update({**SMALL, **overrides})
  return config


def _small(classes=7, **overrides):
  return model_from_config(_config(**overrides), num_classes=classes)


def _params(random_params, model, size=32, seed=0):
  return random_params(families.param_shapes(model, size), seed=seed, scale=0.2)


def _images(n=2, size=32, seed=1):
  return np.random.default_rng(seed).uniform(-1, 1, (n, size, size, 3)).astype(np.float32)


def _numpy(params, images):
  flat = {k: np.asarray(v, np.float64) for k, v in tree.flatten(params).items()}
  return numpy_deit(flat, images.astype(np.float64))


def test_names_and_shapes_agreed_for_checkpoints():
  shapes = tree.flatten(families.param_shapes(get_model('DeiT-B_16-distilled', num_classes=1000)))
  assert shapes['cls'].shape == shapes['dist_token'].shape == (1, 1, 768)
  assert shapes[POSEMB].shape == (1, 2 + 196, 768)
  assert shapes['head_dist/kernel'].shape == shapes['head/kernel'].shape == (768, 1000)
  assert shapes['head_dist/bias'].shape == (1000,)
  assert tree.match_registry(tree.infer_config(shapes)) == 'DeiT-B_16-distilled'


def test_both_heads_and_their_mean_equal_the_deit_equations(random_params):
  model = _small()
  params, images = _params(random_params, model), _images()
  want_cls, want_dist = _numpy(params, images)
  assert np.abs(want_cls - want_dist).max() > 0.5  # two different heads
  got_cls, got_dist = model.apply({'params': params}, images, train=False, both_heads=True)
  np.testing.assert_allclose(got_cls, want_cls, atol=1e-5, rtol=0)
  np.testing.assert_allclose(got_dist, want_dist, atol=1e-5, rtol=0)
  # Inference (and training without both_heads) averages the two heads, as DeiT does.
  mean = model.apply({'params': params}, images, train=False)
  np.testing.assert_allclose(mean, (want_cls + want_dist) / 2, atol=1e-5, rtol=0)


def test_exact_gelu_option_equals_the_deit_equations_with_erf(random_params):
  """DeiT was trained with PyTorch's exact GELU: `gelu_approximate=False` computes it."""
  model = _small(gelu_approximate=False)
  params, images = random_params(families.param_shapes(model, 32), scale=0.5), _images()
  flat = {k: np.asarray(v, np.float64) for k, v in tree.flatten(params).items()}
  want = numpy_deit(flat, images.astype(np.float64), gelu=gelu_exact)
  assert np.abs(want[0] - _numpy(params, images)[0]).max() > 1e-4  # 10x the tolerance
  got = model.apply({'params': params}, images, train=False, both_heads=True)
  for g, w in zip(got, want, strict=True):
    np.testing.assert_allclose(g, w, atol=1e-5, rtol=0)


def test_without_a_head_the_features_are_the_mean_of_both_tokens(random_params):
  model = _small()
  params, images = _params(random_params, model), _images()
  headless = {k: v for k, v in params.items() if k not in ('head', 'head_dist')}
  features = np.asarray(
    model.clone(num_classes=None).apply({'params': headless}, images, train=False)
  )
  assert features.shape == (2, 32)
  # The heads are linear: head(mean features) + bias_mean = mean of both heads only when the
  # two heads are the same; so check the tokens through two identical heads.
  same = {**params, 'head_dist': params['head']}
  logits = np.asarray(model.apply({'params': same}, images, train=False))
  np.testing.assert_allclose(
    logits, features @ params['head']['kernel'] + params['head']['bias'], atol=1e-5
  )


def test_options_that_do_not_fit_are_refused():
  images = jnp.zeros((1, 32, 32, 3))
  with pytest.raises(ValueError, match="distilled=True needs classifier='token'"):
    _small(classifier='gap').init(jax.random.key(0), images, train=False)
  with pytest.raises(ValueError, match='both_heads=True needs a distilled model'):
    get_model('testing', num_classes=3).init(
      jax.random.key(0), images, train=False, both_heads=True
    )


def test_distillation_gradients_reach_both_heads_and_tokens(random_params):
  model = _small(classes=5)
  params, images = _params(random_params, model), _images()
  targets = jax.nn.one_hot(jnp.array([1, 3]), 5)
  teacher = jnp.array([[0.0, 0, 0, 0, 2], [3, 0, 0, 0, 0]])

  def loss(p):
    cls, dist = model.apply({'params': p}, images, train=True, both_heads=True)
    return losses.hard_distillation_loss(cls, dist, targets, teacher).mean()

  grads = jax.jit(jax.grad(loss))(params)
  for name in ('cls', 'dist_token', 'head', 'head_dist'):
    assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grads[name])) > 1e-4, name


def test_save_and_load_round_trip_exactly(tmp_path, random_params):
  params = _params(random_params, _small())
  checkpoint.save_npz(params, tmp_path / 'deit.npz')
  loaded = tree.flatten(checkpoint.load(tmp_path / 'deit.npz'))
  flat = tree.flatten(params)
  assert loaded.keys() == flat.keys()
  for key in flat:
    np.testing.assert_array_equal(loaded[key], flat[key], err_msg=key)
  config = tree.infer_config(loaded)
  assert config.distilled and config.classifier == 'token'
  assert tree.native_resolution(loaded, config) == 32  # 2 prefix rows + a 4x4 grid


def test_fine_tuning_at_another_resolution_keeps_both_prefix_rows(tmp_path, random_params):
  params = _params(random_params, _small())
  checkpoint.save_npz(params, tmp_path / 'deit.npz')
  model = _small(classes=3)
  fitted, report = checkpoint.merge_pretrained(
    checkpoint.load(tmp_path / 'deit.npz'), families.param_shapes(model, 64), {}
  )
  old = np.asarray(params['Transformer']['posembed_input']['pos_embedding'])
  grid = scipy.ndimage.zoom(old[0, 2:].reshape(4, 4, 32), (2, 2, 1), order=1)
  want = np.concatenate([old[:, :2], grid.reshape(1, 64, 32)], axis=1)
  np.testing.assert_allclose(fitted['Transformer']['posembed_input']['pos_embedding'], want)
  assert sorted(report.fresh) == ['head/bias', 'head/kernel', 'head_dist/bias', 'head_dist/kernel']
  np.testing.assert_array_equal(fitted['head_dist']['kernel'], 0.0)
  np.testing.assert_array_equal(fitted['dist_token'], params['dist_token'])


@pytest.mark.slow
def test_a_vit_checkpoint_lacks_the_distillation_token(tmp_path, random_params):
  vit = get_model('DeiT-B_16-distilled', num_classes=7, distilled=False, **SMALL)
  params = _params(random_params, vit)
  checkpoint.save_npz(params, tmp_path / 'vit.npz')
  model = _small(classes=7)
  init = model.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)), train=False)['params']
  with pytest.raises(checkpoint.CheckpointError, match=r'lacks 1 model parameter.*dist_token'):
    checkpoint.load_pretrained(tmp_path / 'vit.npz', init, _config())
  fitted = checkpoint.load_pretrained(tmp_path / 'vit.npz', init, _config(), strict=False)
  posemb = fitted['Transformer']['posembed_input']['pos_embedding']
  old = np.asarray(params['Transformer']['posembed_input']['pos_embedding'])
  np.testing.assert_array_equal(posemb[:, :1], old[:, :1])  # the class row
  np.testing.assert_array_equal(
    posemb[:, 1:2], init['Transformer']['posembed_input']['pos_embedding'][:, 1:2]
  )
  np.testing.assert_array_equal(posemb[:, 2:], old[:, 1:])  # the grid
  np.testing.assert_array_equal(fitted['dist_token'], init['dist_token'])


@pytest.mark.slow
def test_trains_through_the_trainer_with_the_mean_of_both_heads(tmp_path):
  """The trainer's softmax cross-entropy on the averaged logits (DeiT without a teacher)."""
  config = ml_collections.ConfigDict(digits_config.get_config().to_dict())
  config.model.update({'classifier': 'token', 'distilled': True, 'hidden_size': 32})
  config.model.transformer.update({'num_layers': 1, 'mlp_dim': 64, 'num_heads': 2})
  config.update({'total_steps': 4, 'warmup_steps': 1, 'eval_every': 4, 'batch': 32})
  result = train.train_and_evaluate(config, str(tmp_path / 'run'), devices=jax.devices()[:1])
  assert result['status'] == 'done' and np.isfinite(result['loss_test'])
  params = jax.device_get(result['params'])
  assert np.abs(params['head_dist']['kernel']).max() > 0  # trained from its zero init
  assert_run_reads_back(tmp_path / 'run', result['params'], tmp_path)


def test_predict_gives_the_mean_of_both_heads(tmp_path, random_params):
  params = _params(random_params, _small(classes=5))
  checkpoint.save_npz(params, tmp_path / 'deit.npz')
  loaded = vit_jax.load(tmp_path / 'deit.npz', batch_size=3)
  assert (loaded.resolution, loaded.num_classes) == (32, 5)
  assert 'distillation token' in loaded.name  # unregistered size: described
  images = _images(3, seed=5)
  features, got = loaded.features_and_logits(images)
  assert features.shape == (3, 2 * 32)  # the class and distillation tokens side by side
  want_cls, want_dist = _numpy(params, images)
  head = params['head']
  np.testing.assert_allclose(features[:, :32] @ head['kernel'] + head['bias'], want_cls, atol=1e-5)
  np.testing.assert_allclose(got, (want_cls + want_dist) / 2, atol=1e-5, rtol=0)
  np.testing.assert_array_equal(loaded.logits(images), got)
  # --features_block: the same features from the pass that also gives the block's tokens.
  both, grid = inference_model.run_padded(predict.block_program(loaded, 0), images, 3)
  np.testing.assert_allclose(both, features, atol=1e-6, rtol=0)
  assert grid.shape == (3, 4, 4, 32)
