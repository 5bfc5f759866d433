"""Packaging: the wheel holds every module and the configs, its dependency ranges hold the
pinned versions, and `--config=configs/...` is found from any working directory."""

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import configs

REPO = Path(__file__).resolve().parents[1]


def _pins(path: Path) -> dict[str, str]:
  pins = {}
  for line in path.read_text().splitlines():
    line = line.split('#')[0].strip()
    if line and not line.startswith('-'):
      name, version = line.split('==')
      pins[canonicalize_name(name)] = version
  return pins


def test_declared_ranges_hold_the_pinned_versions():
  declared = tomllib.loads((REPO / 'pyproject.toml').read_text())['project']['dependencies']
  pins = _pins(REPO / 'requirements.txt')
  requirements = [Requirement(d) for d in declared]
  # jaxlib comes with jax (the CPU build, or the accelerator one with jax[cuda13], jax[tpu]).
  assert {canonicalize_name(r.name) for r in requirements} == set(pins) - {'jaxlib'}
  for r in requirements:
    assert pins[canonicalize_name(r.name)] in r.specifier, (r, pins[canonicalize_name(r.name)])
    assert '999' not in r.specifier, r  # bounded above: a next major (or 0.x minor) may break


def test_the_wheel_holds_every_module_and_the_configs(tmp_path):
  source = tmp_path / 'source'  # a copy: pip builds in the tree it is given
  ignore = shutil.ignore_patterns('__pycache__', '*.pyc')
  for package in ('vit_jax', 'configs'):
    shutil.copytree(REPO / package, source / package, ignore=ignore)
  for name in ('pyproject.toml', 'README.md'):
    shutil.copy(REPO / name, source / name)
  dist = tmp_path / 'dist'
  subprocess.run(
    [sys.executable, '-m', 'pip', 'wheel', '--no-deps', '--no-build-isolation', '-w', dist, source],
    check=True,
    capture_output=True,
    timeout=300,
  )
  (wheel,) = dist.glob('vit_jax-*.whl')
  shipped = {n for n in zipfile.ZipFile(wheel).namelist() if n.endswith('.py')}
  expected = {
    str(p.relative_to(REPO))
    for package in ('vit_jax', 'configs')
    for p in (REPO / package).rglob('*.py')
  }
  assert shipped == expected
  assert {'configs/vit.py', 'vit_jax/checkpoint/loader.py', 'vit_jax/main.py'} <= shipped


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
  assert proc.returncode == 1
  assert proc.stderr.startswith('Error: Unknown config key') and 'batch' in proc.stderr
  assert not (tmp_path / 'run').exists()
