"""`--start`: how long a command takes to start, cold and warm, and where the time goes.

Each round makes an empty compilation-cache folder and starts fresh processes on it: first the
probe below, cold (nothing cached), then again, warm (the programs the first one compiled are
in the folder), then `vit-predict` on the same checkpoint and image, cold and warm, for the
time to its first output (the process's wall time: it prints once, at the end). The probe
times what `vit-predict` does, in the order it does it:

  imports          jax and the library (`vit_jax.load`, `vit_jax.inference.predict`)
  checkpoint read  `vit_jax.load`: the file read, fitted and placed on the device
  first batch      the forward pass's first call: tracing, compiling (or reading the cache)
                   and running
  batch again      the same call again: running alone, so that first batch - batch again is
                   what compiling (or the cache) and tracing cost

and the process's own wall time (interpreter start and exit included). Processes run one at a
time; the table shows the median round.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

PHASES = ('imports', 'checkpoint read', 'first batch', 'batch again')
# The probe: vit-predict's start, timed phase by phase (argv: checkpoint, image).
PROBE = """
import time
start = time.perf_counter()
import json, sys
from vit_jax import compilation_cache
compilation_cache.for_command()
import vit_jax
from vit_jax.inference import predict
marks = [time.perf_counter()]
model = vit_jax.load(sys.argv[1])
marks.append(time.perf_counter())
x = model.preprocess([sys.argv[2]])
for _ in range(2):
  start_batch = time.perf_counter()
  model.features_and_logits(x)
  marks.append(time.perf_counter() - start_batch)
print(json.dumps([marks[0] - start, marks[1] - marks[0], *marks[2:]]))
"""


def _timed(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
  """(wall seconds, stdout) of a process; raises with its stderr's tail if it fails."""
  start = time.perf_counter()
  done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1800)
  seconds = time.perf_counter() - start
  if done.returncode:
    raise RuntimeError(f'{argv[:3]} failed: {done.stderr.strip()[-500:]}')
  return seconds, done.stdout


def _round(checkpoint: str, image: str) -> dict[str, dict[str, float]]:
  """One round on an empty cache folder: {'probe cold': {...}, 'probe warm': ..., 'vit-predict
  cold': {'wall': s}, 'vit-predict warm': ...}."""
  with tempfile.TemporaryDirectory() as cache:
    env = {k: v for k, v in os.environ.items() if k != 'JAX_COMPILATION_CACHE_DIR'}
    env['VIT_JAX_COMPILATION_CACHE'] = cache
    times = {}
    for start in ('cold', 'warm'):
      wall, out = _timed([sys.executable, '-c', PROBE, checkpoint, image], env)
      times[f'probe {start}'] = {'wall': wall, **dict(zip(PHASES, json.loads(out), strict=True))}
  with tempfile.TemporaryDirectory() as cache:
    env['VIT_JAX_COMPILATION_CACHE'] = cache
    for start in ('cold', 'warm'):
      argv = [sys.executable, '-m', 'vit_jax.predict', f'--checkpoint={checkpoint}', image]
      times[f'vit-predict {start}'] = {'wall': _timed(argv, env)[0]}
  return times


def run_start_benchmark(
  checkpoint: str, work_dir: str, rounds: int, log: Callable[[str], None]
) -> dict[str, Any]:
  """{'rows': [{'start': 'probe cold', 'wall': s, 'imports': s, ...}], 'settings': ...}: the
  median of `rounds` rounds. A registered model name is written once to `work_dir` as an .npz
  of random weights, so that the checkpoint read is a file's."""
  from vit_jax.benchmark import synthetic

  os.makedirs(work_dir, exist_ok=True)
  if not os.path.exists(checkpoint):
    checkpoint = _written(checkpoint, work_dir, log)
  folder = synthetic.write_folder(os.path.join(work_dir, 'jpeg_500x375_1'), 1, (500, 375))
  (image,) = (os.path.join(d, f) for d, _, fs in os.walk(folder) for f in fs if f.endswith('.jpg'))
  runs = []
  for r in range(rounds):
    runs.append(_round(checkpoint, image))
    shown = ', '.join(f'{k} {v["wall"]:.2f} s' for k, v in runs[-1].items())
    log(f'round {r + 1}/{rounds}: {shown}')
  rows = []
  for start, first in runs[0].items():
    rows.append({'start': start} | {k: statistics.median(r[start][k] for r in runs) for k in first})
  settings = {'checkpoint': checkpoint, 'image': image, 'rounds': rounds}
  return {'rows': rows, 'settings': settings, 'runs': runs}


def _written(name: str, work_dir: str, log: Callable[[str], None]) -> str:
  """The registered classifier `name` with random weights and a random 1,000-class head (an
  initialised head is zeros, which vit-predict refuses) as WORK_DIR/NAME.npz, kept for reuse."""
  path = os.path.join(work_dir, f'{name}.npz')
  if not os.path.exists(path):
    import numpy as np

    import vit_jax
    from vit_jax import checkpoint as ckpt

    log(f'writing {name} with random weights to {path} ...')
    params = dict(vit_jax.load(name, num_classes=1000).params)
    kernel = np.random.default_rng(0).normal(0, 0.02, params['head']['kernel'].shape)
    params['head'] = {**params['head'], 'kernel': kernel.astype(np.float32)}
    ckpt.save_npz(params, path)
  return path


def format_table(result: dict[str, Any]) -> str:
  """Markdown: each start's wall time and, for the probe, its phases (seconds)."""
  lines = [
    f'| start | process wall | {" | ".join(PHASES)} |',
    '|---|---|' + '---|' * len(PHASES),
  ]
  for row in result['rows']:
    phases = ' | '.join(f'{row[p]:.2f}' if p in row else '' for p in PHASES)
    lines.append(f'| {row["start"]} | {row["wall"]:.2f} | {phases} |')
  return '\n'.join(lines)
