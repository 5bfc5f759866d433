"""The path layer: every file the project reads or writes is reached through `path()`.

A path is a local path or a bucket URL (`gs://bucket/...`; also `s3://`, `az://`); either
becomes an `etils.epath.Path`, the path type orbax itself uses, so the run directory, its
checkpoints, pretrained files, datasets and every tool's inputs and outputs take both.

Bucket paths go through fsspec (gcsfs for gs://) whatever else is installed: `EPATH_USE_TF`
defaults to false here, else etils would take TensorFlow's GCS client when TensorFlow is
installed (one backend for every file, and the one a Cloud Storage emulator can serve:
`STORAGE_EMULATOR_HOST`). Set EPATH_USE_TF=true in the environment to use tf.io.gfile.

Writes are atomic: a reader sees the old file or the whole new one, never half of it. A
local file is written to a temporary file and renamed into place; a bucket object is
written whole on close (Cloud Storage uploads are atomic per object).

A bucket that cannot be reached is a `StorageError` naming the path, after one connection
attempt of at most `CONNECT_TIMEOUT_S` seconds (gcsfs would retry for about half a minute).
"""

import logging
import os
import socket
import tempfile
import urllib.parse
from collections.abc import Callable
from typing import BinaryIO

os.environ.setdefault('EPATH_USE_TF', 'false')

from etils import epath

# gcsfs logs each failed request with its traceback before raising; the raised error is
# reported (in one line) by whoever called.
logging.getLogger('gcsfs').setLevel(logging.CRITICAL)

PathLike = str | os.PathLike
CONNECT_TIMEOUT_S = 10.0
_GCS_ENDPOINT = 'https://storage.googleapis.com'
_REACHED: set[str] = set()  # endpoints connected to once in this process


class StorageError(OSError):
  """A bucket path that cannot be reached; the message is one line naming the path."""


def is_local(p: PathLike) -> bool:
  """A path on this machine (not a `scheme://` URL)."""
  return '://' not in os.fspath(p)


def path(p: PathLike) -> epath.Path:
  """`p` as an epath.Path; a bucket path's storage endpoint is checked once per process."""
  if not is_local(p):
    _check_endpoint(os.fspath(p))
  return epath.Path(p)


def absolute(p: PathLike) -> str:
  """An absolute local path (orbax's tensorstore specs need one), or the URL unchanged."""
  return os.path.abspath(p) if is_local(p) else os.fspath(p)


def join(p: PathLike, *parts: str) -> str:
  """`p/part/...` as a string, for local paths and URLs alike."""
  return os.fspath(epath.Path(p).joinpath(*parts)) if parts else os.fspath(p)


def makedirs(p: PathLike) -> None:
  """Creates a local folder and its parents; a bucket needs none (objects make their folders)."""
  if is_local(p):
    os.makedirs(p, exist_ok=True)


def _endpoint(url: str) -> str | None:
  """The HTTP endpoint a bucket URL is served from (None: a scheme not checked here)."""
  if url.startswith('gs://'):
    return os.environ.get('STORAGE_EMULATOR_HOST') or _GCS_ENDPOINT
  return None


def _check_endpoint(url: str) -> None:
  """One connection to the storage endpoint of `url`, the first time it is used."""
  endpoint = _endpoint(url)
  if endpoint is None or endpoint in _REACHED:
    return
  parsed = urllib.parse.urlsplit(endpoint if '://' in endpoint else f'http://{endpoint}')
  port = parsed.port or (443 if parsed.scheme == 'https' else 80)
  try:
    socket.create_connection((parsed.hostname, port), timeout=CONNECT_TIMEOUT_S).close()
  except OSError as e:
    raise StorageError(
      f'{url}: Cloud Storage at {endpoint} cannot be reached ({e.strerror or e}); check the '
      'network (or STORAGE_EMULATOR_HOST for an emulator).'
    ) from None
  _REACHED.add(endpoint)


def atomic_write(p: PathLike, write: Callable[[BinaryIO], None]) -> None:
  """Writes `p` whole or not at all; a failure at any point (a bad tree, a full disk,
  Ctrl-C) leaves `p` as it was."""
  if not is_local(p):
    with path(p).open('wb') as f:  # the object appears on close, whole
      write(f)
    return
  _atomic_write_local(os.fspath(p), write)


def _atomic_write_local(p: str, write: Callable[[BinaryIO], None]) -> None:
  """Through a temporary file in the same folder, renamed into place."""
  folder, name = os.path.split(os.path.abspath(p))
  os.makedirs(folder, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=folder, prefix=f'.{name}.', suffix='.tmp')
  try:
    with os.fdopen(fd, 'wb') as f:
      write(f)
      f.flush()
      os.fsync(f.fileno())
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    os.replace(tmp, p)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


def atomic_write_text(p: PathLike, text: str) -> None:
  """`atomic_write` of UTF-8 text."""
  atomic_write(p, lambda f: f.write(text.encode()))


def copy_tree(local_dir: str, dest: PathLike) -> None:
  """Copies the files below the local folder `local_dir` to `dest` (a folder or bucket path)."""
  for folder, _, names in os.walk(local_dir):
    for name in names:
      source = os.path.join(folder, name)
      relative = os.path.relpath(source, local_dir)
      with open(source, 'rb') as f:
        data = f.read()
      atomic_write(join(dest, *relative.split(os.sep)), lambda out, data=data: out.write(data))


class AppendFile:
  """A file written by appending, each write visible to readers when `write` returns.

  A local file is appended to and flushed (a process killed mid-write leaves at most a torn
  last write). A bucket object cannot be appended to: it is rewritten whole, with everything
  written so far, at each write (fine for the small logs this is for).
  """

  def __init__(self, p: PathLike, initial: bytes = b''):
    """Starts the file as `initial` (replacing what was there), atomically."""
    self.path = os.fspath(p)
    atomic_write(self.path, lambda f: f.write(initial))
    self._local = is_local(self.path)
    self._data = bytearray() if self._local else bytearray(initial)
    self._file = open(self.path, 'ab') if self._local else None  # noqa: SIM115  (kept open)
    self.closed = False

  def write(self, data: bytes) -> None:
    if self._file is not None:
      self._file.write(data)
      self._file.flush()
      return
    self._data += data
    atomic_write(self.path, lambda f: f.write(self._data))

  def flush(self) -> None:
    """Every write is already flushed."""

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
    self.closed = True
