"""The device mesh, sharding rules and global batches.

The mesh has named axes (`config.mesh`, e.g. 'data:-1', today's default, or
'data:-1,model:4'): `data` and `fsdp` split the batch, `fsdp` also splits parameters and
optimizer state (FSDP, ZeRO-3), and `model` splits each layer's matmuls (tensor parallelism,
Megatron-style). Parameters and optimizer state are placed by a list of `(regex, rule)`
pairs matched against each leaf's '/'-joined path. The train step is compiled once with
`jax.jit` and these NamedShardings, and XLA's GSPMD partitioner inserts the collectives, so
the gradient of a replicated parameter is the true global gradient (the mesh axes are
`AxisType.Auto`: docs/multihost.md says why). The per-device alternative
(`config.step='shard_map'`, vit_jax/train/steps.py) writes that reduction out as a
`lax.pmean` of per-device gradients, on the 1-D data mesh.
"""

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

DATA_AXIS = 'data'
FSDP_AXIS = 'fsdp'
MODEL_AXIS = 'model'
# The mesh's axes in the order they are laid out: the batch axes outermost (across hosts),
# `model` innermost (within a host, where the links are fastest).
AXES = (DATA_AXIS, FSDP_AXIS, MODEL_AXIS)
BATCH_AXES = (DATA_AXIS, FSDP_AXIS)
DEFAULT_MESH = 'data:-1'
RULES = ('replicate', 'fsdp', 'tp', 'tp+fsdp')
# Leaves smaller than this stay replicated under 'fsdp': sharding them saves nothing.
FSDP_MIN_SIZE = 2**14
# Megatron-style tensor parallelism of a transformer block (Shoeybi et al., 2019): the
# query/key/value projections and the MLP's first layer split by their outputs (heads,
# hidden units), the attention's output projection and the MLP's second layer by their
# inputs, so that each block needs one all-reduce after attention and one after the MLP.
# Specs name a leaf's trailing dimensions (a scanned block's leading layer axis is left whole).
# The ViT's layout (also the text transformer's and Mixer's MLPs), then BERT's
# (vit_jax/models/text.py: (D, D) projections whose columns are the heads).
TENSOR_PARALLEL = (
  (r'attention_layer/(query|key|value)/kernel$', (None, MODEL_AXIS)),  # (D, D)
  (r'attention_layer/(query|key|value)/bias$', (MODEL_AXIS,)),
  (r'attention_block/dense_layer/kernel$', (MODEL_AXIS, None)),
  (r'mlp_block/mlp/dense_layer/kernel$', (None, MODEL_AXIS)),  # (D, mlp_dim)
  (r'mlp_block/mlp/dense_layer/bias$', (MODEL_AXIS,)),
  (r'mlp_block/dense_layer/kernel$', (MODEL_AXIS, None)),
  (r'(query|key|value)/kernel$', (MODEL_AXIS, None)),  # (D, heads, head_dim)
  (r'(query|key|value)/bias$', (MODEL_AXIS, None)),  # (heads, head_dim)
  (r'/out/kernel$', (MODEL_AXIS, None, None)),  # (heads, head_dim, D)
  (r'MlpBlock_\d+/Dense_0/kernel$', (None, MODEL_AXIS)),  # (D, mlp_dim)
  (r'MlpBlock_\d+/Dense_0/bias$', (MODEL_AXIS,)),
  (r'MlpBlock_\d+/Dense_1/kernel$', (MODEL_AXIS, None)),  # (mlp_dim, D)
)


def parse_mesh(spec: Any = DEFAULT_MESH) -> tuple[tuple[str, int], ...]:
  """`config.mesh` as ((axis, size), ...) in layout order: 'data:4,model:2', or pairs
  [('data', 4), ('model', 2)]; axes from `AXES`, each once; one size may be -1 (the rest)."""
  pairs = spec
  if isinstance(spec, str):
    try:
      pairs = [(name.strip(), int(size)) for name, size in (p.split(':') for p in spec.split(','))]
    except ValueError:
      pairs = None
  how = "e.g. 'data:-1' or 'data:-1,model:4'"
  if not pairs or any(len(p) != 2 for p in pairs):
    raise ValueError(f'config.mesh={spec!r}: expected axis:size pairs, {how}.')
  names = [name for name, _ in pairs]
  sizes = [size for _, size in pairs]
  if set(names) - set(AXES) or len(set(names)) != len(names):
    raise ValueError(f'config.mesh={spec!r}: axes are {AXES}, each at most once ({how}).')
  if any(not isinstance(s, int) or (s < 1 and s != -1) for s in sizes) or sizes.count(-1) > 1:
    raise ValueError(f'config.mesh={spec!r}: sizes are positive, one of them may be -1 ({how}).')
  return tuple(sorted(((n, s) for n, s in pairs), key=lambda p: AXES.index(p[0])))


def mesh_shape(spec: Any, num_devices: int) -> dict[str, int]:
  """Axis -> size of `config.mesh` over `num_devices` devices (-1: what the others leave)."""
  pairs = parse_mesh(spec)
  known = math.prod(s for _, s in pairs if s != -1)
  if any(s == -1 for _, s in pairs):
    if num_devices % known:
      raise ValueError(
        f'config.mesh={spec!r}: {num_devices} devices do not split into axes of {known}.'
      )
    pairs = tuple((n, num_devices // known if s == -1 else s) for n, s in pairs)
  if math.prod(s for _, s in pairs) != num_devices:
    raise ValueError(
      f'config.mesh={spec!r} has {math.prod(s for _, s in pairs)} devices, not the '
      f'{num_devices} of this run: make one size -1 (the rest).'
    )
  return dict(pairs)


def _per_process(shape: dict[str, int], num_processes: int) -> list[int]:
  """How many of each axis's positions lie across processes (the `dcn` sizes): the batch
  axes take the processes, outermost first; `model` stays within a process."""
  left, across = num_processes, []
  for name, size in shape.items():
    share = math.gcd(size, left) if name in BATCH_AXES else 1
    across.append(share)
    left //= share
  if left != 1:
    spec = ','.join(f'{n}:{s}' for n, s in shape.items())
    raise ValueError(
      f'config.mesh={spec!r} on {num_processes} processes: the batch axes must split over the '
      f'processes, so that the {MODEL_AXIS!r} axis stays within a process; make '
      f'{DATA_AXIS!r} a multiple of {num_processes}.'
    )
  return across


def device_grid(devices: Sequence[Any], shape: dict[str, int]) -> np.ndarray:
  """`devices` laid out as the mesh `shape` (axis -> size, in `AXES` order).

  The 1-D 'data' mesh keeps the caller's order (the batch blocks follow it). Otherwise, on
  several processes, each process's devices fill one block of the batch axes and `model`
  stays inside a process (`mesh_utils.create_hybrid_device_mesh`); on one process the axes
  follow the devices' topology (`mesh_utils.create_device_mesh`).
  """
  sizes = tuple(shape.values())
  if tuple(shape) == (DATA_AXIS,):
    return np.asarray(devices)
  processes = len({d.process_index for d in devices})
  if processes == 1:
    return mesh_utils.create_device_mesh(sizes, devices)
  across = _per_process(shape, processes)
  within = [size // n for size, n in zip(sizes, across, strict=True)]
  return mesh_utils.create_hybrid_device_mesh(within, across, devices, process_is_granule=True)


def create_mesh(devices: Sequence[jax.Device] | None = None, spec: Any = DEFAULT_MESH) -> Mesh:
  """The mesh of `config.mesh` over `devices` (default: all devices of all hosts)."""
  devices = jax.devices() if devices is None else list(devices)
  shape = mesh_shape(spec, len(devices))
  return Mesh(device_grid(devices, shape), tuple(shape))


def batch_axes(mesh: Mesh) -> tuple[str, ...]:
  """The mesh axes the batch is split over."""
  return tuple(a for a in BATCH_AXES if a in mesh.axis_names)


def data_parallel_size(mesh: Mesh) -> int:
  """How many ways the batch is split: the product of the batch axes' sizes."""
  return math.prod(mesh.shape[a] for a in batch_axes(mesh))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) dimension split over the batch axes, replicated over `model`."""
  axes = batch_axes(mesh)
  return NamedSharding(mesh, PartitionSpec(axes[0] if len(axes) == 1 else axes))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def parse_rules(rules: Any) -> list[tuple[str, Any]]:
  """`[(regex, rule), ...]`, or one rule for every leaf ('fsdp'); a rule is a name of
  `RULES` or a PartitionSpec-like tuple of mesh axes (or None) for the leaf's trailing
  dimensions."""
  if isinstance(rules, str):
    rules = [('.*', rules)]
  parsed = []
  for item in rules:
    if len(item) != 2 or not _valid_rule(item[1]):
      raise ValueError(
        f'Sharding rule {item!r}: expected (regex, rule) with rule in {RULES}, or a tuple of '
        f'mesh axes {AXES} and None for the trailing dimensions.'
      )
    rule = item[1] if isinstance(item[1], str) else tuple(item[1])
    parsed.append((str(item[0]), rule))
  return parsed


def _valid_rule(rule: Any) -> bool:
  if isinstance(rule, str):
    return rule in RULES
  return isinstance(rule, Sequence) and all(a is None or a in AXES for a in rule)


def _fsdp_axis(mesh: Mesh) -> str:
  """The axis FSDP splits parameters over: `fsdp` where the mesh has it, else `data`."""
  return FSDP_AXIS if FSDP_AXIS in mesh.axis_names else DATA_AXIS


def _fit(shape: tuple[int, ...], trailing: Sequence[Any], mesh: Mesh) -> list[Any]:
  """`trailing` aligned to the last dimensions of `shape`; an axis the mesh lacks, or whose
  size does not divide its dimension, replicates that dimension instead."""
  if len(trailing) > len(shape):
    return [None] * len(shape)
  spec = [None] * (len(shape) - len(trailing)) + list(trailing)
  for dim, axis in enumerate(spec):
    if axis is not None and (axis not in mesh.axis_names or shape[dim] % mesh.shape[axis]):
      spec[dim] = None
  return spec


def _add_fsdp(shape: tuple[int, ...], spec: list[Any], mesh: Mesh) -> list[Any]:
  """`spec` with FSDP's axis on the largest dimension it leaves whole that the axis divides."""
  axis = _fsdp_axis(mesh)
  if int(np.prod(shape, dtype=np.int64)) < FSDP_MIN_SIZE or axis in spec:
    return spec
  for dim in sorted(range(len(shape)), key=lambda d: -shape[d]):
    if spec[dim] is None and shape[dim] % mesh.shape[axis] == 0:
      return [*spec[:dim], axis, *spec[dim + 1 :]]
  return spec


def _tensor_parallel(name: str, shape: tuple[int, ...], mesh: Mesh) -> list[Any]:
  for pattern, trailing in TENSOR_PARALLEL:
    if re.search(pattern, name):
      return _fit(shape, trailing, mesh)
  return [None] * len(shape)


def leaf_spec(name: str, shape: tuple[int, ...], rule: Any, mesh: Mesh) -> PartitionSpec:
  """The PartitionSpec of the leaf at path `name` under `rule` on `mesh`."""
  if rule == 'replicate':
    spec = [None] * len(shape)
  elif rule == 'fsdp':
    spec = _add_fsdp(shape, [None] * len(shape), mesh)
  elif rule in ('tp', 'tp+fsdp'):
    spec = _tensor_parallel(name, shape, mesh)
    spec = _add_fsdp(shape, spec, mesh) if rule == 'tp+fsdp' else spec
  else:
    spec = _fit(shape, rule, mesh)
  return PartitionSpec(*spec) if any(a is not None for a in spec) else PartitionSpec()


def tree_shardings(tree: Any, mesh: Mesh, rules: Any = 'replicate') -> Any:
  """NamedShardings for a tree of arrays (params, optimizer state) by the first matching rule.

  Paths are '/'-joined keys, e.g. 'Transformer/encoderblock_0/MlpBlock_0/Dense_0/kernel';
  optimizer-state leaves end with the path of their parameter, so the same rules apply.
  Leaves no rule matches are replicated.
  """
  parsed = [(re.compile(pattern), rule) for pattern, rule in parse_rules(rules)]

  def leaf(path, x):
    name = '/'.join(str(getattr(k, 'key', getattr(k, 'name', getattr(k, 'idx', k)))) for k in path)
    rule = next((rule for regex, rule in parsed if regex.search(name)), 'replicate')
    return NamedSharding(mesh, leaf_spec(name, tuple(np.shape(x)), rule, mesh))

  return jax.tree_util.tree_map_with_path(leaf, tree)


# The train state's entries that the sharding rules place (vit_jax/train/state.py): the
# parameters, their optimizer state and their Polyak average; the step and the dropout key
# are replicated whatever the rules say.
RULED_STATE = ('params', 'opt_state', 'polyak')


def state_shardings(state: Mapping[str, Any], mesh: Mesh, rules: Any) -> dict[str, Any]:
  """NamedShardings of a train state (`RULED_STATE` by `rules`, the rest replicated)."""
  return {
    key: tree_shardings(tree, mesh, rules if key in RULED_STATE else 'replicate')
    for key, tree in state.items()
  }


def constrain(x: jax.Array, *axes: str | None) -> jax.Array:
  """`x` held with its dimensions split as `axes` says ('batch': the batch axes, 'model':
  the tensor-parallel axis, None: whole) on the mesh the step is traced under
  (`parallel.traced_on`), where XLA's propagation alone picks a worse layout: under FSDP it
  would split the activations by width, following the parameters, and gather the global
  batch onto every device. An axis the mesh lacks, or that does not divide its dimension,
  leaves it whole; outside a mesh (or inside `shard_map`, whose axes are manual) `x` is
  returned as it is."""
  mesh = jax.sharding.get_abstract_mesh()
  auto = set() if mesh.empty else {
    name for name, kind in zip(mesh.axis_names, mesh.axis_types, strict=True)
    if kind == jax.sharding.AxisType.Auto
  }  # fmt: skip
  spec = []
  for dim, axis in zip(x.shape, axes, strict=True):
    names = BATCH_AXES if axis == 'batch' else (axis,)
    names = tuple(a for a in names if a in auto)
    whole = not names or dim % math.prod(mesh.shape[a] for a in names)
    spec.append(None if whole else names[0] if len(names) == 1 else names)
  if all(a is None for a in spec):  # nothing to split: no constraint (not "replicated")
    return x
  return jax.lax.with_sharding_constraint(x, PartitionSpec(*spec))


def traced_on(mesh: Mesh, jitted: Any, shardings: Any) -> Any:
  """`jitted` (a `jax.jit` function) traced, lowered and called under `jax.set_mesh(mesh)`,
  so that the model's `constrain` applies, where the mesh has more than the data axis or the
  state (`shardings`) is split (FSDP); a replicated data-parallel step is left as it compiled
  before (its bfloat16 programs round alike on every mesh size)."""
  split = any(s.spec != PartitionSpec() for s in jax.tree.leaves(shardings))
  if mesh.axis_names == (DATA_AXIS,) and not split:
    return jitted

  def call(*args: Any) -> Any:
    with jax.set_mesh(mesh):
      return jitted(*args)

  def lower(*args: Any) -> Any:
    with jax.set_mesh(mesh):
      return jitted.lower(*args)

  call.lower = lower
  return call


def check_batch(batch: int, mesh: Mesh, accum_steps: int = 1, name: str = 'batch') -> None:
  """A clear error when the global batch does not split over hosts, the batch axes' devices
  and micro-batches."""
  shards = data_parallel_size(mesh)
  processes = jax.process_count()
  need = shards * max(1, accum_steps)
  if batch <= 0 or batch % need or batch % processes:
    axes = batch_axes(mesh)
    what = (
      f'{shards} devices'
      if mesh.axis_names == axes
      else f'{shards} batch shards ({" x ".join(axes)})'
    )
    what += f' x accum_steps={accum_steps}' if accum_steps > 1 else ''
    raise ValueError(
      f'config.{name}={batch} does not divide over {what}: use a multiple of {need} '
      f'(e.g. {max(need, batch // need * need) or need}).'
    )


def local_batch_size(batch: int) -> int:
  """This host's share of a global batch."""
  return batch // jax.process_count()


def global_batch(local: dict[str, np.ndarray], sharding: NamedSharding) -> dict[str, jax.Array]:
  """Global arrays over the mesh from this host's rows (hosts hold consecutive blocks)."""
  return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in local.items()}


def place(tree: Any, shardings: Any) -> Any:
  """Global arrays from a host tree that every process holds whole (a checkpoint read on
  each host): each device takes its slice of each leaf."""
  return jax.tree.map(
    lambda x, s: jax.make_array_from_callback(np.shape(x), s, lambda idx, x=x: x[idx]),
    tree,
    shardings,
  )
