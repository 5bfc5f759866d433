r"""Converts ViT, MLP-Mixer and image-text checkpoints between the Google .npz layout, Hugging
Face and timm.

  python -m vit_jax.convert SRC DST --to={npz,hf,timm} [--model=NAME] [--num_classes=K] \
      [--resolution=R] [--params=polyak]
  python -m vit_jax.convert --list [QUERY]     # the released checkpoints and their --model

SRC is any format `vit_jax.checkpoint.read` reads (original/AugReg/big_vision .npz, a Hugging
Face or timm directory or .safetensors/.bin file, an orbax training checkpoint). A SigLIP model
(SigLIP, SigLIP 2) converts to hf as transformers' `SiglipModel` (a SigLIP 2 of patch
sequences: `Siglip2Model`) with its processor's files and, where its vocabulary is at hand, its
tokenizer's; other image-text models convert to npz only.
The pre_logits
layer is kept when the checkpoint has one. The checkpoint is fitted to the model by
`vit_jax.checkpoint.fit`: `--model` (default: the architecture read off the weights), with
`--num_classes` classes (default: the checkpoint's; a different count gives a fresh zero head,
0 drops the head) at `--resolution` pixels (default: the checkpoint's; another resizes the
position embeddings as the original vit_jax fine-tuning does). `--params=polyak` exports a
training run's Polyak average (`config.polyak_decay`) instead of its parameters. The command
prints what it read and wrote, and on any failure exits with status 1 and a one-line reason,
leaving DST untouched; bad usage exits with status 2.
"""

import json
import sys
from collections.abc import Callable, Sequence

from absl import flags

from vit_jax import checkpoint, cli, families
from vit_jax.checkpoint import catalog, tree, two_towers


def _uses(fitted: checkpoint.Fitted, src: str) -> two_towers.Uses:
  """How an image-text source is used beyond its weights: its vocabulary, its templates."""
  pp = dict(fitted.config.get('pp') or {})
  return two_towers.uses(src, pp.get('tokenizer_name', 'bert'))


def _write_npz(fitted: checkpoint.Fitted, src: str, dst: str) -> tuple[str, list[str]]:
  checkpoint.save_npz(fitted.params, dst)
  family = families.of_config(fitted.config)
  # What its shapes cannot say (and an image-text model's vocabulary) beside it.
  stated = family.stated_fields(fitted.config)
  if not family.image_text:
    beside = checkpoint.npz.write_sidecar(dst, stated, fitted.class_names())
    return f'npz ({family.npz_layout})', beside
  scalars = ', '.join(k for k in two_towers.SCALARS if k in fitted.params)
  beside = two_towers.write_beside(dst, stated, _uses(fitted, src))
  return f'npz (LiT layout: img/, txt/, {scalars})', beside


def _write_hf(fitted: checkpoint.Fitted, src: str, dst: str) -> tuple[str, list[str]]:
  if families.of_config(fitted.config).image_text:
    return _write_hf_siglip(fitted, src, dst), []
  path = checkpoint.export_hf(
    fitted.params, fitted.config, dst, image_size=fitted.resolution, labels=fitted.class_names()
  )
  config = json.loads((path / 'config.json').read_text())
  return (
    f'hf ({config["architectures"][0]}, model.safetensors + config.json,'
    f' hidden_act={config["hidden_act"]}, layer_norm_eps={config["layer_norm_eps"]:g})'
  ), []


def _write_hf_siglip(fitted: checkpoint.Fitted, src: str, dst: str) -> str:
  """A SigLIP model as transformers' SiglipModel (SigLIP 2's of patch sequences:
  Siglip2Model), with its processor's files (the tokenizer's where the vocabulary is at hand)."""
  vocab = _uses(fitted, src).vocab
  path = checkpoint.export_hf(
    fitted.params, fitted.config, dst, image_size=fitted.resolution, vocab=vocab
  )
  written = ' + '.join(sorted(p.name for p in path.iterdir()))
  if vocab is None:
    name = fitted.config.pp.tokenizer_name
    written += '; no tokenizer: ' + two_towers.missing_vocab(src, name, flag=None)
  architecture = json.loads((path / 'config.json').read_text())['architectures'][0]
  return f'hf ({architecture}, {written})'


def _write_timm(fitted: checkpoint.Fitted, src: str, dst: str) -> tuple[str, list[str]]:
  del src
  path = checkpoint.export_timm(
    fitted.params, fitted.config, dst, image_size=fitted.resolution, labels=fitted.class_names()
  )
  args = json.loads((path / 'config.json').read_text())['model_args']
  return (
    'timm (model.safetensors + config.json with the create_model arguments,'
    f' act_layer={args["act_layer"]!r}, norm_layer={args["norm_layer"]!r})'
  ), []


# Output format -> writer(fitted, src, dst) -> (what was written, the paths written beside dst).
WRITERS: dict[str, Callable[[checkpoint.Fitted, str, str], tuple[str, list[str]]]] = {
  'npz': _write_npz,
  'hf': _write_hf,
  'timm': _write_timm,
}


def _read_line(src: str, found: checkpoint.Found) -> str:
  family = families.of_config(found.config)
  if family.image_text:
    return (
      f'read {src}: {found.description}; {found.arrays} arrays, {found.parameters:,} parameters;'
      f' model {found.name or "(unregistered)"} ({family.describe(found.config)})'
      + (f', {found.resolution} px' if found.resolution else '')
    )
  head = f'head {found.config.num_classes} classes' if found.config.num_classes else 'no head'
  return (
    f'read {src}: {found.description}; {found.arrays} arrays, {found.parameters:,} parameters;'
    f' model {found.name or "(unregistered)"} ({family.describe(found.config)}); {head},'
    f' pre_logits {"yes" if found.config.get("representation_size") else "no"}'
    + (f', {found.resolution} px' if found.resolution else '')
  )


def _report_lines(report: checkpoint.LoadReport) -> list[str]:
  """What the surgery changed: resized embeddings, dropped and fresh keys."""
  lines = [
    f'  resized {k}: {tree.shape_str(old)} -> {tree.shape_str(new)}'
    for k, old, new in report.resized
  ]
  for key in report.dropped:
    lines.append(
      f'  dropped {key}' + (' (replaced by a fresh zero head)' if key in report.fresh else '')
    )
  lines += [
    f'  fresh {key} (zero-initialised)' for key in report.fresh if key not in report.dropped
  ]
  return lines


def convert(
  src: str,
  dst: str,
  to: str,
  model: str | None = None,
  num_classes: int | None = None,
  resolution: int | None = None,
  out: Callable[[str], None] = print,
  params_entry: str = 'params',
) -> checkpoint.LoadReport:
  """Reads `src`, fits it to the model, writes `dst` as `to` (a key of WRITERS); returns the
  surgery's report."""
  if to not in WRITERS:
    raise checkpoint.CheckpointError(f'--to={to!r}: choose one of {", ".join(WRITERS)}')
  if num_classes is not None and num_classes < 0:
    raise checkpoint.CheckpointError(
      f'--num_classes={num_classes}: must be >= 0 (0 drops the head)'
    )
  fitted = checkpoint.fit(src, model, num_classes, resolution, params_entry=params_entry)
  family = families.of_config(fitted.config)
  if family.image_text and to not in family.writes:
    raise checkpoint.CheckpointError(
      f'--to={to}: an image-text model converts to {" or ".join(family.writes)} only; for'
      f' its image tower alone convert {src}:img'
    )
  out(_read_line(src, fitted.found))
  written, beside = WRITERS[to](fitted, src, dst)
  out(
    f'wrote {dst}: {written}; {len(tree.flatten(fitted.params))} arrays,'
    f' {tree.count_params(fitted.params):,} parameters; model {fitted.name or "(unregistered)"}'
    + (f' at {fitted.resolution} px' if fitted.resolution else '')  # patch sequences: any size
  )
  for path in beside:
    out(f'wrote {path}')
  for line in _report_lines(fitted.report):
    out(line)
  return fitted.report


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """The command line's flags; defined only when run as a program (or on a test's own
  `FlagValues`), so that importing this module registers none."""
  flags.DEFINE_enum('to', None, list(WRITERS), 'Output format.', flag_values=flag_values)
  flags.DEFINE_string(
    'model', None, 'Registered model name, e.g. ViT-B_16 (see --list).', flag_values=flag_values
  )
  flags.DEFINE_integer(
    'num_classes',
    None,
    "Head classes (default: the checkpoint's); 0 drops the head.",
    flag_values=flag_values,
  )
  flags.DEFINE_integer(
    'resolution',
    None,
    "Image size in pixels (default: the checkpoint's); resizes posemb.",
    flag_values=flag_values,
  )
  flags.DEFINE_enum(
    'params',
    'params',
    ['params', 'polyak'],
    "A training run's parameters, or its Polyak average (config.polyak_decay > 0).",
    flag_values=flag_values,
  )
  flags.DEFINE_bool(
    'list',
    False,
    'List the released checkpoints (those matching QUERY if given) and exit.',
    flag_values=flag_values,
  )


def run(args: Sequence[str], f: flags.FlagValues = flags.FLAGS) -> int:
  """The command line's work on parsed flags `f` and positional `args`; returns the exit
  status (0 ok, 1 failed, 2 bad usage)."""
  if f.list:
    if len(args) > 1:
      print(f'error: --list takes one QUERY, got {list(args)}', file=sys.stderr)
      return 2
    entries = catalog.find(args[0] if args else '')
    if not entries:
      print(f'error: no released checkpoint matches {args[0]!r}', file=sys.stderr)
      return 1
    print(catalog.format_table(entries))
    return 0
  if len(args) != 2 or not f.to:
    print('error: SRC, DST and --to are required (or --list [QUERY])', file=sys.stderr)
    return 2
  try:
    convert(*args, f.to, f.model, f.num_classes, f.resolution, params_entry=f.params)
  except checkpoint.CheckpointError as e:
    print(f'error: {e}', file=sys.stderr)
    return 1
  except Exception as e:  # any other failure: still one line, still non-zero
    print(f'error: {cli.failure_line(e)}', file=sys.stderr)
    return 1
  return 0


def main(argv: Sequence[str]) -> None:
  cli.quiet_logs()  # orbax and JAX log at INFO on every restore
  sys.exit(run(argv[1:]))


def run_cli() -> None:
  """The `vit-convert` console script (and `python -m vit_jax.convert`)."""
  cli.start(define_flags, main)
