"""Multi-host runs as several processes on one machine (jax.distributed on 127.0.0.1, gloo).

2 processes x 4 CPU devices train exactly like 1 process x 8; a checkpoint written by one
topology resumes on the other; start-up that cannot complete fails fast with one line; a
SIGTERM or a non-finite value on one process stops both at the same step, and a process
killed with SIGKILL ends the other within the bound; the launch scripts are clean shell and
their dry runs print the commands.
"""

import importlib.util
import json
import os
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time

import jax
import ml_collections
import numpy as np
import pytest
from conftest import TINY, assert_trained_params_close, digest, full_tmpfs, process_env

from configs import digits as digits_config
from configs import vit_h14_fsdp
from vit_jax import data as data_lib
from vit_jax import distributed, families, parallel, rundir, train
from vit_jax.checkpoint import orbax as orbax_format
from vit_jax.models import model_from_config, stats
from vit_jax.train import setup, spec
from vit_jax.train.spec import with_overrides

pytestmark = pytest.mark.slow  # multi-process runs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH = os.path.join(REPO, 'launch')
SCRIPTS = ('local.sh', 'tpu_pod.sh', 'slurm_gpu.sh', 'gpu_benchmark.sh')
RUN_TIMEOUT_S = 300  # per launch; a hang fails the test instead of blocking the suite
# conftest's tiny digits run: 6 steps of batch 32, evaluated, few-shot evaluated and checkpointed at
# steps 3 and 6, with a Polyak average. The data is read as 2 shards, so the global batches do
# not depend on the process count.
OVERRIDES = {
  **TINY,
  'base_lr': 3e-3,
  'data_shards': 2,
  'polyak_decay': 0.9,
  'fewshot_every': 3,
  'fewshot.datasets': ('digits',),
}


def _config() -> ml_collections.ConfigDict:
  return with_overrides(digits_config.get_config(), OVERRIDES)


def _flags(workdir: str) -> list[str]:
  return [
    '--config=configs/digits.py',
    f'--workdir={workdir}',
    *(f'--config.{k}={v}' for k, v in OVERRIDES.items()),
  ]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _local_sh(workdir: str, processes: int = 2, devices: int = 4) -> subprocess.CompletedProcess:
  """launch/local.sh: `processes` processes of `devices` CPU devices each, on 127.0.0.1."""
  env = process_env(devices)
  env.update(PYTHON=sys.executable, DEVICES_PER_PROCESS=str(devices), TIMEOUT='120')
  run = subprocess.run(
    ['bash', os.path.join(LAUNCH, 'local.sh'), str(processes), *_flags(workdir)],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=RUN_TIMEOUT_S,
  )
  assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
  return run


def _run_here(workdir: str, data_shards: int = OVERRIDES['data_shards']) -> dict:
  """The same run in this test process: 1 process, 8 devices."""
  assert jax.process_count() == 1 and jax.device_count() == 8
  config = _config()
  config.data_shards = data_shards
  return train.train_and_evaluate(config, workdir)


def _metrics(workdir: str) -> list[dict]:
  keys = ('loss', 'accuracy_test', 'accuracy_test_top5', 'loss_test', 'num_test')
  keys += (
    'polyak/accuracy_test',
    'polyak/loss_test',
    *(f'fewshot/digits/{n}shot' for n in (1, 25)),
  )
  return [{k: m[k] for k in ('step', *keys) if k in m} for m in rundir.read_metrics(workdir)]


def _final_params(workdir: str, entry: str = 'params') -> dict[str, np.ndarray]:
  """The parameters (or their Polyak average) of the last checkpoint, read back as host arrays
  whatever wrote them."""
  tree, _ = orbax_format.read(os.path.join(workdir, 'checkpoints'), params_entry=entry)
  return {
    '/'.join(str(k.key) for k in path): np.asarray(x)
    for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]
  }


def _assert_same_run(workdir: str, reference: str) -> None:
  got, want = _metrics(workdir), _metrics(reference)
  assert [m['step'] for m in got] == [m['step'] for m in want]
  assert [sorted(m) for m in got] == [sorted(m) for m in want]
  assert len([m for m in got if 'loss' in m]) == OVERRIDES['total_steps']
  for a, b in zip(got, want, strict=True):
    np.testing.assert_allclose(
      [a[k] for k in sorted(a)], [b[k] for k in sorted(b)], atol=1e-5, rtol=0, err_msg=str(a)
    )
  assert [m['step'] for m in got if 'fewshot/digits/1shot' in m] == [3, 6]
  assert [m['step'] for m in got if 'polyak/accuracy_test' in m] == [3, 6]
  for entry in ('params', 'polyak'):
    assert_trained_params_close(
      _final_params(workdir, entry), _final_params(reference, entry), atol=1e-5
    )


@pytest.fixture(scope='module')
def one_process(tmp_path_factory) -> str:
  """The reference: 1 process x 8 devices, 6 steps."""
  workdir = str(tmp_path_factory.mktemp('one_process') / 'run')
  result = _run_here(workdir)
  assert result['status'] == 'done' and result['step'] == 6
  return workdir


@pytest.fixture(scope='module')
def two_processes(tmp_path_factory) -> tuple[str, subprocess.CompletedProcess]:
  """The same run as 2 processes x 4 devices through launch/local.sh."""
  workdir = str(tmp_path_factory.mktemp('two_processes') / 'run')
  return workdir, _local_sh(workdir)


def test_two_processes_of_four_devices_train_like_one_process_of_eight(one_process, two_processes):
  workdir, run = two_processes
  _assert_same_run(workdir, one_process)
  with open(os.path.join(workdir, 'config.json')) as f:
    resolved = json.load(f)['_resolved']
  assert (resolved['processes'], resolved['devices']) == (2, 8)
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['3', '6']
  # Progress and evaluation lines come from process 0 only; local.sh tags the others.
  progress = [line for line in run.stdout.splitlines() if 'step 6/6' in line]
  assert progress and not any(line.startswith('[process 1]') for line in progress)
  assert 'accuracy_test' in run.stdout
  assert 'Final test accuracy' in run.stdout
  # gloo's own connection lines aside (its writes can interleave and split the '[Gloo]' tag
  # from the rest of the line), process 1 prints nothing.
  gloo = ('[Gloo]', 'peer ranks')
  own = [
    x
    for x in run.stdout.splitlines()
    if x.startswith('[process 1]') and not any(g in x for g in gloo)
  ]
  assert not own, own


def test_data_shards_make_the_global_batches_independent_of_the_process_count():
  """Host rows of 2 hosts x 2 shards, stacked, equal 1 host reading all 4 shards; resumable."""
  source = data_lib.get_source('digits')
  pp = data_lib.Pp(train='train', crop=8, area_min=0.6, flip=False, subpixel=True)
  section = data_lib.Data(pp=pp, batch=16, shuffle_buffer=100)

  def batches(process_index, process_count, step=0, n=3):
    ds = data_lib.host_train_dataset(
      source,
      section,
      data_shards=4,
      seed=1,
      step=step,
      process_index=process_index,
      process_count=process_count,
    )
    return list(ds.take(n).as_numpy_iterator())

  one = batches(0, 1)
  two = [batches(0, 2), batches(1, 2)]
  for step, whole in enumerate(one):
    assert whole['image'].shape == (16, 8, 8, 3)
    for key in ('image', 'label'):
      np.testing.assert_array_equal(
        whole[key], np.concatenate([two[0][step][key], two[1][step][key]])
      )
  np.testing.assert_array_equal(batches(0, 1, step=2, n=1)[0]['image'], one[2]['image'])
  with pytest.raises(ValueError, match=r'config.data_shards=4 does not split over 3 processes'):
    batches(0, 3)
  config = _config()
  config.data_shards = 3
  with pytest.raises(ValueError, match=r'config.batch=32 does not split into config.data_shards=3'):
    setup.prepare(spec.from_config(config), 'unused')


def _truncate_to_step_3(src: str, dst: str) -> str:
  """A copy of a finished run as if it had been stopped right after its step-3 checkpoint."""
  shutil.copytree(src, dst)
  shutil.rmtree(os.path.join(dst, 'checkpoints', '6'))
  return dst


def test_checkpoint_of_two_processes_resumes_on_one(tmp_path, one_process, two_processes):
  workdir = _truncate_to_step_3(two_processes[0], str(tmp_path / 'run'))
  result = _run_here(workdir, data_shards=0)  # 0: the checkpoint's 2 shards, read by 1 process
  assert result['status'] == 'done'
  _assert_same_run(workdir, one_process)


def test_checkpoint_of_one_process_resumes_on_two(tmp_path, one_process):
  workdir = _truncate_to_step_3(one_process, str(tmp_path / 'run'))
  run = _local_sh(workdir)
  assert 'Resumed from checkpoint at step 3' in run.stdout
  _assert_same_run(workdir, one_process)


def _start(flags: list[str], workdir: str) -> subprocess.Popen:
  return subprocess.Popen(
    [sys.executable, '-m', 'vit_jax.main', *_flags(workdir), *flags],
    cwd=REPO,
    env=process_env(4),
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )


@pytest.mark.serial
def test_start_up_that_cannot_complete_fails_fast_with_one_line(tmp_path):
  """Nobody listens at the coordinator's port / the other process never comes: exit 1."""
  timeout = 3
  port, port0 = _free_port(), _free_port()
  common = ['--num_processes=2', f'--distributed_timeout={timeout}']
  start = time.monotonic()
  worker = _start(
    [f'--coordinator_address=127.0.0.1:{port}', '--process_id=1', *common], str(tmp_path / 'a')
  )
  alone = _start(
    [f'--coordinator_address=127.0.0.1:{port0}', '--process_id=0', *common], str(tmp_path / 'b')
  )
  outs = [p.communicate(timeout=RUN_TIMEOUT_S) for p in (worker, alone)]
  elapsed = time.monotonic() - start
  assert (worker.returncode, alone.returncode) == (1, 1), outs
  # Bounded: the timeout plus interpreter start-up, far below JAX's own 300 s default.
  assert elapsed < timeout + 90, elapsed
  errors = [[line for line in err.splitlines() if line.strip()] for _, err in outs]
  assert errors[0] == [
    f'Error: Process 1 of 2 could not reach the coordinator at 127.0.0.1:{port} within '
    f'{timeout} s (Connection refused): start process 0 there first, check the address, port '
    'and firewall, or raise --distributed_timeout.'
  ], errors[0]
  assert len(errors[1]) == 1 and errors[1][0].startswith(
    f'Error: Process 0 (coordinator at 127.0.0.1:{port0}): not all 2 processes joined within '
    f'{timeout} s'
  ), errors[1]
  assert not os.path.exists(tmp_path / 'a') and not os.path.exists(tmp_path / 'b')


@pytest.mark.parametrize(
  ('kwargs', 'environ', 'message'),
  [
    ({'coordinator_address': '10.0.0.1:1234'}, {}, '--num_processes, --process_id not set'),
    ({}, {'JAX_COORDINATOR_ADDRESS': 'h:1', 'JAX_NUM_PROCESSES': '2'}, '--process_id not set'),
    ({'coordinator_address': 'h:1', 'num_processes': 2, 'process_id': 2}, {}, '0 <= process_id'),
    ({'coordinator_address': 'nohost', 'num_processes': 2, 'process_id': 0}, {}, 'HOST:PORT'),
    ({'num_processes': 'two'}, {}, "--num_processes='two' is not an integer"),
  ],
)
def test_bad_distributed_settings_are_one_line_errors(kwargs, environ, message):
  with pytest.raises(distributed.DistributedError, match=re.escape(message)) as info:
    distributed.explicit_settings(**kwargs, environ=environ)
  assert '\n' not in str(info.value)


def test_settings_come_from_flags_then_environment():
  environ = {'JAX_COORDINATOR_ADDRESS': 'h0:8476', 'JAX_NUM_PROCESSES': '4', 'JAX_PROCESS_ID': '3'}
  assert distributed.explicit_settings(environ=environ) == ('h0:8476', 4, 3)
  assert distributed.explicit_settings(process_id=1, environ=environ) == ('h0:8476', 4, 1)
  assert distributed.explicit_settings(environ={}) is None
  slurm = {
    'SLURM_JOB_ID': '7',
    'SLURM_STEP_NODELIST': 'n[1-2]',
    'SLURM_PROCID': '0',
    'SLURM_LOCALID': '0',
  }
  assert distributed.in_slurm_job_step({**slurm, 'SLURM_NTASKS': '16'})
  assert not distributed.in_slurm_job_step({**slurm, 'SLURM_NTASKS': '1'})
  assert not distributed.in_slurm_job_step({'SLURM_JOB_ID': '7', 'SLURM_NTASKS': '16'})
  # One process, or 'off': nothing to start (this test process stays single-process).
  assert not distributed.initialize('h:1', 1, 0)
  assert not distributed.initialize('h:1', 2, 1, mode='off')
  assert jax.process_count() == 1


# One process of jax.distributed, then each call vit_jax makes on its coordination client.
_CLIENT_CALLS = """
import sys
import jax
from vit_jax import distributed
jax.distributed.initialize(sys.argv[1], num_processes=1, process_id=0)
client = distributed._client()
distributed.CheckpointBarrier()(key='save', timeout_ms=5000)  # increment, set, get, delete
client.key_value_set('k/0', 'a')
client.key_value_set('k/0', 'b', allow_overwrite=True)
client.wait_at_barrier('vote', 5000)
print(client.key_value_dir_get('k/'), client.key_value_dir_get('vit_jax/aborted/'))
"""


def test_the_private_coordination_client_takes_every_call_we_make():
  """distributed._client() reads jax._src.distributed (no public API reaches the key-value
  store): a jax release that moves it or changes a method fails here, by name."""
  run = subprocess.run(
    [sys.executable, '-c', _CLIENT_CALLS, f'127.0.0.1:{_free_port()}'],
    cwd=REPO,
    env=process_env(1),
    capture_output=True,
    text=True,
    timeout=RUN_TIMEOUT_S,
  )
  assert run.returncode == 0, run.stderr[-3000:]
  assert run.stdout.splitlines()[-1] == "[('k/0', 'b')] []"


@pytest.mark.parametrize('script', sorted(f for f in os.listdir(LAUNCH) if f.endswith('.sh')))
def test_launch_script_passes_bash_n_and_shellcheck(script):
  path = os.path.join(LAUNCH, script)
  syntax = subprocess.run(['bash', '-n', path], capture_output=True, text=True)
  assert syntax.returncode == 0, syntax.stderr
  assert shutil.which('shellcheck'), 'shellcheck is missing: apt-get install -y shellcheck'
  # -x follows `source launch/lib.sh` (resolved from the repository root).
  lint = subprocess.run(['shellcheck', '-x', path], cwd=REPO, capture_output=True, text=True)
  assert lint.returncode == 0, lint.stdout
  if script in SCRIPTS:
    usage = subprocess.run(['bash', path, '--help'], cwd=REPO, capture_output=True, text=True)
    assert usage.returncode == 0 and 'Usage' in usage.stdout
    assert not any(line.startswith('#SBATCH') for line in usage.stdout.splitlines())


@pytest.mark.parametrize('script', ['tpu_pod.sh', 'slurm_gpu.sh'])
def test_cluster_scripts_refuse_to_run_outside_the_repository_root(script, tmp_path):
  run = subprocess.run(
    ['bash', os.path.join(LAUNCH, script), '--dry-run'],
    cwd=tmp_path,
    env={k: v for k, v in process_env(4).items() if k != 'SLURM_SUBMIT_DIR'},
    capture_output=True,
    text=True,
  )
  assert run.returncode == 2
  assert run.stderr.strip().endswith('(launch/lib.sh and requirements/ not found)')


def _dry_run(script: str, *args: str, **env: str) -> list[str]:
  run = subprocess.run(
    ['bash', os.path.join(LAUNCH, script), '--dry-run', *args],
    cwd=REPO,
    env={**process_env(4), **env},
    capture_output=True,
    text=True,
    timeout=60,
  )
  assert run.returncode == 0, run.stderr
  return run.stdout.splitlines()


def _pinned_jax(end: str) -> str:
  with open(os.path.join(REPO, 'requirements', f'{end}.txt')) as f:
    return re.search(r'^jax==(\S+)$', f.read(), re.M)[1]


def _ends() -> list[tuple[str, str]]:
  """(Python version, end): the versions requirements/lock.py writes each end's locks for."""
  path = os.path.join(REPO, 'requirements', 'lock.py')
  module_spec = importlib.util.spec_from_file_location('lock', path)
  lock = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(lock)
  return [(f'{v[0]}.{v[1]}', end) for end, versions in lock.ENDS.items() for v in versions]


ENDS = _ends()


def _fake_python(tmp_path, version: str) -> str:
  """An interpreter that says it is Python `version`; its `-m venv DIR` makes DIR/bin/pip, which
  appends its arguments to tmp_path/pip.log."""
  log = tmp_path / 'pip.log'
  pip = f'#!/bin/sh\necho "$*" >> {shlex.quote(str(log))}\n'
  path = tmp_path / f'python{version}'
  path.write_text(
    '#!/bin/sh\n'
    f'if [ "$1" = -c ]; then echo {version}; exit 0; fi\n'
    'if [ "$1 $2" = "-m venv" ]; then\n'
    f'  mkdir -p "$3/bin" && printf %s {shlex.quote(pip)} > "$3/bin/pip" && chmod +x "$3/bin/pip"\n'
    '  exit 0\n'
    'fi\n'
    'exit 1\n'
  )
  path.chmod(0o755)
  return str(path)


MESH = ('--mesh', 'data:-1,model:2', '--sharding=tp')  # the launchers' options, both forms
MESH_FLAGS = '--config.mesh=data:-1,model:2 --config.sharding=tp'  # what vit_jax.main gets


def test_local_dry_run_prints_one_command_per_process():
  lines = _dry_run('local.sh', '3', '--config=configs/digits.py', '--workdir=runs/x', PORT='9999')
  assert lines[-1] == 'wait' and len(lines) == 4
  for i, line in enumerate(lines[:3]):
    assert 'XLA_FLAGS=--xla_force_host_platform_device_count=4' in line
    assert '-m vit_jax.main --coordinator_address=127.0.0.1:9999 --num_processes=3' in line
    assert f'--process_id={i} ' in line and line.endswith('--workdir=runs/x &')
  meshed = _dry_run('local.sh', *MESH, '2', '--config=configs/digits.py', '--workdir=runs/x')
  assert len(meshed) == 3
  for line in meshed[:2]:
    assert line.endswith(f'--config=configs/digits.py --workdir=runs/x {MESH_FLAGS} &'), line


def _launch(script: str, *args: str) -> subprocess.CompletedProcess:
  return subprocess.run(
    ['bash', os.path.join(LAUNCH, script), *args],
    cwd=REPO,
    env={**process_env(4), 'TPU_NAME': 'p', 'ZONE': 'z'},
    capture_output=True,
    text=True,
  )


@pytest.mark.parametrize('script', SCRIPTS)
def test_launcher_options_out_of_place_or_without_a_value_stop_with_one_line(script):
  """After the arguments --mesh would reach vit_jax.main as an unknown flag; without a value
  it would take the next argument."""
  late = _launch(script, '--dry-run', '2', '--config=configs/digits.py', '--mesh=data:-1,model:2')
  assert late.returncode == 2 and late.stdout == ''
  said = 'error: --mesh is an option of this script: put it before the other arguments'
  assert late.stderr.splitlines()[-1] == said
  for args in (('--mesh',), ('--sharding', '--config=configs/digits.py'), ('--mesh=',)):
    bare = _launch(script, '--dry-run', *args)
    assert bare.returncode == 2 and bare.stdout == ''
    name = args[0].rstrip('=')
    said = f'error: {name} needs a value, e.g. --mesh data:-1,model:4 or --sharding tp'
    assert bare.stderr.splitlines()[-1] == said


def test_gpu_benchmark_dry_run_passes_the_mesh_to_every_training_phase():
  lines = [x for x in _dry_run('gpu_benchmark.sh', *MESH, 'out') if x.startswith('== ')]
  phases = {x.split(':')[0][3:]: x for x in lines}
  training = ['policies', 'attention', 'profile', 'lhs', 'triton', 'vit_l', 'vit_h']
  assert sorted(phases) == sorted([*training, 'inference'])
  for name in training:
    assert ' --train --noinference --mesh=data:-1,model:2 --sharding=tp ' in phases[name]
  inference = phases['inference']
  assert '--mesh' not in inference and '--sharding' not in inference


def test_tpu_pod_dry_run_prints_the_gcloud_commands():
  lines = _dry_run(
    'tpu_pod.sh',
    *MESH,
    '--config=configs/vit.py:b16,cifar10',
    '--workdir=/mnt/runs/b16',
    TPU_NAME='vit-pod',
    ZONE='us-central2-b',
    ACCELERATOR_TYPE='v4-32',
  )
  text = '\n'.join(lines)
  base = 'gcloud compute tpus tpu-vm'
  assert f'+ {base} create vit-pod --zone=us-central2-b --accelerator-type=v4-32' in text
  assert f'+ {base} scp ' in text
  ssh = [line for line in lines if line.startswith(f'+ {base} ssh vit-pod')]
  assert len(ssh) == 3 and all('--worker=all' in line for line in ssh)
  assert '--command=cd vit_jax && . launch/lib.sh && ' in ssh[1]
  assert 'python3 -m venv .venv' in ssh[1]  # the workers' python3 unless WORKER_PYTHON says
  assert ssh[2].endswith(
    f"-m vit_jax.main --config=configs/vit.py:b16,cifar10 --workdir=/mnt/runs/b16 {MESH_FLAGS}'"
  )
  cloned = _dry_run('tpu_pod.sh', TPU_NAME='p', ZONE='z', REPO_URL='https://example.org/v.git')
  assert any('git clone -q --branch main https://example.org/v.git vit_jax' in x for x in cloned)


def _worker_installs(tmp_path, python: str) -> subprocess.CompletedProcess:
  """tpu_pod.sh's install command with WORKER_PYTHON=python, run as a worker runs it: in its
  home, the code in vit_jax/."""
  lines = _dry_run('tpu_pod.sh', TPU_NAME='p', ZONE='z', WORKER_PYTHON=python)
  install = next(line for line in lines if ' -m venv ' in line)
  command = next(w for w in shlex.split(install[2:]) if w.startswith('--command='))
  code = tmp_path / 'vit_jax'
  code.mkdir(exist_ok=True)
  for name in ('launch', 'requirements'):
    if not (code / name).exists():
      (code / name).symlink_to(os.path.join(REPO, name))
  return subprocess.run(
    ['bash', '-c', command.removeprefix('--command=')], cwd=tmp_path, capture_output=True, text=True
  )


@pytest.mark.parametrize('version,end', ENDS)
def test_tpu_pod_workers_install_the_lock_of_their_python(version, end, tmp_path):
  worker = _worker_installs(tmp_path, _fake_python(tmp_path, version))
  assert worker.returncode == 0, worker.stderr
  assert (tmp_path / 'pip.log').read_text().splitlines() == [
    'install -q --upgrade pip',
    f'install -q -r requirements/{end}.txt jax[tpu]=={_pinned_jax(end)}',
  ]


@pytest.mark.parametrize('version,end', ENDS)
def test_slurm_dry_run_prints_srun_one_process_per_gpu(version, end, tmp_path):
  python = _fake_python(tmp_path, version)
  lines = _dry_run('slurm_gpu.sh', '--config=configs/digits.py', '--workdir=runs/x', PYTHON=python)
  assert lines[:2] == [
    f'+ {python} -m venv .venv',
    f"+ .venv/bin/pip install -q -r requirements/{end}.txt 'jax[cuda13]=={_pinned_jax(end)}'",
  ]
  assert lines[-1] == (
    '+ srun --kill-on-bad-exit=1 --cpu-bind=none .venv/bin/python -m vit_jax.main '
    '--distributed=on --config=configs/digits.py --workdir=runs/x'
  )
  with open(os.path.join(LAUNCH, 'slurm_gpu.sh')) as f:
    header = dict(re.findall(r'^#SBATCH --([\w-]+)=(\S+)$', f.read(), re.M))
  assert header['ntasks-per-node'] == header['gpus-per-node']  # one process per GPU
  missing = subprocess.run(
    ['bash', os.path.join(LAUNCH, 'slurm_gpu.sh')],
    cwd=REPO,
    env={k: v for k, v in process_env(4).items() if not k.startswith('SLURM')},
    capture_output=True,
    text=True,
  )
  assert missing.returncode == 2 and 'not inside a SLURM job' in missing.stderr


def test_slurm_dry_run_with_a_model_axis_starts_one_process_per_node(tmp_path):
  """The model axis stays within a process: one per node, seeing all the node's GPUs and
  CPUs; a mesh without one keeps one process per GPU."""
  python = _fake_python(tmp_path, '3.11')
  job = {'SLURM_JOB_NUM_NODES': '2', 'SLURM_GPUS_ON_NODE': '4', 'SLURM_CPUS_ON_NODE': '48'}
  flags = ('--config=configs/digits.py', '--workdir=runs/x')
  lines = _dry_run('slurm_gpu.sh', *MESH, *flags, PYTHON=python, **job)
  assert lines[-1] == (
    '+ srun --kill-on-bad-exit=1 --cpu-bind=none --ntasks=2 --ntasks-per-node=1 '
    '--cpus-per-task=48 env JAX_LOCAL_DEVICE_IDS=0,1,2,3 .venv/bin/python -m vit_jax.main '
    f'--distributed=on --config=configs/digits.py --workdir=runs/x {MESH_FLAGS}'
  )
  for mesh in ('fsdp:-1', 'data:-1,model:1'):
    lines = _dry_run('slurm_gpu.sh', f'--mesh={mesh}', *flags, PYTHON=python, **job)
    assert lines[-1] == (
      '+ srun --kill-on-bad-exit=1 --cpu-bind=none .venv/bin/python -m vit_jax.main '
      f'--distributed=on --config=configs/digits.py --workdir=runs/x --config.mesh={mesh}'
    )


def test_a_python_outside_the_ends_stops_the_scripts_with_one_line(tmp_path):
  python310 = _fake_python(tmp_path, '3.10')
  for python, said in ((python310, 'Python 3.10'), ('python3.99-missing', 'not found')):
    run = subprocess.run(
      ['bash', os.path.join(LAUNCH, 'slurm_gpu.sh'), '--dry-run'],
      cwd=REPO,
      env={**process_env(4), 'PYTHON': python},
      capture_output=True,
      text=True,
    )
    assert run.returncode == 2 and run.stdout == '', run.stdout
    expected = f'error: {python} is {said}: the project runs on 3.11, 3.12 or 3.13; name one with'
    assert run.stderr == f'{expected} PYTHON=\n'
  worker = _worker_installs(tmp_path, python310)
  assert worker.returncode == 2 and not (tmp_path / 'pip.log').exists()
  assert worker.stderr == (
    f'error: {python310} is Python 3.10: the project runs on 3.11, 3.12 or 3.13;'
    ' name one with WORKER_PYTHON=\n'
  )


def test_h14_fsdp_state_fits_16_gb_devices():
  """The memory arithmetic of configs/vit_h14_fsdp.py, from the real parameter shapes."""
  config = vit_h14_fsdp.get_config('imagenet21k')
  assert (config.sharding, config.model.remat_policy, config.dtype) == ('fsdp', 'full', 'bfloat16')
  shapes = families.param_shapes(model_from_config(config.model, num_classes=21843), 224)
  n = stats.count_params(shapes)
  assert n == 660_385_363
  mesh = parallel.create_mesh()  # 8 devices
  shardings = parallel.tree_shardings(shapes, mesh, config.sharding)

  def per_device(x, s):
    shard = s.shard_shape(x.shape)
    return int(np.prod(shard, dtype=np.int64))

  local = sum(jax.tree.leaves(jax.tree.map(per_device, shapes, shardings)))
  # Weight, gradient and two Adam moments in float32: 16 bytes per parameter.
  assert 16 * n > 10.5e9  # replicated: two thirds of a 16 GB device before any activation
  # Every large leaf is split 8 ways; leaves under parallel.FSDP_MIN_SIZE (biases, LayerNorms:
  # 0.56M parameters) stay whole.
  assert local == pytest.approx(n / 8, rel=0.01)
  assert 16 * local < 1.34e9
  block = stats.count_params(shapes['Transformer']['encoderblock_0'])
  assert 4 * block < 80e6  # one block gathered in float32 while it computes


# ----------------------------------------------------------------------------------------
# Faults of one process: SIGTERM, SIGKILL, a non-finite value. Each process is started on
# its own (its output in a file), so that a test can signal one of them.
# ----------------------------------------------------------------------------------------

PEER_TIMEOUT_S = 15  # --distributed_timeout of these runs: the bound on every wait


def _start_processes(
  workdir, tmp_path, flags=(), per_process=((), ()), tag='run', env=None, wrap=((), ())
):
  """2 processes of 4 devices on 127.0.0.1, `flags` for both, `per_process[i]` for process i,
  `env` added to their environment, process i's command run by the command `wrap[i]`.

  Returns [(Popen, read_output)]; output (stdout and stderr) goes to files.
  """
  port = _free_port()
  started = []
  for i, own in enumerate(per_process):
    log = tmp_path / f'{tag}_{i}.log'
    with open(log, 'w') as out:
      process = subprocess.Popen(
        [
          *wrap[i],
          sys.executable,
          '-m',
          'vit_jax.main',
          *_flags(workdir),
          f'--coordinator_address=127.0.0.1:{port}',
          '--num_processes=2',
          f'--process_id={i}',
          f'--distributed_timeout={PEER_TIMEOUT_S}',
          *flags,
          *own,
        ],
        cwd=REPO,
        env={**process_env(4), **(env or {})},
        stdout=out,
        stderr=subprocess.STDOUT,
        text=True,
      )
    started.append((process, log.read_text))
  return started


@pytest.fixture
def processes(tmp_path):
  """`_start_processes`; whatever still runs at the end of the test is killed."""
  started = []

  def start(*args, **kwargs):
    started.extend(_start_processes(*args, **kwargs))
    return started[-2:]

  yield start
  for process, _ in started:
    if process.poll() is None:
      process.kill()
      process.wait()


def _wait_until(ready, started, timeout=RUN_TIMEOUT_S):
  start = time.monotonic()
  while not ready():
    for process, output in started:
      assert process.poll() is None, output()
    assert time.monotonic() - start < timeout, f'{ready.__doc__} did not happen'
    time.sleep(0.05)


def _last_step(workdir) -> int:
  steps = [m['step'] for m in rundir.read_metrics(workdir) if 'loss' in m]
  return steps[-1] if steps else 0


def _error_lines(output: str) -> list[str]:
  return [line for line in output.splitlines() if line.startswith('Error: ')]


@pytest.mark.serial
def test_sigterm_to_one_process_stops_both_at_one_step_and_sigkill_is_bounded(tmp_path, processes):
  """SIGTERM to process 1 only, at a random step: both save the same step and exit 0. A
  SIGKILL of process 1 at the resumed run's first save ends process 0 within the bound, with
  one line (the save's sync between the processes fails; the disk is not to blame).
  The run resumed after both ends exactly like an uninterrupted one on the same 2 processes.
  All four runs use the rbg PRNG, with dropout on so that the key matters: multi-host stop and
  resume under rbg (its bits may depend on the sharding, so 2 x 4 is not compared to 1 x 8)."""
  workdir = str(tmp_path / 'run')
  steps, every = 16, 4  # a checkpoint every 4 steps; one evaluation a run and no few-shot one
  # (the claim is on the parameters and losses)
  flags = [f'--config.total_steps={steps}', f'--config.checkpoint_every={every}']
  flags += [f'--config.eval_every={steps}', '--config.fewshot_every=0']
  flags.append('--config.model.transformer.dropout_rate=0.1')
  rbg = {'JAX_DEFAULT_PRNG_IMPL': 'rbg'}
  started = processes(workdir, tmp_path, flags, tag='term', env=rbg)
  at = random.randint(2, 8)  # room after the stop for the resumed run to reach its next save

  def reached():
    """the random step"""
    return _last_step(workdir) >= at

  _wait_until(reached, started)
  started[1][0].send_signal(signal.SIGTERM)
  codes = [p.wait(timeout=RUN_TIMEOUT_S) for p, _ in started]
  assert codes == [0, 0], [out() for _, out in started]
  stopped = rundir.latest_step(workdir)
  assert at <= stopped < steps - 2, (at, stopped)
  assert (
    f'Stopping at step {stopped}: checkpoint saved, rerun to resume (SIGTERM on process 1)'
    in (started[0][1]())
  )
  assert not _error_lines(started[1][1]())
  meta = json.loads(
    (tmp_path / 'run' / 'checkpoints' / str(stopped) / 'meta' / 'metadata').read_text()
  )
  assert meta['step'] == stopped and meta['global_batch'] == OVERRIDES['batch']
  assert meta['prng_impl'] == 'rbg', meta

  started = processes(workdir, tmp_path, flags, tag='kill', env=rbg)
  save = stopped - stopped % every + every  # the resumed run's first save: orbax syncs them
  assert save < steps

  def trained_on():
    """the step of the next save (its metrics are written just before the save starts)"""
    return _last_step(workdir) >= save

  _wait_until(trained_on, started)
  started[1][0].send_signal(signal.SIGKILL)
  killed = time.monotonic()
  code = started[0][0].wait(timeout=RUN_TIMEOUT_S)
  waited = time.monotonic() - killed
  assert code == 1, started[0][1]()
  # The bound: the peer watch's timeout and one poll period (docs/multihost.md), plus slack for
  # 2 cores.
  assert waited < PEER_TIMEOUT_S * 1.1 + 15, waited
  assert _error_lines(started[0][1]()) == [
    f'Error: Process 0: process 1 of 2 has been silent for {PEER_TIMEOUT_S} s (killed, hung, '
    'failed or its host gone): stopping; rerun every process to resume from the last checkpoint.'
  ]

  started = processes(workdir, tmp_path, flags, tag='resume', env=rbg)
  codes = [p.wait(timeout=RUN_TIMEOUT_S) for p, _ in started]
  assert codes == [0, 0], [out() for _, out in started]
  assert rundir.latest_step(workdir) == steps
  # The uninterrupted run, on the same 2 processes (another topology sums in another order).
  reference = str(tmp_path / 'reference')
  started = processes(reference, tmp_path, flags, tag='reference', env=rbg)
  codes = [p.wait(timeout=RUN_TIMEOUT_S) for p, _ in started]
  assert codes == [0, 0], [out() for _, out in started]
  assert_trained_params_close(_final_params(workdir), _final_params(reference), atol=1e-6)
  losses = [[m['loss'] for m in _metrics(w) if 'loss' in m] for w in (workdir, reference)]
  np.testing.assert_allclose(*losses, atol=1e-6, rtol=0)


def test_non_finite_on_one_process_stops_both_at_the_same_step(tmp_path, processes, two_processes):
  """Process 1's replica of the parameters turns non-finite (its learning rate is inf), process
  0's stays finite: both stop at that step, and the last good checkpoint stays untouched."""
  workdir = _truncate_to_step_3(two_processes[0], str(tmp_path / 'run'))
  good = os.path.join(workdir, 'checkpoints', '3')
  before = digest(good)
  started = processes(workdir, tmp_path, per_process=((), ('--config.base_lr=inf',)))
  codes = [p.wait(timeout=RUN_TIMEOUT_S) for p, _ in started]
  outputs = [out() for _, out in started]
  assert codes == [1, 1], outputs
  for output in outputs:
    (line,) = _error_lines(output)
    assert re.match(
      r'Error: Non-finite parameters at step 4 \(seen by process 1\), with a finite loss '
      r'\(\S+\): run stopped\. Last good checkpoint \(step 3\)',
      line,
    ), line
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['3']
  assert digest(good) == before


def _read_only(path: str) -> list[str]:
  """A command prefix: what follows runs in a mount namespace of its own where `path` is
  read-only (for it alone: the other processes write there as before)."""
  remount = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
  return ['unshare', '--mount', '--propagation', 'private', 'sh', '-c', remount, path]


# The write-failure runs resume the step-3 checkpoint and save every step, so that the next
# save (step 4) fails before the evaluations of step 6; no few-shot evaluation either.
FAILING_SAVE = 4
FAILING_FLAGS = ['--config.checkpoint_every=1', '--config.fewshot_every=0']


def _assert_both_stop_at_the_next_save(started, workdir, good, process, cause_and_fix):
  """Both processes exit 1 with the same one line, `Error: process P: Cannot write checkpoint
  .../4 (CAUSE): FIX, then rerun ...` (P matching the regex `process`), no traceback, and
  step 3 alone kept, byte for byte its `good` digest."""
  codes = [p.wait(timeout=RUN_TIMEOUT_S) for p, _ in started]
  outputs = [out() for _, out in started]
  assert codes == [1, 1], outputs
  lines = [_error_lines(o) for o in outputs]
  assert lines[0] == lines[1] and len(lines[0]) == 1, outputs
  checkpoints = rundir.checkpoint_dir(workdir)
  assert re.fullmatch(
    rf'Error: process {process}: Cannot write checkpoint {re.escape(checkpoints)}/{FAILING_SAVE} '
    + re.escape(
      f'{cause_and_fix}, then rerun the same command to resume (step 3 is kept; the partial '
      'write is removed at the next start).'
    ),
    lines[0][0],
  ), lines[0][0]
  assert 'Traceback' not in outputs[0] + outputs[1]
  assert rundir.checkpoint_steps(checkpoints) == [3]
  assert digest(os.path.join(checkpoints, '3')) == good


@pytest.mark.skipif(os.geteuid() != 0, reason='a mount namespace needs root (CI runs as root)')
def test_a_write_that_fails_on_one_process_only_stops_both_with_its_line(
  tmp_path, processes, two_processes
):
  """Process 1 sees the run directory read-only, process 0 writes as before: process 1's
  part of the step-4 save fails while process 0's succeeds. orbax's own barriers would keep
  both waiting for 20 minutes (process 0 at the commit, process 1 at the next barrier); both
  exit 1 at once with process 1's line, and step 3 is kept byte for byte."""
  workdir = _truncate_to_step_3(two_processes[0], str(tmp_path / 'run'))
  good = digest(os.path.join(workdir, 'checkpoints', '3'))
  started = processes(workdir, tmp_path, FAILING_FLAGS, tag='ro', wrap=((), _read_only(workdir)))
  _assert_both_stop_at_the_next_save(
    started, workdir, good, '1', '(a read-only filesystem): remount it read-write'
  )


@pytest.mark.skipif(os.geteuid() != 0, reason='mounting a tmpfs needs root (CI runs as root)')
def test_a_full_disk_at_a_save_stops_both_processes_with_one_line(
  tmp_path, processes, one_process, two_processes
):
  """The step-3 run on a tmpfs, filled by another file but for 200 KiB (less than a step,
  whose size varies with the write's timing): the step-4 save fails, both processes exit 1
  with the same one line (the vote on the write), step 3 is kept byte for byte. Grown, the
  run resumes, removes the partial write and ends as the uninterrupted one; it resumes here
  on 1 process of 8 devices, which costs no start of two processes (the same command on
  the same processes resumes in test_checkpoint_faults and in the SIGTERM test)."""
  mount = tmp_path / 'disk'
  with full_tmpfs(mount) as fill:
    workdir = _truncate_to_step_3(two_processes[0], str(mount / 'run'))
    good = digest(os.path.join(workdir, 'checkpoints', '3'))
    fill()
    started = processes(workdir, tmp_path, FAILING_FLAGS, tag='full')
    _assert_both_stop_at_the_next_save(
      started,
      workdir,
      good,
      '[01]',
      '(no space left on the device): free space or grow the filesystem',
    )
    checkpoints = rundir.checkpoint_dir(workdir)
    assert f'{FAILING_SAVE}.orbax-checkpoint-tmp' in os.listdir(checkpoints)
    subprocess.run(['mount', '-o', 'remount,size=16m', str(mount)], check=True)
    assert _run_here(workdir, data_shards=0)['status'] == 'done'  # 0: the checkpoint's 2 shards
    assert sorted(os.listdir(checkpoints)) == ['3', '6']
    assert digest(os.path.join(checkpoints, '3')) == good
    _assert_same_run(workdir, one_process)
