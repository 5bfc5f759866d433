"""Prints the model zoo, every registered model: the classifiers (the paper's Table 1
reproduced from the code, the hybrids, DeiT, Mixer), then the image-text models, each at its
own image size.

python -m vit_jax.models [--resolution 224] [--num_classes 1000] [--xla_flops]
"""

import jax.numpy as jnp
from absl import flags

from vit_jax import cli, families
from vit_jax.models import MODEL_CONFIGS, stats

# The paper's Table 1 "Params" column, per variant (hidden size D).
PAPER_PARAMS_M = {768: ('ViT-Base', 86), 1024: ('ViT-Large', 307), 1280: ('ViT-Huge', 632)}


def table_rows(
  resolution: int = 224, num_classes: int = 1000, xla_flops: bool = False, names=None
) -> list[dict]:
  """One dict per registered model (of `names`, default all) with its size, exact count and
  forward GFLOPs, and `image_text`: whether it belongs to the second table."""
  rows = []
  for name in MODEL_CONFIGS if names is None else names:
    config = MODEL_CONFIGS[name]
    family = families.of_config(config)
    model = family.build(config, num_classes=num_classes, dtype=jnp.float32, precision='matmul')
    columns = family.table_columns(config)
    size = columns.pop('resolution', resolution)
    params = stats.count_params(families.param_shapes(model, size))
    if 'patch' not in columns:  # a NaFlex tower's columns say it: it has no `patches`
      columns['patch'] = family.image_config(config)['patches']['size'][0]
    row = {
      'model': name,
      **columns,
      'params': params,
      'gflops': families.forward_flops(config, size, num_classes) / 1e9,
      'paper': '',
      'image_text': family.image_text,
    }
    if xla_flops:
      row['xla_gflops'] = families.xla_forward_flops(model, size) / 1e9
    if family.is_plain(config) and config.hidden_size in PAPER_PARAMS_M:
      variant, paper = PAPER_PARAMS_M[config.hidden_size]
      row['paper'] = f'{paper}M'
      diff = params / 1e6 - paper
      if abs(diff) >= 1:
        row['note'] = f'DIFFERS from {variant} by {diff:+.1f}M'
    rows.append(row)
  return rows


def format_table(rows) -> str:
  has_xla = 'xla_gflops' in rows[0]
  header = (
    ['model', 'layers', 'hidden', 'MLP', 'heads', 'patch', 'params', 'paper', 'GFLOPs']
    + (['XLA GFLOPs'] if has_xla else [])
    + ['note']
  )
  lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
  for r in rows:
    cells = [
      r['model'],
      r['layers'],
      r['hidden'],
      r['mlp'],
      r['heads'],
      r['patch'],
      f'{r["params"]:,}',
      r['paper'],
      f'{r["gflops"]:.2f}',
    ]
    cells += [f'{r["xla_gflops"]:.2f}'] if has_xla else []
    lines.append('| ' + ' | '.join(str(c) for c in [*cells, r['note']]) + ' |')
  return '\n'.join(lines)


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """The command line's flags, on `flag_values` (defined at program start, not at import)."""
  fv = flag_values
  flags.DEFINE_integer('resolution', 224, 'Input resolution in pixels.', flag_values=fv)
  flags.DEFINE_integer('num_classes', 1000, 'Head width.', flag_values=fv)
  flags.DEFINE_bool('xla_flops', False, "Add XLA's cost-analysis FLOPs (slower).", flag_values=fv)


def main(argv):
  del argv
  f = flags.FLAGS
  rows = table_rows(f.resolution, f.num_classes, f.xla_flops)
  print(
    f'Registered classifiers at {f.resolution} px with {f.num_classes} classes '
    '(params exact; GFLOPs: forward, per image, 2 per multiply-add).'
  )
  print(format_table([r for r in rows if not r['image_text']]))
  print(
    '\nThe paper rounds per variant; "patch" changes only the patch embedding and the '
    'position embeddings. Its 307M for ViT-Large matches no exact count (L/16 is 304.3M).'
  )
  print(
    '\nRegistered image-text models, each at its own image size (its pp.size); the columns '
    "are the image tower's, GFLOPs its forward pass."
  )
  print(format_table([r for r in rows if r['image_text']]))


def run_cli() -> None:
  """The `vit-models` console script (and `python -m vit_jax.models`)."""
  cli.start(define_flags, main)
