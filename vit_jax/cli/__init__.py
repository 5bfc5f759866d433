"""The command-line tools, apart from the library: one module each, with its absl flags.

  console script   python -m                    module here
  vit-train        vit_jax.main                 train       train and evaluate a run
  vit-convert      vit_jax.convert              convert     npz / Hugging Face / timm
  vit-predict      vit_jax.predict              predict     top-k classes, features
  vit-visualize    vit_jax.visualize            visualize   filters, posemb, attention
  vit-benchmark    vit_jax.benchmark            benchmark   speed, memory, MFU
                   vit_jax.benchmark --pipeline benchmark_pipeline  the input pipeline's
                   vit_jax.benchmark --contrastive_loss  benchmark_loss  the sigmoid loss's memory
  vit-reproduce    vit_jax.reproduce            reproduce   the paper's tables
  vit-models       vit_jax.models               models      the model zoo (Table 1)
  vit-zeroshot     vit_jax.zeroshot             zeroshot    image-text zero-shot classes
  vit-export       vit_jax.export               export      StableHLO, SavedModel
  vit-embed        vit_jax.embed                embed       sharded embeddings of collections

Each module defines its flags in `define_flags(flag_values)`, which its `run_cli()` (the
console script, pyproject.toml) calls at program start; importing a module defines none. So
`ENTRY_POINTS` lets a test define any tool's flags on a fresh `flags.FlagValues`.
"""

import dataclasses
import importlib
import json
import sys
from collections.abc import Callable, Sequence

from absl import app, flags


@dataclasses.dataclass(frozen=True)
class EntryPoint:
  """One command line: how it is started, and the module that defines it."""

  module: str  # what `python -m` runs: 'vit_jax.main'
  script: str  # the console script: 'vit-train'
  cli: str  # the module with `define_flags` and `run_cli`: 'vit_jax.cli.train'
  mode: str = ''  # a flag that selects this entry point among those of one command

  def define_flags(self, flag_values: flags.FlagValues) -> None:
    """Defines the command's flags on `flag_values` (imports its module)."""
    importlib.import_module(self.cli).define_flags(flag_values)


ENTRY_POINTS: tuple[EntryPoint, ...] = (
  EntryPoint('vit_jax.main', 'vit-train', 'vit_jax.cli.train'),
  EntryPoint('vit_jax.convert', 'vit-convert', 'vit_jax.cli.convert'),
  EntryPoint('vit_jax.predict', 'vit-predict', 'vit_jax.cli.predict'),
  EntryPoint('vit_jax.visualize', 'vit-visualize', 'vit_jax.cli.visualize'),
  EntryPoint('vit_jax.benchmark', 'vit-benchmark', 'vit_jax.cli.benchmark'),
  EntryPoint('vit_jax.benchmark', 'vit-benchmark', 'vit_jax.cli.benchmark_pipeline', '--pipeline'),
  EntryPoint(
    'vit_jax.benchmark', 'vit-benchmark', 'vit_jax.cli.benchmark_loss', '--contrastive_loss'
  ),
  EntryPoint('vit_jax.reproduce', 'vit-reproduce', 'vit_jax.cli.reproduce'),
  EntryPoint('vit_jax.models', 'vit-models', 'vit_jax.cli.models'),
  EntryPoint('vit_jax.zeroshot', 'vit-zeroshot', 'vit_jax.cli.zeroshot'),
  EntryPoint('vit_jax.export', 'vit-export', 'vit_jax.cli.export'),
  EntryPoint('vit_jax.embed', 'vit-embed', 'vit_jax.cli.embed'),
)


def entry_point(command: str, args: Sequence[str] = ()) -> EntryPoint:
  """The entry point that `python -m COMMAND ARGS...` or `SCRIPT ARGS...` runs."""
  matches = [e for e in ENTRY_POINTS if command in (e.module, e.script)]
  if not matches:
    known = sorted({e.module for e in ENTRY_POINTS} | {e.script for e in ENTRY_POINTS})
    raise KeyError(f'{command!r} is not an entry point; they are: {", ".join(known)}')
  for match in matches:
    if match.mode and match.mode in args:
      return match
  return next(e for e in matches if not e.mode)


def failure_line(e: BaseException) -> str:
  """An unexpected failure as one line: its type and the first line of its message."""
  reason = str(e).strip().splitlines()[0] if str(e).strip() else ''
  return f'{type(e).__name__}: {reason}'


def usage_flags_parser(usage: str) -> Callable[[list[str]], list[str]]:
  """A `flags_parser` for `start`: a bad flag (unknown, misspelt, a value out of range) is one
  line, then `usage`, and exit status 2."""

  def parse(argv: list[str]) -> list[str]:
    try:
      return flags.FLAGS(argv)
    except flags.Error as e:
      print(f'error: {e}'.replace('\n', ' '), file=sys.stderr)
      print(usage, file=sys.stderr)
      sys.exit(2)

  return parse


def start(
  define_flags: Callable[[flags.FlagValues], None],
  main: Callable[[list[str]], object],
  flags_parser: Callable[[list[str]], list[str]] | None = None,
) -> None:
  """Runs a command as the program, whichever script or `python -m` shim started it: its flags
  and its module's docstring are the program's (what `--help` shows), then `app.run(main)`."""
  program = sys.modules['__main__']
  program.__doc__ = sys.modules[define_flags.__module__].__doc__
  before = set(flags.FLAGS)
  define_flags(flags.FLAGS)
  for name in sorted(set(flags.FLAGS) - before):
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS[name])
  if flags_parser is None:
    app.run(main)
  else:
    app.run(main, flags_parser=flags_parser)


def define_checkpoint_flags(flag_values: flags.FlagValues) -> None:
  """--checkpoint, --model, --resolution: what `vit_jax.load` takes (the inference tools')."""
  fv = flag_values
  flags.DEFINE_string(
    'checkpoint',
    None,
    'Checkpoint file or directory, vit-export directory, or a registered model name.',
    required=True,
    flag_values=fv,
  )
  flags.DEFINE_string(
    'model', None, 'Registered model name; inferred from the shapes if unset.', flag_values=fv
  )
  flags.DEFINE_integer(
    'resolution',
    None,
    'Input size in pixels; default: the one the checkpoint was trained at.',
    flag_values=fv,
  )


def define_dtype_flag(flag_values: flags.FlagValues) -> None:
  """--dtype: the inference tools' compute dtype."""
  flags.DEFINE_enum(
    'dtype',
    'float32',
    ['float32', 'bfloat16'],
    'Compute dtype (bfloat16: 16-bit matmul operands, the kernels cast once).',
    flag_values=flag_values,
  )


def print_zero_shot(shown: dict, as_json: bool) -> None:
  """Zero-shot predictions (`inference.zeroshot.predictions`) as JSON or one line an image,
  and each unreadable image as an error line (vit-zeroshot's and vit-predict --classes')."""
  if as_json:
    print(json.dumps(shown, indent=1))
  else:
    for row in shown['predictions']:
      top = ', '.join(f'{c["class"]} {c["probability"]:.4f}' for c in row['top_k'])
      print(f'{row["image"]}: {top}')
  for error in shown['errors']:
    print(f'error: {error}', file=sys.stderr)
