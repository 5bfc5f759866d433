"""Every command keeps one convention (`vit_jax.cli.start`): `--help` prints the command's
docstring and its own flags and exits 0; a usage error (a flag that is unknown, missing or
malformed, arguments that do not go together) is an `error:` line and a line naming `--help`
on stderr, exit status 2. Each console script's `run_cli()` runs in this process up to absl's
`app.run`, on a fresh FLAGS that holds a library's test flag as a real program's does; the
real programs (absl's `app.run`, the console scripts, `python -m`) are run by
tests/test_packaging.py and tests/test_train.py."""

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest
from absl import flags
from conftest import LIBRARY_FLAG

from vit_jax import cli
from vit_jax.cli import convert

REPO = Path(__file__).parent.parent
# A command line of each command that lacks a required flag, and that flag.
MISSING = {
  'vit-train': (['--workdir=w'], 'config'),
  'vit-predict': (['cat.jpg'], 'checkpoint'),
  'vit-visualize': (['--checkpoint=c'], 'out'),
  'vit-zeroshot': (['cat.jpg'], 'checkpoint'),
  'vit-embed': (['--checkpoint=c'], 'out'),
}


def _hint(entry: cli.EntryPoint) -> str:
  program = f'{entry.script} {entry.mode}'.strip()
  return f"Try '{program} --help' for more information."


def _own_flags(entry: cli.EntryPoint) -> set[str]:
  flag_values = flags.FlagValues()
  entry.define_flags(flag_values)
  return set(flag_values)


@pytest.mark.parametrize('entry', cli.ENTRY_POINTS, ids=lambda e: f'{e.script}{e.mode}')
def test_help_is_the_docstring_and_the_commands_own_flags_and_exits_0(command, entry):
  mode = [entry.mode] if entry.mode else []
  status, out, err = command(entry, *mode, '--help')
  assert (status, err) == (0, ''), err
  doc = importlib.import_module(entry.cli).__doc__
  assert out.startswith(doc.strip().splitlines()[0])
  flag_lines = [line for line in out.splitlines() if line.startswith('  --')]
  listed = {
    line.split(':')[0].strip().removeprefix('--[no]').removeprefix('--') for line in flag_lines
  }
  assert listed == _own_flags(entry), out
  assert LIBRARY_FLAG not in out
  assert command(entry, *mode, '-h')[:2] == (0, out)


@pytest.mark.parametrize('entry', cli.ENTRY_POINTS, ids=lambda e: f'{e.script}{e.mode}')
def test_a_misspelt_flag_is_two_lines_and_exits_2(command, entry):
  name = sorted(_own_flags(entry) - {'contrastive_loss', 'pipeline'})[0]
  typo = f'{name[:-1]}x'
  mode = [entry.mode] if entry.mode else []
  status, out, err = command(entry, *mode, f'--{typo}=1')
  assert (status, out) == (2, '')
  error, hint = err.splitlines()
  assert error.startswith(f"error: Unknown command line flag '{typo}'") and hint == _hint(entry)


@pytest.mark.parametrize('script', sorted(MISSING))
def test_a_missing_required_flag_is_two_lines_and_exits_2(command, script):
  args, missing = MISSING[script]
  status, out, err = command(cli.entry_point(script), *args)
  assert (status, out) == (2, '')
  assert err.splitlines() == [
    f'error: flag --{missing}=None: Flag --{missing} must have a value other than None.',
    f"Try '{script} --help' for more information.",
  ]


@pytest.mark.parametrize(
  ('script', 'args', 'error'),
  [
    ('vit-predict', ['--checkpoint=c', '--top_k=many', 'cat.jpg'], 'flag --top_k=many: invalid'),
    (
      'vit-predict',
      ['--checkpoint=c', '--dtype=float64', 'cat.jpg'],
      'flag --dtype=float64: value',
    ),
    ('vit-benchmark', ['--model=ViT-B_17'], "flag --model=ViT-B_17: Unknown model 'ViT-B_17'."),
    ('vit-benchmark', ['--model=ViT-B_16,ViT-S_16'], 'a comma list of them only with'),
    ('vit-train', ['--config=configs/vit.py:b17,cifar10', '--workdir=w'], "Unknown model 'b17'"),
  ],
)
def test_a_malformed_value_is_two_lines_and_exits_2(command, script, args, error):
  status, out, err = command(cli.entry_point(script), *args)
  assert (status, out) == (2, '')
  first, hint = err.splitlines()
  assert first.startswith('error: ') and error in first and hint == _hint(cli.entry_point(script))
  if script == 'vit-benchmark' and 'Unknown' in error:  # not every registered name
    assert 'Did you mean: ViT-B_16' in first and '`vit-models` lists' in first
    assert 'SigLIP' not in first


@pytest.mark.parametrize(
  ('script', 'args', 'error'),
  [
    ('vit-train', ['--config=configs/digits.py', '--workdir=w', 'more'], 'Unexpected arguments'),
    ('vit-reproduce', [], 'give a command: one of compute, sweep'),
    ('vit-embed', ['--checkpoint=c', '--out=o', 'more'], 'unexpected arguments'),
  ],
)
def test_a_usage_error_the_command_finds_is_two_lines_and_exits_2(command, script, args, error):
  """Its `main` raises `app.UsageError`, or prints its `error:` line and exits 2."""
  status, out, err = command(cli.entry_point(script), *args)
  assert (status, out) == (2, '')
  first, hint = err.splitlines()
  assert first.startswith(f'error: {error}') and hint == _hint(cli.entry_point(script))


def test_a_usage_error_returned_by_main_gets_the_hint(capsys):
  flag_values = flags.FlagValues()
  convert.define_flags(flag_values)
  flag_values(['vit-convert', 'only_src'])
  main = cli.with_usage_hint(lambda argv: convert.run(argv[1:], flag_values), 'vit-convert')
  assert main(['vit-convert', 'only_src']) == 2
  assert capsys.readouterr().err.splitlines() == [
    'error: SRC, DST and --to are required (or --list [QUERY])',
    "Try 'vit-convert --help' for more information.",
  ]


def test_helpfull_lists_every_flag_of_the_program_and_exits_0(command):
  status, out, err = command(cli.entry_point('vit-models'), '--helpfull')
  assert (status, err) == (0, '')
  assert '--resolution' in out and f'--{LIBRARY_FLAG}' in out


def test_a_checkpoint_that_cannot_be_read_is_a_runtime_error_of_one_line(command, tmp_path):
  missing = tmp_path / 'none.npz'
  argv = [f'--checkpoint={missing}', f'--out={tmp_path}', '--verbosity=0']
  status, out, err = command(cli.entry_point('vit-visualize'), *argv)
  assert (status, out) == (1, '')
  assert err.startswith(f'error: {missing}: ') and err.count('\n') == 1, err


# A command line of each inference command whose checkpoint is not there.
ABSENT = {
  'vit_jax.predict': ['--checkpoint={missing}', 'cat.jpg'],
  'vit_jax.zeroshot': ['--checkpoint={missing}', '--classes=a,b', 'cat.jpg'],
  'vit_jax.embed': ['--checkpoint={missing}', '--out={tmp}/out', '--folder={tmp}'],
  'vit_jax.export': ['{missing}', '{tmp}/out'],
}


@pytest.mark.parametrize('module', sorted(ABSENT))
def test_a_missing_path_comes_back_before_jax_loads(module, tmp_path):
  """One line and status 1, as for any unreadable checkpoint, but said before the seconds
  that importing jax takes: `python -X importtime` lists every module the process loaded."""
  missing = tmp_path / 'absent.npz'
  args = [a.format(missing=missing, tmp=tmp_path) for a in ABSENT[module]]
  proc = subprocess.run(
    [sys.executable, '-X', 'importtime', '-m', module, *args],
    cwd=REPO, capture_output=True, text=True, timeout=120,
  )  # fmt: skip
  lines = proc.stderr.splitlines()
  said = [line for line in lines if not line.startswith('import time:')]
  loaded = {line.split('|')[-1].strip() for line in lines if line.startswith('import time:')}
  assert (proc.returncode, said) == (1, [f'error: {missing}: no such file or directory'])
  assert 'jax' not in loaded and 'tensorflow' not in loaded


def test_an_existing_export_folder_comes_back_before_jax_loads(tmp_path):
  (tmp_path / 'm.npz').write_bytes(b'')
  proc = subprocess.run(
    [sys.executable, '-X', 'importtime', '-m', 'vit_jax.export', f'{tmp_path}/m.npz', tmp_path],
    cwd=REPO, capture_output=True, text=True, timeout=120,
  )  # fmt: skip
  said = [line for line in proc.stderr.splitlines() if not line.startswith('import time:')]
  exists = f'error: {tmp_path} exists: remove it or choose another directory'
  assert (proc.returncode, said) == (1, [exists])
  assert not re.search(r'\| +jax$', proc.stderr, re.M)
