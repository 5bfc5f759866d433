"""The sigmoid loss's memory per device, gathered against chunked:
`python -m vit_jax.benchmark --contrastive_loss`.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu \\
      python -m vit_jax.benchmark --contrastive_loss --batches 4096,16384,32768 --dim 768

Compiles, on abstract arrays (nothing is allocated or run), SigLIP's loss alone
(vit_jax/tasks/contrastive_losses.py) on (B, dim) embeddings with its gradient w.r.t. both
embeddings, t and b (`jax.value_and_grad`, what training compiles), under `jax.jit` on the
global batch (rows split over the mesh, as the jit step has them) and inside `jax.shard_map`
(each device's rows, as the shard_map step), both forms of `config.contrastive.logits`, on
every device JAX sees; prints the compiled programs' temporaries of one device
(`compiled.memory_analysis().temp_size_in_bytes`) in MiB, a markdown table.
"""

import sys
from collections.abc import Sequence

import jax
from absl import flags

from vit_jax import parallel
from vit_jax.benchmark import contrastive_loss
from vit_jax.tasks import contrastive_losses


def table(batches: Sequence[int], mesh_size: int, measured: dict[str, list[int]]) -> str:
  """The markdown table of `contrastive_loss.measure`: a row per global batch, a column per
  step and form, in MiB."""
  head = ['global batch', 'per device', *measured]
  lines = ['| ' + ' | '.join(head) + ' |', '|' + '---:|' * len(head)]
  for i, batch in enumerate(batches):
    mib = [f'{values[i] / 2**20:,.1f}' for values in measured.values()]
    lines.append('| ' + ' | '.join([f'{batch:,}', f'{batch // mesh_size:,}', *mib]) + ' |')
  return '\n'.join(lines)


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """The `--contrastive_loss` mode's flags, on `flag_values` (defined at program start)."""
  fv = flag_values
  flags.DEFINE_bool(
    'contrastive_loss', True, "the sigmoid loss's memory per device (this mode)", flag_values=fv
  )
  flags.DEFINE_list('batches', ['4096', '16384', '32768'], 'global batch sizes', flag_values=fv)
  flags.DEFINE_integer('dim', 768, 'embedding width (SigLIP B: 768)', flag_values=fv)


def main(argv: Sequence[str]) -> None:
  del argv
  f = flags.FLAGS
  mesh = parallel.create_mesh()
  device = jax.devices()[0]
  print(
    f'{mesh.size} x {device.platform} ({device.device_kind}), jax {jax.__version__}, '
    f'd={f.dim}, chunk={contrastive_losses.CHUNK}; temporaries per device, MiB',
    file=sys.stderr,
  )
  batches = [int(b) for b in f.batches]
  print(table(batches, mesh.size, contrastive_loss.measure(batches, f.dim, mesh)))
