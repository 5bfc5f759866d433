"""The benchmark runs and counts right; the fast paths (bfloat16, remat, fused) keep the numbers.

Timings are never asserted: they depend on the machine and its load.
"""

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import benchmark
from vit_jax.models import get_model, stats, vit

TINY = {'transformer': {'num_layers': 2}}  # ViT-Ti_16 with 2 blocks: compiles in seconds


@pytest.fixture(scope='module')
def tiny_run(tmp_path_factory):
  result = benchmark.run_benchmark(
    'ViT-Ti_16',
    batch=2,
    resolution=64,
    dtypes=('float32', 'bfloat16'),
    remats=('none', 'full'),
    train=True,
    num_classes=10,
    rounds=1,
    steps=1,
    check_batches=1,
    probe_sizes=(256,),
    model_overrides=TINY,
  )
  path = tmp_path_factory.mktemp('bench') / 'out.json'
  benchmark.write_json(result, str(path))
  return result, path


def _rows(result, mode):
  return {(r['dtype'], r['remat']): r for r in result['rows'] if r['mode'] == mode}


def test_tiny_run_measures_every_variant(tiny_run):
  result, _ = tiny_run
  # remat changes no inference program, so inference is measured once per dtype.
  assert set(_rows(result, 'inference')) == {('float32', 'none'), ('bfloat16', 'none')}
  assert set(_rows(result, 'train')) == {
    (d, r) for d in ('float32', 'bfloat16') for r in ('none', 'full')
  }
  for row in result['rows']:
    assert row['img_per_s'] > 0 and math.isfinite(row['img_per_s'])
    assert row['compile_s'] > 0
    assert row['xla_memory_bytes'] > 0
    assert row['mfu'] > 0 and row['achieved_tflops'] > 0
  assert set(result['matmul_probe_tflops']) == {'float32', 'bfloat16'}


def test_forward_flops_match_the_analytic_formula(tiny_run):
  result, _ = tiny_run
  config = benchmark.model_config('ViT-Ti_16', TINY)
  analytic = stats.forward_flops(config, 64, 10)
  assert result['analytic_forward_flops_per_image'] == analytic
  xla = _rows(result, 'inference')[('float32', 'none')]['flops_per_image']
  # XLA also counts the elementwise work (norms, softmax, GELU) the formula leaves out.
  assert 0.98 < analytic / xla <= 1.0


def test_training_flops_are_three_forwards_and_remat_recomputes(tiny_run):
  result, _ = tiny_run
  forward = _rows(result, 'inference')[('float32', 'none')]['flops_per_image']
  train = _rows(result, 'train')
  plain, remat = train[('float32', 'none')], train[('float32', 'full')]
  # Backward = 2 forwards, less the input gradient of the patch embedding.
  assert 2.85 < plain['flops_per_image'] / forward < 3.0
  # Full remat runs every block's forward again; MFU counts the model FLOPs only.
  assert 1.15 < remat['flops_per_image'] / plain['flops_per_image'] < 1.35
  assert remat['model_flops_per_image'] == plain['flops_per_image']


def test_bfloat16_agreement_is_reported(tiny_run):
  result, _ = tiny_run
  a = result['agreement']['bfloat16/xla/remat=none']
  assert a['reference'] == 'float32/xla/remat=none'
  assert a['images'] == 2
  assert 0 < a['max_abs_logit_error'] < 0.05 * a['max_abs_logit']


def test_json_and_table(tiny_run):
  result, path = tiny_run
  loaded = json.loads(path.read_text())
  assert loaded['rows'][0]['img_per_s'] == result['rows'][0]['img_per_s']
  assert not list(path.parent.glob('.benchmark.*'))  # no temporary left behind
  table = benchmark.format_table(result)
  assert table.count('\n| float32/xla/remat=') == 3  # 1 inference + 2 train rows
  assert 'matmul probe' in table


def _train_memory(config, variant, batch=16, resolution=128):
  images = jnp.zeros((batch, resolution, resolution, 3))
  labels = jnp.zeros((batch,), jnp.int32)
  params = benchmark.init_params(config, 10, resolution)
  if variant.layers == 'scan':
    params = vit.stack_encoder_blocks(params)
  model = benchmark._model(config, 10, variant)
  *_, facts = benchmark._train(model, params, images, labels)
  return facts['xla_memory_bytes']


def test_remat_inside_scan_cuts_training_memory():
  # Activations dominate here (65 tokens x 6 blocks x batch 16 against 2M parameters).
  config = benchmark.model_config('ViT-Ti_16', {'transformer': {'num_layers': 6}})
  plain = _train_memory(config, benchmark.Variant())
  remat = _train_memory(config, benchmark.Variant(remat='full', layers='scan'))
  assert remat < 0.6 * plain


def test_bad_flags_name_the_problem():
  with pytest.raises(ValueError, match=r'--dtype=float64: expected a comma list of float32'):
    benchmark.variants_from(['float64'], ['xla'], ['none'])
  with pytest.raises(ValueError, match=r'--remat=some'):
    benchmark.variants_from(['float32'], ['xla'], ['some'])
  with pytest.raises(
    ValueError, match=r'--layers=scanned: expected a comma list of unrolled, scan'
  ):
    benchmark.variants_from(['float32'], ['xla'], ['none'], ['scanned'])
  with pytest.raises(ValueError, match=r"R50\+ViT-B_16 has resnet=True, classifier='token'"):
    benchmark.run_benchmark('R50+ViT-B_16', compare=True)
  with pytest.raises(ValueError, match='nothing to measure'):
    benchmark.run_benchmark('ViT-Ti_16', inference=False, train=False)


def test_command_line_writes_json(tmp_path):
  out = tmp_path / 'b.json'
  cmd = [sys.executable, '-m', 'vit_jax.benchmark', '--model=ViT-Ti_16', '--resolution=32']
  cmd += ['--batch=1', '--rounds=1', '--steps=1', '--probe_sizes=128', f'--json={out}']
  root = Path(__file__).resolve().parents[1]
  done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=root)
  assert done.returncode == 0, done.stderr[-2000:]
  assert '| float32/xla/remat=none | inference |' in done.stdout
  assert json.loads(out.read_text())['rows'][0]['flops_per_image'] > 0
  bad = subprocess.run(
    [*cmd[:3], '--dtype=float64'], capture_output=True, text=True, timeout=300, cwd=root
  )
  assert bad.returncode != 0
  assert '--dtype=float64: expected a comma list of float32, bfloat16, float16' in bad.stderr


def test_compare_runs_hugging_face_on_the_same_weights():
  result = benchmark.run_benchmark(
    'ViT-Ti_16',
    batch=2,
    resolution=32,
    compare=True,
    train=True,
    num_classes=10,
    rounds=1,
    steps=1,
    probe_sizes=(128,),
    model_overrides=TINY,
  )
  rows = {(r['framework'], r['mode']): r for r in result['rows']}
  assert set(rows) == {(f, m) for f in ('jax', 'hf-pytorch') for m in ('inference', 'train')}
  for mode in ('inference', 'train'):
    ours, theirs = rows['jax', mode], rows['hf-pytorch', mode]
    assert ours['vs_hf'] == pytest.approx(ours['img_per_s'] / theirs['img_per_s'])
  assert result['hf_max_abs_logit_error'] < 1e-4


# ----------------------------------------------------------------------------- the model paths


def _tiny_model(**overrides):
  return get_model(
    'ViT-Ti_16',
    num_classes=10,
    patches={'size': (8, 8)},
    transformer={'num_layers': 2},
    **overrides,
  )


def _grads(model, params, images, labels):
  def loss(p):
    logits = model.apply({'params': p}, images, train=False)
    return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(len(labels)), labels])

  return jax.jit(jax.grad(loss))(params)


@pytest.fixture(scope='module')
def tiny_batch():
  images = jax.random.uniform(jax.random.key(1), (2, 32, 32, 3), minval=-1, maxval=1)
  labels = jnp.array([3, 7])
  model = _tiny_model()
  params = model.init(jax.random.key(0), images, train=False)['params']
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda x: jnp.asarray(0.05 * rng.standard_normal(x.shape), x.dtype), params)
  return params, images, labels


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize('policy', ['full', 'dots', 'dots_saveable'])
def test_remat_leaves_gradients_equal(policy, dtype, tiny_batch):
  params, images, labels = tiny_batch
  ref = _grads(_tiny_model(dtype=dtype), params, images, labels)
  out = _grads(_tiny_model(dtype=dtype, remat_policy=policy), params, images, labels)
  scale = max(float(jnp.abs(g).max()) for g in jax.tree.leaves(ref))
  assert scale > 1e-3
  for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ref), strict=True):
    np.testing.assert_allclose(a, b, atol=1e-6 * scale, rtol=1e-5)


def test_fused_attention_leaves_gradients_equal(tiny_batch):
  params, images, labels = tiny_batch
  ref = _grads(_tiny_model(), params, images, labels)
  out = _grads(_tiny_model(attention_impl='fused'), params, images, labels)
  for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ref), strict=True):
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize('attention', ['xla', 'fused'])
def test_bfloat16_gradients_are_float32_and_close(attention, tiny_batch):
  params, images, labels = tiny_batch
  ref = _grads(_tiny_model(), params, images, labels)
  out = _grads(_tiny_model(dtype=jnp.bfloat16, attention_impl=attention), params, images, labels)
  for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ref), strict=True):
    assert a.dtype == jnp.float32
    scale = float(jnp.abs(b).max())
    assert float(jnp.abs(a - b).max()) <= 0.05 * scale + 1e-6


def _dots(hlo_text):
  """(lhs, rhs, result) element types of every dot_general in StableHLO text."""
  types = r'\(tensor<(?:\d+x)*(\w+)>, tensor<(?:\d+x)*(\w+)>\) -> tensor<(?:\d+x)*(\w+)>'
  return re.findall(r'stablehlo\.dot_general.*?:\s*' + types, hlo_text)


def test_bfloat16_matmuls_take_bfloat16_and_sum_in_float32(tiny_batch):
  params, images, _ = tiny_batch

  def hlo(dtype):
    model = _tiny_model(dtype=dtype)
    loss = lambda p: model.apply({'params': p}, images, train=False).sum()
    return jax.jit(jax.value_and_grad(loss)).lower(params).as_text()

  dots = _dots(hlo(jnp.bfloat16))
  # Per block q, k, v, scores, values, out and 2 MLP matmuls, then the head; the backward
  # pass has two matmuls for each (the patch embedding is a float32 convolution).
  assert len(dots) == 3 * (2 * 8 + 1)
  assert set(dots) == {('bf16', 'bf16', 'f32')}
  assert set(_dots(hlo(jnp.float32))) == {('f32', 'f32', 'f32')}


def test_mixed_einsum_gradients_are_not_rounded():
  kx, ky = jax.random.split(jax.random.key(0))
  x = jax.random.normal(kx, (4, 5, 32))
  y = jax.random.normal(ky, (32, 3, 6))
  spec = 'btd,dhk->bthk'
  mixed = lambda x, y: (vit.mixed_einsum(spec, x, y, jnp.bfloat16) ** 2).sum()
  exact = lambda x, y: (jnp.einsum(spec, x, y) ** 2).sum()
  (dx, dy), (ex, ey) = jax.grad(mixed, (0, 1))(x, y), jax.grad(exact, (0, 1))(x, y)
  for got, want in ((dx, ex), (dy, ey)):
    assert got.dtype == jnp.float32
    assert float(jnp.abs(got - want).max()) < 0.02 * float(jnp.abs(want).max())
    # float32 sums come back unrounded: most entries are not bfloat16 numbers.
    assert float(jnp.mean(got != got.astype(jnp.bfloat16).astype(jnp.float32))) > 0.9


@pytest.mark.parametrize(
  'lhs_shape, rhs_shape, dims',
  [
    ((2, 5, 8), (8, 3, 4), (((2,), (0,)), ((), ()))),  # DenseGeneral to heads
    ((2, 5, 3, 4), (3, 4, 8), (((2, 3), (0, 1)), ((), ()))),  # out projection
    ((2, 3, 5, 4), (2, 3, 6, 4), (((3,), (3,)), ((0, 1), (0, 1)))),  # batched scores
    ((5, 8), (8, 7), (((1,), (0,)), ((), ()))),  # Dense
  ],
)
def test_dot_general_to_einsum(lhs_shape, rhs_shape, dims):
  kx, ky = jax.random.split(jax.random.key(0))
  lhs, rhs = jax.random.normal(kx, lhs_shape), jax.random.normal(ky, rhs_shape)
  spec = vit._dot_general_as_einsum(lhs.ndim, rhs.ndim, dims)
  np.testing.assert_allclose(
    jnp.einsum(spec, lhs, rhs), jax.lax.dot_general(lhs, rhs, dims), rtol=1e-5, atol=1e-5
  )


@pytest.mark.parametrize('remat', ['none', 'full'])
def test_scanned_layers_equal_the_unrolled_model(remat, tiny_batch):
  params, images, labels = tiny_batch
  stacked = vit.stack_encoder_blocks(params)
  assert stacked['Transformer']['encoderblock']['MlpBlock_0']['Dense_0']['kernel'].shape == (
    2,
    192,
    768,
  )
  scanned = _tiny_model(scan_layers=True, remat_policy=remat)
  init = scanned.init(jax.random.key(0), images, train=False)['params']
  assert jax.tree.map(jnp.shape, init) == jax.tree.map(jnp.shape, stacked)
  np.testing.assert_allclose(
    scanned.apply({'params': stacked}, images, train=False),
    _tiny_model().apply({'params': params}, images, train=False),
    atol=1e-5,
  )
  grads = vit.unstack_encoder_blocks(_grads(scanned, stacked, images, labels))
  ref = _grads(_tiny_model(), params, images, labels)
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref), strict=True):
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-4)


def test_stacking_round_trips_and_checks_the_layout(tiny_batch):
  params, *_ = tiny_batch
  back = vit.unstack_encoder_blocks(vit.stack_encoder_blocks(params))
  assert jax.tree.structure(back) == jax.tree.structure(params)
  for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(params), strict=True):
    np.testing.assert_array_equal(a, b)
  with pytest.raises(ValueError, match='already stacked'):
    vit.stack_encoder_blocks(vit.stack_encoder_blocks(params))
  with pytest.raises(ValueError, match='not stacked'):
    vit.unstack_encoder_blocks(params)
  gap = dict(params['Transformer'])
  del gap['encoderblock_0']
  with pytest.raises(ValueError, match=r'expected Transformer/encoderblock_0..N-1'):
    vit.stack_encoder_blocks({**params, 'Transformer': gap})


def test_scanned_dropout_depends_on_the_key(random_params):
  model = get_model('testing', num_classes=5, scan_layers=True, transformer={'num_layers': 3})
  images = jax.random.uniform(jax.random.key(1), (2, 32, 32, 3), minval=-1, maxval=1)
  params = model.init(jax.random.key(0), images, train=False)['params']
  params = random_params(params)
  train = lambda seed: model.apply(
    {'params': params}, images, train=True, rngs={'dropout': jax.random.key(seed)}
  )
  assert float(jnp.abs(train(0) - train(1)).max()) > 1e-3
  np.testing.assert_array_equal(train(0), train(0))


def test_largest_batch_fits_and_the_next_does_not():
  config = benchmark.model_config('ViT-Ti_16', TINY)
  variant = benchmark.Variant()
  mem = lambda b: benchmark.train_memory_bytes(config, 10, variant, 32, b)
  limit = mem(8) + int(2.5 * (mem(16) - mem(8)))
  batch, need = benchmark.largest_batch(config, 10, variant, 32, limit, multiple=8)
  assert batch >= 24
  assert need == mem(batch) <= limit < mem(batch + 8)
  with pytest.raises(ValueError, match='batch 8 needs'):
    benchmark.largest_batch(config, 10, variant, 32, mem(8) - 1, multiple=8)


def test_compile_only_counts_scanned_models_unrolled():
  result = benchmark.run_benchmark(
    'ViT-Ti_16',
    batch=2,
    resolution=64,
    layers=('unrolled', 'scan'),
    remats=('none', 'full'),
    train=True,
    num_classes=10,
    compile_only=True,
    model_overrides=TINY,
  )
  rows = {(r['mode'], r['remat'], r['layers']): r for r in result['rows']}
  assert len(rows) == 6  # inference once per layout, training per remat policy
  for row in rows.values():
    assert row['img_per_s'] is None and row['compile_s'] > 0 and row['xla_memory_bytes'] > 0
  unrolled, scanned = rows['train', 'none', 'unrolled'], rows['train', 'full', 'scan']
  assert scanned['flops_per_image'] is None  # XLA counts a loop body once
  assert scanned['model_flops_per_image'] == unrolled['flops_per_image']
  assert rows['inference', 'none', 'scan']['model_flops_per_image'] == pytest.approx(
    rows['inference', 'none', 'unrolled']['flops_per_image']
  )


def test_training_only_run_measures_peak_memory():
  result = benchmark.run_benchmark(
    'ViT-Ti_16',
    batch=1,
    resolution=32,
    inference=False,
    train=True,
    num_classes=10,
    rounds=1,
    steps=1,
    probe_sizes=(128,),
    model_overrides=TINY,
  )
  (row,) = result['rows']
  assert row['mode'] == 'train' and row['img_per_s'] > 0
  assert row['peak_memory_bytes'] > row['xla_memory_bytes'] > 0
  assert row['peak_memory_kind'] == 'process peak RSS'


def test_fused_attention_asks_cudnn_on_gpus_and_falls_back(monkeypatch):
  """The choice logic, with the GPU and cuDNN's refusal stood in (no GPU here): jax would pick
  XLA unless asked for cuDNN by name, and cuDNN refuses unsupported shapes while tracing."""
  q, k, v = (
    jax.random.normal(key, (2, 5, 3, 8), jnp.bfloat16)
    for key in jax.random.split(jax.random.key(0), 3)
  )
  asked = []
  original = jax.nn.dot_product_attention

  def refusing(q, k, v, implementation=None):
    asked.append(implementation)
    if implementation == 'cudnn':
      raise NotImplementedError('Unsupported sequence length Q 5, KV 5.')
    return original(q, k, v, implementation=implementation)

  monkeypatch.setattr(jax.nn, 'dot_product_attention', refusing)
  monkeypatch.setattr(jax, 'default_backend', lambda: 'gpu')
  out = vit.fused_attention(q, k, v)
  assert asked == ['cudnn', None]
  np.testing.assert_array_equal(out, original(q, k, v))
  asked.clear()
  vit.fused_attention(*(t.astype(jnp.float32) for t in (q, k, v)))  # cuDNN's takes 16-bit
  assert asked == [None]
  monkeypatch.setattr(jax, 'default_backend', lambda: 'cpu')
  vit.fused_attention(q, k, v)
  assert asked == [None, None]


def _attention_run(**kwargs):
  return benchmark.run_benchmark(
    'ViT-Ti_16',
    batch=2,
    resolution=32,
    attentions=('xla', 'fused'),
    train=True,
    num_classes=10,
    peak_tflops=1.0,
    rounds=1,
    steps=1,
    check_batches=0,
    model_overrides=TINY,
    **kwargs,
  )


def test_model_flops_count_attention_explicitly_or_analytically(monkeypatch):
  rows = {(r['attention'], r['mode']): r for r in _attention_run()['rows']}
  for mode in ('inference', 'train'):
    explicit, fused = rows['xla', mode], rows['fused', mode]
    # The fused program's MFU counts the explicit program's FLOPs (a cuDNN kernel counts 0).
    assert fused['model_flops_per_image'] == explicit['flops_per_image']
    assert fused['cudnn_attention'] is False and explicit['cudnn_attention'] is False
  # A backend that analyses no lowered program (GPUs under jax 0.11): the analytic count,
  # and a training step as 3 forward passes.
  monkeypatch.setattr(benchmark, '_flops', lambda lowered: float('nan'))
  result = _attention_run()
  analytic = stats.forward_flops(benchmark.model_config('ViT-Ti_16', TINY), 32, 10)
  for row in result['rows']:
    assert row['flops_per_image'] is None
    assert row['model_flops_per_image'] == analytic * (3 if row['mode'] == 'train' else 1)
