"""Packed NaFlex rows against one image a row, in training: `python -m vit_jax.benchmark
--packing`.

  python -m vit_jax.benchmark --packing [--rows=16] [--tokens=256] [--images_per_row=8] \
      [--read=3] [--rounds=3] [--json=packing.json]

The trainer's step on a NaFlex classifier (ViT-Ti/16's encoder, patches of 16), on two
batches of `--rows` rows of `--tokens` patch slots cut from one stream of images of
NaViT-style sizes (each image's patch budget uniform in {64, 80, ..., 256}, its aspect ratio
log-uniform in [1/4, 4]): one image a row, and packed, at most `--images_per_row` a row from
a chunk of `--rows` x `--read` images (vit_jax.benchmark.packing). Prints each batch's
images, padding (padding slots / all slots), step seconds and images/s, and the ratio of
images/s. The issue's goal: at most 3% padding packed, and at least 1.4x the images/s.
"""

import sys
from collections.abc import Sequence

import jax
from absl import flags

from vit_jax import cli


def table(result: dict) -> str:
  """The markdown table of `packing.measure`'s result."""
  lines = ['| rows hold | images | padding | step s | images/s |', '|---|---:|---:|---:|---:|']
  for name in ('one a row', 'packed'):
    r = result[name]
    lines.append(
      f'| {name} | {r["images"]} | {r["padding"]:.1%} | {r["step_s"]:.3f} | '
      f'{r["images_per_s"]:.1f} |'
    )
  return '\n'.join(lines) + f'\n\npacked / one a row: {result["speedup"]:.2f}x images/s'


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """The `--packing` mode's flags, on `flag_values` (defined at program start)."""
  fv = flag_values
  flags.DEFINE_bool('packing', True, 'packed NaFlex rows in training (this mode)', flag_values=fv)
  flags.DEFINE_integer('rows', 16, 'rows per batch', lower_bound=1, flag_values=fv)
  flags.DEFINE_integer('tokens', 256, 'patch slots per row', lower_bound=256, flag_values=fv)
  flags.DEFINE_integer('images_per_row', 8, 'the most images a packed row holds', lower_bound=1,
                       flag_values=fv)  # fmt: skip
  flags.DEFINE_integer('read', 3, 'images read per packed row', lower_bound=1, flag_values=fv)
  flags.DEFINE_integer('rounds', 3, 'interleaved rounds', lower_bound=1, flag_values=fv)
  flags.DEFINE_integer('steps', 2, 'timed steps per round', lower_bound=1, flag_values=fv)
  flags.DEFINE_integer('seed', 0, 'the image stream and the weights', flag_values=fv)
  flags.DEFINE_string('json', None, 'write the results here (JSON)', flag_values=fv)


def main(argv: Sequence[str]) -> None:
  del argv
  from vit_jax.benchmark import packing  # imports TensorFlow (the pipeline's packing)

  f = flags.FLAGS
  cli.quiet_logs()  # jax logs at INFO as it looks for accelerators
  device = jax.devices()[0]
  print(f'{device.platform} ({device.device_kind}), jax {jax.__version__}', file=sys.stderr)
  result = packing.measure(
    rows=f.rows, tokens=f.tokens, images=f.images_per_row, read=f.read, rounds=f.rounds,
    steps=f.steps, seed=f.seed,
  )  # fmt: skip
  cli.report(table(result), result, f.json)
