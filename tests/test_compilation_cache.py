"""The persistent XLA compilation cache: the commands' (vit_jax.compilation_cache), which a
second call of a command reads instead of compiling, and the test suite's (tests/conftest.py):
where they live, that jax writes the programs there, and that the folder is cut to its cap by
last access."""

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import jax
import numpy as np
import pytest
from conftest import CACHE_ENV, kept_cache_dir, pytest_configure
from PIL import Image

from vit_jax import checkpoint, compilation_cache
from vit_jax.compilation_cache import prune as prune_cache
from vit_jax.models import get_model

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
  ('setting', 'xdg', 'expected'),
  [
    (None, None, 'home/.cache/vit_jax/xla'),
    (None, 'xdg', 'xdg/vit_jax/xla'),
    ('elsewhere', 'xdg', 'elsewhere'),
    ('off', 'xdg', None),
  ],
)
def test_the_kept_folder_follows_the_environment(monkeypatch, tmp_path, setting, xdg, expected):
  monkeypatch.setenv('HOME', str(tmp_path / 'home'))
  for name, value in ((CACHE_ENV, setting), ('XDG_CACHE_HOME', xdg)):
    if value is None:
      monkeypatch.delenv(name, raising=False)
    else:
      monkeypatch.setenv(name, str(tmp_path / value) if value != 'off' else value)
  assert kept_cache_dir() == (expected and tmp_path / expected)


def test_a_folder_that_cannot_be_made_stops_the_run_with_one_line(monkeypatch, tmp_path):
  (tmp_path / 'file').write_bytes(b'')
  monkeypatch.setenv(CACHE_ENV, str(tmp_path / 'file' / 'xla'))
  with pytest.raises(pytest.UsageError) as info:
    pytest_configure(SimpleNamespace(workerinput={}))
  assert str(info.value) == (
    f'cannot make the XLA cache folder {tmp_path}/file/xla (Not a directory): '
    'set VIT_JAX_TEST_CACHE to a writable folder, or to off'
  )


def test_the_session_compiles_into_its_cache(session_compilation_cache):
  def cache_probe(x):
    return x * 3 + 1

  for earlier in Path(session_compilation_cache).glob('jit_cache_probe-*'):
    earlier.unlink()  # a run before this one wrote it
  np.testing.assert_array_equal(jax.jit(cache_probe)(np.arange(4.0)), [1, 4, 7, 10])
  assert os.environ['JAX_COMPILATION_CACHE_DIR'] == str(session_compilation_cache)  # children's
  assert list(Path(session_compilation_cache).glob('jit_cache_probe-*'))


def test_the_prune_drops_the_files_read_longest_ago(tmp_path):
  now = time.time()
  day = 86400
  # name: (bytes, last read, last written), in days before now
  files = {'read_long_ago': (300, 9, 10), 'rewritten': (200, 9, 1), 'read_today': (400, 0, 5)}
  for name, (size, read, written) in files.items():
    (tmp_path / name).write_bytes(b'x' * size)
    os.utime(tmp_path / name, (now - read * day, now - written * day))

  prune_cache(tmp_path, 900)  # 900 bytes: everything stays
  assert sorted(p.name for p in tmp_path.iterdir()) == sorted(files)
  prune_cache(tmp_path, 650)  # the least recent, read 9 days ago, goes
  assert sorted(p.name for p in tmp_path.iterdir()) == ['read_today', 'rewritten']
  prune_cache(tmp_path, 399)  # both go: written a day ago, then the one read today
  assert list(tmp_path.iterdir()) == []


def _predict(checkpoint_path: str, image: str, **env: str) -> subprocess.CompletedProcess:
  """`python -m vit_jax.predict` as a user runs it: no cache folder of jax's own set."""
  environment = {k: v for k, v in os.environ.items() if k != compilation_cache.JAX_ENV}
  return subprocess.run(
    [sys.executable, '-m', 'vit_jax.predict', f'--checkpoint={checkpoint_path}', '--json', image],
    cwd=REPO, capture_output=True, text=True, timeout=300, env={**environment, **env},
  )  # fmt: skip


def test_a_second_command_reads_its_programs_from_the_cache(tmp_path, random_params):
  """vit-predict twice on one folder: the first compiles and writes its programs, the second
  finds every one there (jax logs each hit under JAX_LOG_COMPILES) and writes none."""
  model = get_model('testing', num_classes=3)
  x = np.zeros((1, 32, 32, 3), np.float32)
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), x, train=False))['params']
  checkpoint.save_npz(random_params(shapes), tmp_path / 'm.npz')
  Image.new('RGB', (40, 30), (200, 10, 90)).save(tmp_path / 'a.png')
  folder = tmp_path / 'cache'
  env = {
    compilation_cache.ENV: str(folder),
    'JAX_LOG_COMPILES': '1',
    'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS': '0',  # this tiny model compiles in no time
  }
  runs = []
  for _ in range(2):
    run = _predict(str(tmp_path / 'm.npz'), str(tmp_path / 'a.png'), **env)
    assert run.returncode == 0, run.stderr[-2000:]
    runs.append((run, sorted(p.name for p in folder.iterdir())))
  (first, written), (second, kept) = runs
  assert written and 'Persistent compilation cache hit' not in first.stderr
  compiled = first.stderr.count('Finished XLA compilation of ')
  assert second.stderr.count('Persistent compilation cache hit') == compiled > 0
  assert kept == written
  assert json.loads(second.stdout) == json.loads(first.stdout)


def test_the_commands_folder_follows_the_environment(monkeypatch, tmp_path):
  """jax's own setting wins and is left to jax; `off` turns the cache off; a folder that
  cannot be made leaves it off with one line (the command still runs)."""
  monkeypatch.setenv(compilation_cache.JAX_ENV, str(tmp_path / 'jax_own'))
  monkeypatch.setenv(compilation_cache.ENV, str(tmp_path / 'ours'))
  assert compilation_cache.for_command() == tmp_path / 'jax_own'
  assert not (tmp_path / 'ours').exists()
  monkeypatch.delenv(compilation_cache.JAX_ENV)
  monkeypatch.setenv(compilation_cache.ENV, 'off')
  assert compilation_cache.for_command() is None
  (tmp_path / 'file').write_bytes(b'')
  monkeypatch.setenv(compilation_cache.ENV, str(tmp_path / 'file' / 'xla'))
  stderr = io.StringIO()
  monkeypatch.setattr(sys, 'stderr', stderr)
  assert compilation_cache.for_command() is None
  assert stderr.getvalue() == (
    f'compilation cache off: cannot use {tmp_path}/file/xla (Not a directory); '
    'set VIT_JAX_COMPILATION_CACHE to a writable folder, or to off\n'
  )
