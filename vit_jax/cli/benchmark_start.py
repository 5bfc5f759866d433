"""How long a command takes to start, cold and warm: `python -m vit_jax.benchmark --start`.

  python -m vit_jax.benchmark --start [--checkpoint=ViT-B_16] [--rounds=2] [--json=start.json]

Each round starts fresh processes on an empty compilation-cache folder: a probe of what
`vit-predict` does (imports, checkpoint read, first batch, the batch again), cold and then warm,
and `vit-predict` itself, cold and warm (`vit_jax.benchmark.start`). The checkpoint is a
classifier's file with a head, or a registered classifier, written once to `--start_dir` with
random weights.
"""

import os
import sys
import tempfile
from collections.abc import Sequence

from absl import flags

from vit_jax import cli
from vit_jax.benchmark import start


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """The `--start` mode's flags, on `flag_values` (defined at program start)."""
  fv = flag_values
  flags.DEFINE_bool('start', True, "a command's start (this mode)", flag_values=fv)
  flags.DEFINE_string('checkpoint', 'ViT-B_16', 'a file, or a registered name', flag_values=fv)
  default_dir = os.path.join(tempfile.gettempdir(), 'vit_jax_start_benchmark')
  flags.DEFINE_string(
    'start_dir', default_dir, 'where the image and a written checkpoint are kept', flag_values=fv
  )
  flags.DEFINE_integer('rounds', 2, 'rounds (each cold, then warm)', flag_values=fv)
  flags.DEFINE_string('json', None, 'write the results here (JSON)', flag_values=fv)


def main(argv: Sequence[str]) -> None:
  del argv
  f = flags.FLAGS
  cli.quiet_logs()  # jax logs at INFO as it looks for accelerators
  log = lambda s: print(s, file=sys.stderr, flush=True)
  result = start.run_start_benchmark(f.checkpoint, f.start_dir, f.rounds, log)
  cli.report(start.format_table(result), result, f.json)
