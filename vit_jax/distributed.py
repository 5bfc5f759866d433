"""Multi-process start-up through `jax.distributed`: one call before any other JAX call.

The same command runs on one machine, under SLURM, on a TPU VM pod, or as several
processes given explicitly. `initialize()` decides which:

  explicit   `--coordinator_address`, `--num_processes`, `--process_id` (or the environment
             variables JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID);
  SLURM      a job step with more than one task (srun): JAX reads SLURM's variables;
  TPU VM     a Cloud TPU VM (libtpu and a TPU on the PCI bus): JAX asks the metadata server;
  otherwise  one process, nothing to initialise.

On CPU the cross-process collectives go through gloo. Every wait on another process is
bounded by the same `timeout_s` (--distributed_timeout):
  start-up     a process that cannot reach the coordinator, or a coordinator whose peers
               never arrive, ends with a one-line message (JAX itself would abort with a
               C++ stack trace, later);
  agreement    `gather()`, the training loop's vote between steps, ends with a one-line
               message when a process does not arrive;
  a dead peer  anywhere else (a device collective, a checkpoint's barriers): each process
               posts a heartbeat every `timeout_s / 10` s and watches the others'; one
               silent for `timeout_s` ends every other process with a one-line message.
               Behind it, JAX's coordination service declares a process without heartbeats
               for 2 x `timeout_s` dead and terminates the rest (its own message, then a
               C++ stack trace);
  shutdown     at exit, a process waits at most max(`timeout_s`, SHUTDOWN_MIN_S) for the
               others.
"""

import atexit
import collections
import contextlib
import glob
import importlib.util
import os
import socket
import sys
import threading
import time
from collections.abc import Mapping
from typing import ClassVar

MODES = ('auto', 'on', 'off')
ENV_ADDRESS = 'JAX_COORDINATOR_ADDRESS'
ENV_NUM_PROCESSES = 'JAX_NUM_PROCESSES'
ENV_PROCESS_ID = 'JAX_PROCESS_ID'
DEFAULT_TIMEOUT_S = 300
SHUTDOWN_MIN_S = 120
_KEY_PREFIX = 'vit_jax'
_GOOGLE_PCI_VENDOR = '0x1ae0'  # TPU chips on a Cloud TPU VM


class DistributedError(RuntimeError):
  """Multi-process start-up failed; the message says why and what to do."""


# The bound of every wait on another process, and the peer watch, set by `initialize()`.
_timeout_s: float = DEFAULT_TIMEOUT_S
_watch: '_PeerWatch | None' = None


def _parse_address(address: str) -> tuple[str, int]:
  host, sep, port = address.rpartition(':')
  if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
    raise DistributedError(
      f'Coordinator address {address!r}: expected HOST:PORT, e.g. 10.0.0.1:8476.'
    )
  return host.strip('[]'), int(port)


def _int_or_none(value: int | str | None, name: str) -> int | None:
  if value is None or value == '':
    return None
  try:
    return int(value)
  except ValueError:
    raise DistributedError(f'{name}={value!r} is not an integer.') from None


def explicit_settings(
  coordinator_address: str | None = None,
  num_processes: int | None = None,
  process_id: int | None = None,
  environ: Mapping[str, str] | None = None,
) -> tuple[str, int, int] | None:
  """(address, num_processes, process_id) from the arguments, else the environment.

  None when none of the three is given; a DistributedError when only some are, or when
  they do not fit together.
  """
  environ = os.environ if environ is None else environ
  address = coordinator_address or environ.get(ENV_ADDRESS) or None
  n = _int_or_none(
    num_processes if num_processes is not None else environ.get(ENV_NUM_PROCESSES),
    '--num_processes',
  )
  i = _int_or_none(
    process_id if process_id is not None else environ.get(ENV_PROCESS_ID), '--process_id'
  )
  given = {'--coordinator_address': address, '--num_processes': n, '--process_id': i}
  if all(v is None for v in given.values()):
    return None
  missing = [k for k, v in given.items() if v is None]
  if missing:
    raise DistributedError(
      f'Multi-process run: {", ".join(missing)} not set; give all three of '
      '--coordinator_address, --num_processes and --process_id (or JAX_COORDINATOR_ADDRESS, '
      'JAX_NUM_PROCESSES, JAX_PROCESS_ID).'
    )
  _parse_address(address)
  if n < 1 or not 0 <= i < n:
    raise DistributedError(
      f'--process_id={i} with --num_processes={n}: expected 0 <= process_id < num_processes.'
    )
  return address, n, i


def in_slurm_job_step(environ: Mapping[str, str] | None = None) -> bool:
  """Inside `srun` with more than one task (JAX's SLURM detection reads these variables)."""
  environ = os.environ if environ is None else environ
  needed = ('SLURM_JOB_ID', 'SLURM_STEP_NODELIST', 'SLURM_NTASKS', 'SLURM_PROCID', 'SLURM_LOCALID')
  if not all(k in environ for k in needed):
    return False
  return (_int_or_none(environ['SLURM_NTASKS'], 'SLURM_NTASKS') or 1) > 1


def on_cloud_tpu_vm() -> bool:
  """libtpu is installed and a Google TPU sits on the PCI bus (what JAX itself checks)."""
  if importlib.util.find_spec('libtpu') is None:
    return False
  for path in glob.glob('/sys/bus/pci/devices/*/vendor'):
    try:
      with open(path) as f:
        if f.read().strip() == _GOOGLE_PCI_VENDOR:
          return True
    except OSError:
      continue
  return False


def wait_for_coordinator(address: str, timeout_s: float, process_id: int, n: int) -> None:
  """Retries a TCP connection to the coordinator until it answers or `timeout_s` passes."""
  host, port = _parse_address(address)
  deadline = time.monotonic() + timeout_s
  while True:
    try:
      with socket.create_connection((host, port), timeout=min(5.0, max(0.1, timeout_s))):
        return
    except OSError as e:
      if time.monotonic() >= deadline:
        raise DistributedError(
          f'Process {process_id} of {n} could not reach the coordinator at {address} within '
          f'{timeout_s:g} s ({e.strerror or e}): start process 0 there first, check the address, '
          'port and firewall, or raise --distributed_timeout.'
        ) from None
    time.sleep(0.25)


def _exit_now(message: str) -> None:
  """One line on stderr, then exit 1 at once: no exit handler may wait on a dead peer."""
  sys.stderr.write(f'Error: {message}\n')
  sys.stderr.flush()
  os._exit(1)


class _Watchdog:
  """Ends the process with a one-line message if start-up outlasts its deadline.

  JAX's own connect aborts the process with a C++ stack trace (and only after about twice
  its timeout); this fires first, at `timeout_s`.
  """

  def __init__(self, timeout_s: float, message: str):
    self._timer = threading.Timer(timeout_s, self._fire, args=(message,))
    self._timer.daemon = True

  @staticmethod
  def _fire(message: str) -> None:
    _exit_now(message)

  def __enter__(self):
    self._timer.start()
    return self

  def __exit__(self, *exc):
    self._timer.cancel()


def _use_gloo_on_cpu() -> None:
  """CPU devices of different processes talk through gloo (must precede backend start-up)."""
  import jax

  jax.config.update('jax_cpu_collectives_implementation', 'gloo')


def initialize(
  coordinator_address: str | None = None,
  num_processes: int | None = None,
  process_id: int | None = None,
  *,
  mode: str = 'auto',
  timeout_s: float = DEFAULT_TIMEOUT_S,
) -> bool:
  """Starts JAX's multi-controller runtime when the run spans several processes.

  Call it first, before anything asks JAX for devices. `mode` 'auto' initialises for
  explicit settings, a multi-task SLURM step or a Cloud TPU VM; 'on' always (JAX detects
  the cluster when nothing is given); 'off' never.

  Returns:
    True when `jax.distributed` was initialised (jax.process_count() may then be > 1).

  Raises:
    DistributedError: bad or partial settings, an unreachable coordinator, or an unknown
      cluster under mode 'on'.
  """
  if mode not in MODES:
    raise DistributedError(f'--distributed={mode!r}; expected one of {MODES}.')
  if timeout_s <= 0:
    raise DistributedError(f'--distributed_timeout={timeout_s:g}: expected seconds > 0.')
  if mode == 'off':
    return False
  explicit = explicit_settings(coordinator_address, num_processes, process_id)
  if explicit is None and mode == 'auto' and not (in_slurm_job_step() or on_cloud_tpu_vm()):
    return False
  if explicit is not None and explicit[1] == 1 and mode == 'auto':
    return False
  _use_gloo_on_cpu()
  global _timeout_s
  _timeout_s = timeout_s
  if explicit is None:
    _initialize_detected(timeout_s)
  else:
    _initialize_explicit(*explicit, timeout_s)
  global _watch
  _watch = _PeerWatch(timeout_s)
  _watch.start()
  return True


def mark_finished() -> None:
  """Tells the other processes that this one ends normally: its silence from now on is no
  fault (a process that ends with an error falls silent, and the others stop)."""
  if _watch is not None:
    _watch.finished()


def collective_failed(e: BaseException) -> None:
  """A device collective of a multi-process run raised (gloo or NCCL saw a peer's connection
  close): the peer watch names the silent peer within its bound, so wait for it; a failure
  with every peer alive ends the process with the error's first line. Never returns while
  several processes run; a single process returns (its caller re-raises)."""
  import jax

  if _watch is None or jax.process_count() == 1:
    return
  time.sleep(_timeout_s * 1.1)  # the watch exits the process first if a peer died
  _exit_now(
    f'Process {_watch.me}: a collective with the other processes failed ({_first_line(e)}); '
    'rerun every process to resume from the last checkpoint.'
  )


def _jax_timeouts(timeout_s: float) -> dict[str, int]:
  """JAX's own bounds, behind ours: its connect and its heartbeats get more time than the
  watchdog and `_PeerWatch`; at exit a process waits for the others (tearing down the
  runtime and the input pipeline can take tens of seconds on a loaded host)."""
  return {
    'initialization_timeout': int(2 * timeout_s + 30),
    'heartbeat_timeout_seconds': max(2, round(2 * timeout_s)),
    'shutdown_timeout_seconds': round(max(SHUTDOWN_MIN_S, timeout_s)),
  }


def _initialize_detected(timeout_s: float) -> None:
  """`jax.distributed.initialize()` with the cluster's settings found by JAX itself."""
  import jax

  message = (
    f'Multi-process start-up did not finish within {timeout_s:g} s (cluster detected from '
    'the environment): check that every process of the job started, or raise '
    '--distributed_timeout.'
  )
  with _Watchdog(timeout_s, message):
    try:
      jax.distributed.initialize(**_jax_timeouts(timeout_s))
    except (ValueError, RuntimeError) as e:
      first = str(e).splitlines()[0] if str(e) else type(e).__name__
      raise DistributedError(
        f'No cluster detected for --distributed=on ({first}): give --coordinator_address, '
        '--num_processes and --process_id.'
      ) from None


def _initialize_explicit(address: str, n: int, i: int, timeout_s: float) -> None:
  """Process `i` of `n` joins the coordinator at `address`; every wait ends by `timeout_s`."""
  import jax

  start = time.monotonic()
  if i != 0:
    wait_for_coordinator(address, timeout_s, i, n)
  left = max(1.0, timeout_s - (time.monotonic() - start))
  if i == 0:
    message = (
      f'Process 0 (coordinator at {address}): not all {n} processes joined within '
      f'{timeout_s:g} s: start processes 1..{n - 1} with the same --coordinator_address and '
      '--num_processes, or raise --distributed_timeout.'
    )
  else:
    message = (
      f'Process {i} of {n}: the coordinator at {address} answered, but not all {n} processes '
      f'joined within {timeout_s:g} s: check every process has a distinct --process_id in '
      f'0..{n - 1} and the same --num_processes, or raise --distributed_timeout.'
    )
  with _Watchdog(left, message):
    jax.distributed.initialize(
      coordinator_address=address,
      num_processes=n,
      process_id=i,
      **_jax_timeouts(timeout_s),
    )


# ----------------------------------------------------------------------------------------
# Agreement between processes, through the coordination service (no device involved).
# ----------------------------------------------------------------------------------------


class Vote:
  """Each call, every process puts in a note (or None) and gets back every process's note.

  All processes must make the same calls in the same order (each call is a barrier of the
  coordination service named after the vote). A process that does not arrive within
  --distributed_timeout ends every waiting process with one line. One process: its own note.
  """

  _calls: ClassVar[collections.Counter] = collections.Counter()  # per name, for the keys

  def __init__(self, name: str):
    self._name = name

  def __call__(self, note: str | None) -> dict[int, str]:
    import jax

    Vote._calls[self._name] += 1
    calls = Vote._calls[self._name]
    client = _client()
    if client is None or jax.process_count() == 1:
      return {} if note is None else {jax.process_index(): note}
    prefix = f'{_KEY_PREFIX}/{self._name}/{calls}/'
    if note is not None:
      client.key_value_set(prefix + str(jax.process_index()), note)
    try:
      client.wait_at_barrier(f'{_KEY_PREFIX}/{self._name}', int(_timeout_s * 1000))
      notes = client.key_value_dir_get(prefix)
    except jax.errors.JaxRuntimeError as e:  # the barrier timed out, or the coordinator died
      _exit_now(
        f'Process {jax.process_index()}: not every process of {jax.process_count()} reached '
        f'"{self._name}" #{calls} within {_timeout_s:g} s: a peer died or hangs '
        f'({_first_line(e)}); rerun every process to resume from the last checkpoint.'
      )
    return {int(key.rsplit('/', 1)[1]): value for key, value in notes}


class BarrierAborted(RuntimeError):
  """A process called `abort_barriers`: the message names it and its note."""

  def __init__(self, process: int, note: str):
    super().__init__(f'process {process}: {note}')
    self.process = process


_ABORTED = f'{_KEY_PREFIX}/aborted/'


def abort_barriers(note: str) -> None:
  """Every `CheckpointBarrier` wait of every process, now or later, raises BarrierAborted
  naming this process and `note` (a checkpoint write of this process failed)."""
  import jax

  client = _client()
  if client is not None and jax.process_count() > 1:
    with contextlib.suppress(_jax_runtime_error()):  # the coordinator is gone: the timeout ends it
      client.key_value_set(_ABORTED + str(jax.process_index()), note, allow_overwrite=True)


class CheckpointBarrier:
  """orbax's `barrier_sync_fn` (the barriers of its checkpoint threads) in the coordination
  service's key-value store, so that a wait can end before its timeout.

  A process whose part of a write fails skips orbax's commit barrier and waits at the next
  one, while the others wait at the commit barrier: with orbax's own barrier both wait out
  its timeout (20 minutes). Here the failed process calls `abort_barriers` and every wait
  ends at once with its note. The n-th call with a key on every process is one barrier.
  """

  POLL_MS = 200  # how often a wait looks for an abort

  def __init__(self):
    self._calls: collections.Counter = collections.Counter()
    self._lock = threading.Lock()

  def __call__(self, *, key: str, timeout_ms: int) -> None:
    import jax

    client, n = _client(), jax.process_count()
    with self._lock:  # orbax calls barriers from several threads
      self._calls[key] += 1
      calls = self._calls[key]
    here = f'{_KEY_PREFIX}/barrier/{key}/{calls}'
    if client.key_value_increment(f'{here}/arrived', 1) == n:
      client.key_value_set(f'{here}/done', '')
      for name in ('arrived', 'done'):  # everyone has left the previous one: forget it
        with contextlib.suppress(_jax_runtime_error()):
          client.key_value_delete(f'{_KEY_PREFIX}/barrier/{key}/{calls - 1}/{name}')
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
      aborted = sorted(client.key_value_dir_get(_ABORTED))
      if aborted:
        key_of, note = aborted[0]
        raise BarrierAborted(int(key_of.rsplit('/', 1)[1]), note)
      left_ms = int((deadline - time.monotonic()) * 1000)
      if left_ms <= 0:
        raise TimeoutError(
          f'Not every process of {n} reached the checkpoint barrier {key} within '
          f'{timeout_ms / 1000:g} s.'
        )
      try:
        client.blocking_key_value_get(f'{here}/done', min(left_ms, self.POLL_MS))
        return
      except _jax_runtime_error():  # not every process has arrived yet
        pass


class _PeerWatch:
  """A daemon thread: this process's heartbeat in the coordination service's key-value
  store, and the others' read back; a peer silent for `timeout_s` (killed, hung, ended by
  an error, its host gone) ends this process with one line; one marked finished does not."""

  def __init__(self, timeout_s: float):
    import jax

    self._timeout_s, self._client = timeout_s, _client()
    self.me, self._n = jax.process_index(), jax.process_count()
    self._prefix = f'{_KEY_PREFIX}/alive/'
    self._thread = threading.Thread(target=self._run, name='peer-watch', daemon=True)
    self._stopped = threading.Event()

  def start(self) -> None:
    atexit.register(self._stopped.set)  # runs before jax.distributed's own shutdown at exit
    self._thread.start()

  def finished(self) -> None:
    self._stopped.set()
    self._thread.join(timeout=self._timeout_s)  # its last beat must not follow 'done'
    with contextlib.suppress(_jax_runtime_error()):
      self._client.key_value_set(self._prefix + str(self.me), 'done', allow_overwrite=True)

  def _run(self) -> None:
    last_seen = {p: (None, time.monotonic()) for p in range(self._n) if p != self.me}
    beat = 0
    while not self._stopped.wait(self._timeout_s / 10):
      beat += 1
      now = time.monotonic()
      try:
        self._client.key_value_set(self._prefix + str(self.me), str(beat), allow_overwrite=True)
        posted = dict(self._client.key_value_dir_get(self._prefix))
      except _jax_runtime_error() as e:  # the coordinator is gone, or this process is exiting
        if self._stopped.is_set():
          return
        _exit_now(
          f'Process {self.me}: lost the coordination service ({_first_line(e)}): process 0 '
          'died or its host is gone; rerun every process to resume from the last checkpoint.'
        )
      for p, (value, since) in last_seen.items():
        new = posted.get(self._prefix + str(p))
        if new == 'done':
          continue
        if new != value:
          last_seen[p] = (new, now)
        elif now - since > self._timeout_s:
          _exit_now(
            f'Process {self.me}: process {p} of {self._n} has been silent for '
            f'{self._timeout_s:g} s (killed, hung, failed or its host gone): stopping; rerun '
            'every process to resume from the last checkpoint.'
          )


def _jax_runtime_error() -> type[Exception]:
  import jax

  return jax.errors.JaxRuntimeError


def _first_line(e: BaseException) -> str:
  return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _client():
  """The jax.distributed client (None in a single process); orbax reads it the same way."""
  # Private: no public API reaches the coordination service's key-value store (jax 0.10-0.12).
  from jax._src import distributed as jax_distributed

  return jax_distributed.global_state.client
