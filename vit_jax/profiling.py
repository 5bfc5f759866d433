"""The top ops of a `jax.profiler` trace by time, read with `jax.profiler.ProfileData` (no
TensorBoard, no TensorFlow): which share of a step goes to matmuls, attention and the rest
(elementwise fusions, reductions, copies), so that the next optimisation is chosen from
evidence.

  summary = profiling.summarise('/tmp/profile')   # the newest *.xplane.pb under it
  print(profiling.format_summary(summary))

Device traces (GPU, TPU) are read from each device plane's `XLA Ops` line (one event per HLO
op), or its stream lines where there is none; a CPU trace from the XLA threads of the host.
"""

import collections
import glob
import os
import re
from typing import Any

CATEGORIES = ('matmul', 'attention', 'other')
_ATTENTION = re.compile(r'fmha|sdpa|flash|attention|fprop_sm|bprop_sm', re.I)
_MATMUL = re.compile(r'gemm|cublas|matmul|\bdot|^dot|convolution|xmma|cutlass|wgmma', re.I)
# Host-side bookkeeping events of XLA:CPU's thread pools, not ops.
_HOST_NOISE = re.compile(r'^(ThreadpoolListener|ThunkExecutor|SlinkyThreadPool|end: )')


def newest_trace(directory: str) -> str:
  """The newest `*.xplane.pb` under `directory` (jax.profiler writes plugins/profile/<run>/)."""
  found = glob.glob(os.path.join(directory, '**', '*.xplane.pb'), recursive=True)
  if not found:
    raise ValueError(f'no *.xplane.pb trace under {directory}: was jax.profiler.trace run there?')
  return max(found, key=os.path.getmtime)


def hlo_categories(hlo_text: str) -> dict[str, str]:
  """The category of each fusion and call of a compiled module (`compiled.as_text()`), read
  from the computation it calls: XLA:CPU's traces name an op only by its instruction
  (`ynn_fusion.12`: a YNNPACK matmul, or an elementwise fusion), with no HLO beside it."""
  bodies, current = {}, None
  for line in hlo_text.splitlines():
    start = re.match(r'^(?:ENTRY )?%?([\w.\-]+) .*\{$', line)
    if start:
      current = bodies.setdefault(start.group(1), [])
    elif current is not None:  # the ops alone: metadata names modules ('Attention_0/...')
      current.append(re.sub(r', metadata=\{.*?\}', '', line))
  categories = {}
  for line in hlo_text.splitlines():
    op = re.search(r'%?([\w.\-]+) = .*calls=%?([\w.\-]+)', line)
    if op:
      categories[op.group(1)] = category(op.group(1), '\n'.join(bodies.get(op.group(2), [])))
  return categories


def category(name: str, detail: str = '') -> str:
  """'attention', 'matmul' or 'other' for an op's name (and its HLO text, where known)."""
  text = f'{name} {detail}'
  if _ATTENTION.search(text):
    return 'attention'
  return 'matmul' if _MATMUL.search(text) else 'other'


def _device_events(plane: Any) -> list[Any]:
  lines = list(plane.lines)
  ops = [line for line in lines if line.name == 'XLA Ops']
  chosen = ops or [line for line in lines if line.name.startswith('Stream')]
  return [e for line in chosen for e in line.events]


def _events(data: Any) -> tuple[str, list[Any]]:
  """(where the ops were read, their events): the device planes, else XLA's CPU threads."""
  planes = [p for p in data.planes if p.name.startswith('/device:')]
  events = [e for p in planes for e in _device_events(p)]
  if events:
    return 'device', events
  host = data.find_plane_with_name('/host:CPU')
  lines = [line for line in (host.lines if host else []) if line.name.startswith('tf_XLA')]
  return 'host', [e for line in lines for e in line.events if not _HOST_NOISE.match(e.name)]


def summarise(path: str, top: int = 15, hlo_text: str | None = None) -> dict[str, Any]:
  """{'trace', 'source', 'total_ms', 'shares': {category: fraction of the op time},
  'top': [{'name', 'category', 'ms', 'share', 'count'}]} of a trace file or directory;
  `hlo_text`, the traced program's compiled text, categorises ops named only by instruction."""
  from jax.profiler import ProfileData

  trace = newest_trace(path) if os.path.isdir(path) else path
  source, events = _events(ProfileData.from_file(trace))
  time_ns, count, detail = collections.Counter(), collections.Counter(), {}
  for e in events:
    time_ns[e.name] += e.duration_ns
    count[e.name] += 1
    if e.name not in detail:
      stats = dict(e.stats)
      detail[e.name] = str(stats.get('long_name', stats.get('hlo_op', '')))
  total = sum(time_ns.values())
  known = hlo_categories(hlo_text) if hlo_text else {}
  kind = lambda name: known.get(name) or category(name, detail[name])
  shares = dict.fromkeys(CATEGORIES, 0.0)
  for name, ns in time_ns.items():
    shares[kind(name)] += ns / total if total else 0.0
  rows = [
    {
      'name': name,
      'category': kind(name),
      'ms': ns / 1e6,
      'share': ns / total,
      'count': count[name],
    }
    for name, ns in time_ns.most_common(top)
  ]
  return {'trace': trace, 'source': source, 'total_ms': total / 1e6, 'shares': shares, 'top': rows}


def format_summary(summary: dict[str, Any]) -> str:
  """The shares by category, then the top ops as a Markdown table."""
  shares = ', '.join(f'{k} {v:.1%}' for k, v in summary['shares'].items())
  lines = [
    f'profile {summary["trace"]} ({summary["source"]} ops): {summary["total_ms"]:.1f} ms of'
    f' ops; {shares}',
    '| op | category | ms | share | count |',
    '|---|---|---|---|---|',
  ]
  for r in summary['top']:
    name = r['name'] if len(r['name']) <= 60 else r['name'][:57] + '...'
    lines.append(f'| {name} | {r["category"]} | {r["ms"]:.2f} | {r["share"]:.1%} | {r["count"]} |')
  return '\n'.join(lines)
