r"""Looks inside a checkpoint: the paper's Figure 7 (left, center, right) and Figure 6.

  python -m vit_jax.visualize --checkpoint PATH [--model NAME] [--resolution R] \
      [--image IMG ...] --out DIR

writes PNGs to DIR:
  patch_filters.png       the first 28 principal components of the patch-embedding filters
  posemb_similarity.png   cosine similarity of each patch's position embedding with all others
  attention_distance.png  mean attention distance of every head against depth (needs --image)
  attention_rollout_<image>.png  attention rollout (Abnar & Zuidema 2020) over each --image

The computations are `vit_jax.inference.attention`'s, the pictures
`vit_jax.inference.figures`'.
"""

import sys
from collections.abc import Sequence

from absl import app, flags

from vit_jax import cli


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """The command line's flags, on `flag_values` (defined at program start, not at import)."""
  fv = flag_values
  cli.define_checkpoint_flags(fv)
  flags.DEFINE_multi_string(
    'image',
    [],
    'Image for the attention figures; repeat for several (distances are averaged).',
    flag_values=fv,
  )
  flags.DEFINE_string('out', None, 'Directory for the PNGs.', required=True, flag_values=fv)


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}; give images with --image.')
  f = flags.FLAGS
  cli.quiet_logs()  # orbax and JAX log at INFO on every restore
  from vit_jax import data, inference
  from vit_jax.inference import figures

  data.hide_accelerators_from_tensorflow()
  try:
    model = inference.load(f.checkpoint, model=f.model, resolution=f.resolution)
  except (OSError, ValueError, KeyError) as e:
    print(f'error: {f.checkpoint}: {e}'.replace('\n', ' '), file=sys.stderr)
    sys.exit(1)
  written, errors = figures.visualize(model, f.out, f.image)
  for error in errors:  # each unreadable image, one line
    print(f'error: {error}', file=sys.stderr)
  for path in written:
    print(f'wrote {path}')
  sys.exit(1 if errors else 0)


def run_cli() -> None:
  """The `vit-visualize` console script (and `python -m vit_jax.visualize`)."""
  cli.start(define_flags, main)
