"""Prints the model zoo, every registered model: the classifiers (the paper's Table 1
reproduced from the code, the hybrids, DeiT, Mixer), then the image-text models, each at its
own image size.

python -m vit_jax.models [--resolution 224] [--num_classes 1000] [--xla_flops]

With `--describe FILE`, one checkpoint instead (anything `vit_jax.load` takes: a released
.npz in any layout, a Hugging Face or timm file, LiT, SigLIP, SigLIP 2, NaFlex, a training
run, a vit-export directory), read but not run: its kind, architecture, counts, resolution
or patch budget, preprocessing, tokenizer, class names, and every setting the project
computes otherwise than the file states; `--json` prints it as one JSON object.

python -m vit_jax.models --describe FILE [--json]
"""

import json
import sys
from collections.abc import Sequence

import jax.numpy as jnp
from absl import flags, logging

from vit_jax import cli, families
from vit_jax.inference import describe
from vit_jax.models import MODEL_CONFIGS, stats

SHOWN_CLASS_NAMES = 5  # the first few a description prints
TABLE_FLAGS = ('resolution', 'num_classes', 'xla_flops')

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


def describe_lines(d: describe.Description) -> list[str]:
  """A checkpoint's description, a line a subject (`--describe`)."""
  tower = f' (image tower: {d.image_tower})' if d.image_tower else ''
  counts = 'unknown (an exported program)'
  if d.parameters is not None:
    counts = f'{d.arrays:,} arrays, {d.parameters:,} parameters'
  lines = [
    f'checkpoint: {d.source}',
    f'format: {d.format}',
    f'kind: {d.kind}{tower}',
    f'model: {d.model or "unregistered"}',
    f'architecture: {d.architecture or "unknown (an exported program)"}',
    f'counts: {counts}',
    _input_line(d),
    f'preprocessing: {d.preprocessing}',
  ]
  if d.tokenizer is not None:
    lines.append(_tokenizer_line(d.tokenizer))
  lines.append(_classes_line(d))
  lines.append('computed unlike the file:' + ('' if d.unlike else ' none'))
  lines += [f'  {line}' for line in d.unlike]
  return lines


def _input_line(d: describe.Description) -> str:
  if d.max_patches is not None:
    return f'patch budget: at most {d.max_patches} patches an image, at its own aspect ratio'
  size = d.resolution
  size = f'{size} px' if isinstance(size, int) else ' x '.join(map(str, size)) + ' px'
  return f'resolution: {size}'


def _tokenizer_line(t: describe.Tokenizer) -> str:
  vocab = f'vocabulary {t.vocab} ({t.pieces:,} pieces)' if t.vocab else t.missing
  return f'tokenizer: {t.name}, {t.max_len} tokens a text; {vocab}'


def _classes_line(d: describe.Description) -> str:
  if d.tokenizer is not None:
    return 'classes: none (an image-text model: its classes are texts, given zero-shot)'
  if not d.num_classes:
    return 'classes: none (no head)'
  if d.class_names is None:
    return f'classes: {d.num_classes}, no names (indices)'
  shown = ', '.join(json.dumps(name) for name in d.class_names[:SHOWN_CLASS_NAMES])
  more = len(d.class_names) - SHOWN_CLASS_NAMES
  shown += f', ... ({more} more)' if more > 0 else ''
  return f'classes: {d.num_classes}, names from {d.class_names_source}: {shown}'


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """The command line's flags, on `flag_values` (defined at program start, not at import)."""
  fv = flag_values
  flags.DEFINE_integer('resolution', 224, 'Input resolution in pixels.', flag_values=fv)
  flags.DEFINE_integer('num_classes', 1000, 'Head width.', flag_values=fv)
  flags.DEFINE_bool('xla_flops', False, "Add XLA's cost-analysis FLOPs (slower).", flag_values=fv)
  flags.DEFINE_string(
    'describe',
    None,
    'Describe this checkpoint (anything vit_jax.load takes) instead of listing the zoo.',
    flag_values=fv,
  )
  flags.DEFINE_bool(
    'json', False, 'With --describe: print one JSON object instead of lines.', flag_values=fv
  )


def run(f: flags.FlagValues = flags.FLAGS) -> int:
  """The command line's work on the parsed flags `f`; returns the exit status (0 done, 1 a
  checkpoint that cannot be described, 2 flags that do not go together)."""
  if f.describe is None:
    if f.json:
      print('error: --json is for --describe FILE', file=sys.stderr)
      return 2
    print_tables(f.resolution, f.num_classes, f.xla_flops)
    return 0
  given = [f'--{name}' for name in TABLE_FLAGS if f[name].present]
  if given:
    print(f"error: {', '.join(given)}: the table's, not for --describe", file=sys.stderr)
    return 2
  try:
    description = describe.describe(f.describe)
  except (OSError, ValueError, KeyError) as e:
    message = str(e) if f.describe in str(e) else f'{f.describe}: {e}'  # the path once
    print(f'error: {message}'.replace('\n', ' '), file=sys.stderr)
    return 1
  if f.json:
    print(json.dumps(description.to_json(), indent=1))
  else:
    print('\n'.join(describe_lines(description)))
  return 0


def print_tables(resolution: int, num_classes: int, xla_flops: bool) -> None:
  """The zoo: the classifiers' table, then the image-text models'."""
  rows = table_rows(resolution, num_classes, xla_flops)
  print(
    f'Registered classifiers at {resolution} px with {num_classes} classes '
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


def main(argv: Sequence[str]) -> None:
  del argv
  cli.quiet_logs(logging.ERROR)  # `fit` logs what the description prints
  sys.exit(run(flags.FLAGS))


def run_cli() -> None:
  """The `vit-models` console script (and `python -m vit_jax.models`)."""
  cli.start(define_flags, main)
