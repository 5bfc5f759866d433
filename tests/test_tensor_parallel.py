"""Tensor parallelism on a named N-D mesh: the same run on 8 simulated devices under data x
model meshes (and fsdp x model) as on one device; a checkpoint written on one mesh resumes on
another; 2 processes x 4 devices on a 2 x 4 mesh equal 1 process x 8; the contrastive task
with both towers split over 'model'.

One run per mesh serves several assertions (module fixtures)."""

import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from conftest import TINY, assert_trained_params_close, process_env

from configs import digits
from vit_jax import rundir, train
from vit_jax.checkpoint import orbax as orbax_format
from vit_jax.train.spec import with_overrides

pytestmark = pytest.mark.slow  # 10-step training runs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 10
RESUMED_AT = 5  # the 2 x 4 run's checkpoint that the 8 x 1 run resumes from
# configs/digits.py:vit22b (ViT-22B's block: parallel attention and MLP, QK norm, no QKV or
# norm biases) at TINY's sizes, its one block of 8 heads and an MLP of 64 (both split 8 ways),
# 10 steps, a checkpoint at the end, one evaluation there, the data read as 2 shards (the
# same global batches on 1 process and on 2). One block, not two: a fifth less CPU per run.
OVERRIDES = {
  'model.transformer.num_heads': 8,
  'total_steps': STEPS,
  'checkpoint_every': STEPS,
  'eval_every': STEPS,
  'data_shards': 2,
}
# mesh name -> (config.mesh, config.sharding).
MESHES = {
  '4x2': ('data:4,model:2', 'tp'),
  '2x4': ('data:2,model:4', 'tp'),
  '1x8': ('data:1,model:8', 'tp'),
  'fsdp4xmodel2': ('fsdp:4,model:2', 'tp+fsdp'),
}


def _config(mesh: str = 'data:-1', sharding: str = 'replicate'):
  config = with_overrides(digits.get_config('vit22b'), {**TINY, **OVERRIDES})
  config.mesh, config.sharding = mesh, sharding
  return config


def _losses(workdir: str) -> list[float]:
  return [m['loss'] for m in rundir.read_metrics(workdir) if 'loss' in m]


def _flat(params) -> dict[str, np.ndarray]:
  return {
    '/'.join(str(k.key) for k in path): np.asarray(x)
    for path, x in jax.tree_util.tree_flatten_with_path(jax.device_get(params))[0]
  }


def _model_split(params) -> list[str]:
  """The parameters split over the 'model' axis."""
  specs = jax.tree_util.tree_flatten_with_path(jax.tree.map(lambda x: x.sharding.spec, params))
  return ['/'.join(str(k.key) for k in path) for path, spec in specs[0] if 'model' in spec]


@pytest.fixture(scope='module')
def one_device(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp('tp_one'))
  return workdir, train.train_and_evaluate(_config(), workdir, jax.devices()[:1])


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  """Each mesh's run on 8 devices, made on first use: {name: (workdir, result)}."""
  made = {}

  def run(name):
    if name not in made:
      workdir = str(tmp_path_factory.mktemp(f'tp_{name}'))
      config = _config(*MESHES[name])
      if name == '2x4':  # the resume test's start
        config.checkpoint_every = RESUMED_AT
      made[name] = workdir, train.train_and_evaluate(config, workdir)
    return made[name]

  return run


@pytest.mark.parametrize('name', MESHES)
def test_mesh_trains_like_one_device(name, runs, one_device):
  """Losses, parameters and the test accuracy of the 1-device run, to 1e-5."""
  (workdir, result), (one_dir, one) = runs(name), one_device
  split = _model_split(result['params'])
  assert any('MlpBlock_0/Dense_0/kernel' in p for p in split), split
  assert any('query/kernel' in p for p in split), split
  assert not any('LayerNorm_1' in p or 'query/bias' in p for p in _flat(result['params']))
  assert len(_losses(workdir)) == STEPS
  np.testing.assert_allclose(_losses(workdir), _losses(one_dir), atol=1e-5, rtol=0)
  assert_trained_params_close(_flat(one['params']), _flat(result['params']), atol=1e-5)
  assert result['num_test'] == one['num_test'] == 360
  assert result['accuracy_test'] == one['accuracy_test']


def test_checkpoint_of_a_2x4_mesh_resumes_exactly_on_8x1(tmp_path, runs):
  """The 2 x 4 run stopped after its step-5 checkpoint, resumed on the 1-D 8-device mesh
  (parameters replicated): the 2 x 4 run's last five losses and its parameters."""
  source, done = runs('2x4')
  workdir = str(tmp_path / 'run')
  shutil.copytree(source, workdir)
  shutil.rmtree(os.path.join(workdir, 'checkpoints', str(STEPS)))
  assert os.listdir(os.path.join(workdir, 'checkpoints')) == [str(RESUMED_AT)]
  result = train.train_and_evaluate(_config('data:8'), workdir)
  assert _model_split(result['params']) == []
  np.testing.assert_allclose(_losses(workdir), _losses(source), atol=1e-6, rtol=0)
  assert_trained_params_close(_flat(done['params']), _flat(result['params']), atol=1e-6)


def test_two_processes_of_four_devices_on_2x4_train_like_one_process(tmp_path, runs):
  """launch/local.sh --mesh data:2,model:4 --sharding tp, 2 processes x 4 devices (each process
  one model group): the losses and final parameters of the 1-process 2 x 4 run."""
  reference, done = runs('2x4')
  workdir = str(tmp_path / 'run')
  mesh, sharding = MESHES['2x4']
  flags = [f'--config.{k}={v}' for k, v in {**TINY, **OVERRIDES}.items()]
  command = ['bash', 'launch/local.sh', '--mesh', mesh, '--sharding', sharding, '2']
  command += ['--config=configs/digits.py:vit22b', f'--workdir={workdir}', *flags]
  env = {**process_env(4), 'PYTHON': sys.executable, 'DEVICES_PER_PROCESS': '4', 'TIMEOUT': '120'}
  run = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
  np.testing.assert_allclose(_losses(workdir), _losses(reference), atol=1e-5, rtol=0)
  tree, _ = orbax_format.read(os.path.join(workdir, 'checkpoints'))
  assert_trained_params_close(_flat(done['params']), _flat(tree), atol=1e-5)
