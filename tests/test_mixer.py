"""MLP-Mixer: logits equal the Mixer equations written in numpy; the released .npz layout
(written here by hand) loads exactly, fits, saves back bit for bit, predicts, trains through
the trainer and runs in the benchmark."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import tensorflow_datasets as tfds
from conftest import assert_run_reads_back
from numpy_models import mixer as numpy_mixer

import vit_jax
from configs import digits as digits_config
from configs import vit as vit_config
from vit_jax import benchmark, checkpoint, families, train
from vit_jax.checkpoint import tree
from vit_jax.cli import convert
from vit_jax.inference import model as inference_model
from vit_jax.inference import predict
from vit_jax.models import get_config, get_model, model_from_config

# A small Mixer: 64 px images in 16x16 patches, S = 16 patches.
SMALL = {'hidden_dim': 32, 'num_blocks': 2, 'tokens_mlp_dim': 8, 'channels_mlp_dim': 64}
PATCH, SIZE, S = 16, 64, 16


def released_layout(classes: int, seed: int = 0, hidden: int = 32, blocks: int = 2) -> dict:
  """A flat dict in the released Mixer layout (`gs://mixer_models/...`), every key and shape
  spelled out here from the architecture, random values (N(0, 0.1); N(1, 0.1) for the
  LayerNorm scales; the head included)."""
  tokens, channels = SMALL['tokens_mlp_dim'], SMALL['channels_mlp_dim']
  shapes = {'stem/kernel': (PATCH, PATCH, 3, hidden), 'stem/bias': (hidden,)}
  for i in range(blocks):
    b = f'MixerBlock_{i}'
    for norm in ('LayerNorm_0', 'LayerNorm_1'):
      shapes |= {f'{b}/{norm}/scale': (hidden,), f'{b}/{norm}/bias': (hidden,)}
    for mlp, width, inner in (('token_mixing', S, tokens), ('channel_mixing', hidden, channels)):
      shapes |= {
        f'{b}/{mlp}/Dense_0/kernel': (width, inner),
        f'{b}/{mlp}/Dense_0/bias': (inner,),
        f'{b}/{mlp}/Dense_1/kernel': (inner, width),
        f'{b}/{mlp}/Dense_1/bias': (width,),
      }
  shapes |= {'pre_head_layer_norm/scale': (hidden,), 'pre_head_layer_norm/bias': (hidden,)}
  shapes |= {'head/kernel': (hidden, classes), 'head/bias': (classes,)}
  rng = np.random.default_rng(seed)
  one = lambda k: float(k.endswith('/scale'))  # LayerNorm scales around 1
  return {k: (one(k) + 0.1 * rng.standard_normal(s)).astype(np.float32) for k, s in shapes.items()}


def _images(n=2, seed=1):
  return np.random.default_rng(seed).uniform(-1, 1, (n, SIZE, SIZE, 3)).astype(np.float32)


def _small_config():
  config = get_config('Mixer-B_16')
  config.update(SMALL)
  return config


def _small_model(classes):
  return model_from_config(_small_config(), num_classes=classes)


def _apply(model, params, images, train=False):
  """The logits, compiled (cheaper here than op by op)."""
  apply = jax.jit(lambda p, x: model.apply({'params': p}, x, train=train))
  return np.asarray(apply(params, images))


def test_logits_equal_the_mixer_equations_in_numpy():
  flat = released_layout(7)
  images = _images()
  want = numpy_mixer({k: v.astype(np.float64) for k, v in flat.items()}, images.astype(np.float64))
  got = _apply(_small_model(7), tree.unflatten(flat), images)
  assert np.abs(want).max() > 0.3 and np.abs(want[0] - want[1]).max() > 0.1  # worth comparing
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_tree_has_the_released_names_and_shapes():
  shapes = families.param_shapes(get_model('Mixer-B_16', num_classes=1000), 224)
  flat = {k: tuple(v.shape) for k, v in tree.flatten(shapes).items()}
  assert len(flat) == 4 + 12 * 12 + 2  # stem, 12 blocks of 12 arrays, norm, head
  assert flat['stem/kernel'] == (16, 16, 3, 768)
  assert flat['MixerBlock_11/LayerNorm_0/scale'] == (768,)
  assert flat['MixerBlock_11/token_mixing/Dense_0/kernel'] == (196, 384)
  assert flat['MixerBlock_11/token_mixing/Dense_1/kernel'] == (384, 196)
  assert flat['MixerBlock_11/channel_mixing/Dense_0/kernel'] == (768, 3072)
  assert flat['MixerBlock_11/LayerNorm_1/bias'] == (768,)
  assert flat['pre_head_layer_norm/scale'] == (768,)
  assert flat['head/kernel'] == (768, 1000)
  config = tree.infer_config(shapes)
  assert tree.match_registry(config) == 'Mixer-B_16' and config.num_classes == 1000


@pytest.mark.slow
def test_head_is_zero_initialised_and_train_changes_nothing():
  model = _small_model(5)
  init = jax.jit(lambda: model.init(jax.random.key(0), jnp.zeros((1, SIZE, SIZE, 3)), train=False))
  np.testing.assert_array_equal(init()['params']['head']['kernel'], 0.0)
  images = _images()
  params = tree.unflatten(released_layout(5))
  np.testing.assert_array_equal(
    _apply(model, params, images, train=True), _apply(model, params, images)
  )


@pytest.mark.parametrize('classes', [21843, 1000], ids=['imagenet21k', 'imagenet1k'])
def test_released_npz_loads_exactly(tmp_path, classes):
  flat = released_layout(classes)
  path = tmp_path / 'Mixer.npz'
  np.savez(path, **flat)
  params, description = checkpoint.read(path)
  assert description == 'npz (Mixer, Linen names)'
  loaded = tree.flatten(params)
  assert loaded.keys() == flat.keys()
  for key, value in flat.items():
    np.testing.assert_array_equal(loaded[key], value, err_msg=key)
  config = tree.infer_config(params)
  assert (config.hidden_dim, config.num_blocks, config.tokens_mlp_dim) == (32, 2, 8)
  assert config.num_classes == classes and tree.match_registry(config) is None  # unregistered
  assert tree.native_resolution(loaded, config) == SIZE


def test_load_pretrained_gives_a_fresh_head_and_every_other_weight(tmp_path):
  flat = released_layout(21843)
  np.savez(tmp_path / 'Mixer.npz', **flat)
  model = _small_model(10)
  init = families.param_shapes(model, SIZE)
  params = checkpoint.load_pretrained(tmp_path / 'Mixer.npz', init, _small_config())
  out = tree.flatten(params)
  np.testing.assert_array_equal(out['head/kernel'], np.zeros((32, 10)))
  for key in flat.keys() - {'head/kernel', 'head/bias'}:
    np.testing.assert_array_equal(out[key], flat[key], err_msg=key)


def test_another_resolution_names_the_token_mixing_mlp(tmp_path):
  np.savez(tmp_path / 'Mixer.npz', **released_layout(1000))
  init = families.param_shapes(_small_model(10), 2 * SIZE)
  with pytest.raises(checkpoint.CheckpointError, match=r'token-mixing MLP is sized for the 16 pat'):
    checkpoint.load_pretrained(tmp_path / 'Mixer.npz', init, _small_config())


def test_save_npz_writes_the_released_layout_bit_for_bit(tmp_path):
  flat = released_layout(1000)
  checkpoint.save_npz(tree.unflatten(flat), tmp_path / 'out.npz')
  with np.load(tmp_path / 'out.npz', allow_pickle=False) as written:
    assert set(written.files) == set(flat)
    for key, value in flat.items():
      assert written[key].dtype == np.float32
      np.testing.assert_array_equal(written[key], value, err_msg=key)


def test_convert_writes_a_mixer_with_a_fresh_head_and_refuses_hugging_face(tmp_path):
  flat = released_layout(21843)
  src = tmp_path / 'Mixer.npz'
  np.savez(src, **flat)
  lines = []
  convert.convert(str(src), str(tmp_path / 'out.npz'), 'npz', num_classes=10, out=lines.append)
  read, wrote = lines[:2]
  described = 'Mixer with hidden_dim 32, 2 blocks, tokens MLP 8, channels MLP 64, patch 16x16'
  assert described in read and 'head 21843 classes, pre_logits no, 64 px' in read
  assert 'npz (Mixer layout)' in wrote and 'at 64 px' in wrote
  out = tree.flatten(checkpoint.load(tmp_path / 'out.npz'))
  assert out['head/kernel'].shape == (32, 10)
  for key in flat.keys() - {'head/kernel', 'head/bias'}:
    np.testing.assert_array_equal(out[key], flat[key], err_msg=key)
  with pytest.raises(checkpoint.CheckpointError, match='MLP-Mixer models have no Hugging Face'):
    convert.convert(str(src), str(tmp_path / 'hf'), 'hf', out=lines.append)
  assert not (tmp_path / 'hf').exists()


def test_predict_infers_the_model_and_resolution(tmp_path):
  flat = released_layout(10)
  np.savez(tmp_path / 'Mixer.npz', **flat)
  loaded = vit_jax.load(tmp_path / 'Mixer.npz')
  assert loaded.resolution == SIZE and loaded.num_classes == 10
  assert loaded.name.startswith('Mixer with hidden_dim 32, 2 blocks')  # unregistered
  images = _images(3, seed=4)
  _, logits = inference_model.run_padded(loaded.features_and_logits, images, 4)
  want = numpy_mixer({k: v.astype(np.float64) for k, v in flat.items()}, images.astype(np.float64))
  np.testing.assert_allclose(logits, want, atol=1e-5)
  with pytest.raises(ValueError, match='has no transformer encoder blocks'):
    predict.feature_block(loaded, 0)  # --features_block: a Mixer has no encoder blocks


@pytest.mark.slow
def test_fine_tunes_through_the_trainer_from_a_released_file(tmp_path):
  """configs/vit.py:mixer_b16,cifar10 (224 px, as the original) with a small Mixer at 64 px,
  from a released-layout file with an imagenet21k head, on mock cifar10."""
  np.savez(tmp_path / 'Mixer-B_16.npz', **released_layout(21843))
  config = ml_collections.ConfigDict(vit_config.get_config('mixer_b16,cifar10').to_dict())
  assert config.pp.crop == 224 and config.model_name == 'Mixer-B_16'
  config.model.update(SMALL)
  config.pretrained_dir = str(tmp_path)
  config.pp.crop = SIZE
  config.batch = config.batch_eval = 8
  config.accum_steps = 2
  config.total_steps, config.warmup_steps, config.eval_every = 3, 1, 3
  with tfds.testing.mock_data(num_examples=16):
    result = train.train_and_evaluate(config, str(tmp_path / 'run'), devices=jax.devices()[:2])
  assert result['status'] == 'done' and result['num_test'] == 16
  params = tree.flatten(jax.device_get(result['params']))
  assert params['head/kernel'].shape == (32, 10)
  start = released_layout(21843)['MixerBlock_0/token_mixing/Dense_0/kernel']
  moved = np.abs(params['MixerBlock_0/token_mixing/Dense_0/kernel'] - start).max()
  assert 0 < moved < 0.1  # fine-tuned from the file, not from scratch


@pytest.mark.slow
def test_digits_mixer_learns_from_scratch(tmp_path):
  """configs/digits.py:mixer, shortened to 250 steps (the full 3,000 reach 97-98%)."""
  config = ml_collections.ConfigDict(digits_config.get_config('mixer').to_dict())
  config.update({'total_steps': 250, 'eval_every': 250, 'checkpoint_every': 250})
  result = train.train_and_evaluate(config, str(tmp_path / 'run'), devices=jax.devices()[:1])
  assert result['accuracy_test'] > 0.9, result['accuracy_test']  # measured: 96.7%
  assert_run_reads_back(tmp_path / 'run', result['params'], tmp_path)


@pytest.mark.slow
def test_benchmark_runs_a_mixer_and_counts_its_flops():
  result = benchmark.run_benchmark(
    'Mixer-B_16',
    batch=2,
    resolution=64,
    dtypes=('float32', 'bfloat16'),
    train=True,
    num_classes=10,
    rounds=1,
    steps=1,
    check_batches=1,
    probe_sizes=(256,),
    model_overrides={'num_blocks': 2},
  )
  rows = {(r['mode'], r['dtype']): r for r in result['rows']}
  assert set(rows) == {(m, d) for m in ('inference', 'train') for d in ('float32', 'bfloat16')}
  # Per block: token MLP 2x(S x D_S x C) and channel MLP 2x(S x C x D_C) multiply-adds.
  s, c = 16, 768
  per_block = 2 * 2 * s * c * (384 + 3072)
  analytic = 2 * s * 16 * 16 * 3 * c + 2 * per_block + 2 * c * 10
  assert result['analytic_forward_flops_per_image'] == analytic
  xla = rows[('inference', 'float32')]['flops_per_image']
  assert 0.98 < analytic / xla <= 1.0  # XLA adds the elementwise work
  agreement = result['agreement']['bfloat16/xla/remat=none']
  assert 0 < agreement['max_abs_logit_error'] < 0.05 * agreement['max_abs_logit']


def test_attention_options_are_refused_in_one_line():
  with pytest.raises(TypeError, match='MlpMixer has no field attention_impl'):
    get_model('Mixer-B_16', attention_impl='fused')
