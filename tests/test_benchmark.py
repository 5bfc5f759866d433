"""The benchmark runs and counts right, and times the trainer's own training step.

Timings are never asserted: they depend on the machine and its load. (That the fast paths
keep the numbers is tests/test_model_paths.py.)
"""

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl import flags
from jax.sharding import PartitionSpec as P
from PIL import Image

from vit_jax import benchmark, checkpoint, cli, families, parallel
from vit_jax.benchmark import (
  analysis,
  contrastive_loss,
  embedder,
  memory,
  mesh_table,
  programs,
  start,
)
from vit_jax.benchmark.variants import build_model
from vit_jax.cli import benchmark as benchmark_cli
from vit_jax.models import get_model, stats

TINY = {'transformer': {'num_layers': 2}}  # ViT-Ti_16 with 2 blocks: compiles in seconds


@pytest.fixture(scope='module')
def tiny_run(tmp_path_factory):
  result = benchmark.run_benchmark(
    'ViT-Ti_16',
    batch=2,
    resolution=32,
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
  benchmark_cli.write_json(result, str(path))
  return result, path


def _rows(result, mode):
  return {(r['dtype'], r['remat']): r for r in result['rows'] if r['mode'] == mode}


@pytest.mark.slow
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


# Inference computes the last block for the class token alone: the queries, attention, out
# projection and MLP of the other 4 of 5 tokens are left out (ViT-Ti: D=192, MLP 768).
_D, _MLP, _TOKENS = 192, 768, 5
LEFT_OUT = 2 * (_TOKENS - 1) * (2 * _D * _D + 2 * _TOKENS * _D + 2 * _D * _MLP)


@pytest.mark.slow
def test_forward_flops_match_the_analytic_formula(tiny_run):
  result, _ = tiny_run
  config = benchmark.model_config('ViT-Ti_16', TINY)
  analytic = families.forward_flops(config, 32, 10)
  assert result['analytic_forward_flops_per_image'] == analytic
  xla = _rows(result, 'inference')[('float32', 'none')]['flops_per_image']
  analytic -= LEFT_OUT
  # XLA also counts the elementwise work (norms, softmax, GELU) the formula leaves out.
  assert 0.98 < analytic / xla <= 1.0


@pytest.mark.slow
def test_training_flops_are_three_forwards_and_remat_recomputes(tiny_run):
  result, _ = tiny_run
  # The forward pass of every token, as training runs it.
  forward = _rows(result, 'inference')[('float32', 'none')]['flops_per_image'] + LEFT_OUT
  train = _rows(result, 'train')
  plain, remat = train[('float32', 'none')], train[('float32', 'full')]
  # The trainer's step at two batch sizes: what grows with the batch is the per-image work,
  # the rest is the optimizer's, once per step on every parameter.
  config = benchmark.model_config('ViT-Ti_16', TINY)
  model = build_model(config, 10, benchmark.Variant())
  image = jax.ShapeDtypeStruct((1, 32, 32, 3), jnp.float32)
  params = jax.eval_shape(lambda x: model.init(jax.random.key(0), x, train=False), image)['params']

  def step_flops(batch):
    images = jax.ShapeDtypeStruct((batch, 32, 32, 3), jnp.float32)
    labels = jax.ShapeDtypeStruct((batch,), jnp.int32)
    return programs.compile_train(model, params, images, labels)[2] * batch

  assert step_flops(2) == pytest.approx(2 * plain['flops_per_image'], rel=1e-6)  # as timed
  per_image = (step_flops(4) - step_flops(2)) / 2
  # Backward = 2 forwards, less the input gradient of the patch embedding.
  assert 2.85 < per_image / forward < 3.0
  # Clipping (a global norm), the gradient-norm metric, momentum, the learning-rate scaling,
  # the update and the finiteness check: a few element-wise operations per parameter.
  per_parameter = (step_flops(2) - 2 * per_image) / stats.count_params(params)
  assert 5 < per_parameter < 30, per_parameter
  # Full remat runs every block's forward again; MFU counts the model FLOPs only.
  assert 1.15 < remat['flops_per_image'] / plain['flops_per_image'] < 1.35
  assert remat['model_flops_per_image'] == plain['flops_per_image']


@pytest.mark.slow
def test_bfloat16_agreement_is_reported(tiny_run):
  result, _ = tiny_run
  a = result['agreement']['bfloat16/xla/remat=none']
  assert a['reference'] == 'float32/xla/remat=none'
  assert a['images'] == 2
  assert 0 < a['max_abs_logit_error'] < 0.05 * a['max_abs_logit']


@pytest.mark.slow
def test_json_and_table(tiny_run):
  result, path = tiny_run
  loaded = json.loads(path.read_text())
  assert loaded['rows'][0]['img_per_s'] == result['rows'][0]['img_per_s']
  assert not list(path.parent.glob('.benchmark.*'))  # no temporary left behind
  table = benchmark_cli.format_table(result)
  assert table.count('\n| float32/xla/remat=') == 3  # 1 inference + 2 train rows
  assert 'matmul probe' in table


@pytest.mark.slow
def test_remat_inside_scan_cuts_training_memory():
  # Activations dominate here (65 tokens x 6 blocks x batch 16 against 2M parameters).
  config = benchmark.model_config('ViT-Ti_16', {'transformer': {'num_layers': 6}})
  memory = lambda variant: benchmark.train_memory_bytes(config, 10, variant, 128, 16)
  plain = memory(benchmark.Variant())
  remat = memory(benchmark.Variant(remat='full', layers='scan'))
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


@pytest.mark.slow
def test_command_line_writes_json(tmp_path):
  out = tmp_path / 'b.json'
  cmd = [sys.executable, '-m', 'vit_jax.benchmark', '--model=testing', '--resolution=32']
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_largest_batch_fits_and_the_next_does_not():
  config = benchmark.model_config('ViT-Ti_16', TINY)
  variant = benchmark.Variant()
  mem = lambda b: benchmark.train_memory_bytes(config, 10, variant, 32, b)
  # Between the two: 6 fits, 8 does not. The line through batches 2 and 4 (the programs the
  # tests above compiled) gives the first estimate. (The memory is not linear in the batch at
  # the smallest batches, so that estimate can overshoot and be walked back.)
  limit = (mem(6) + mem(8)) // 2
  assert mem(6) <= limit < mem(8)
  assert benchmark.largest_batch(config, 10, variant, 32, limit, multiple=2) == (6, mem(6))
  with pytest.raises(ValueError, match='batch 2 needs'):
    benchmark.largest_batch(config, 10, variant, 32, mem(2) - 1, multiple=2)


@pytest.mark.slow
def test_memory_line_holds_the_state_and_accum_steps_fit_the_device():
  """The fixed part of the step's memory is at least the weights, gradients and SGD momentum
  in float32 (12 B per parameter); accum_steps is the fewest micro-batches that fit."""
  config = benchmark.model_config('ViT-Ti_16', TINY)
  fixed, per_image = benchmark.memory_line(config, 10, benchmark.Variant(), 32)
  model = build_model(config, 10, benchmark.Variant())
  n = stats.count_params(families.param_shapes(model, 32))
  assert 12 * n <= fixed < 20 * n and per_image > 0
  # 512 images on 8 devices (64 each), 1 GB fixed, 0.1 GB per image, 90% of the device:
  # 16 GB holds 134 images (1 pass), 4 GB 26 (64 / 4 = 16 per pass), 1.05 GB none.
  fit = lambda gb: benchmark.accum_steps_to_fit(1e9, 1e8, gb * 1e9, 512, 8)
  assert (fit(16), fit(4), fit(1.05)) == (1, 4, None)


def test_memory_table_fits_a_line_and_the_largest_batches(monkeypatch):
  """The table's arithmetic on a made-up step (no compile): the state 1.5 GiB + 0.5 MiB per
  image, the temporaries 0.5 GiB + 95.5 MiB per image, 1 MiB above that line at batch 16."""
  mib = 2**20
  state = lambda b: 1536 * mib + b * mib // 2
  temp = lambda b: 512 * mib + b * 191 * mib // 2 + (mib if b == 16 else 0)
  fake = lambda config, classes, variant, resolution, b: {
    'xla_memory_bytes': state(b) + temp(b),
    'temp_bytes': temp(b),
    'compile_s': 1.0,
  }
  monkeypatch.setattr(memory, 'train_memory', fake)
  variants = [benchmark.Variant(), benchmark.Variant('bfloat16', remat='full', layers='scan')]
  result = benchmark.memory_table(['ViT-B_16'], variants, 224, [8, 16, 32], [1, 16, 40, 80])
  row = result['rows'][1]
  assert row['program'] == 'bfloat16/xla/remat=full/scan'
  assert (row['fixed_bytes'], row['per_image_bytes']) == (2048 * mib, 96 * mib)
  assert (row['state_bytes'], row['temp_fixed_bytes']) == (1536 * mib, 512 * mib)
  assert (row['temp_per_image_bytes'], row['off_line_bytes']) == (95.5 * mib, mib)
  # (G GiB - 2 GiB) / 96 MiB images: 14 * 1024 / 96 = 149.3, 405.3, and 832 exactly.
  assert row['largest_batch'] == {'1': 0, '16': 149, '40': 405, '80': 832}
  table = benchmark_cli.format_memory_table(result)
  assert '| ViT-B_16 | bfloat16/xla/remat=full/scan | 2.00 | 1.50 | 96.0 | 95.5 | 1.00 |' in table
  with pytest.raises(ValueError, match='two or more increasing batches'):
    benchmark.memory_table(['ViT-B_16'], variants, 224, [8])


@pytest.mark.slow
def test_compile_only_counts_scanned_models_unrolled():
  result = benchmark.run_benchmark(
    'ViT-Ti_16',
    batch=2,
    resolution=32,
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
    batch=2,
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


def test_mesh_runs_the_training_step_tensor_parallel_and_counts_the_whole_mesh(monkeypatch):
  """--mesh data:-1,model:2 --sharding tp on the 8 simulated devices: the state the step
  trains is split over 'model' as Megatron's layout says (the MLP's first kernel by its
  outputs, the second by its inputs); img/s and TFLOP/s count the whole mesh and MFU is
  against 8 devices' peak. Without dropout: its random masks, split over the mesh, more than
  double the step's compile time."""
  placed = {}
  train_program = programs.train_program

  def keeping_state(*args, **kwargs):
    placed['state'] = args[4]  # the state dict that the training programs share
    return train_program(*args, **kwargs)

  monkeypatch.setattr(programs, 'train_program', keeping_state)
  result = benchmark.run_benchmark(
    'testing',  # heads 2, MLP width 10: both split over model:2
    batch=8,
    resolution=32,
    inference=False,
    train=True,
    num_classes=10,
    peak_tflops=1.0,
    rounds=1,
    steps=1,
    model_overrides={'transformer': {'dropout_rate': 0.0}},
    mesh='data:-1,model:2',
    sharding='tp',
  )
  assert (result['mesh'], result['mesh_devices'], result['sharding']) == ('data:4,model:2', 8, 'tp')
  mlp = placed['state']['train']['params']['Transformer']['encoderblock_0']['MlpBlock_0']
  assert mlp['Dense_0']['kernel'].sharding.spec == jax.sharding.PartitionSpec(None, 'model')
  assert mlp['Dense_1']['kernel'].sharding.spec == jax.sharding.PartitionSpec('model', None)
  assert mlp['Dense_0']['kernel'].sharding.mesh.shape == {'data': 4, 'model': 2}
  (row,) = result['rows']
  assert row['img_per_s_per_device'] == pytest.approx(row['img_per_s'] / 8)
  assert row['achieved_tflops'] == pytest.approx(
    row['model_flops_per_image'] * row['img_per_s'] / 1e12
  )
  assert row['mfu'] == pytest.approx(row['achieved_tflops'] / 8.0)  # of 8 x 1 TFLOP/s
  assert 'mesh data:4,model:2 (8 devices), sharding tp' in benchmark_cli.format_table(result)
  with pytest.raises(ValueError, match=r'--batch=6 does not divide over 4 batch shards \(data\)'):
    benchmark.run_benchmark('testing', batch=6, inference=False, train=True, mesh='data:-1,model:2')
  with pytest.raises(ValueError, match='--mesh places the training step alone: pass --noinference'):
    benchmark.run_benchmark('testing', train=True, mesh='data:-1,model:2')


def test_mesh_flags_are_usage_errors_when_config_mesh_would_refuse_them():
  fv = flags.FlagValues()
  benchmark_cli.define_flags(fv)
  fv(['vit-benchmark', '--mesh=fsdp:4,model:2', '--sharding=tp+fsdp'])
  assert (fv.mesh, fv.sharding) == ('fsdp:4,model:2', 'tp+fsdp')
  for flag, said in (
    ('--mesh=data:-1,tensor:2', "--mesh='data:-1,tensor:2': axes are ('data', 'fsdp', 'model')"),
    ('--mesh=data:-1,model:-1', "--mesh='data:-1,model:-1': sizes are positive, one of them"),
    ('--sharding=zero3', "--sharding='zero3': expected one of ['replicate', 'fsdp', 'tp',"),
  ):
    with pytest.raises(flags.IllegalFlagValueError, match=re.escape(said)):
      fv(['vit-benchmark', flag])


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


@pytest.mark.slow
def test_model_flops_count_attention_explicitly_or_analytically(monkeypatch):
  rows = {(r['attention'], r['mode']): r for r in _attention_run()['rows']}
  for mode in ('inference', 'train'):
    explicit, fused = rows['xla', mode], rows['fused', mode]
    # The fused program's MFU counts the explicit program's FLOPs (a cuDNN kernel counts 0).
    assert fused['model_flops_per_image'] == explicit['flops_per_image']
    assert fused['cudnn_attention'] is False and explicit['cudnn_attention'] is False
  # A backend that analyses no lowered program (GPUs under jax 0.11): the analytic count,
  # and a training step as 3 forward passes.
  monkeypatch.setattr(analysis, 'flops', lambda lowered: float('nan'))
  result = _attention_run()
  analytic = families.forward_flops(benchmark.model_config('ViT-Ti_16', TINY), 32, 10)
  for row in result['rows']:
    assert row['flops_per_image'] is None
    assert row['model_flops_per_image'] == analytic * (3 if row['mode'] == 'train' else 1)


def test_the_benchmark_imports_no_tensorflow():
  """It runs on accelerator machines that have JAX but no TensorFlow, tfds or clu: on the core
  install, without the extras' packages (pyproject.toml)."""
  code = (
    'import sys, vit_jax.benchmark; '
    "print(sorted({m.split('.')[0] for m in sys.modules} & {'tensorflow', 'clu', "
    "'tensorflow_datasets', 'orbax', 'sentencepiece', 'sklearn', 'matplotlib', 'gcsfs'}))"
  )
  root = Path(__file__).resolve().parents[1]
  done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=root)
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.strip() == '[]'


@pytest.mark.slow
def test_pipeline_mode_measures_every_variant_and_checks_the_resumed_batches(tmp_path):
  """`--pipeline`: rows for each variant, the cores an accelerator needs (img/s over the
  measured img/s per core), the resume cost at 0 and 95%, and resumed batches checked."""
  model = {
    'model': 'ViT-B_16',
    'batch': 832,
    'resolution': 16,
    'device': 'NVIDIA H200',
    'rows': [
      {'mode': 'inference', 'framework': 'jax', 'program': 'x', 'img_per_s': 9000.0},
      {'mode': 'train', 'framework': 'jax', 'program': 'bfloat16/fused', 'img_per_s': 2459.0},
    ],
  }
  (tmp_path / 'model.json').write_text(json.dumps(model))
  out = tmp_path / 'pipeline.json'
  flags = [
    '--pipeline', f'--pipeline_dir={tmp_path}', '--crops=16', '--threads=1,2', '--images=32',
    '--image_size=40x30', '--batch=8', '--measure_images=16', '--rounds=1',
    '--resume_images=200', '--resume_size=16x12', f'--model_json={tmp_path}/model.json',
    f'--json={out}',
  ]  # fmt: skip
  root = Path(__file__).resolve().parents[1]
  done = subprocess.run(
    [sys.executable, '-m', 'vit_jax.benchmark', *flags],
    capture_output=True,
    text=True,
    cwd=root,
    timeout=600,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  result = json.loads(out.read_text())
  names = {r['name'] for r in result['rows']}
  # JPEG training both ways; the digits (pixels) and evaluation have one decode.
  expected = {
    f'{source} {mode}{decode} 16px {t}t'
    for t in (1, 2)
    for source, mode, decode in [
      ('digits', 'train', ''),
      ('digits', 'eval', ''),
      ('folder', 'train', ' window'),
      ('folder', 'train', ' whole'),
      ('folder', 'eval', ''),
    ]
  }
  assert names == expected
  for row in result['rows']:
    assert row['img_per_s'] > 0 and row['img_per_s_per_core'] > 0
  per_core = next(r for r in result['rows'] if r['name'] == 'folder train window 16px 1t')
  (measured,) = [c for c in result['cores_per_accelerator'] if '(measured)' in c['accelerator']]
  assert measured['img_per_s'] == 2459.0
  assert measured['cores'] == pytest.approx(2459.0 / per_core['img_per_s_per_core'])
  resume = result['resume']
  assert resume['position'] == 184  # 95% of 200, in whole batches of 8
  assert {(r['read'], r['position']) for r in resume['rows']} == {
    (read, p) for read in ('by index', 'in order') for p in (0, 184)
  }
  assert resume['resumed_equals_uninterrupted'] is True
  assert '| folder | train | crop window | 16 | 1 |' in done.stdout


@pytest.mark.slow
def test_embedder_mode_times_vit_embed_beside_its_model(tmp_path):
  """`--embedder`'s measure: the model-alone and end-to-end rates over the same JPEG folder,
  each the images over the median round."""
  result = embedder.run_embedder_benchmark(
    'testing', str(tmp_path), 6, (40, 30), ['float32'], batch=4, rounds=2, log=len
  )
  (row,) = result['rows']
  model, whole = (result['seconds'][f'float32 {kind}'] for kind in ('model', 'end_to_end'))
  assert len(model) == len(whole) == 2
  assert row['model_img_s'] == pytest.approx(6 / np.median(model))
  assert row['ratio'] == pytest.approx(np.median(model) / np.median(whole))
  assert len(list((tmp_path / 'jpeg_40x30_6').rglob('*.jpg'))) == 6
  assert '| float32 |' in embedder.format_table(result)


def test_start_probe_times_vit_predicts_phases(tmp_path, random_params):
  """`--start`'s probe, one process as the mode starts it: imports, the checkpoint read, the
  first batch (tracing and compiling: slower than) the batch again, all within its wall time."""
  model = get_model('testing', num_classes=3)
  x = np.zeros((1, 32, 32, 3), np.float32)
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), x, train=False))['params']
  checkpoint.save_npz(random_params(shapes), tmp_path / 'm.npz')
  Image.new('RGB', (40, 30), (200, 10, 90)).save(tmp_path / 'a.jpg')
  env = dict(os.environ, VIT_JAX_COMPILATION_CACHE='off')
  env.pop('JAX_COMPILATION_CACHE_DIR', None)  # compiled, not read from the tests' cache
  argv = [sys.executable, '-c', start.PROBE, str(tmp_path / 'm.npz'), str(tmp_path / 'a.jpg')]
  wall, out = start._timed(argv, env)
  phases = dict(zip(start.PHASES, json.loads(out), strict=True))
  assert all(s > 0 for s in phases.values())
  assert phases['first batch'] > phases['batch again']
  assert sum(phases.values()) < wall
  row = {'start': 'probe cold', 'wall': wall, **phases}
  assert start.format_table({'rows': [row]}).splitlines()[-1].startswith('| probe cold |')


def test_precision_policies_show_bytes_accessed_and_temporary_memory():
  """The compiled training step's XLA memory traffic and temporaries per image, for both
  precision policies of bfloat16 (compiled only; float32 once, the policies are 16-bit ones)."""
  result = benchmark.run_benchmark(
    'ViT-Ti_16',
    batch=2,
    resolution=32,
    dtypes=('float32', 'bfloat16'),
    precisions=('matmul', 'activations'),
    inference=False,
    train=True,
    num_classes=10,
    compile_only=True,
    model_overrides=TINY,
  )
  rows = {r['program']: r for r in result['rows']}
  assert list(rows) == [
    'float32/xla/remat=none',
    'bfloat16/xla/remat=none',
    'bfloat16/xla/remat=none/activations',
  ]
  assert [r['precision'] for r in rows.values()] == ['matmul', 'matmul', 'activations']
  for r in rows.values():
    # At least the step's own arrays are read once: parameters, images.
    assert r['bytes_accessed_per_image'] > 32 * 32 * 3 * 4
    assert 0 < r['temp_bytes_per_image'] * 2 < r['xla_memory_bytes']  # the batch's
  # (XLA:CPU computes bfloat16 elementwise ops in float32: the two policies' temporaries
  # differ by a few percent here, either way; what the backward pass keeps is
  # tests/test_precision.py.)
  float32, bfloat16 = rows['float32/xla/remat=none'], rows['bfloat16/xla/remat=none']
  assert bfloat16['bytes_accessed_per_image'] < float32['bytes_accessed_per_image']
  table = benchmark_cli.format_table(result)
  assert '| MB acc/img | temp MB/img |' in table


def test_profile_steps_trace_and_summarise_the_training_step(tmp_path):
  result = benchmark.run_benchmark(
    'ViT-Ti_16',
    batch=2,
    resolution=32,
    inference=False,
    train=True,
    num_classes=10,
    rounds=1,
    steps=1,
    probe_sizes=(128,),
    model_overrides=TINY,
    profile_steps=2,
    profile_dir=str(tmp_path),
  )
  profile = result['profile']
  assert (profile['program'], profile['mode'], profile['steps']) == (
    'float32/xla/remat=none',
    'train',
    2,
  )
  assert profile['trace'].startswith(str(tmp_path)) and profile['trace'].endswith('.xplane.pb')
  assert profile['total_ms'] > 0 and profile['top']
  assert sum(profile['shares'].values()) == pytest.approx(1.0)
  # XLA:CPU's trace names its YNNPACK matmuls `ynn_fusion.N` only: the compiled text says
  # which ones hold a dot (all were 'other' before).
  assert profile['shares']['matmul'] > 0
  assert sum(r['ms'] for r in profile['top']) <= profile['total_ms'] + 1e-6
  assert 'steps profiled:' in benchmark_cli.format_table(result)


@pytest.fixture(scope='module')
def loss_memory():
  """`--contrastive_loss`'s measure: one device's temporaries of the sigmoid loss and its
  gradient (d=32, tiles of 16 texts), by (step, logits, devices, rows per device)."""
  forms = (('jit', 'chunked'), ('shard_map', 'chunked'), ('shard_map', 'gathered'))
  cases = [(*form, 8, rows) for form in forms for rows in (64, 256)]
  cases += [('shard_map', logits, 2, 64) for logits in ('chunked', 'gathered')]
  got = {}
  for step, logits, devices, rows in cases:
    mesh = parallel.create_mesh(jax.devices()[:devices])
    got[step, logits, devices, rows] = contrastive_loss.temp_bytes(
      rows * devices, 32, logits, step, mesh, chunk=16
    )
  return got


def test_contrastive_loss_mode_chunked_memory_grows_linearly_with_the_batch(loss_memory):
  """On 8 devices at 4x the global batch: the chunked forms' temporaries at most 4.5x those
  at 1x (a tile of (rows, 16) logits, and embeddings), the gathered form's at least 12x
  (its (rows, B) logits: 16x)."""
  grow = lambda step, logits: loss_memory[step, logits, 8, 256] / loss_memory[step, logits, 8, 64]
  assert grow('jit', 'chunked') <= 4.5 and grow('shard_map', 'chunked') <= 4.5, loss_memory
  assert grow('shard_map', 'gathered') >= 12, loss_memory


def test_contrastive_loss_mode_ring_memory_does_not_grow_with_the_devices(loss_memory):
  """At 64 rows per device, the shard_map chunked form's temporaries on 8 devices are within
  1.3x those on 2 (a device holds its own and one visiting block of texts, never all B),
  where the gathered form's grow with the global batch (4x: its (64, B) logits)."""
  at = lambda logits, devices: loss_memory['shard_map', logits, devices, 64]
  assert at('chunked', 8) <= 1.3 * at('chunked', 2), loss_memory
  assert at('gathered', 8) >= 3.5 * at('gathered', 2), loss_memory


# An HLO module as XLA prints one: a loop of 12 trips whose body gathers through a called
# computation, reduces asynchronously and runs an inner loop of 3 trips that scatters; outside
# the loop one all-reduce and one collective-permute.
HLO = """HloModule step, is_scheduled=true, num_partitions=8

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %sum = f32[] add(%a, %b)
}

%gather (p: bf16[4,8]) -> bf16[32,8] {
  %p = bf16[4,8]{1,0} parameter(0)
  ROOT %ag = bf16[32,8]{1,0} all-gather(%p), channel_id=1, replica_groups=[1,8]<=[8], dimensions={0}
}

%inner_body (q: (s32[], f32[16])) -> (s32[], f32[16]) {
  %q = (s32[], f32[16]{0}) parameter(0)
  %v = f32[16]{0} get-tuple-element(%q), index=1
  %rs = f32[2]{0} reduce-scatter(%v), channel_id=2, replica_groups=[1,8]<=[8], dimensions={0}, to_apply=%add
  ROOT %t = (s32[], f32[16]{0}) tuple(%i, %v)
}

%body (p.1: (s32[], bf16[4,8], f32[16])) -> (s32[], bf16[4,8], f32[16]) {
  %p.1 = (s32[], bf16[4,8]{1,0}, f32[16]{0}) parameter(0)
  %x = bf16[4,8]{1,0} get-tuple-element(%p.1), index=1
  %g = bf16[32,8]{1,0} call(%x), to_apply=%gather, metadata={op_name="while/body/closed_call"}
  %y = f32[16]{0} get-tuple-element(%p.1), index=2
  %ars = f32[16]{0} all-reduce-start(%y), channel_id=3, to_apply=%add
  %ard = f32[16]{0} all-reduce-done(%ars)
  %w.1 = (s32[], f32[16]{0}) while(%u), condition=%cond, body=%inner_body, backend_config={"known_trip_count":{"n":"3"}}
  ROOT %r = (s32[], bf16[4,8]{1,0}, f32[16]{0}) tuple(%i, %x, %ard)
}

ENTRY %main (x.1: bf16[4,8], y.1: f32[16]) -> f32[16] {
  %x.1 = bf16[4,8]{1,0} parameter(0), sharding={devices=[8,1]<=[8]}
  %w = (s32[], bf16[4,8]{1,0}, f32[16]{0}) while(%init), condition=%cond, body=%body, backend_config={"known_induction_variable":{"tuple_index":"0"},"known_trip_count":{"n":"12"}}
  %cp = f32[2,2]{1,0} collective-permute(%z), channel_id=4, source_target_pairs={{0,1},{1,0}}
  ROOT %all = f32[16]{0} all-reduce(%y.1), channel_id=5, to_apply=%add
}
"""  # noqa: E501 (XLA's long lines)


def test_collectives_count_loop_bodies_times_their_trips():
  found = mesh_table.hlo_collectives(HLO)
  assert found['all-gather'] == {'ops': 1, 'per_step': 12, 'bytes_per_step': 12 * 32 * 8 * 2}
  # The asynchronous pair counts once, 12 times; the one outside once: 16 floats each.
  assert found['all-reduce'] == {'ops': 2, 'per_step': 13, 'bytes_per_step': 13 * 64}
  assert found['reduce-scatter'] == {'ops': 1, 'per_step': 36, 'bytes_per_step': 36 * 8}
  assert found['collective-permute'] == {'ops': 1, 'per_step': 1, 'bytes_per_step': 16}
  assert found['all-to-all'] == {'ops': 0, 'per_step': 0, 'bytes_per_step': 0}
  assert mesh_table.array_bytes('(bf16[4,197]{1,0}, /*index=1*/pred[3], s32[])') == 1576 + 3 + 4


def test_collectives_of_a_compiled_loop_with_a_known_all_reduce():
  """A psum inside a 5-trip loop and one after it, on 8 devices: 6 all-reduces of 3 floats."""
  mesh = parallel.create_mesh()

  def per_device(x):
    body = lambda i, c: jax.lax.pcast(jax.lax.psum(c, 'data'), 'data', to='varying') * 0.5
    return jax.lax.psum(jax.lax.fori_loop(0, 5, body, x), 'data')

  step = jax.shard_map(per_device, mesh=mesh, in_specs=P('data'), out_specs=P())
  compiled = jax.jit(step).lower(jax.ShapeDtypeStruct((8, 3), jnp.float32)).compile()
  found = mesh_table.hlo_collectives(compiled.as_text())
  assert found['all-reduce'] == {'ops': 2, 'per_step': 6, 'bytes_per_step': 6 * 3 * 4}
  assert sum(v['ops'] for v in found.values()) == 2


# ViT-Ti/16 at 128 wide with 4 heads, 2 scanned blocks: its kernels are 2^14 elements or
# more, with a dimension of 128 that splits over 8 devices; the rest is under 2^14.
WIDE_TINY = {
  'hidden_size': 128,
  'transformer': {'num_layers': 2, 'mlp_dim': 512, 'num_heads': 4, 'dropout_rate': 0.0},
}


def test_fsdp_state_per_device_is_its_bytes_over_the_devices():
  settings = mesh_table.Settings(resolution=32, num_classes=10)
  row = mesh_table.mesh_row('ViT-Ti_16', 'fsdp:-1', [2], settings, WIDE_TINY)
  model = build_model(benchmark.model_config('ViT-Ti_16', WIDE_TINY), 10, settings.variant)
  image = jnp.zeros((1, 32, 32, 3))
  params = jax.eval_shape(lambda: model.init(jax.random.key(0), image, train=False))
  leaves = jax.tree.leaves(params['params'])
  whole = sum(x.size * 4 for x in leaves)
  split = sum(x.size * 4 for x in leaves if x.size >= 2**14)
  assert split > 0.9 * whole
  assert row['param_bytes'] == split // 8 + (whole - split)
  assert row['parameters'] == sum(x.size for x in leaves)
  # Adam's two float32 moments, and its and the schedule's int32 step counts.
  assert row['optimizer_bytes'] == 2 * row['param_bytes'] + 2 * 4
  # XLA's arguments: the state, the step and the key (4 + 8 bytes) and 2 images and labels.
  memory = row['at_batch'][0]
  assert memory['batch_bytes'] == 2 * (32 * 32 * 3 * 4 + 4)
  state = row['param_bytes'] + row['optimizer_bytes'] + 4 + 8
  assert memory['argument_bytes'] == state + memory['batch_bytes']
  assert memory['alias_bytes'] == state  # the state is donated
  assert row['rule'] == 'fsdp' and row['mesh_shape'] == {'fsdp': 8}


def test_mesh_table_shows_gib_per_device_and_the_batches_that_fit():
  gib = mesh_table.GIB
  none = {k: {'ops': 0, 'per_step': 0, 'bytes_per_step': 0} for k in mesh_table.COLLECTIVES}
  gathers = {**none, 'all-gather': {'ops': 3, 'per_step': 120, 'bytes_per_step': 40 * gib}}
  at = lambda b, total, fits: {
    'per_device_batch': b, 'temp_bytes': total - 3 * gib, 'total_bytes': total, 'fits': fits,
    'compile_s': 10.0, 'collectives': gathers,
  }  # fmt: skip
  row = {
    'devices': 64, 'model': 'ViT-22B_14', 'mesh': 'fsdp:-1', 'param_bytes': gib,
    'optimizer_bytes': 2 * gib, 'at_batch': [at(4, 70 * gib, True), at(16, 90 * gib, False)],
  }  # fmt: skip
  result = {'device_gib': 80.0, 'rows': [row]}
  memory, collectives = mesh_table.format_tables(result).split('\n\n')
  assert memory.splitlines()[0] == (
    '| devices | model | mesh | params | optimizer | temp @4 | total @4 | temp @16 | total @16'
    ' | fits 80 GiB at | compile s |'
  )
  assert memory.splitlines()[2] == (
    '| 64 | ViT-22B_14 | fsdp:-1 | 1.00 | 2.00 | 67.00 | 70.00 | 87.00 | 90.00 | 4 | 20 |'
  )
  assert collectives.splitlines()[2] == (
    '| 64 | ViT-22B_14 | fsdp:-1 | 0 (0) | 120 (3) | 0 (0) | 0 (0) | 0 (0) | 0.00 | 40.00 | 40.00 |'
  )
  with pytest.raises(ValueError, match='fsdp:3'):
    mesh_table.check(['fsdp:-1', 'fsdp:3'], [8], [4])
  with pytest.raises(ValueError, match='increasing'):
    mesh_table.check(['fsdp:-1'], [8], [8, 4])


@pytest.mark.slow
def test_mesh_table_command_compiles_in_a_process_of_its_device_count(
  command, monkeypatch, tmp_path
):
  """The command end to end, its flags and `main` run in this process: a child process of 2
  simulated devices compiles both meshes (the arithmetic of the rows is checked in this
  process, above; SGD: each compile takes about a quarter less CPU than Adam's)."""
  out = tmp_path / 'mesh.json'
  monkeypatch.chdir(Path(__file__).resolve().parents[1])  # the child imports this vit_jax
  status, stdout, stderr = command(
    cli.entry_point('vit-benchmark'),
    '--mesh_table', '--model=ViT-Ti_16', '--devices=2', '--meshes=fsdp:-1;fsdp:-1,model:2',
    '--per_device_batch=1', '--resolution=32', '--num_classes=10', '--optimizer=sgd',
    f'--json={out}',
  )  # fmt: skip
  assert not status, stderr[-3000:]  # main returned: exit status 0
  rows = json.loads(out.read_text())['rows']
  shapes = [(r['devices'], r['mesh_shape'], r['rule']) for r in rows]
  assert shapes == [(2, {'fsdp': 2}, 'fsdp'), (2, {'fsdp': 1, 'model': 2}, 'tp+fsdp')]
  # FSDP gathers the parameters where the fsdp axis has more than one device.
  gathers = [r['at_batch'][0]['collectives']['all-gather']['per_step'] > 0 for r in rows]
  assert gathers == [True, False]
  assert '| 2 | ViT-Ti_16 | fsdp:-1,model:2 |' in stdout
