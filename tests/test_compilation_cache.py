"""The test suite's XLA compilation cache (tests/conftest.py): where it lives, that jax writes
the session's programs there, and that the folder is cut to its cap by last access."""

import os
import time
from pathlib import Path
from types import SimpleNamespace

import jax
import numpy as np
import pytest
from conftest import CACHE_ENV, kept_cache_dir, prune_cache, pytest_configure


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
