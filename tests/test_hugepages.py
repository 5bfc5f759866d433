"""vit_jax.hugepages: when the entry points restart with glibc's huge-page tunable, and that
the restarted process really maps large buffers with huge pages."""

import os
import platform
import subprocess
import sys

import pytest

from vit_jax import hugepages

GLIBC = ('glibc', '2.36')


def test_thp_mode_reads_the_bracketed_choice(tmp_path):
  path = tmp_path / 'enabled'
  path.write_text('always [madvise] never\n')
  assert hugepages.thp_mode(str(path)) == 'madvise'
  path.write_text('[always] madvise never\n')
  assert hugepages.thp_mode(str(path)) == 'always'
  assert hugepages.thp_mode(str(tmp_path / 'missing')) is None


@pytest.mark.parametrize(
  ('environ', 'libc', 'mode', 'expected'),
  [
    ({}, GLIBC, 'madvise', True),
    ({'GLIBC_TUNABLES': 'glibc.malloc.arena_max=2'}, GLIBC, 'madvise', True),
    ({'GLIBC_TUNABLES': 'glibc.malloc.hugetlb=1'}, GLIBC, 'madvise', False),  # already on
    ({'GLIBC_TUNABLES': 'x=1:glibc.malloc.hugetlb=1'}, GLIBC, 'madvise', False),
    ({'VIT_JAX_HUGE_PAGES': '0'}, GLIBC, 'madvise', False),  # opted out
    ({}, GLIBC, 'always', False),  # every mapping gets huge pages anyway
    ({}, GLIBC, 'never', False),
    ({}, GLIBC, None, False),  # no THP (not Linux, or no sysfs)
    ({}, ('glibc', '2.34'), 'madvise', False),  # the tunable came in 2.35
    ({}, ('glibc', '2.4'), 'madvise', False),
    ({}, ('', ''), 'madvise', False),  # musl, macOS
  ],
)
def test_should_reexec(environ, libc, mode, expected):
  assert hugepages.should_reexec(environ, libc, mode) is expected


def test_reexec_command_keeps_the_command_and_other_tunables():
  argv = ['python3', '-X', 'utf8', '-m', 'vit_jax.main', '--workdir=runs/a b']
  exe, new_argv, env = hugepages.reexec_command(
    {'GLIBC_TUNABLES': 'glibc.malloc.arena_max=2', 'HOME': '/h'}, argv, '/usr/bin/python3.11'
  )
  assert exe == '/usr/bin/python3.11'
  assert new_argv == [
    '/usr/bin/python3.11',
    '-X',
    'utf8',
    '-m',
    'vit_jax.main',
    '--workdir=runs/a b',
  ]
  assert env == {'GLIBC_TUNABLES': 'glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1', 'HOME': '/h'}
  assert hugepages.reexec_command({}, argv, 'py')[2] == {'GLIBC_TUNABLES': 'glibc.malloc.hugetlb=1'}


# A child that restarts itself as the entry points do, then touches a fresh 256 MiB malloc.
_CHILD = """
from vit_jax import hugepages
hugepages.reexec_with_huge_pages()
import ctypes, os, resource, sys
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
size = 2**28  # 256 MiB: glibc serves it with a fresh mmap (numpy would madvise by itself)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
ctypes.memset(libc.malloc(size), 1, size)  # the first touch
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(os.environ.get('GLIBC_TUNABLES', ''), faults, sys.argv[1:])
"""


def _child(opt_out: bool) -> tuple[str, int, str]:
  env = {k: v for k, v in os.environ.items() if k not in ('GLIBC_TUNABLES', hugepages.OPT_OUT)}
  if opt_out:
    env[hugepages.OPT_OUT] = '0'
  out = (
    subprocess.run(
      [sys.executable, '-c', _CHILD, 'an-argument'],
      env=env,
      capture_output=True,
      text=True,
      check=True,
      timeout=120,
    )
    .stdout.strip()
    .split(maxsplit=2)
  )
  return out[0] if len(out) == 3 else '', int(out[-2]), out[-1]


@pytest.mark.skipif(
  not hugepages.should_reexec({}, platform.libc_ver(), hugepages.thp_mode()),
  reason='needs Linux, glibc >= 2.35 and THP mode madvise',
)
@pytest.mark.serial
def test_the_restarted_process_maps_large_buffers_with_huge_pages():
  tunables, faults, argv = _child(opt_out=False)
  assert tunables == hugepages.TUNABLE
  assert argv == "['an-argument']"  # the same command ran again
  # 256 MiB is 65,536 pages of 4 KiB but only 128 of 2 MiB.
  assert faults < 4_000, faults
  tunables_off, faults_off, _ = _child(opt_out=True)
  assert tunables_off == ''
  assert faults_off > 60_000, faults_off
