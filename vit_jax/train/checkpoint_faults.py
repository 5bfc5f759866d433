"""A checkpoint write that fails (a full disk, a quota, a permission, a read-only mount):
its cause read off the exception orbax or TensorStore raised, as one line with the fix.

orbax writes a step asynchronously into `<step>.orbax-checkpoint-tmp` and renames it to
`<step>` once every file is written; a failed write leaves only the tmp directory, which
orbax removes when the next run opens the checkpoints (`cleanup_tmp_directories`). Each of
the failed write's threads and tasks also logs its own traceback (orbax's
`_SignalingThread.run() raised an exception`, asyncio's `... exception was never
retrieved`): `drop_write_failure_tracebacks()` drops those, and only those, since the one
line says it all.
"""

import errno
import logging
import re
from collections.abc import Callable

import jax

from vit_jax import distributed

# (cause, fix) by errno, and the same errno as TensorStore writes it in its messages.
_CAUSES = {
  errno.ENOSPC: ('no space left on the device', 'free space or grow the filesystem'),
  errno.EDQUOT: ('the disk quota is exceeded', 'raise the quota or free space'),
  errno.EACCES: ('permission denied', 'make the directory writable for this user'),
  errno.EPERM: ('operation not permitted', 'make the directory writable for this user'),
  errno.EROFS: ('a read-only filesystem', 'remount it read-write'),
  # Two causes without an errno of their own, under the nearest one: TensorStore and XLA
  # report both as RESOURCE_EXHAUSTED, which alone says nothing of the disk.
  errno.EAGAIN: ("the bucket's rate limit, HTTP 429",
                 'save less often (a larger --config.checkpoint_every) or raise the quota'),
  errno.ENOMEM: ('out of memory while copying the state to save it',
                 'free device or host memory (a smaller --config.batch)'),
}  # fmt: skip
_WORDS = (  # how each cause reads where the errno is only in the text, specific ones first
  ('No space left on device', errno.ENOSPC),
  ('Disk quota exceeded', errno.EDQUOT),
  ('Read-only file system', errno.EROFS),
  ('Permission denied', errno.EACCES),
  ('Too Many Requests', errno.EAGAIN),
  ('rateLimitExceeded', errno.EAGAIN),
  ('HTTP response code: 429', errno.EAGAIN),
  ('Out of memory', errno.ENOMEM),
  ('out of memory', errno.ENOMEM),
  ('quota', errno.EDQUOT),
  ('PERMISSION_DENIED', errno.EACCES),
  ('AccessDenied', errno.EACCES),
)
_OS_ERROR_CODE = re.compile(r"os_error_code='?(\d+)")


class CheckpointWriteError(OSError):
  """A checkpoint could not be written; the message names the path, the cause and the fix."""

  from_peer = False  # True when it is another process's failed write, seen here


def _chain(e: BaseException | None):
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    yield e
    e = e.__cause__ or e.__context__


def storage_errno(e: BaseException | None) -> int | None:
  """The errno of a failed write (ENOSPC, EDQUOT, EACCES, EPERM, EROFS; EAGAIN for a
  bucket's rate limit, ENOMEM for exhausted memory) in `e` or its causes, from an OSError's
  errno or a TensorStore or XLA message's text; None for any other error."""
  for link in _chain(e):
    if isinstance(link, OSError) and link.errno in _CAUSES:
      return link.errno
    text = str(link)
    code = _OS_ERROR_CODE.search(text)
    if code and int(code.group(1)) in _CAUSES:
      return int(code.group(1))
    for word, number in _WORDS:
      if word in text:
        return number
  return None


def is_collective_failure(e: BaseException) -> bool:
  """Whether `e` is a device collective that failed (orbax syncs the processes of a save
  through one; gloo or NCCL raise when a peer dies), not a failed storage write."""
  return isinstance(e, jax.errors.JaxRuntimeError) and storage_errno(e) is None


def _first_line(e: BaseException) -> str:
  return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


def failure_note(e: BaseException) -> str:
  """A short line for the other processes that keeps the cause `storage_errno` reads."""
  return f'{_first_line(e)} [os_error_code={storage_errno(e)}]'


def write_failure(path: str, e: BaseException, kept: list[int]) -> CheckpointWriteError:
  """The one-line error of a failed write of the step directory `path`."""
  number = storage_errno(e)
  cause, fix = _CAUSES.get(number, (_first_line(e), 'check the filesystem of --workdir'))
  steps = kept_steps(kept)
  error = CheckpointWriteError(
    f'Cannot write checkpoint {path} ({cause}): {fix}, then rerun the same command to resume '
    f'({steps} kept; the partial write is removed at the next start).'
  )
  error.errno = number
  error.from_peer = from_peer(e)
  return error


def kept_steps(kept: list[int]) -> str:
  """'step 3 is', 'steps 3, 6 are', 'no earlier step is'."""
  if not kept:
    return 'no earlier step is'
  return f'step {kept[0]} is' if len(kept) == 1 else f'steps {", ".join(map(str, kept))} are'


class _WriteFailureTracebacks(logging.Filter):
  """Drops a record whose exception is a failed storage write (the one line follows), and
  passes each one of this process to `on_failure`: orbax's threads log a failure when it
  happens, long before the main thread waits for the write."""

  def __init__(self):
    super().__init__()
    self.on_failure: Callable[[BaseException], None] | None = None

  def filter(self, record: logging.LogRecord) -> bool:
    error = record.exc_info[1] if record.exc_info else None
    if error is None or not (record.name == 'asyncio' or 'orbax' in record.pathname):
      return True
    if storage_errno(error) is None:
      return True
    if self.on_failure is not None and not from_peer(error):
      self.on_failure(error)
    return False


_FILTER = _WriteFailureTracebacks()


def drop_write_failure_tracebacks(
  on_failure: Callable[[BaseException], None] | None = None,
) -> None:
  """From now on, orbax's and asyncio's tracebacks of failed writes are not logged, and
  `on_failure` is called with each such failure of this process (installing it twice is a
  no-op)."""
  _FILTER.on_failure = on_failure
  for name in ('absl', 'asyncio'):
    logger = logging.getLogger(name)
    if _FILTER not in logger.filters:
      logger.addFilter(_FILTER)


def from_peer(e: BaseException) -> bool:
  """Whether `e` is another process's failed write, reported through the barriers."""
  return any(
    isinstance(link, distributed.BarrierAborted) and link.process != jax.process_index()
    for link in _chain(e)
  )
