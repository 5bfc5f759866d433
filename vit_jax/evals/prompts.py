"""Zero-shot prompts: the template sets and ImageNet's class names, shipped as package data.

`prompts.json` beside this module holds big_vision's lists (its
`evaluators/proj/image_text/prompt_engineering_constants.py` and
`datasets/imagenet/class_names.py`):

  templates    'clip' (CLIP's 80 ImageNet templates), 'clip_paper' (big_vision's set: the 80
               and '{}'), 'clip_best' (CLIP's 7 best and '{}', big_vision's LiT evaluations),
               'class_name_only' ('{}')
  class_names  'imagenet2012': CLIP's curated ImageNet names (1,000, in label order)

`load()` reads the file (once). `templates(entries)` expands set names and keeps templates
written out (a string with '{}'); `class_names(dataset, fallback)` gives the curated names of
a dataset that has them, else `fallback` (the dataset's own). Both are canonicalised as
big_vision's `prompt_engineering` does by default (`canonicalize`: '_' to ' ', punctuation
dropped but for the kept string, lower case, runs of whitespace to one space).
"""

import functools
import importlib.resources
import json
import re
import string
from collections.abc import Sequence
from typing import Any


@functools.cache
def load() -> dict[str, Any]:
  """The package data: {'templates': {set: [...]}, 'class_names': {dataset: [...]}}."""
  return json.loads(importlib.resources.files(__package__).joinpath('prompts.json').read_text())


def canonicalize(text: str, keep: str | None = None) -> str:
  """big_vision's `canonicalize_text`: '_' to ' ', punctuation removed (except the exact
  string `keep`, e.g. '{}' in a template), lower-cased, whitespace runs made one space."""
  text = text.replace('_', ' ')
  table = str.maketrans('', '', string.punctuation)
  parts = text.split(keep) if keep else [text]
  text = (keep or '').join(part.translate(table) for part in parts)
  return re.sub(r'\s+', ' ', text.lower()).strip()


def templates(entries: str | Sequence[str], canonical: bool = True) -> list[str]:
  """The templates of `entries`: each a set name ('clip', ...) or a template with '{}'."""
  known = load()['templates']
  result = []
  for entry in [entries] if isinstance(entries, str) else entries:
    if entry in known:
      result.extend(known[entry])
    elif '{}' in entry:
      result.append(entry)
    else:
      raise ValueError(
        f'prompt template {entry!r}: not a set ({", ".join(known)}) and has no {{}} for the '
        'class name.'
      )
  if not result:
    raise ValueError('no prompt templates given.')
  return [canonicalize(t, keep='{}') for t in result] if canonical else result


def class_names(dataset: str, fallback: Sequence[str], canonical: bool = True) -> list[str]:
  """The curated class names of `dataset` if shipped (ImageNet: CLIP's), else `fallback`."""
  names = load()['class_names'].get(dataset, list(fallback))
  return [canonicalize(n, keep=',') for n in names] if canonical else list(names)
