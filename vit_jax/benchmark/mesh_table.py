"""`--mesh_table`: the training step of large ViTs on N simulated devices and named meshes,
compiled with nothing allocated: per device, the parameters' and the optimizer's bytes (their
shard shapes), XLA's temporaries and whole memory at each per-device batch, whether it fits a
device, and the collectives XLA inserted, per step.

JAX fixes the number of simulated CPU devices when it starts
(`--xla_force_host_platform_device_count`), so `run_mesh_table` starts one child process per
device count and model (`CHILD`, which calls `device_rows`) and gathers their rows. A child
compiles the trainer's own step (`programs.lower_train`: the run spec's classification step,
`accum_steps=1`) of the model with `scan_layers=True` and the `Settings`' dtype, precision
policy, remat policy and optimizer, its state placed as the trainer places it
(`parallel.tree_shardings`: 'fsdp' on a mesh without a `model` axis, else 'tp+fsdp') and the
batch split over the batch axes; the global batch is the per-device batch times the devices.
"""

import dataclasses
import datetime
import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from vit_jax import parallel
from vit_jax.benchmark import programs
from vit_jax.benchmark.variants import Variant, build_model, model_config

GIB = 2**30
COLLECTIVES = ('all-reduce', 'all-gather', 'reduce-scatter', 'all-to-all', 'collective-permute')


@dataclasses.dataclass(frozen=True)
class Settings:
  """What every row compiles besides the model, mesh and batch."""

  dtype: str = 'bfloat16'
  precision: str = 'activations'
  remat: str = 'full'
  optimizer: str = 'adam'
  resolution: int = 224
  num_classes: int = 1000

  @property
  def variant(self) -> Variant:
    return Variant(self.dtype, 'xla', self.remat, 'scan', self.precision)


# --- The collectives of a compiled program, from its HLO text -------------------------------

_HEADER = re.compile(r'^(?:ENTRY )?%?([\w.\-]+) .*\{$')
_OP = re.compile(r'^\s*(?:ROOT )?%?[\w.\-]+ = (.*?) ([a-z][\w\-]*)\(')
_BODY = re.compile(r'\bbody=%?([\w.\-]+)')
_CALLEE = re.compile(r'\b(?:calls|to_apply|true_computation|false_computation)=%?([\w.\-]+)')
_BRANCHES = re.compile(r'branch_computations=\{([^}]*)\}')
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
_ARRAY = re.compile(r'\b(pred|[a-z]+\d+)\[([\d,]*)\]')


def _computations(text: str) -> tuple[dict[str, list[str]], str]:
  """{computation name: its instruction lines}, and the entry computation's name."""
  computations, entry, current = {}, None, None
  for line in text.splitlines():
    header = _HEADER.match(line) if line and not line[0].isspace() else None
    if header:
      current = computations.setdefault(header.group(1), [])
      entry = header.group(1) if line.startswith('ENTRY') else entry
    elif line.strip() == '}':
      current = None
    elif current is not None:
      current.append(line)
  if entry is None:
    raise ValueError('no ENTRY computation in the HLO text')
  return computations, entry


def _executions(computations: dict[str, list[str]], entry: str) -> dict[str, int]:
  """How often each computation runs per call of the entry: a while loop's body runs its
  known trip count times (once where XLA states none), every other callee once per call."""
  callers: dict[str, list[tuple[str, int]]] = {}
  for name, lines in computations.items():
    for line in lines:
      trips = _TRIP_COUNT.search(line)
      for body in _BODY.findall(line):
        callers.setdefault(body, []).append((name, int(trips.group(1)) if trips else 1))
      branches = ','.join(_BRANCHES.findall(line))
      for callee in _CALLEE.findall(line) + re.findall(r'%?([\w.\-]+)', branches):
        callers.setdefault(callee, []).append((name, 1))
  counts = {entry: 1}

  def count(name: str) -> int:
    if name not in counts:
      counts[name] = sum(count(c) * n for c, n in callers.get(name, ()) if c in computations)
    return counts[name]

  return {name: count(name) for name in computations}


def array_bytes(hlo_type: str) -> int:
  """Bytes of an HLO type: an array ('bf16[4,197]{1,0}') or a tuple of them."""
  total = 0
  for dtype, dims in _ARRAY.findall(hlo_type):
    bits = 8 if dtype == 'pred' else int(re.sub(r'^\D+', '', dtype))
    total += math.prod(int(d) for d in dims.split(',') if d) * bits // 8
  return total


def hlo_collectives(text: str) -> dict[str, dict[str, int]]:
  """Per collective kind: `ops`, the instructions in the program; `per_step`, how many run
  in one call (inside while loops: times the trip count); `bytes_per_step`, the bytes of
  their results on one device (an all-gather's gathered array, an all-reduce's reduced one, a
  reduce-scatter's shard), summed over the runs. Asynchronous pairs count once: the
  '-start' op, with the '-done' op's result."""
  computations, entry = _computations(text)
  runs = _executions(computations, entry)
  found = {kind: {'ops': 0, 'per_step': 0, 'bytes_per_step': 0} for kind in COLLECTIVES}
  for name, lines in computations.items():
    for line in lines:
      op = _OP.match(line)
      if not op:
        continue
      result, opcode = op.groups()
      kind = opcode.removesuffix('-start').removesuffix('-done')
      if kind not in found:
        continue
      if not opcode.endswith('-done'):
        found[kind]['ops'] += 1
        found[kind]['per_step'] += runs[name]
      if not opcode.endswith('-start'):
        found[kind]['bytes_per_step'] += runs[name] * array_bytes(result)
  return found


# --- One row: a model's step on one mesh, in a process with the devices ----------------------


def sharding_rule(mesh: jax.sharding.Mesh) -> str:
  """FSDP alone, or Megatron-style tensor parallelism over `model` with FSDP."""
  return 'tp+fsdp' if parallel.MODEL_AXIS in mesh.axis_names else 'fsdp'


def placed_bytes(compiled: Any) -> tuple[Any, Any]:
  """Bytes of one device's shard of each argument leaf of a compiled `step(state, batch)`,
  where the program takes it: (state tree, batch tree)."""
  infos, shardings = compiled.args_info[0], compiled.input_shardings[0]
  shard = lambda a, s: math.prod(s.shard_shape(a.shape)) * a.dtype.itemsize
  return jax.tree.map(shard, infos, shardings)


def compile_step(model: Any, params: Any, mesh: jax.sharding.Mesh, batch: int, settings: Settings):
  """The trainer's step on `mesh` at a global `batch` (`programs.lower_train`), compiled on
  abstract arrays (`params`: the model's, abstract)."""
  side = settings.resolution
  images = jax.ShapeDtypeStruct((batch, side, side, 3), jnp.float32)
  labels = jax.ShapeDtypeStruct((batch,), jnp.int32)
  how = (mesh, sharding_rule(mesh), settings.optimizer)
  return programs.lower_train(model, params, images, labels, 1, *how)[1].compile()


def _at_batch(model: Any, params: Any, mesh: jax.sharding.Mesh, per_device: int, settings):
  """(XLA's memory and the collectives per step at `per_device` images per device, the bytes
  of each state leaf's shard on one device)."""
  start = time.perf_counter()
  compiled = compile_step(model, params, mesh, per_device * mesh.size, settings)
  seconds = time.perf_counter() - start
  state, batch = placed_bytes(compiled)
  m = compiled.memory_analysis()
  total = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
  measured = {
    'per_device_batch': per_device,
    'argument_bytes': int(m.argument_size_in_bytes),
    'output_bytes': int(m.output_size_in_bytes),
    'alias_bytes': int(m.alias_size_in_bytes),
    'temp_bytes': int(m.temp_size_in_bytes),
    'total_bytes': int(total + m.temp_size_in_bytes),
    'batch_bytes': int(sum(jax.tree.leaves(batch))),
    'compile_s': seconds,
    'collectives': hlo_collectives(compiled.as_text()),
  }
  return measured, state


def mesh_row(
  name: str, mesh_spec: str, batches: Sequence[int], settings: Settings, overrides=None
) -> dict[str, Any]:
  """One model on one mesh of this process's devices, compiled at each per-device batch of
  `batches`: the state's bytes per device, and XLA's memory and the collectives per step at
  each batch (`at_batch`)."""
  mesh = parallel.create_mesh(jax.devices(), mesh_spec)
  model = build_model(model_config(name, overrides), settings.num_classes, settings.variant)
  image = jnp.zeros((1, settings.resolution, settings.resolution, 3))
  params = jax.eval_shape(lambda: model.init(jax.random.key(0), image, train=False))['params']
  at = [_at_batch(model, params, mesh, b, settings) for b in batches]
  state = at[0][1]
  return {
    'model': name,
    'devices': mesh.size,
    'mesh': mesh_spec,
    'mesh_shape': dict(mesh.shape),
    'rule': sharding_rule(mesh),
    'parameters': int(sum(math.prod(x.shape) for x in jax.tree.leaves(params))),
    'param_bytes': int(sum(jax.tree.leaves(state['params']))),
    'optimizer_bytes': int(sum(jax.tree.leaves(state['opt_state']))),
    'at_batch': [measured for measured, _ in at],
  }


def device_rows(
  models: Sequence[str],
  meshes: Sequence[str],
  batches: Sequence[int],
  settings: dict[str, Any],
  overrides: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
  """`mesh_row` of every model and mesh on this process's devices (a child's work)."""
  chosen = Settings(**settings)
  rows = []
  for name in models:
    for spec in meshes:
      rows.append(mesh_row(name, spec, batches, chosen, (overrides or {}).get(name)))
  return rows


# --- The whole table: one child process per device count and model --------------------------

# A child: `device_rows` of its JSON argument, printed as JSON on its last line.
CHILD = """
import json, sys
from vit_jax.benchmark import mesh_table
print(json.dumps(mesh_table.device_rows(**json.loads(sys.argv[1]))))
"""


def child_env(devices: int) -> dict[str, str]:
  """This process's environment for a child of `devices` simulated CPU devices."""
  env = dict(os.environ)
  flags = re.sub(r'--xla_force_host_platform_device_count=\S+', '', env.get('XLA_FLAGS', ''))
  env['XLA_FLAGS'] = f'{flags} --xla_force_host_platform_device_count={devices}'.strip()
  env['JAX_PLATFORMS'] = 'cpu'
  return env


def _child(devices: int, job: dict[str, Any]) -> list[dict[str, Any]]:
  done = subprocess.run(
    [sys.executable, '-c', CHILD, json.dumps(job)],
    capture_output=True,
    text=True,
    env=child_env(devices),
  )
  if done.returncode:
    tail = done.stderr.strip().splitlines()[-1:] or ['(no output)']
    raise RuntimeError(f'the {devices}-device compile of {job["models"]} failed: {tail[0]}')
  return json.loads(done.stdout.strip().splitlines()[-1])


def check(meshes: Sequence[str], devices: Sequence[int], batches: Sequence[int]) -> None:
  """A ValueError naming the first mesh that does not lay out over a device count, or the
  per-device batches where they are not increasing."""
  if not batches or list(batches) != sorted(set(batches)) or batches[0] < 1:
    raise ValueError(f'--per_device_batch={",".join(map(str, batches))}: increasing, from 1')
  for spec in meshes:
    for n in devices:
      parallel.mesh_shape(spec, n)


def run_mesh_table(
  models: Sequence[str],
  devices: Sequence[int],
  meshes: Sequence[str],
  batches: Sequence[int],
  settings: Settings = Settings(),
  device_gib: float = 80.0,
  log: Callable[[str], None] = lambda s: None,
  overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
  """Every model on every mesh of every device count, one child process per device count and
  model; JSON-ready, with the conditions and the run's seconds."""
  check(meshes, devices, batches)
  start, load = time.perf_counter(), os.getloadavg()[0]
  rows = []
  for n in devices:
    for name in models:
      job = {
        'models': [name],
        'meshes': list(meshes),
        'batches': list(batches),
        'settings': dataclasses.asdict(settings),
        'overrides': overrides,
      }
      began = time.perf_counter()
      for row in _child(n, job):
        for at in row['at_batch']:
          at['fits'] = at['total_bytes'] <= device_gib * GIB
        rows.append(row)
      log(f'  {name} on {n} devices: {time.perf_counter() - began:.0f} s')
  return {
    'settings': dataclasses.asdict(settings),
    'device_gib': device_gib,
    'platform': 'cpu (simulated devices)',
    'jax': jax.__version__,
    'date': datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds'),
    'run_s': time.perf_counter() - start,
    'cpu_count': os.cpu_count(),
    'load_average_start_end': [load, os.getloadavg()[0]],  # other processes' share of the cores
    'rows': rows,
  }


def _gib(value: float) -> str:
  return f'{value / GIB:,.2f}'


def format_memory(result: dict[str, Any]) -> str:
  """Markdown, GiB per device: the parameters' and optimizer's shards, and at each per-device
  batch XLA's temporaries and whole memory; the batches whose step fits the device."""
  batches = [at['per_device_batch'] for at in result['rows'][0]['at_batch']]
  head = ['devices', 'model', 'mesh', 'params', 'optimizer']
  head += [f'{what} @{b}' for b in batches for what in ('temp', 'total')]
  head += [f'fits {result["device_gib"]:g} GiB at', 'compile s']
  lines = ['| ' + ' | '.join(head) + ' |', '|---|---|---|' + '---:|' * (len(head) - 3)]
  for r in result['rows']:
    cells = [str(r['devices']), r['model'], r['mesh']]
    cells += [_gib(r['param_bytes']), _gib(r['optimizer_bytes'])]
    cells += [_gib(at[k]) for at in r['at_batch'] for k in ('temp_bytes', 'total_bytes')]
    fits = [str(at['per_device_batch']) for at in r['at_batch'] if at['fits']]
    cells += [', '.join(fits) or 'none', f'{sum(at["compile_s"] for at in r["at_batch"]):.0f}']
    lines.append('| ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def format_collectives(result: dict[str, Any]) -> str:
  """Markdown: the collectives per step at the first per-device batch: runs (in brackets the
  ops in the program) and GiB of their results on one device."""
  short = {'all-reduce': 'AR', 'all-gather': 'AG', 'reduce-scatter': 'RS', 'all-to-all': 'A2A'}
  short['collective-permute'] = 'CP'
  head = ['devices', 'model', 'mesh', *(f'{short[k]} runs (ops)' for k in COLLECTIVES)]
  head += [f'{short[k]} GiB' for k in ('all-reduce', 'all-gather')] + ['all GiB']
  lines = ['| ' + ' | '.join(head) + ' |', '|' + '---:|' * len(head)]
  for r in result['rows']:
    c = r['at_batch'][0]['collectives']
    total = sum(v['bytes_per_step'] for v in c.values())
    cells = [str(r['devices']), r['model'], r['mesh']]
    cells += [f'{c[k]["per_step"]:,} ({c[k]["ops"]})' for k in COLLECTIVES]
    cells += [_gib(c[k]['bytes_per_step']) for k in ('all-reduce', 'all-gather')] + [_gib(total)]
    lines.append('| ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def format_tables(result: dict[str, Any]) -> str:
  return format_memory(result) + '\n\n' + format_collectives(result)
