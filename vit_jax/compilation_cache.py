"""The persistent XLA compilation cache that the commands (and the tests) keep between runs.

A command's programs are compiled again on every call unless jax finds them in a persistent
cache: `vit-predict` on a ViT-B/16 spends seconds compiling the same forward pass each time.
Every command (`vit_jax.cli.start`) enables one folder for that, outside any run directory:

  $VIT_JAX_COMPILATION_CACHE   a folder, or `off` for none
  else                          vit_jax/xla under $XDG_CACHE_HOME, or ~/.cache

Where jax's own `JAX_COMPILATION_CACHE_DIR` is set, jax uses it and nothing here changes it
(the tests set it for the commands they run). jax keys each entry by the program, jaxlib's
version, the platform, the XLA flags, the compile options and the devices, so environments of
other versions share the folder unharmed, and a program compiled under other XLA_FLAGS or
device counts is compiled anew. jax's own eviction stays off (its size-bounded cache rescans
the folder on every write): the folder is cut to `CAP_BYTES` by last access when a command
starts. Deleting the folder clears it. Programs that compile in 0.1 s or more are kept (jax's
default is 1 s; `JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS` sets another).
"""

import contextlib
import os
import sys
from pathlib import Path

ENV = 'VIT_JAX_COMPILATION_CACHE'
CAP_BYTES = 2**30
JAX_ENV = 'JAX_COMPILATION_CACHE_DIR'  # jax's own setting, read when jax is imported
# jax keeps only programs that took a second or more to compile; a ViT-B/16's forward pass takes
# 0.45 s on a 2-core CPU, and its start was what a second command call should skip.
MIN_COMPILE_TIME_ENV = 'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS'
MIN_COMPILE_TIME_S = 0.1


def folder(setting: str | None) -> Path | None:
  """The cache folder a setting names: a path, `off` (None), or unset or empty (the default,
  vit_jax/xla under $XDG_CACHE_HOME or ~/.cache)."""
  if setting == 'off':
    return None
  if setting:
    return Path(setting)
  return Path(os.environ.get('XDG_CACHE_HOME') or Path.home() / '.cache') / 'vit_jax' / 'xla'


def prune(directory: Path, cap: int = CAP_BYTES) -> None:
  """Deletes the files of `directory` read longest ago (by access time, or modification time
  where later) until it holds at most `cap` bytes."""
  files = []
  for entry in os.scandir(directory):
    with contextlib.suppress(FileNotFoundError):  # another process's prune took it
      if entry.is_file():
        stat = entry.stat()
        files.append((max(stat.st_atime, stat.st_mtime), stat.st_size, entry.path))
  size = sum(bytes_ for _, bytes_, _ in files)
  for _, bytes_, path in sorted(files):
    if size <= cap:
      break
    with contextlib.suppress(FileNotFoundError):
      os.remove(path)
    size -= bytes_


def for_command() -> Path | None:
  """Enables the commands' cache in this process (before anything compiles); returns its
  folder: jax's own `JAX_COMPILATION_CACHE_DIR` where set, else `folder()` of
  $VIT_JAX_COMPILATION_CACHE, made and pruned here. A folder that cannot be made costs only
  the cache: one line on stderr."""
  if os.environ.get(JAX_ENV):
    return Path(os.environ[JAX_ENV])
  directory = folder(os.environ.get(ENV))
  if directory is None:
    return None
  try:
    directory.mkdir(parents=True, exist_ok=True)
    prune(directory)
  except OSError as error:
    print(
      f'compilation cache off: cannot use {directory} ({error.strerror}); '
      f'set {ENV} to a writable folder, or to off',
      file=sys.stderr,
    )
    return None
  _set(JAX_ENV, str(directory))
  if not os.environ.get(MIN_COMPILE_TIME_ENV):
    _set(MIN_COMPILE_TIME_ENV, MIN_COMPILE_TIME_S)
  return directory


def _set(env: str, value: str | float) -> None:
  """A jax setting: in the environment, which jax reads as it loads (a command checks its
  arguments before it imports jax, 1-2 s), or on jax's config where it is loaded."""
  if 'jax' in sys.modules:
    sys.modules['jax'].config.update(env.lower(), value)
  else:
    os.environ[env] = str(value)
