"""The manual cannot rot: README.md and docs/ checked against the code, nothing trained or compiled.

- Every relative link and `#anchor` resolves (GitHub's anchors: the heading in lower case,
  punctuation dropped, spaces to '-', a repeated heading numbered -1, -2, ...).
- Every `--config=configs/NAME.py[:ARG]` in a command loads as `vit_jax.main` loads it, with the
  command's `--config.KEY=VALUE` overrides, and resolves into a run spec (`spec.from_config`);
  a `--config.KEY` with no `--config=` beside it names a key of configs/vit.py's default.
  Upper-case words are placeholders (`--config.KEY=VALUE`, `configs/vit.py:MODEL,DATASET`).
- A blockquote after `<!-- quote: configs/NAME.py -->` is, whitespace aside, text of that file's
  docstring: a recipe's command and measured result live there, and the pages quote them.
- A code block after `<!-- needs: download -->` (or `accelerator`, `cluster`; comma-separated)
  needs what a fresh machine lacks; a block that reads a released checkpoint, a bucket or a
  dataset other than the bundled digits carries the mark, so an unmarked block runs offline
  (`<!-- needs: nothing -->`: offline though it looks otherwise, e.g. against a local emulator).
  The README's first screen (up to its second `## ` heading) has no marked block: it works on a
  fresh machine as written.
- A code block after `<!-- shows: error -->` shows a command failing on purpose: its config must
  fail to load or to resolve.
- Every `python -m vit_jax.X` names an entry point and flags that it defines, and every
  `jax[EXTRA]==VERSION` the jax that one end's lock pins (requirements/oldest.txt or newest.txt).
- docs/layout.md names every module of the package: each `*.py` file under vit_jax/, every
  `__init__.py` and `python -m` shim included (no file is exempt), is written there in a code
  span as its path under vit_jax/ (`checkpoint/npz.py`, `__init__.py`); and every module path it
  writes exists (see `layout_problems` for which code spans are module paths and how they
  resolve). Its floor 4 table has a row for each console script of pyproject.toml, naming the
  module the script runs, and no row for a script that pyproject.toml lacks.

Each check is shown failing once, on a copy of the pages with one thing broken.
"""

import ast
import dataclasses
import functools
import os
import re
import shlex
import shutil
import sys
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from unittest import mock

import ml_collections
import pytest
from absl import flags

import configs
from vit_jax.train import spec

# ml_collections loads each config file with importlib's deprecated load_module.
pytestmark = pytest.mark.filterwarnings('ignore:the load_module:DeprecationWarning')

ROOT = Path(__file__).resolve().parent.parent
NEEDS = {  # what a `needs:` mark may name, and the text that makes a code block need it
  'download': re.compile(
    r'gs://|gsutil|--config\.pretrained_(?:dir|path)=(?!runs/)|\b[\w+-]*\d\.npz\b'
    r'|configs/(?!digits\.py)\w+\.py'
  ),
  'accelerator': re.compile(r'gpu_benchmark\.sh|jax\[(?:cuda|tpu)'),
  'cluster': re.compile(r'\bsbatch\b|\bsrun\b|tpu_pod\.sh'),
}
SHELL = {'', 'bash', 'sh', 'shell', 'console'}  # commands; output and messages go in ```text
PLACEHOLDER = re.compile(r'^[A-Z][A-Z_]*$')
ORPHAN_KEYS_CONFIG = 'configs/vit.py'  # where a `--config.KEY` without `--config=` is looked up
# Pages that other work adds, linked from here already: a link to one may dangle until it lands.
PENDING_PAGES = {'docs/layout.md', 'docs/image-text.md'}

_FENCE = re.compile(r'^(\s*)(`{3,}|~{3,})\s*([\w-]*)')
_MARK = re.compile(r'^\s*<!--\s*(quote|needs|shows):\s*(.*?)\s*-->\s*$')
_HEADING = re.compile(r'^#{1,6}\s+(.*?)\s*#*\s*$')
_LINK = re.compile(r'!?\[([^\]]*)\]\(([^)\s]*)(?:\s+"[^"]*")?\)')
_CODE_SPAN = re.compile(r'`+[^`]+?`+')
_PYTHON = re.compile(r'(?:^|/)python3?(?:\.\d+)?$')


# --- Reading a page ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Block:
  """A fenced code block: the line of its fence (1-based), language, lines (dedented to the
  fence) and the `needs:` or `shows:` mark before it."""

  line: int
  lang: str
  lines: tuple[str, ...]
  mark: tuple[str, str] | None


@dataclasses.dataclass(frozen=True)
class Page:
  path: str  # relative to the root, '/'-separated
  lines: tuple[str, ...]
  blocks: tuple[Block, ...]
  prose: str  # the page with code blocks and HTML comments blanked, line numbers kept
  stray_marks: tuple[str, ...]  # `needs:` and `shows:` marks with no code block after them


def _blank(match: re.Match) -> str:
  return re.sub(r'[^\n]', ' ', match.group())


def read_page(root: Path, path: str) -> Page:
  lines = (root / path).read_text().splitlines()
  blocks, stray, prose = [], [], list(lines)
  mark, i = None, 0  # a block mark waiting for its code block: (kind, value, line)
  while i < len(lines):
    fence, found = _FENCE.match(lines[i]), _MARK.match(lines[i])
    if fence:
      indent, end = len(fence.group(1)), i + 1
      while end < len(lines) and not lines[end].strip().startswith(fence.group(2)):
        end += 1
      body = tuple(
        line[indent:] if not line[:indent].strip() else line for line in lines[i + 1 : end]
      )
      blocks.append(Block(i + 1, fence.group(3), body, mark and mark[:2]))
      prose[i : end + 1] = [''] * len(prose[i : end + 1])
      mark, i = None, end + 1
      continue
    if mark and (found or lines[i].strip()):
      stray.append(f'{path}:{mark[2]}: a {mark[0]} mark not followed by a code block')
      mark = None
    if found and found.group(1) != 'quote':
      mark = (found.group(1), found.group(2), i + 1)
    i += 1
  if mark:
    stray.append(f'{path}:{mark[2]}: a {mark[0]} mark not followed by a code block')
  text = re.sub(r'<!--.*?-->', _blank, '\n'.join(prose), flags=re.S)
  return Page(path, tuple(lines), tuple(blocks), text, tuple(stray))


def pages(root: Path) -> list[Page]:
  """README.md and every page under docs/."""
  docs = sorted(p.relative_to(root).as_posix() for p in root.glob('docs/**/*.md'))
  return [read_page(root, p) for p in ['README.md', *docs]]


def _line_of(text: str, offset: int) -> int:
  return text.count('\n', 0, offset) + 1


# --- Links and anchors ------------------------------------------------------------------------


def github_anchor(heading: str) -> str:
  """The anchor GitHub gives a heading: link text kept, lower case, punctuation dropped."""
  text = _LINK.sub(r'\1', heading).strip().lower()
  return re.sub(r'[^\w\- ]', '', text).replace(' ', '-')


def anchors(page: Page) -> set[str]:
  seen: dict[str, int] = {}
  for line in page.prose.splitlines():
    heading = _HEADING.match(line)
    if heading:
      anchor = github_anchor(heading.group(1))
      count = seen.get(anchor, 0)
      seen[anchor] = count + 1
      if count:
        seen[f'{anchor}-{count}'] = 1
  return set(seen)


def link_problems(root: Path) -> list[str]:
  """Every relative link of every page names a file or folder, and an anchor a heading."""
  all_pages = pages(root)
  by_path = {p.path: p for p in all_pages}
  problems = []
  for page in all_pages:
    text = _CODE_SPAN.sub(_blank, page.prose)
    for link in _LINK.finditer(text):
      target = link.group(2)
      file, _, anchor = target.partition('#')
      path = os.path.normpath(os.path.join(os.path.dirname(page.path), file)) if file else page.path
      exists = not path.startswith('..') and (root / path).exists()
      where = f'{page.path}:{_line_of(text, link.start())}: link to {target}'
      if re.match(r'[a-z][a-z0-9+.-]*:', target) or (path in PENDING_PAGES and not exists):
        continue  # https:, mailto:; a page still to come
      if not exists:
        problems.append(f'{where}: no file {path}')
      elif (
        anchor
        and path.endswith('.md')
        and anchor not in anchors(by_path.get(path) or read_page(root, path))
      ):
        problems.append(f'{where}: no heading #{anchor} in {path}')
  return problems


# --- Commands ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Command:
  """One simple command of a page: where it is, its words, and the mark of its block."""

  where: str
  words: tuple[str, ...]
  mark: tuple[str, str] | None = None


def _logical_lines(block: Block) -> Iterator[tuple[int, str]]:
  """The shell lines of a block, continuations joined; a block with `$ ` prompts: only those."""
  prompt = any(line.startswith('$ ') for line in block.lines)
  pending, first = '', 0
  for n, line in enumerate(block.lines, block.line + 1):
    if not pending:
      if prompt and not line.startswith('$ '):
        continue
      line, first = (line[2:] if prompt else line), n
    if line.rstrip().endswith('\\'):
      pending += line.rstrip()[:-1] + ' '
      continue
    yield first, pending + line
    pending = ''


def _split(line: str) -> list[tuple[str, ...]]:
  """A shell line in simple commands (split at ; && | > ...), comments dropped; of a usage
  line's optional `[--flag=a|b]`, the flag with its first choice."""
  line = re.sub(r'\[(--?[^\]|\s]+)[^\]\s]*\]', r'\1', line)
  lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
  lexer.whitespace_split = True
  commands, words = [], []
  for word in lexer:
    if set(word) <= set('();<>|&'):
      commands.append(tuple(words))
      words = []
    else:
      words.append(word)
  return [c for c in [*commands, tuple(words)] if c]


def commands(page: Page) -> list[Command]:
  """The commands of a page's shell blocks, and of its code spans that hold one."""
  found = []
  for block in page.blocks:
    if block.lang in SHELL:
      for line, text in _logical_lines(block):
        if 'vit_jax' in text or '--config' in text:
          found += [Command(f'{page.path}:{line}', w, block.mark) for w in _split(text)]
  for span in _CODE_SPAN.finditer(page.prose):
    text = span.group().strip('`')
    if 'python -m ' in text or text.startswith('--config'):
      where = f'{page.path}:{_line_of(page.prose, span.start())}'
      found += [Command(where, words) for words in _split(text)]
  return found


def _placeholder(text: str) -> bool:
  return any(PLACEHOLDER.match(part) for part in re.split(r'[][,.:=/]', text) if part)


def entry_point(command: Command) -> tuple[str, list[str]] | None:
  """(module, flag names) of a `python -m vit_jax.X ...` command, else None."""
  words = command.words
  for i in range(1, len(words) - 1):
    module = words[i + 1]
    if words[i] == '-m' and _PYTHON.search(words[i - 1]) and module.startswith('vit_jax'):
      if _placeholder(module):
        return None
      return module, [w[2:].split('=')[0] for w in words[i + 2 :] if w.startswith('--') and w[2:]]
  return None


# --- Configs ----------------------------------------------------------------------------------


@functools.cache
def _load(real_path: str, arg: str, overrides: tuple[str, ...]) -> ml_collections.ConfigDict:
  """The config as `vit_jax.main` parses it: its config flag over the command line (the
  overrides are read from sys.argv, as ml_collections does)."""
  flag_values = flags.FlagValues()
  configs.define_config_flag('config', 'The config under test.', flag_values=flag_values)
  argv = ['docs', f'--config={real_path}{":" + arg if arg else ""}', *overrides]
  with mock.patch.object(sys, 'argv', argv):
    flag_values(argv)
  return flag_values.config


def _has_key(config, key: str) -> bool:
  node = config
  for part in key.split('.'):
    if not isinstance(node, (ml_collections.ConfigDict, dict)) or part not in node:
      return False
    node = node[part]
  return True


def _config_words(words: tuple[str, ...]) -> tuple[str | None, list[str]]:
  """(the `--config=` value or None, the `--config.KEY[=VALUE]` words) of a command."""
  path, overrides = None, []
  for i, word in enumerate(words):
    if word.startswith('--config='):
      path = word.split('=', 1)[1]
    elif word == '--config' and i + 1 < len(words):
      path = words[i + 1]
    elif word.startswith('--config.'):
      overrides.append(word)
  return path, overrides


def _one_line(e: Exception) -> str:
  lines = [line.strip() for line in str(e).splitlines() if line.strip()] or ['']
  reason = lines[0] if len(lines) == 1 else f'{lines[0]} ... {lines[-1]}'
  return f'{type(e).__name__}: {reason}'


def _config_problem(root: Path, command: Command) -> str | None:
  path, overrides = _config_words(command.words)
  keys = [o[len('--config.') :].split('=')[0] for o in overrides]
  if path is None:  # keys on their own: each must exist; a value may be a placeholder
    if not overrides:
      return None
    path, literal = ORPHAN_KEYS_CONFIG, ()
  elif not path.startswith('configs/') or '...' in path or _placeholder(path):
    return None
  else:  # values with a shell variable or a placeholder: only their keys are checked
    literal = tuple(o for o in overrides if '$' not in o and not _placeholder(o.partition('=')[2]))
  file, _, arg = path.partition(':')
  if not (root / file).is_file():
    return f'--config={path}: no file {file}'
  shown, shows_error = (
    ' '.join([f'--config={path}', *overrides]),
    command.mark == ('shows', 'error'),
  )
  try:
    config = _load(str((root / file).resolve()), arg, literal)
    missing = [k for k in keys if not _placeholder(k) and not _has_key(config, k)]
    if missing:
      raise KeyError(f'no key {", ".join(missing)}')
    spec.from_config(config)
  except Exception as e:  # the error a user would see
    return None if shows_error else f'{shown}: {_one_line(e)}'
  return f'{shown}: shown failing, but loads and resolves' if shows_error else None


def config_problems(root: Path) -> list[str]:
  """Every command's config loads with its overrides and resolves, or fails where it should."""
  found = [(c, _config_problem(root, c)) for page in pages(root) for c in commands(page)]
  return [f'{c.where}: {problem}' for c, problem in found if problem]


# --- Quotes of config docstrings --------------------------------------------------------------


def _normalised(text: str) -> str:
  return ' '.join(text.split())


def _quote_problem(root: Path, file: str, following: list[str]) -> str | None:
  while following and not following[0].strip():
    following.pop(0)
  quote = []
  while following and following[0].lstrip().startswith('>'):
    quote.append(following.pop(0).lstrip()[1:])
  if not quote:
    return 'a quote mark not followed by a blockquote'
  if not (root / file).is_file():
    return f'quotes {file}: no such file'
  docstring = ast.get_docstring(ast.parse((root / file).read_text())) or ''
  if _normalised(' '.join(quote)) not in _normalised(docstring):
    return f'the quote is not in the docstring of {file}'
  return None


def quote_problems(root: Path) -> list[str]:
  """Every blockquote after `<!-- quote: FILE -->` is text of FILE's module docstring."""
  problems = []
  for page in pages(root):
    for i, line in enumerate(page.lines):
      mark = _MARK.match(line)
      if mark and mark.group(1) == 'quote':
        problem = _quote_problem(root, mark.group(2), list(page.lines[i + 1 :]))
        problems += [f'{page.path}:{i + 1}: {problem}'] if problem else []
  return problems


# --- Commands that need a download ------------------------------------------------------------


def needs_problems(root: Path) -> list[str]:
  """A block that needs a download (an accelerator, a cluster) says so; marks name known needs
  and mark a code block."""
  problems = []
  for page in pages(root):
    problems += page.stray_marks
    for block in page.blocks:
      if block.lang not in SHELL:
        continue
      where, marked = f'{page.path}:{block.line}', set()
      if block.mark and block.mark[0] == 'needs':
        marked = {w.strip() for w in block.mark[1].split(',')}
        unknown = sorted(marked - set(NEEDS) - {'nothing'})
        problems += [f'{where}: unknown need {w!r}' for w in unknown]
      if 'nothing' in marked or block.mark == ('shows', 'error'):  # offline; or fails at once
        continue
      text = '\n'.join(block.lines)
      needed = [need for need in sorted(set(NEEDS) - marked) if NEEDS[need].search(text)]
      problems += [f'{where}: needs {need}, not marked' for need in needed]
  return problems


def first_screen(readme: Page) -> list[Block]:
  """The code blocks of the README's first screen: its title, introduction and Quickstart, the
  lines before its second `## ` heading."""
  sections = [n for n, line in enumerate(readme.prose.splitlines(), 1) if line.startswith('## ')]
  end = sections[1] if len(sections) > 1 else len(readme.lines) + 1
  return [b for b in readme.blocks if b.line < end]


def first_screen_problems(root: Path) -> list[str]:
  """No block of the README's first screen needs anything a fresh machine lacks."""
  return [
    f'README.md:{b.line}: marked needs: {b.mark[1]} on the first screen'
    for b in first_screen(read_page(root, 'README.md'))
    if b.mark and b.mark[0] == 'needs'
  ]


# --- Versions ---------------------------------------------------------------------------------


def pinned_jax(root: Path) -> dict[str, str]:
  """{lock: its jax} of each end's runtime lock (requirements/END.txt)."""
  locks = sorted(p for p in (root / 'requirements').glob('*.txt') if '-' not in p.stem)
  return {
    p.relative_to(root).as_posix(): re.search(r'(?m)^jax==(\S+)$', p.read_text())[1] for p in locks
  }


def pin_problems(root: Path) -> list[str]:
  """Every `jax[EXTRA]==VERSION` of a command is the jax that one end's lock pins."""
  pinned = pinned_jax(root)
  said = ', '.join(f'{lock} {version}' for lock, version in pinned.items())
  problems = []
  for page in pages(root):
    for block in page.blocks:
      for n, line in enumerate(block.lines, block.line + 1):
        for version in re.findall(r'jax\[\w+\]==([\w.]+)', line):
          if version not in pinned.values():
            problems.append(f'{page.path}:{n}: jax {version}; the locks pin: {said}')
  return problems


# --- Entry points' flags ----------------------------------------------------------------------
# Each entry point defines its flags in `define_flags(FlagValues)` (vit_jax.cli.ENTRY_POINTS),
# so all of them can be defined, each on a fresh FlagValues, in this one process; absl.app adds
# its own to every program.
_ABSL_FLAGS = {'help', 'helpshort', 'helpfull', 'helpxml', 'flagfile', 'undefok', 'verbosity', 'v'}


def _entry_point_flags() -> dict[str, set[str]]:
  """Each `python -m` module's flag names (the flags of all its modes: `--pipeline`)."""
  from vit_jax import cli

  names: dict[str, set[str]] = {}
  for entry in cli.ENTRY_POINTS:
    flag_values = flags.FlagValues()
    entry.define_flags(flag_values)
    names.setdefault(entry.module, set(_ABSL_FLAGS)).update(flag_values)
  return names


def flag_problems(root: Path, entry_flags: Mapping[str, set[str]]) -> list[str]:
  """Every `python -m vit_jax.X --flag` names an entry point of `entry_flags` and its flags."""
  problems = []
  for command in [c for page in pages(root) for c in commands(page)]:
    found = entry_point(command)
    if found is None:
      continue
    module, names = found
    if module not in entry_flags:
      problems.append(f'{command.where}: python -m {module}: no such entry point')
      continue
    known = entry_flags[module]
    for name in names:
      config_key = name.startswith('config.') and 'config' in known
      negated = name.startswith('no') and name[2:] in known
      if name not in known and not config_key and not negated:
        problems.append(f'{command.where}: python -m {module} has no flag --{name}')
  return problems


# --- Names of the code ------------------------------------------------------------------------
# A file of the repository or a dotted name of the package, written in a page, exists: a module
# that moves or a function renamed fails here instead of misleading a reader.

# The repository's folders a page names files of (`launch/tpu_pod.sh`, `requirements/lock.py`).
ROOT_DIRS = ('vit_jax', 'configs', 'tests', 'launch', 'notebooks', 'docs', 'requirements')
_FILE = re.compile(rf'(?<![\w/.-])((?:{"|".join(ROOT_DIRS)})/[\w/.-]*\w)')
_DOTTED = re.compile(r'(?<![\w.])(vit_jax(?:\.\w+)+)')
_FROM_IMPORT = re.compile(r'^\s*from (vit_jax[\w.]*) import ([\w, ]+)$', re.M)


def _placeholder(name: str) -> bool:
  return any(PLACEHOLDER.match(part) for part in re.split(r'[/.]', name))


def _resolves(dotted: str) -> bool:
  """`vit_jax.a.b.c`: the longest importable module prefix, then attributes."""
  import importlib

  parts = dotted.split('.')
  for i in range(len(parts), 0, -1):
    try:
      value = importlib.import_module('.'.join(parts[:i]))
    except ImportError:
      continue
    for attr in parts[i:]:
      if not hasattr(value, attr):
        return False
      value = getattr(value, attr)
    return True
  return False


def name_problems(root: Path) -> list[str]:
  """Every repository file and `vit_jax.*` name a page writes in code exists."""
  problems = []
  for page in pages(root):
    code = [(_line_of(page.prose, m.start()), m.group()) for m in _CODE_SPAN.finditer(page.prose)]
    code += [(block.line, '\n'.join(block.lines)) for block in page.blocks]
    for line, snippet in code:
      where = f'{page.path}:{line}'
      for path in _FILE.findall(snippet):
        path = path.rstrip('.')
        if not _placeholder(path) and not (root / path).exists() and path not in PENDING_PAGES:
          problems.append(f'{where}: no file {path}')
      names = _DOTTED.findall(snippet)
      for module, imported in _FROM_IMPORT.findall(snippet):
        names += [
          f'{module}.{n.split(" as ")[0].strip()}' for n in imported.split(',') if n.strip()
        ]
      for name in names:
        if not _placeholder(name) and not _resolves(name):
          problems.append(f'{where}: no {name}')
  return problems


# --- The layout page: every module, every console script ------------------------------------

LAYOUT = 'docs/layout.md'
_MODULE_PATH = re.compile(r'((?:[\w-]+/)*[\w-]+\.py)(?::[\w.]+)?')


def package_modules(root: Path) -> list[str]:
  """Every `*.py` file under vit_jax/, as its '/'-separated path relative to vit_jax/."""
  package = root / 'vit_jax'
  return sorted(p.relative_to(package).as_posix() for p in package.rglob('*.py'))


def _module_paths(prose: str) -> list[tuple[int, str]]:
  """(line, path) of each code span of `prose` that is a module path."""
  found = []
  for span in _CODE_SPAN.finditer(prose):
    path = _MODULE_PATH.fullmatch(span.group().strip('`').strip())
    if path:
      found.append((_line_of(prose, span.start()), path.group(1)))
  return found


def _module_file(root: Path, path: str) -> Path:
  return root / path if path.split('/')[0] in ROOT_DIRS else root / 'vit_jax' / path


def layout_problems(root: Path) -> list[str]:
  """docs/layout.md names every module of vit_jax/, and only modules that exist.

  A module path is a code span that is a '/'-separated path ending in `.py` and nothing else,
  optionally followed by `:NAME` (`evals/spec.py:check`); spans with more in them (commands,
  `--config=configs/vit.py:b16`) and code blocks are not read. A path whose first part is one
  of ROOT_DIRS (`tests/conftest.py`, `vit_jax/models/vit.py`, `configs/digits.py`) is resolved
  from the repository root; any other (`cli/train.py`, `files.py`, `__init__.py`) from
  vit_jax/, and must be a file there. A module counts as named only when its path relative to
  vit_jax/ is written as such: `vit_jax/files.py` does not name `files.py`.
  """
  page = read_page(root, LAYOUT)
  named = _module_paths(page.prose)
  problems = [
    f'{LAYOUT}:{line}: no module {path}'
    for line, path in named
    if not _module_file(root, path).is_file()
  ]
  written = {path for _, path in named}
  problems += [
    f'{LAYOUT}: vit_jax/{module} is not named (as `{module}`)'
    for module in package_modules(root)
    if module not in written
  ]
  return problems


def script_problems(root: Path) -> list[str]:
  """Each console script of pyproject.toml has a row of docs/layout.md's tables whose first cell
  starts with the script and which names its module (`vit_jax.cli.train:run_cli`:
  `cli/train.py`); each row whose first cell starts with `vit-` names a console script."""
  scripts = tomllib.loads((root / 'pyproject.toml').read_text())['project']['scripts']
  page = read_page(root, LAYOUT)
  rows = []  # (line, the first word of the first cell, the row's module paths)
  for n, line in enumerate(page.prose.splitlines(), 1):
    cells = [c.strip() for c in line.strip().strip('|').split('|')] if line.startswith('|') else []
    first = cells[0].strip('`').split() if cells and cells[0].startswith('`') else []
    if first:
      modules = {p for _, p in _module_paths(line)}
      rows.append((n, first[0], modules))
  problems = []
  for script, target in scripts.items():
    module = target.split(':')[0].removeprefix('vit_jax.').replace('.', '/') + '.py'
    if not any(name == script and module in modules for _, name, modules in rows):
      problems.append(f'{LAYOUT}: console script {script} has no row naming `{module}`')
  problems += [
    f'{LAYOUT}:{n}: {name} is not a console script of pyproject.toml'
    for n, name, _ in rows
    if name.startswith('vit-') and name not in scripts
  ]
  return problems


# --- The checks on the manual -----------------------------------------------------------------


def test_every_link_and_anchor_resolves():
  assert link_problems(ROOT) == []


def test_every_config_and_key_in_a_command_resolves():
  assert config_problems(ROOT) == []


def test_every_quote_is_text_of_its_config_docstring():
  assert quote_problems(ROOT) == []


def test_every_command_needing_a_download_is_marked():
  assert needs_problems(ROOT) == []


def test_the_readme_first_screen_needs_no_download():
  (block,) = first_screen(read_page(ROOT, 'README.md'))
  assert [line.split()[:2] for line in block.lines] == [['make', 'run'], ['make', 'test']]
  assert first_screen_problems(ROOT) == []


def test_every_jax_version_in_a_command_is_the_pinned_one():
  assert pin_problems(ROOT) == []


def test_every_file_and_name_of_the_code_exists():
  assert name_problems(ROOT) == []


def test_the_layout_names_every_module_and_no_missing_one():
  modules = package_modules(ROOT)
  assert {'__init__.py', 'files.py', 'main.py', 'checkpoint/npz.py', 'models/__main__.py'} <= set(
    modules
  )
  assert layout_problems(ROOT) == []


def test_the_layout_has_a_row_for_every_console_script():
  scripts = tomllib.loads((ROOT / 'pyproject.toml').read_text())['project']['scripts']
  assert {'vit-train', 'vit-zeroshot'} <= set(scripts)
  assert script_problems(ROOT) == []


def test_every_entry_point_command_names_its_flags():
  entry_flags = _entry_point_flags()
  assert {'config', 'workdir', 'distributed_timeout'} <= entry_flags['vit_jax.main']
  assert {'to', 'num_classes', 'list'} <= entry_flags['vit_jax.convert']
  assert {'pipeline', 'crops', 'compare'} <= entry_flags['vit_jax.benchmark']
  assert flag_problems(ROOT, entry_flags) == []


# --- Each check failing once, on a broken copy --------------------------------------------------


@pytest.fixture
def copy(tmp_path: Path) -> Path:
  """The pages copied into tmp_path, the code beside them linked as the pages see it."""
  shutil.copy(ROOT / 'README.md', tmp_path / 'README.md')
  shutil.copytree(ROOT / 'docs', tmp_path / 'docs')
  for name in (
    'configs',
    'vit_jax',
    'launch',
    'notebooks',
    'tests',
    'Makefile',
    'requirements',
    'pyproject.toml',
  ):
    (tmp_path / name).symlink_to(ROOT / name)
  return tmp_path


def _append(path: Path, text: str) -> int:
  """Appends `text` to a page after a blank line; returns the line number of its first line."""
  lines = path.read_text().splitlines()
  path.write_text('\n'.join([*lines, '', text]) + '\n')
  return len(lines) + 2


def test_a_broken_link_or_anchor_is_reported(copy):
  n = _append(
    copy / 'docs' / 'training.md',
    'See [the data](configuration.md#no-such-heading), [a file](../no_such_file.py) and'
    ' [the data](configuration.md#data).',
  )
  assert link_problems(copy) == [
    f'docs/training.md:{n}: link to configuration.md#no-such-heading: no heading'
    ' #no-such-heading in docs/configuration.md',
    f'docs/training.md:{n}: link to ../no_such_file.py: no file no_such_file.py',
  ]


def test_an_unknown_config_key_or_a_bad_value_is_reported(copy):
  n = _append(
    copy / 'docs' / 'training.md',
    '```bash\n'
    'python -m vit_jax.main --config=configs/digits.py --workdir=runs/x \\\n'
    '    --config.eval_evry=5 --config.seed=$s\n'
    'python -m vit_jax.main --config=configs/digits.py:vitt --workdir=runs/x\n'
    'python -m vit_jax.main --config=configs/digits.py --workdir=runs/x --config.step=pmap\n'
    '```\n'
    '<!-- shows: error -->\n'
    '```\n'
    'python -m vit_jax.main --config=configs/digits.py --workdir=runs/x --config.seed=3\n'
    '```\n'
    'And `--config.pp.crops=224` on its own.',
  )
  problems = config_problems(copy)
  assert [p.split(': ', 1)[0] for p in problems] == [
    f'docs/training.md:{line}' for line in (n + 1, n + 3, n + 4, n + 8, n + 10)
  ]
  assert 'eval_evry' in problems[0] and 'eval_every' in problems[0]  # absl's "Did you mean"
  assert 'expected one of vit, mixer, regularised, deit, vit22b' in problems[1]
  assert "config.step='pmap'; expected one of ('jit', 'shard_map')" in problems[2]
  assert problems[3].endswith('shown failing, but loads and resolves')
  assert 'no key pp.crops' in problems[4]


def test_a_changed_quote_is_reported(copy):
  page = copy / 'docs' / 'training.md'
  n = _append(page, '<!-- quote: configs/digits.py -->\n> no flip (a mirrored digit')
  assert quote_problems(copy) == []  # a quote may start and end anywhere in the docstring
  page.write_text(page.read_text().replace('> no flip (a mirrored', '> a flip (a mirrored'))
  assert quote_problems(copy) == [
    f'docs/training.md:{n}: the quote is not in the docstring of configs/digits.py'
  ]


def test_an_unmarked_download_or_a_marked_first_screen_is_reported(copy):
  n = _append(
    copy / 'docs' / 'training.md',
    '```bash\npython -m vit_jax.predict --checkpoint ViT-B_16.npz cat.jpg\n```\n'
    '<!-- needs: downlaod -->\n```bash\ngsutil cp gs://vit_models/x.npz .\n```\n'
    '<!-- needs: download -->\nA mark before prose.',
  )
  assert needs_problems(copy) == [
    f'docs/training.md:{n + 7}: a needs mark not followed by a code block',
    f'docs/training.md:{n}: needs download, not marked',
    f"docs/training.md:{n + 4}: unknown need 'downlaod'",
    f'docs/training.md:{n + 4}: needs download, not marked',
  ]
  readme = copy / 'README.md'
  lines = readme.read_text().splitlines()
  first = next(i for i, line in enumerate(lines) if line.startswith('```'))
  readme.write_text('\n'.join([*lines[:first], '<!-- needs: download -->', *lines[first:]]) + '\n')
  assert first_screen_problems(copy) == [
    f'README.md:{first + 2}: marked needs: download on the first screen'
  ]


def test_a_stale_jax_version_is_reported(copy):
  oldest, newest = (
    re.search(r'(?m)^jax==(\S+)$', (ROOT / 'requirements' / f'{end}.txt').read_text())[1]
    for end in ('oldest', 'newest')
  )
  n = _append(
    copy / 'docs' / 'training.md',
    f'```bash\npip install "jax[cuda13]==0.4.1"\npip install "jax[tpu]=={oldest}"\n'
    f'pip install "jax[cuda12]=={newest}"\n```',
  )
  assert pin_problems(copy) == [
    f'docs/training.md:{n + 1}: jax 0.4.1; the locks pin: requirements/newest.txt {newest},'
    f' requirements/oldest.txt {oldest}'
  ]


def test_an_unknown_entry_point_or_flag_is_reported(copy):
  n = _append(
    copy / 'docs' / 'training.md',
    '```bash\n'
    'python -m vit_jax.main --config=configs/digits.py --workdir=runs/x --nosuch=1 \\\n'
    '    --config.seed=1 --verbosity=1\n'
    'python -m vit_jax.predict --checkpoint runs/x --top_k 3 --json --nojson a.png\n'
    'python -m vit_jax.nosuch --help\n'
    '```',
  )
  assert flag_problems(copy, _entry_point_flags()) == [
    f'docs/training.md:{n + 1}: python -m vit_jax.main has no flag --nosuch',
    f'docs/training.md:{n + 4}: python -m vit_jax.nosuch: no such entry point',
  ]
  # Any mapping: here one without --workdir, --verbosity or predict's --json.
  entry_flags = {'vit_jax.main': {'config'}, 'vit_jax.predict': {'checkpoint', 'top_k'}}
  mine = (f'docs/training.md:{n + 1}: ', f'docs/training.md:{n + 3}: ')
  assert [p for p in flag_problems(copy, entry_flags) if p.startswith(mine)] == [
    f'{mine[0]}python -m vit_jax.main has no flag --workdir',
    f'{mine[0]}python -m vit_jax.main has no flag --nosuch',
    f'{mine[0]}python -m vit_jax.main has no flag --verbosity',
    f'{mine[1]}python -m vit_jax.predict has no flag --json',
    f'{mine[1]}python -m vit_jax.predict has no flag --nojson',
  ]


def test_a_moved_module_or_a_renamed_function_is_reported(copy):
  n = _append(
    copy / 'docs' / 'models.md',
    'The losses live in `vit_jax/losses.py` (`vit_jax.tasks.mixing.make_mix`, and\n'
    '`vit_jax.models.vit.no_such_function`).\n'
    '```python\nfrom vit_jax.tasks import distillation_losses, no_such_module\n```',
  )
  assert name_problems(copy) == [
    f'docs/models.md:{n}: no file vit_jax/losses.py',
    f'docs/models.md:{n + 1}: no vit_jax.models.vit.no_such_function',
    f'docs/models.md:{n + 2}: no vit_jax.tasks.no_such_module',
  ]


def test_a_module_left_out_of_the_layout_or_a_stale_one_is_reported(copy):
  page = copy / LAYOUT
  text = page.read_text()
  lines = [n for n, line in enumerate(text.splitlines(), 1) for _ in range(line.count('`text.py`'))]
  assert lines
  page.write_text(text.replace('`text.py`', '`txt.py`'))
  n = _append(
    page,
    'Also `models/nosuch.py`, `tests/nosuch.py`, `vit_jax/nosuch.py:f`, `evals/spec.py:check`,\n'
    '`tests/conftest.py`, `launch/local.sh`, `configs/` and `--config=configs/nosuch.py:x`.',
  )
  found = set(layout_problems(ROOT))  # those of the real page, reported by the test above
  assert [p for p in layout_problems(copy) if p not in found] == [
    *[f'{LAYOUT}:{line}: no module txt.py' for line in lines],
    f'{LAYOUT}:{n}: no module models/nosuch.py',
    f'{LAYOUT}:{n}: no module tests/nosuch.py',
    f'{LAYOUT}:{n}: no module vit_jax/nosuch.py',
    f'{LAYOUT}: vit_jax/text.py is not named (as `text.py`)',
  ]


def test_a_console_script_left_out_of_the_layout_or_a_stale_one_is_reported(copy):
  pyproject = copy / 'pyproject.toml'
  text = pyproject.read_text()
  pyproject.unlink()  # the fixture's link to the real file
  pyproject.write_text(
    text.replace(
      '[project.scripts]\n', '[project.scripts]\nvit-nosuch = "vit_jax.cli.nosuch:run_cli"\n'
    )
  )
  page = copy / LAYOUT
  lines = page.read_text().splitlines()
  (row,) = [n for n, line in enumerate(lines, 1) if line.startswith('| `vit-models` |')]
  lines[row - 1] = lines[row - 1].replace('`vit-models`', '`vit-model`')
  (zeroshot,) = [n for n, line in enumerate(lines, 1) if line.startswith('| `vit-zeroshot` |')]
  lines[zeroshot - 1] = lines[zeroshot - 1].replace('`cli/zeroshot.py`', '`cli/predict.py`')
  page.write_text('\n'.join(lines) + '\n')
  assert script_problems(copy) == [
    f'{LAYOUT}: console script vit-nosuch has no row naming `cli/nosuch.py`',
    f'{LAYOUT}: console script vit-models has no row naming `cli/models.py`',
    f'{LAYOUT}: console script vit-zeroshot has no row naming `cli/zeroshot.py`',
    f'{LAYOUT}:{row}: vit-model is not a console script of pyproject.toml',
  ]
