"""Large ViTs' training step on 8 and 64 simulated devices, per mesh: memory per device and
the collectives per step: `python -m vit_jax.benchmark --mesh_table`.

  python -m vit_jax.benchmark --mesh_table --model ViT-giant_14,ViT-22B_14 --devices 8,64 \\
      --meshes 'fsdp:-1;fsdp:-1,model:2;fsdp:-1,model:4;fsdp:-1,model:8' \\
      --per_device_batch 4,16 --json mesh_table.json

Compiles the trainer's step (bfloat16 under the 'activations' precision policy, the encoder
blocks as one `nn.scan`, `--remat`, `--optimizer`) at each `--per_device_batch` with nothing
allocated, one child process per device count and model (`vit_jax.benchmark.mesh_table`).
Prints two Markdown tables: per device, the parameters' and optimizer's GiB (their shards),
XLA's temporaries and whole memory (arguments + outputs - donated + temporaries) at each batch,
and the batches whose step fits `--device_gib`; and the collectives per step at the first
batch: all-reduce, all-gather, reduce-scatter, all-to-all and collective-permute runs (inside
a scanned loop, times its trip count; in brackets the ops in the program) and the GiB of their
results on one device.
"""

import sys
from collections.abc import Sequence

from absl import app, flags

from vit_jax import cli
from vit_jax.benchmark import mesh_table
from vit_jax.benchmark.variants import REMAT
from vit_jax.models import MODEL_CONFIGS, unknown_model
from vit_jax.optim import OPTIMIZERS

DEFAULT_MODELS = 'ViT-giant_14,ViT-gigantic_14,ViT-e_14,ViT-22B_14'
DEFAULT_MESHES = 'fsdp:-1;fsdp:-1,model:2;fsdp:-1,model:4;fsdp:-1,model:8'


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """The `--mesh_table` mode's flags, on `flag_values` (defined at program start)."""
  fv = flag_values
  flags.DEFINE_bool(
    'mesh_table', True, 'memory and collectives per mesh (this mode)', flag_values=fv
  )
  flags.DEFINE_list('model', DEFAULT_MODELS.split(','), 'registered model names', flag_values=fv)
  flags.DEFINE_list('devices', ['8', '64'], 'simulated device counts', flag_values=fv)
  flags.DEFINE_string(
    'meshes', DEFAULT_MESHES, "meshes (config.mesh), separated by ';'", flag_values=fv
  )
  flags.DEFINE_list(
    'per_device_batch',
    ['4', '8'],
    "images per device, increasing: each compiled (the collectives shown are the first one's)",
    flag_values=fv,
  )
  flags.DEFINE_enum(
    'remat', 'full', [r for r in REMAT if r != 'none'], 'remat policy', flag_values=fv
  )
  flags.DEFINE_enum('optimizer', 'adam', list(OPTIMIZERS), 'the optimizer', flag_values=fv)
  flags.DEFINE_integer('resolution', 224, 'image side in pixels', flag_values=fv)
  flags.DEFINE_integer('num_classes', 1000, 'head width', flag_values=fv)
  flags.DEFINE_float('device_gib', 80.0, 'device memory for the fit, GiB', flag_values=fv)
  flags.DEFINE_string('json', None, 'write the results here (JSON)', flag_values=fv)


def _arguments(f: flags.FlagValues) -> tuple[list[str], list[int], list[str], list[int]]:
  """(models, device counts, meshes, per-device batches), checked: a usage error names the
  first bad one."""
  for name in f.model:
    if name not in MODEL_CONFIGS:
      raise app.UsageError(f'{unknown_model(name)} `vit-models` lists the registered ones.')
  try:
    devices = [int(n) for n in f.devices]
    batches = [int(b) for b in f.per_device_batch]
  except ValueError as e:
    raise app.UsageError(f'--devices and --per_device_batch take integers: {e}') from e
  meshes = [m.strip() for m in f.meshes.split(';') if m.strip()]
  try:
    mesh_table.check(meshes, devices, batches)
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  return list(f.model), devices, meshes, batches


def main(argv: Sequence[str]) -> None:
  del argv
  f = flags.FLAGS
  cli.quiet_logs()
  models, devices, meshes, batches = _arguments(f)
  settings = mesh_table.Settings(
    remat=f.remat, optimizer=f.optimizer, resolution=f.resolution, num_classes=f.num_classes
  )
  log = lambda s: print(s, file=sys.stderr, flush=True)
  try:
    result = mesh_table.run_mesh_table(
      models, devices, meshes, batches, settings, f.device_gib, log
    )
  except RuntimeError as e:  # a child's compile failed: one line
    sys.exit(f'error: {e}')
  log(f'{len(result["rows"])} rows in {result["run_s"]:.0f} s')
  cli.report(mesh_table.format_tables(result), result, f.json)
