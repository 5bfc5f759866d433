"""Writes one end's lock files: every package pinned exactly, as pip resolves them together.

  python3 requirements/lock.py oldest       # Python 3.11: today's pins (oldest.in)
  python3.13 requirements/lock.py newest    # Python 3.12 and 3.13: the newest that install together

Inputs: pyproject.toml's dependencies with all their extras (the ranges users get), narrowed by
END.in (the end's own pins); test.in (the test oracles and tools); onnx.in (ONNX export's
environment). Outputs, beside this file:
  END.txt        the runtime (make run)
  END-test.txt   what the tests add (make test), on top of END.txt
  END-onnx.txt   ONNX export's environment (make onnx-env), a set of its own
Each is pip's own resolution (`pip install --dry-run --report`) in a throwaway venv of the
interpreter that runs this script, so a lock holds for that Python's minor version.
"""

import json
import pathlib
import subprocess
import sys
import tempfile
import tomllib
import venv

HERE = pathlib.Path(__file__).resolve().parent
ENDS = {'oldest': ((3, 11),), 'newest': ((3, 12), (3, 13))}
# ONNX's environment keeps the oldest end's versions on every Python: jax2onnx 0.17.1 fails on
# jax 0.12 (NaFlex and the hybrid: jax 0.12 removed jax._src.core.ClosedJaxpr, which it uses),
# all but orbax-checkpoint, which jax2onnx declares older than the runtime's.
ONNX_VERSIONS = 'oldest'
ONNX_UNPINNED = ('orbax-checkpoint',)


def project_requirements() -> list[str]:
  project = tomllib.loads((HERE.parent / 'pyproject.toml').read_text())['project']
  extras = project.get('optional-dependencies', {}).values()
  own = project['name']  # `all` names the other extras through the project itself
  return [*project['dependencies'], *(r for e in extras for r in e if not r.startswith(own))]


def resolve(python: pathlib.Path, args: list[str]) -> dict[str, str]:
  """{name: version} of everything pip would install into an empty environment."""
  with tempfile.TemporaryDirectory() as tmp:
    report = pathlib.Path(tmp) / 'report.json'
    subprocess.run(
      [python, '-m', 'pip', 'install', '--quiet', '--dry-run', '--ignore-installed',
       '--report', report, *args],
      check=True,
    )  # fmt: skip
    installs = json.loads(report.read_text())['install']
  return {i['metadata']['name'].lower(): i['metadata']['version'] for i in installs}


def read_pins(lock: pathlib.Path) -> dict[str, str]:
  lines = (line.split('#')[0].strip() for line in lock.read_text().splitlines())
  return dict(line.lower().split('==') for line in lines if line and not line.startswith('-'))


def pins(packages: dict[str, str]) -> str:
  return ''.join(f'{name}=={version}\n' for name, version in sorted(packages.items()))


def write(path: pathlib.Path, header: str, body: str):
  path.write_text(
    f'# {header}\n# Written by requirements/lock.py: edit the .in files, then rerun it.\n{body}'
  )
  print('wrote', path.relative_to(HERE.parent))


def python_names(end: str) -> str:
  return ' and '.join('.'.join(map(str, v)) for v in ENDS[end])


def main(end: str):
  if sys.version_info[:2] not in ENDS[end]:
    print(f'the {end} end is for Python {python_names(end)}: run this with one', file=sys.stderr)
    sys.exit(2)
  with tempfile.TemporaryDirectory() as tmp:
    venv.create(tmp, with_pip=True)
    python = pathlib.Path(tmp) / 'bin' / 'python'
    runtime = resolve(python, [*project_requirements(), '-c', HERE / f'{end}.in'])
    constraints = pathlib.Path(tmp) / 'runtime.txt'
    constraints.write_text(pins(runtime))
    test = resolve(python, ['-r', HERE / 'test.in', '-c', constraints])
    onnx_constraints = pathlib.Path(tmp) / 'onnx-constraints.txt'
    onnx_versions = read_pins(HERE / f'{ONNX_VERSIONS}.txt')
    onnx_constraints.write_text(
      pins({k: v for k, v in onnx_versions.items() if k not in ONNX_UNPINNED})
    )
    onnx = resolve(python, ['-r', HERE / 'onnx.in', '-c', onnx_constraints])
  names = python_names(end)
  write(HERE / f'{end}.txt', f'The {end} end, Python {names}: the runtime.', pins(runtime))
  added = {k: v for k, v in test.items() if runtime.get(k) != v}
  write(
    HERE / f'{end}-test.txt',
    f'The {end} end, Python {names}: what the tests add.',
    f'-r {end}.txt\n' + pins(added),
  )
  write(HERE / f'{end}-onnx.txt', f'The {end} end, Python {names}: ONNX export.', pins(onnx))


if __name__ == '__main__':
  if len(sys.argv) != 2 or sys.argv[1] not in ENDS:
    print(f'usage: python requirements/lock.py {{{",".join(ENDS)}}}', file=sys.stderr)
    sys.exit(2)
  main(sys.argv[1])
