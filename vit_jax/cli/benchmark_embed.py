"""vit-embed's speed beside its model's: `python -m vit_jax.benchmark --embedder`.

  python -m vit_jax.benchmark --embedder [--checkpoint=ViT-B_16] [--images=2000] \
      [--dtypes=float32,bfloat16] [--batch=32] [--rounds=2] [--json=embedder.json]

A folder of `--images` synthetic JPEGs of `--image_size` (kept in `--embedder_dir` for reuse)
embedded as `vit-embed --folder` embeds it, against the same images preprocessed beforehand
through the model alone, both per dtype, rounds interleaved (`vit_jax.benchmark.embedder`).
The checkpoint is any `vit_jax.load` reads; by default a registered ViT-B/16 with random
weights. Run it on an otherwise quiet machine: both numbers share its cores.
"""

import os
import sys
import tempfile
from collections.abc import Sequence

from absl import flags

from vit_jax import cli
from vit_jax.benchmark import embedder


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """The `--embedder` mode's flags, on `flag_values` (defined at program start)."""
  fv = flag_values
  flags.DEFINE_bool('embedder', True, "vit-embed's benchmark (this mode)", flag_values=fv)
  flags.DEFINE_string('checkpoint', 'ViT-B_16', 'what vit_jax.load reads', flag_values=fv)
  default_dir = os.path.join(tempfile.gettempdir(), 'vit_jax_embedder_benchmark')
  flags.DEFINE_string('embedder_dir', default_dir, 'where the JPEG folder is kept', flag_values=fv)
  flags.DEFINE_integer('images', 2000, 'JPEGs in the folder', flag_values=fv)
  flags.DEFINE_string('image_size', '224x224', 'their size, WxH', flag_values=fv)
  flags.DEFINE_list('dtypes', ['float32', 'bfloat16'], 'compute dtypes', flag_values=fv)
  flags.DEFINE_integer('batch', 32, 'images per batch', flag_values=fv)
  flags.DEFINE_integer('rounds', 2, 'interleaved rounds', flag_values=fv)
  flags.DEFINE_string('json', None, 'write the results here (JSON)', flag_values=fv)


def main(argv: Sequence[str]) -> None:
  del argv
  f = flags.FLAGS
  cli.quiet_logs()  # jax logs at INFO as it looks for accelerators
  w, h = (int(s) for s in f.image_size.split('x'))
  result = embedder.run_embedder_benchmark(
    f.checkpoint, f.embedder_dir, f.images, (w, h), f.dtypes, f.batch, f.rounds,
    log=lambda s: print(s, file=sys.stderr, flush=True),
  )  # fmt: skip
  cli.report(embedder.format_table(result), result, f.json)
