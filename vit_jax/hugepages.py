"""Transparent huge pages for XLA's host buffers (Linux with glibc >= 2.35).

XLA:CPU allocates a program's temporaries afresh at every execution, as one large `malloc`
that glibc serves with a fresh `mmap`, so every step touches that memory for the first time,
page by page. With 4 KiB pages a ViT-B/16 training step at batch 8 (2.8 GB of temporaries)
takes ~530,000 page faults: ~0.9 s of kernel time in a 5.2 s step on a 2-core CPU. glibc's
tunable `glibc.malloc.hugetlb=1` advises transparent huge pages for its mappings (2 MiB, 512x
fewer faults); the same step then takes 4.8 s. (numpy does the same for its own large arrays.)

In a virtual machine whose host takes back free guest memory (virtio-balloon free page
reporting), huge pages freed and left unused for a few seconds are re-faulted from the host
when reused: a program run after a pause pays for it once; a training loop, which reuses its
memory at once, does not. The benchmark therefore reports the best of consecutive steps.

glibc reads tunables only when a process starts, so the command-line entry points
(`vit_jax.main`, `vit_jax.benchmark`, `vit_jax.reproduce`) call `reexec_with_huge_pages()`
first: where it helps (the kernel's THP mode is `madvise`; with `always` every mapping gets
huge pages anyway, with `never` none can), it replaces the process by the same command with the
tunable added to GLIBC_TUNABLES. Set VIT_JAX_HUGE_PAGES=0 to keep the process as started.
"""

import os
import platform
import re
import sys

TUNABLE = 'glibc.malloc.hugetlb=1'
OPT_OUT = 'VIT_JAX_HUGE_PAGES'
THP_MODE_FILE = '/sys/kernel/mm/transparent_hugepage/enabled'


def thp_mode(path: str = THP_MODE_FILE) -> str | None:
  """The kernel's transparent-huge-page mode ('always', 'madvise', 'never'), or None."""
  try:
    with open(path) as f:
      match = re.search(r'\[(\w+)\]', f.read())
  except OSError:
    return None
  return match.group(1) if match else None


def _glibc_at_least(version: str, minimum: tuple[int, int] = (2, 35)) -> bool:
  parts = re.match(r'(\d+)\.(\d+)', version or '')
  return bool(parts) and (int(parts.group(1)), int(parts.group(2))) >= minimum


def tunable_set(environ: dict[str, str]) -> bool:
  return TUNABLE in environ.get('GLIBC_TUNABLES', '').split(':')


def should_reexec(environ: dict[str, str], libc: tuple[str, str], mode: str | None) -> bool:
  """True where adding the tunable would change how this process's memory is mapped."""
  name, version = libc
  return (
    environ.get(OPT_OUT, '1') != '0'
    and not tunable_set(environ)
    and name == 'glibc'
    and _glibc_at_least(version)
    and mode == 'madvise'
  )


def reexec_command(environ: dict[str, str], orig_argv: list[str], executable: str):
  """(executable, argv, env) of the same command with the tunable added."""
  env = dict(environ)
  env['GLIBC_TUNABLES'] = ':'.join(filter(None, [environ.get('GLIBC_TUNABLES'), TUNABLE]))
  return executable, [executable, *orig_argv[1:]], env


def reexec_with_huge_pages() -> None:
  """Restarts this command with glibc's huge-page tunable where that helps; else returns.

  Call it first in a `__main__`, before threads start or files open.
  """
  environ = dict(os.environ)
  if not should_reexec(environ, platform.libc_ver(), thp_mode()):
    return
  sys.stdout.flush()
  sys.stderr.flush()
  executable, argv, env = reexec_command(environ, sys.orig_argv, sys.executable)
  os.execve(executable, argv, env)


def describe(environ: dict[str, str] | None = None) -> str:
  """One line for logs and benchmark reports: the THP mode and whether malloc uses it."""
  environ = dict(os.environ) if environ is None else environ
  mode = thp_mode()
  state = 'on' if tunable_set(environ) or mode == 'always' else 'off'
  return f'transparent huge pages for malloc: {state} (kernel THP mode {mode or "unknown"})'
