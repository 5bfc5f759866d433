r"""Converts ViT checkpoints between the Google .npz layout, Hugging Face and timm.

  python -m vit_jax.convert SRC DST --to {npz,hf,timm} [--model NAME] [--num-classes K] \
      [--resolution R]
  python -m vit_jax.convert --list [QUERY]     # the released checkpoints and their --model

SRC is any format `vit_jax.checkpoint.load` reads (original/AugReg/big_vision .npz, a Hugging
Face or timm directory or .safetensors/.bin file, an orbax training checkpoint). The pre_logits
layer is kept when the checkpoint has one. The checkpoint is checked against the model: `--model`
(default: the architecture read off the weights), with `--num-classes` classes (default: the
checkpoint's; a different count gives a fresh zero head, 0 drops the head) at `--resolution`
pixels (default: the checkpoint's; another resizes the position embeddings as the original
vit_jax fine-tuning does). The command prints what it read and wrote, and on any failure exits
with status 1 and a one-line reason, leaving DST untouched.
"""

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

import ml_collections

from vit_jax import checkpoint
from vit_jax.checkpoint import catalog, tree

FORMATS_OUT = ('npz', 'hf', 'timm')


def _describe(config: Any) -> str:
  t = config.transformer
  parts = [f'hidden {config.hidden_size}']
  if t is not None:
    parts.append(f'{t.num_layers} layers, {t.num_heads} heads, mlp {t.mlp_dim}')
  parts.append('patch ' + 'x'.join(map(str, config.patches.size)))
  if config.resnet is not None:
    parts.append(f'resnet {tuple(config.resnet.num_layers)}')
  parts.append(f'classifier {config.classifier}')
  return ', '.join(parts)


def _native_resolution(flat: dict, config: Any) -> int | None:
  """The square image size the checkpoint's position embeddings are laid out for."""
  posemb = flat.get(tree.POSEMB)
  if posemb is None:
    return None
  side = tree.square_side(posemb.shape[1] - int('cls' in flat))
  if side is None:
    return None
  return side * config.patches.size[0] * tree.feature_stride(config)


def convert(
  src: str,
  dst: str,
  to: str,
  model: str | None = None,
  num_classes: int | None = None,
  resolution: int | None = None,
  out: Callable[[str], None] = print,
) -> checkpoint.LoadReport:
  """Reads `src`, fits it to the model, writes `dst` as `to` (FORMATS_OUT); returns the report."""
  from vit_jax.models import get_config, model_from_config, stats

  if to not in FORMATS_OUT:
    raise checkpoint.CheckpointError(f'--to {to!r}: choose one of {", ".join(FORMATS_OUT)}')
  if num_classes is not None and num_classes < 0:
    raise checkpoint.CheckpointError(
      f'--num-classes {num_classes}: must be >= 0 (0 drops the head)'
    )
  if resolution is not None and resolution <= 0:
    raise checkpoint.CheckpointError(f'--resolution {resolution}: must be a positive pixel count')
  try:
    base = get_config(model) if model else None
  except KeyError as e:
    raise checkpoint.CheckpointError(f'--model: {e.args[0]}') from None

  heads = base.transformer.num_heads if base is not None and base.transformer else None
  params, description = checkpoint.read(src, num_heads=heads)
  flat = tree.flatten(params)
  found = tree.infer_config(flat)
  native = _native_resolution(flat, found)
  head = f'head {found.num_classes} classes' if found.num_classes else 'no head'
  out(
    f'read {src}: {description}; {len(flat)} arrays, {tree.count_params(flat):,} parameters;'
    f' model {found.model_name or "(unregistered)"} ({_describe(found)}); {head},'
    f' pre_logits {"yes" if found.representation_size else "no"}'
    + (f', {native} px' if native else '')
  )

  config = base if base is not None else ml_collections.ConfigDict(found.to_dict())
  config.num_classes = found.num_classes if num_classes is None else (num_classes or None)
  config.representation_size = found.representation_size  # a converter keeps pre_logits
  size = resolution or native
  if size is None:
    raise checkpoint.CheckpointError(
      f'{src}: the position embeddings are not a square grid: pass --resolution'
    )
  shapes = stats.param_shapes(model_from_config(config), size)
  keep_head = bool(found.num_classes) and config.num_classes == found.num_classes
  params, report = checkpoint.merge_pretrained(
    params,
    shapes,
    config,
    keep_head=keep_head,
    image_size=size,
    source=src,
  )

  if to == 'npz':
    checkpoint.save_npz(params, dst)
    written = 'npz (vit_jax layout, pre-Linen names)'
  elif to == 'timm':
    checkpoint.export_timm(params, config, dst, image_size=size)
    written = 'timm (model.safetensors + config.json with the create_model arguments,'
    written += " act_layer='gelu_tanh', norm_layer='layernorm')"
  else:
    checkpoint.export_hf(params, config, dst, image_size=size)
    arch = 'ViTForImageClassification' if config.num_classes else 'ViTModel'
    written = f'hf ({arch}, model.safetensors + config.json, hidden_act=gelu_pytorch_tanh,'
    written += ' layer_norm_eps=1e-6)'
  out(
    f'wrote {dst}: {written}; {len(tree.flatten(params))} arrays,'
    f' {tree.count_params(params):,} parameters; model {config.model_name or "(unregistered)"}'
    f' at {size} px'
  )
  for key, old, new in report.resized:
    out(f'  resized {key}: {tree.shape_str(old)} -> {tree.shape_str(new)}')
  for key in report.dropped:
    out(f'  dropped {key}' + (' (replaced by a fresh zero head)' if key in report.fresh else ''))
  for key in report.fresh:
    if key not in report.dropped:
      out(f'  fresh {key} (zero-initialised)')
  return report


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
    prog='python -m vit_jax.convert',
    description='Convert ViT checkpoints: Google .npz (original, AugReg, big_vision) <-> Hugging'
    ' Face <-> timm. Prints what it read and wrote; exits 1 with a one-line reason on failure.',
  )
  parser.add_argument(
    'src',
    nargs='?',
    help='checkpoint to read: .npz, .safetensors/.bin, Hugging Face or orbax directory',
  )
  parser.add_argument('dst', nargs='?', help='.npz file, Hugging Face or timm directory to write')
  parser.add_argument('--to', choices=FORMATS_OUT, help='output format')
  parser.add_argument('--model', help='registered model name, e.g. ViT-B_16 (see --list)')
  parser.add_argument('--num-classes', type=int, help='head classes; 0 drops the head')
  parser.add_argument('--resolution', type=int, help='image size in pixels (resizes posemb)')
  parser.add_argument(
    '--list',
    nargs='?',
    const='',
    metavar='QUERY',
    help='list the released checkpoints (optionally those matching QUERY) and exit',
  )
  return parser


def main(argv: Sequence[str] | None = None) -> int:
  """The command line; returns the exit status (0 ok, 1 failed, 2 bad usage)."""
  parser = _parser()
  args = parser.parse_args(argv)
  if args.list is not None:
    entries = catalog.find(args.list)
    if not entries:
      print(f'error: no released checkpoint matches {args.list!r}', file=sys.stderr)
      return 1
    print(catalog.format_table(entries))
    return 0
  if not (args.src and args.dst and args.to):
    parser.print_usage(sys.stderr)
    print('error: SRC, DST and --to are required (or --list)', file=sys.stderr)
    return 2
  try:
    convert(args.src, args.dst, args.to, args.model, args.num_classes, args.resolution)
  except checkpoint.CheckpointError as e:
    print(f'error: {e}', file=sys.stderr)
    return 1
  except Exception as e:  # any other failure: still one line, still non-zero
    reason = str(e).strip().splitlines()[0] if str(e).strip() else ''
    print(f'error: {type(e).__name__}: {reason}', file=sys.stderr)
    return 1
  return 0


if __name__ == '__main__':
  sys.exit(main())
