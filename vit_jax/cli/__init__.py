"""The command-line tools, apart from the library: one module each, with its absl flags.

  console script   python -m                    module here
  vit-train        vit_jax.main                 train       train and evaluate a run
  vit-convert      vit_jax.convert              convert     npz / Hugging Face / timm
  vit-predict      vit_jax.predict              predict     top-k classes, features
  vit-visualize    vit_jax.visualize            visualize   filters, posemb, attention
  vit-benchmark    vit_jax.benchmark            benchmark   speed, memory, MFU
                   vit_jax.benchmark --pipeline benchmark_pipeline  the input pipeline's
                   vit_jax.benchmark --contrastive_loss  benchmark_loss  the sigmoid loss's memory
                   vit_jax.benchmark --embedder  benchmark_embed  vit-embed beside its model
                   vit_jax.benchmark --start     benchmark_start  a command's cold and warm start
                   vit_jax.benchmark --mesh_table  benchmark_mesh  memory and collectives per mesh
                   vit_jax.benchmark --packing   benchmark_packing  packed NaFlex rows in training
  vit-reproduce    vit_jax.reproduce            reproduce   the paper's tables
  vit-models       vit_jax.models               models      the model zoo (Table 1)
  vit-zeroshot     vit_jax.zeroshot             zeroshot    image-text zero-shot classes
  vit-export       vit_jax.export               export      StableHLO, SavedModel
  vit-embed        vit_jax.embed                embed       sharded embeddings of collections

Each module defines its flags in `define_flags(flag_values)`, which its `run_cli()` (the
console script, pyproject.toml) calls at program start; importing a module defines none. So
`ENTRY_POINTS` lets a test define any tool's flags on a fresh `flags.FlagValues`.

Every `run_cli()` starts its command through `start`, so all keep one convention: `--help`
prints the command's docstring and its own flags, exit status 0; a usage error (a flag that is
unknown, missing, malformed or out of range; arguments that do not go together) is an
`error: ...` line and a line naming `--help`, status 2; a runtime error is one line, status 1.
"""

import dataclasses
import functools
import importlib
import itertools
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from absl import app, flags, logging

from vit_jax import compilation_cache


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
  EntryPoint('vit_jax.benchmark', 'vit-benchmark', 'vit_jax.cli.benchmark_embed', '--embedder'),
  EntryPoint('vit_jax.benchmark', 'vit-benchmark', 'vit_jax.cli.benchmark_start', '--start'),
  EntryPoint('vit_jax.benchmark', 'vit-benchmark', 'vit_jax.cli.benchmark_mesh', '--mesh_table'),
  EntryPoint('vit_jax.benchmark', 'vit-benchmark', 'vit_jax.cli.benchmark_packing', '--packing'),
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


USAGE_ERROR = 2  # the exit status of a command line that cannot be run as given
_HELP = re.compile(r'-[h?]|--?(help|helpshort|helpfull)')


def failure_line(e: BaseException) -> str:
  """An unexpected failure as one line: its type and the first line of its message."""
  reason = str(e).strip().splitlines()[0] if str(e).strip() else ''
  return f'{type(e).__name__}: {reason}'


def program_name(entry: EntryPoint) -> str:
  """How the user started `entry`: the console script as typed, or `python -m MODULE`; then
  its mode flag, if any (`vit-benchmark --pipeline`)."""
  ran_as_module = getattr(sys.modules['__main__'], '__spec__', None) is not None
  started = f'python -m {entry.module}' if ran_as_module else os.path.basename(sys.argv[0])
  return f'{started} {entry.mode}'.strip()


def usage_error(message: str, program: str) -> NoReturn:
  """A command line that cannot be run as given: `error: MESSAGE` and where the help is, two
  lines on stderr, then exit status 2 (1 is a runtime error, one line)."""
  print(f'error: {" ".join(message.split())}', file=sys.stderr)
  print(usage_hint(program), file=sys.stderr)
  sys.exit(USAGE_ERROR)


def usage_hint(program: str) -> str:
  return f"Try '{program} --help' for more information."


def help_text(
  define_flags: Callable[[flags.FlagValues], None],
  program: str,
  every_flag: flags.FlagValues | None = None,
) -> str:
  """The command's docstring and its own flags: those `define_flags` defines, not those its
  libraries leave in the program's FLAGS (chex's and absltest's test flags); with `every_flag`,
  every flag it holds (`--helpfull`)."""
  doc = (sys.modules[define_flags.__module__].__doc__ or '').rstrip()
  if every_flag is not None:
    return f'{doc}\n\nflags:\n{every_flag.get_help()}'
  own = flags.FlagValues()
  define_flags(own)
  for name in own:
    own.register_key_flag_for_module(program, own[name])
  more = 'Try --helpfull to get a list of all flags.'
  return f'{doc}\n\nflags:\n{own.module_help(program)}\n\n{more}'


def parse(
  argv: list[str],
  define_flags: Callable[[flags.FlagValues], None],
  program: str,
  flag_values: flags.FlagValues = flags.FLAGS,
  flags_parser: Callable[[list[str], flags.FlagValues], list[str]] | None = None,
) -> list[str]:
  """`argv` parsed onto `flag_values`, which holds the command's flags, as every command's is:
  `--help` (`-h`, `--helpshort`) prints `help_text` and `--helpfull` every flag, exit status 0;
  a flag that is unknown, missing, malformed or out of range is a `usage_error`. A command's own
  `flags_parser(argv, flag_values)` parses instead of `flag_values(argv)`; it raises
  `app.UsageError` with one line for what it rejects."""
  asked = [a for a in itertools.takewhile(lambda a: a != '--', argv[1:]) if _HELP.fullmatch(a)]
  if asked:
    every_flag = flag_values if asked[0].lstrip('-') == 'helpfull' else None
    try:
      print(help_text(define_flags, program, every_flag), flush=True)
    except BrokenPipeError:  # `--help | head`: the rest unread, as Python's docs advise
      os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(0)
  try:
    return flags_parser(argv, flag_values) if flags_parser else flag_values(argv)
  except (flags.Error, app.UsageError) as e:
    usage_error(str(e), program)


def with_usage_hint(
  main: Callable[[list[str]], int | None], program: str
) -> Callable[[list[str]], int | None]:
  """`main` whose usage errors end as `usage_error`'s: an `app.UsageError` it raises, or exit
  status 2 after the one `error:` line it printed, which gets the hint line after it."""

  def run(argv: list[str]) -> int | None:
    try:
      status = main(argv)
    except app.UsageError as e:
      usage_error(str(e), program)
    except SystemExit as e:
      if e.code == USAGE_ERROR:
        print(usage_hint(program), file=sys.stderr)
      raise
    if status == USAGE_ERROR:
      print(usage_hint(program), file=sys.stderr)
    return status

  return run


def start(
  define_flags: Callable[[flags.FlagValues], None],
  main: Callable[[list[str]], int | None],
  flags_parser: Callable[[list[str], flags.FlagValues], list[str]] | None = None,
  keep_compilations: bool = True,
) -> None:
  """Runs a command as the program, whichever script or `python -m` shim started it: its flags
  on FLAGS, parsed by `parse`, then `app.run(main)` with `with_usage_hint`. So every command
  exits 0 when done (and after `--help`), 1 on a runtime error (one line), 2 on a usage error
  (one line and the hint). With `keep_compilations`, `main` runs with the persistent
  compilation cache (`vit_jax.compilation_cache`) on."""
  entry = next(e for e in ENTRY_POINTS if e.cli == define_flags.__module__)
  program = program_name(entry)
  flag_values = flags.FLAGS
  define_flags(flag_values)
  parser = functools.partial(
    parse,
    define_flags=define_flags,
    program=program,
    flag_values=flag_values,
    flags_parser=flags_parser,
  )

  def main_with_cache(argv: list[str]) -> int | None:
    if keep_compilations:
      compilation_cache.for_command()  # once the flags parse, before anything compiles
    return main(argv)

  app.run(with_usage_hint(main_with_cache, program), flags_parser=parser)


def missing_path(path: str) -> str | None:
  """`PATH: no such file or directory` where `path` names a local file or folder that is not
  there, else None. Commands check their paths with it before they import jax (1-2 s), so a
  mistyped one comes back at once; a cloud path (scheme://) and a bare name (a registered
  model's: no '/' or '.') are left to the command."""
  if '://' in path or not any(c in path for c in '/.') or os.path.lexists(path):
    return None
  return f'{path}: no such file or directory'


def said_missing(paths: Sequence[str], images: Sequence[str] = ()) -> bool:
  """Whether a command's inputs are not there, each error line said on stderr; checked before
  jax loads: the first of `paths` (a checkpoint, a folder) that `missing_path` finds, else
  every one of `images` when none of them is there (a command that reads none has nothing to
  do)."""
  lines = [m for m in map(missing_path, paths) if m][:1]
  if not lines and images:
    no_images = [m for m in map(missing_path, images) if m]
    lines = no_images if len(no_images) == len(images) else []
  for line in lines:
    print(f'error: {line}', file=sys.stderr)
  return bool(lines)


def existing_out(path: str) -> str | None:
  """`PATH exists: ...` where `path`, a new local output directory a command would write, is
  already there (checked before jax loads, as `missing_path`), else None."""
  if '://' in path or not os.path.lexists(path):
    return None
  return f'{path} exists: remove it or choose another directory'


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


def quiet_logs(level: int = logging.WARNING) -> None:
  """Absl logging at `level` (WARNING: the libraries' INFO lines out of the output) unless the
  command line gave --verbosity."""
  if not flags.FLAGS['verbosity'].present:
    logging.set_verbosity(level)


def report(table: str, result: dict, json_path: str | None) -> None:
  """A benchmark mode's table on stdout, and its whole result as JSON where asked."""
  from vit_jax import files

  print(table)
  if json_path:
    files.atomic_write_text(json_path, json.dumps(result, indent=2) + '\n')
    print(f'wrote {json_path}')


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
