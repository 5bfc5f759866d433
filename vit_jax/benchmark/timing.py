"""Timing the programs: interleaved rounds of steps (wall and CPU seconds, page faults, peak
memory), and the matmul probe, the MFU's measured peak."""

import re
import resource
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from vit_jax.benchmark.programs import Job, Timed
from vit_jax.benchmark.variants import DTYPES


def _time(fn: Callable[[], Any]) -> tuple[float, float, int]:
  """(wall seconds, process CPU seconds, minor page faults) of one call."""
  faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  wall, cpu = time.perf_counter(), time.process_time()
  jax.block_until_ready(fn())
  wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
  return wall, cpu, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults


def matmul_probe(dtype: str, size: int, repeats: int = 3) -> float:
  """TFLOP/s of the best of `repeats` jitted (size x size) @ (size x size) matmuls.

  16-bit dtypes multiply 16-bit operands with float32 accumulation and output, as the model
  does; that is the fast path on CPUs with bfloat16 dot products and on GPU tensor cores.
  """
  keys = jax.random.split(jax.random.key(0))
  a, b = (jax.random.normal(k, (size, size), jnp.float32).astype(DTYPES[dtype]) for k in keys)
  f = jax.jit(lambda x, y: jnp.matmul(x, y, preferred_element_type=jnp.float32))
  jax.block_until_ready(f(a, b))
  best = min(_time(lambda: f(a, b))[0] for _ in range(repeats))
  return 2 * size**3 / best / 1e12


def _default_probe_sizes() -> tuple[int, ...]:
  return (2048, 4096) if jax.default_backend() == 'cpu' else (8192, 16384)


def _peak_rss_reset() -> bool:
  """Resets the process's peak resident set (Linux); False where that is not possible."""
  try:
    with open('/proc/self/clear_refs', 'w') as f:
      f.write('5')
    return True
  except OSError:
    return False


def _peak_rss() -> int | None:
  try:
    with open('/proc/self/status') as f:
      match = re.search(r'VmHWM:\s+(\d+) kB', f.read())
  except OSError:
    return None
  return int(match.group(1)) * 1024 if match else None


def _device_peak_bytes() -> int | None:
  stats_ = jax.local_devices()[0].memory_stats() or {}
  return stats_.get('peak_bytes_in_use')


def _rounds(job: Job, programs: list[Timed], rounds, steps, probe_sizes, measure_probe) -> dict:
  """Warm-up, then interleaved rounds of `steps` timed steps per program; the matmul probe
  (TFLOP/s per dtype, once per round) if `measure_probe`."""
  on_cpu = jax.default_backend() == 'cpu'
  for p in programs:
    jax.block_until_ready(p.run())  # the first runs allocate
  probe: dict[str, list[float]] = {d: [] for d in dict.fromkeys(v.dtype for v in job.variants)}
  for r in range(rounds):
    if measure_probe:
      for d in probe:
        probe[d].append(max(matmul_probe(d, s) for s in probe_sizes))
    for p in programs:
      reset = on_cpu and _peak_rss_reset()
      for _ in range(steps):
        wall, cpu, faults = _time(p.run)
        p.wall.append(wall)
        p.cpu.append(cpu)
        p.faults.append(faults)
      peak = (_peak_rss() if reset else None) if on_cpu else _device_peak_bytes()
      if peak is not None:
        p.peak_bytes = max(p.peak_bytes or 0, peak)
    speeds = [f'{p.label} {p.mode} {job.batch / min(p.wall[-steps:]):.2f}' for p in programs]
    job.log(f'  round {r + 1}/{rounds} (img/s): {", ".join(speeds)}')
  return probe


def measure(
  job: Job, programs: list[Timed], peak_tflops, rounds: int, steps: int, probe_sizes
) -> tuple:
  """(the matmul probe by dtype, its sizes) after timing the programs (`_rounds`)."""
  # The probe is the MFU denominator unless a peak is given; on an accelerator, where it
  # costs milliseconds, it is measured anyway: the ceiling this chip reaches beside its datasheet.
  sizes = tuple(probe_sizes or _default_probe_sizes())
  measure_probe = peak_tflops is None or jax.default_backend() != 'cpu'
  if job.compile_only or not rounds:
    return {}, sizes
  return _rounds(job, programs, rounds, steps, sizes, measure_probe), sizes
