"""Atomic file writes: a reader sees the old file or the whole new one, never half of it."""

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> None:
  """Writes `path` through a temporary file in the same folder and renames it into place.

  A failure at any point (a bad tree, a full disk, Ctrl-C) leaves `path` as it was.
  """
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f'.{path.name}.', suffix='.tmp')
  try:
    with os.fdopen(fd, 'wb') as f:
      write(f)
      f.flush()
      os.fsync(f.fileno())
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
  """`atomic_write` of UTF-8 text."""
  atomic_write(path, lambda f: f.write(text.encode()))
