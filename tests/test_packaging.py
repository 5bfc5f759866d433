"""Packaging: the wheel holds every module and the configs, its console scripts are the
entry points and run, its dependency ranges hold the pinned versions, and
`--config=configs/...` is found from any working directory."""

import configparser
import importlib
import importlib.util
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest
from absl import flags
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import configs
from vit_jax import cli

pytestmark = pytest.mark.slow  # a wheel build and install

REPO = Path(__file__).resolve().parents[1]


def _pins(path: Path) -> dict[str, str]:
  pins = {}
  for line in path.read_text().splitlines():
    line = line.split('#')[0].strip()
    if line and not line.startswith('-'):
      name, version = line.split('==')
      pins[canonicalize_name(name)] = version
  return pins


def _declared() -> list[Requirement]:
  """The core's requirements and every extra's; `all` names exactly the other extras."""
  project = tomllib.loads((REPO / 'pyproject.toml').read_text())['project']
  extras = project['optional-dependencies']
  assert [Requirement(r).extras for r in extras.pop('all')] == [set(extras)]
  optional = [r for extra in extras.values() for r in extra]
  return [Requirement(d) for d in (*project['dependencies'], *optional)]


@pytest.mark.parametrize('end', ['oldest', 'newest'])
def test_declared_ranges_hold_both_ends_locks(end):
  pins = _pins(REPO / 'requirements' / f'{end}.txt')
  for r in _declared():
    assert canonicalize_name(r.name) in pins, (end, r)
    assert pins[canonicalize_name(r.name)] in r.specifier, (end, r, pins[canonicalize_name(r.name)])
    assert '999' not in r.specifier, r  # bounded above: a next major (or 0.x minor) may break
  # Each end's jax is jaxlib's (the CPU build; jax[cuda13] or jax[tpu] on accelerators).
  assert pins['jax'] == pins['jaxlib']
  assert {'oldest': '0.10.2', 'newest': '0.12.0.1'}[end] == pins['jax']


def _scripts() -> dict[str, str]:
  """Console script -> its `module:function`, from the entry points (one per command)."""
  return {e.script: f'{e.cli}:run_cli' for e in cli.ENTRY_POINTS if not e.mode}


def test_the_console_scripts_are_the_entry_points_and_python_m_finds_each():
  declared = tomllib.loads((REPO / 'pyproject.toml').read_text())['project']['scripts']
  assert declared == _scripts()
  assert len(declared) == 10  # train, convert, predict, visualize, benchmark, reproduce, models,
  # zeroshot, export, embed
  for entry in cli.ENTRY_POINTS:
    assert importlib.util.find_spec(entry.module) is not None, entry
    assert cli.entry_point(entry.module, [entry.mode]) == entry
    assert cli.entry_point(entry.script, [entry.mode]) == entry


def _flag_names(entry: cli.EntryPoint) -> set[str]:
  """The flags the entry point defines, on a fresh FlagValues."""
  flag_values = flags.FlagValues()
  entry.define_flags(flag_values)
  return set(flag_values)


def _pip(*args: str | Path) -> None:
  subprocess.run([sys.executable, '-m', 'pip', *args], check=True, capture_output=True, timeout=300)


# The scripts whose `--help` imports no JAX (the others take 3-10 s each to start): run from
# the installed wheel. Every entry point's flags are checked in-process below.
LIGHT_SCRIPTS = ('vit-train', 'vit-reproduce')


def _installed_scripts(wheel: Path, tmp_path: Path) -> dict[str, str]:
  """Installs the wheel alone into a folder; its console scripts' `--help` (the light ones)."""
  target = tmp_path / 'installed'
  _pip('install', '--no-deps', '--no-index', '-t', target, wheel)
  for script, entry in _scripts().items():  # pip's wrapper imports the declared function
    module, function = entry.split(':')
    assert f'from {module} import {function}' in (target / 'bin' / script).read_text()
  env = {**os.environ, 'PYTHONPATH': str(target)}
  procs = {
    script: subprocess.Popen(
      [target / 'bin' / script, '--help'],
      cwd=tmp_path,  # not the repository: the installed copy is imported
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
    )
    for script in LIGHT_SCRIPTS
  }
  helps = {}
  for script, proc in procs.items():
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, (script, out[-2000:])
    helps[script] = out
  return helps


def _listed_flags(help_text: str) -> set[str]:
  return {
    line.split(':')[0].strip().lstrip('-').removeprefix('[no]') for line in help_text.split('\n')
  }


def test_every_entry_point_defines_its_flags_on_fresh_flag_values():
  """Each tool's flags come from its `define_flags(flag_values)`, not from importing it."""
  for entry in cli.ENTRY_POINTS:
    names = _flag_names(entry)
    assert names and names.isdisjoint(flags.FLAGS), (entry, names & set(flags.FLAGS))
    module = importlib.import_module(entry.cli)
    assert callable(module.main) and (entry.mode or callable(module.run_cli)), entry
  assert {'config', 'workdir', 'num_processes'} <= _flag_names(cli.entry_point('vit-train'))
  assert 'crops' in _flag_names(cli.entry_point('vit-benchmark', ['--pipeline']))
  assert 'crops' not in _flag_names(cli.entry_point('vit-benchmark'))


def test_the_wheel_holds_every_module_and_the_configs(tmp_path):
  source = tmp_path / 'source'  # a copy: pip builds in the tree it is given
  ignore = shutil.ignore_patterns('__pycache__', '*.pyc')
  for package in ('vit_jax', 'configs'):
    shutil.copytree(REPO / package, source / package, ignore=ignore)
  for name in ('pyproject.toml', 'README.md'):
    shutil.copy(REPO / name, source / name)
  dist = tmp_path / 'dist'
  _pip('wheel', '--no-deps', '--no-build-isolation', '-w', dist, source)
  (wheel,) = dist.glob('vit_jax-*.whl')
  shipped = {n for n in zipfile.ZipFile(wheel).namelist() if n.endswith('.py')}
  expected = {
    str(p.relative_to(REPO))
    for package in ('vit_jax', 'configs')
    for p in (REPO / package).rglob('*.py')
  }
  assert shipped == expected
  assert {
    'configs/vit.py',
    'vit_jax/checkpoint/loader.py',
    'vit_jax/main.py',
    'vit_jax/cli/train.py',
  } <= shipped
  assert 'vit_jax/evals/prompts.json' in zipfile.ZipFile(wheel).namelist()  # package data
  (entry_points,) = (n for n in zipfile.ZipFile(wheel).namelist() if n.endswith('entry_points.txt'))
  parser = configparser.ConfigParser()
  parser.read_string(zipfile.ZipFile(wheel).read(entry_points).decode())
  assert dict(parser['console_scripts']) == _scripts()
  for script, text in _installed_scripts(wheel, tmp_path).items():
    assert _flag_names(cli.entry_point(script)) <= _listed_flags(text), (script, text[-2000:])
    assert f'\n{script}:\n' in text  # listed as the script's own, by the name it was run as


def test_the_makefile_setup_installs_the_package_editable_for_any_directory(tmp_path):
  """`make run`'s and `make test`'s setup (the Makefile's `.package`) installs the checkout into
  the venv: from another directory `import vit_jax` is the checkout's, and `vit-predict --help`
  runs and lists its flags. The venv here is an empty one on this environment's packages (its
  `.runtime` made), so that the Makefile's own recipe runs offline."""
  venv = tmp_path / 'venv'
  subprocess.run([sys.executable, '-m', 'venv', '--without-pip', venv], check=True, timeout=60)
  own = sysconfig.get_path('purelib', 'venv', vars={'base': str(venv), 'platbase': str(venv)})
  (Path(own) / 'dependencies.pth').write_text('\n'.join(site.getsitepackages()) + '\n')
  (venv / '.runtime').touch()  # newer than the lock: the dependencies are there
  make = ['make', '-s', '-C', REPO, f'VENV={venv}', f'{venv}/.package']
  subprocess.run(make, check=True, capture_output=True, timeout=300)
  env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}  # the venv's own lookup
  where = [venv / 'bin' / 'python', '-c', 'import vit_jax; print(vit_jax.__file__)']
  found = subprocess.run(where, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
  assert found.stdout.strip() == str(REPO / 'vit_jax' / '__init__.py'), found.stderr
  help_run = subprocess.run(
    [venv / 'bin' / 'vit-predict', '--help'],
    cwd=tmp_path,
    env={**env, 'JAX_PLATFORMS': 'cpu'},
    capture_output=True,
    text=True,
    timeout=300,
  )  # its exit status is the exit-code convention's (tests of `--help` elsewhere)
  text = help_run.stdout + help_run.stderr
  assert _flag_names(cli.entry_point('vit-predict')) <= _listed_flags(text), text[-2000:]


def test_a_configs_path_is_the_packaged_file_unless_the_working_directory_has_it(
  tmp_path, monkeypatch
):
  monkeypatch.chdir(tmp_path)
  packaged = os.path.join(configs.DIR, 'vit.py')
  assert configs.resolve('configs/vit.py:b16,cifar10') == f'{packaged}:b16,cifar10'
  assert configs.resolve('./configs/vit.py') == packaged
  for untouched in ('configs/no_such.py', 'mine/vit.py', '/abs/configs/vit.py:b16'):
    assert configs.resolve(untouched) == untouched
  (tmp_path / 'configs').mkdir()
  (tmp_path / 'configs' / 'vit.py').write_text('')
  assert configs.resolve('configs/vit.py:b16,cifar10') == 'configs/vit.py:b16,cifar10'


def test_main_reads_a_packaged_config_from_another_directory(tmp_path):
  # The installed layout: vit_jax and configs importable, the working directory elsewhere. A
  # misspelt key is reported against the loaded file, so the file was found and read.
  argv = ['--config=configs/digits.py', '--workdir=run', '--config.bathc=3']
  proc = subprocess.run(
    [sys.executable, '-m', 'vit_jax.main', *argv],
    cwd=tmp_path,
    env={**os.environ, 'PYTHONPATH': str(REPO), 'JAX_PLATFORMS': 'cpu'},
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 2  # a usage error: the line, then where the help is
  error, hint = proc.stderr.splitlines()
  assert error.startswith('error: Unknown config key') and 'batch' in error
  assert hint == "Try 'python -m vit_jax.main --help' for more information."
  assert not (tmp_path / 'run').exists()
