"""The package's import graph: no circle, and no import up a floor. Read from the source with
`ast`; nothing is imported.

Every import statement counts, at module level or inside a function (a lazy import is still a
dependency, only a later one). `from pkg import name` points at `pkg.name` where that is a
module, else at `pkg` itself (its `__init__`); `import pkg.mod` points at `pkg.mod` alone (the
packages Python runs first on the way are no edge: an `__init__` importing its own submodules
is the usual shape of a package, not a circle).
"""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ('vit_jax', 'configs')

# The floors of docs/layout.md, by the first name under vit_jax (configs: the package). A
# module imports from its own floor or the ones below; a new top-level module takes a floor here.
FLOORS = {
  # 4: the entry points, and the shims that keep `python -m vit_jax.<tool>` working.
  **dict.fromkeys(['cli', 'main', 'convert', 'predict', 'visualize', 'zeroshot', 'embed'], 4),
  # 3: what runs an experiment, the benchmark harness, the inference layer, the configs.
  **dict.fromkeys(
    [
      'train',
      'tasks',
      'evals',
      'reproduce',
      'fewshot',
      'export',
      'benchmark',
      'inference',
      'configs',
    ],
    3,
  ),
  # 2: models and their families, checkpoints, data, text.
  **dict.fromkeys(['models', 'families', 'checkpoint', 'data', 'text'], 2),
  # 1: the shared services.
  **dict.fromkeys(
    [
      'files',
      'flat',
      'rundir',
      'parallel',
      'distributed',
      'optim',
      'hugepages',
      'torch_compat',
      'compilation_cache',
      'logs',
      'profiling',
    ],
    1,
  ),
  'vit_jax': 1,  # the package's own __init__
}
# `python -m vit_jax.reproduce`, `vit_jax.models`, `vit_jax.export`, `vit_jax.benchmark`: shims
# inside their packages.
ENTRY_SHIMS = (
  'vit_jax.reproduce.__main__',
  'vit_jax.models.__main__',
  'vit_jax.export.__main__',
  'vit_jax.benchmark.__main__',
)


def _modules(root: pathlib.Path, packages: tuple[str, ...]) -> dict[str, pathlib.Path]:
  """Dotted module name -> file, for every .py file of `packages` under `root`."""
  found = {}
  for package in packages:
    for path in sorted((root / package).rglob('*.py')):
      parts = path.relative_to(root).with_suffix('').parts
      name = '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)
      found[name] = path
  return found


def _targets(node: ast.AST, module: str, is_package: bool, known: set[str]) -> set[str]:
  """The known modules one import statement points at."""
  if isinstance(node, ast.Import):
    names = [alias.name for alias in node.names]
  elif isinstance(node, ast.ImportFrom):
    base = node.module or ''
    if node.level:  # relative: from the module's own package, `level - 1` more up
      package = module.split('.') if is_package else module.split('.')[:-1]
      package = package[: len(package) - (node.level - 1)]
      base = '.'.join([*package, base] if base else package)
    names = [f'{base}.{a.name}' if f'{base}.{a.name}' in known else base for a in node.names]
  else:
    return set()
  targets = set()
  for name in names:
    while name and name not in known:  # `import a.b.c` of a non-module c: its package
      name = name.rpartition('.')[0]
    if name:
      targets.add(name)
  return targets


def import_graph(root: pathlib.Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
  """Module -> the modules it imports (anywhere in its file), within `packages`."""
  modules = _modules(root, packages)
  known = set(modules)
  graph = {}
  for name, path in modules.items():
    is_package = path.name == '__init__.py'
    edges = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
      edges |= _targets(node, name, is_package, known)
    graph[name] = edges - {name}
  return graph


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
  """One circle of `graph` as [a, b, ..., a], or None: a depth-first search for a back edge."""
  state = {}  # module -> 'open' while on the search path, 'done' after

  def visit(node: str, path: list[str]) -> list[str] | None:
    state[node] = 'open'
    path.append(node)
    for nxt in sorted(graph.get(node, ())):
      if state.get(nxt) == 'open':
        return [*path[path.index(nxt) :], nxt]
      if nxt not in state and (circle := visit(nxt, path)):
        return circle
    path.pop()
    state[node] = 'done'
    return None

  for node in sorted(graph):
    if node not in state and (circle := visit(node, [])):
      return circle
  return None


def test_the_package_has_no_import_circle():
  graph = import_graph(ROOT, PACKAGES)
  assert 'vit_jax.models.vit' in graph['vit_jax.models']  # the graph is read at all
  assert 'vit_jax.train.spec' in graph['vit_jax.train.setup']
  circle = find_circle(graph)
  assert circle is None, 'import circle: ' + ' -> '.join(circle or ())


def floor(module: str) -> int:
  """The floor of a module of `PACKAGES` (KeyError: a top-level name without a floor)."""
  if module in ENTRY_SHIMS:
    return FLOORS['cli']
  parts = module.split('.')
  key = parts[0] if parts[0] != 'vit_jax' or len(parts) == 1 else parts[1]
  if key not in FLOORS:
    raise KeyError(f'{module}: give {key!r} a floor in FLOORS (tests/test_imports.py)')
  return FLOORS[key]


def test_no_module_imports_from_a_floor_above_its_own():
  graph = import_graph(ROOT, PACKAGES)
  upward = [f'{a} -> {b}' for a in sorted(graph) for b in sorted(graph[a]) if floor(b) > floor(a)]
  assert not upward, 'imports up a floor: ' + ', '.join(upward)
  assert floor('vit_jax.cli.train') > floor('vit_jax.train.loop') > floor('vit_jax.models.vit')
  assert floor('vit_jax.models.vit') > floor('vit_jax.files')


def _write(root: pathlib.Path, files: dict[str, str]) -> None:
  for name, text in files.items():
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_text(text)


@pytest.mark.parametrize(
  'b_text',
  [
    'from pkg import a\n',  # a module-level import back
    'def f():\n  from pkg.a import X\n  return X\n',  # a lazy one, inside a function
    'from . import a\n',  # relative
    'import typing\nif typing.TYPE_CHECKING:\n  import pkg.a\n',  # for type hints only
  ],
)
def test_a_circle_through_any_import_statement_is_found(tmp_path, b_text):
  _write(tmp_path, {'pkg/__init__.py': '', 'pkg/a.py': 'from pkg import b\n', 'pkg/b.py': b_text})
  assert find_circle(import_graph(tmp_path, ('pkg',))) == ['pkg.a', 'pkg.b', 'pkg.a']


def test_a_package_init_importing_its_submodules_is_no_circle(tmp_path):
  """`pkg/__init__.py` hands on `pkg.a`'s names, and `pkg.a` imports its sibling `pkg.b`."""
  _write(
    tmp_path,
    {
      'pkg/__init__.py': 'from pkg.a import A\nfrom pkg.b import B\n',
      'pkg/a.py': 'from pkg.b import B\nA = B\n',
      'pkg/b.py': 'B = 1\n',
    },
  )
  graph = import_graph(tmp_path, ('pkg',))
  assert graph == {'pkg': {'pkg.a', 'pkg.b'}, 'pkg.a': {'pkg.b'}, 'pkg.b': set()}
  assert find_circle(graph) is None


def test_a_submodule_taking_a_name_from_its_own_package_init_is_a_circle(tmp_path):
  _write(
    tmp_path,
    {
      'pkg/__init__.py': 'from pkg.a import A\nHELPER = 1\n',
      'pkg/a.py': 'from pkg import HELPER\n',
    },
  )
  assert find_circle(import_graph(tmp_path, ('pkg',))) == ['pkg', 'pkg.a', 'pkg']
