"""Prints the model zoo: the paper's Table 1 reproduced from the code.

python -m vit_jax.models [--resolution 224] [--num_classes 1000] [--xla_flops]
"""

from absl import flags

from vit_jax import cli, families
from vit_jax.models import MODEL_CONFIGS, get_model, stats

# The paper's Table 1 "Params" column, per variant (hidden size D).
PAPER_PARAMS_M = {768: ('ViT-Base', 86), 1024: ('ViT-Large', 307), 1280: ('ViT-Huge', 632)}


def table_rows(resolution: int = 224, num_classes: int = 1000, xla_flops: bool = False):
  """One dict per registered model with its size, exact count and forward GFLOPs."""
  rows = []
  for name, config in MODEL_CONFIGS.items():
    family = families.of_config(config)
    model = get_model(name, num_classes=num_classes)
    params = stats.count_params(stats.param_shapes(model, resolution))
    row = {
      'model': name,
      **family.table_columns(config),
      'patch': config.patches.size[0],
      'params': params,
      'gflops': stats.forward_flops(config, resolution, num_classes) / 1e9,
      'paper': '',
    }
    if xla_flops:
      row['xla_gflops'] = stats.xla_forward_flops(model, resolution) / 1e9
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
    f'Registered models at {f.resolution} px with {f.num_classes} classes '
    '(params exact; GFLOPs: forward, per image, 2 per multiply-add).'
  )
  print(format_table(rows))
  print(
    '\nThe paper rounds per variant; "patch" changes only the patch embedding and the '
    'position embeddings. Its 307M for ViT-Large matches no exact count (L/16 is 304.3M).'
  )


def run_cli() -> None:
  """The `vit-models` console script (and `python -m vit_jax.models`)."""
  cli.start(define_flags, main)
