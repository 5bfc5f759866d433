"""The evaluations' section of the run spec: which evaluators run, how often, on what.

The trainer's run spec (vit_jax/train/spec.py) holds an `Evals` as `spec.evals`; the
evaluators (vit_jax/evals/registry.py) are built from it. The config stays flat: the fields
of `Evals` are top-level keys (`--config.fewshot_every`), `Fewshot` the nested
`config.fewshot`. An evaluator's own keys are fields here, checked in `check`.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Fewshot:
  """`config.fewshot`: linear few-shot evaluation on frozen pre-logits (evals/fewshot.py)."""

  # Datasets: a name as `config.dataset` takes ('digits', a tfds name, an image folder) with
  # its 'train' and 'test' splits, or a triple (name, train split, test split).
  datasets: tuple = ()
  # Examples per class; the L2 regularisations (the first one names the headline metric);
  # seeds 0 .. seeds-1 of the per-class draw (big_vision's fewshot_lsr defaults).
  shots: tuple = (1, 5, 10, 25)
  l2_reg: tuple = (2.0**10,)
  seeds: int = 3


@dataclasses.dataclass(frozen=True)
class Zeroshot:
  """`config.zeroshot`: zero-shot top-1 of an image-text model (evals/zeroshot.py)."""

  # Datasets: a name as `config.dataset` takes ('digits', a tfds name, an image folder) with
  # its 'test' split, or a pair (name, split). Class names: the dataset's (ImageNet: CLIP's).
  datasets: tuple = ()
  # Prompt templates: set names of vit_jax/evals/prompts.json ('clip', 'clip_best', ...) or
  # templates with '{}' for the class name.
  templates: tuple = ('clip_best',)
  # Class names and templates canonicalised as big_vision does (lower case, no punctuation).
  canonicalize: bool = True
  # The tokenizer's vocabulary file; the tokenizer and max_len default to the model's `pp`.
  vocab: str = ''
  tokenizer: str = ''
  max_len: int = 0
  # Prompts per text-tower batch.
  batch_texts: int = 256


@dataclasses.dataclass(frozen=True)
class Evals:
  """The evaluations: the test split's, and those beside it."""

  # Evaluate the test split every so many steps (and at the end).
  eval_every: int = 100
  # Few-shot linear accuracy every so many steps (and at the end); 0 = never.
  fewshot_every: int = 0
  fewshot: Fewshot = Fewshot()
  # Zero-shot accuracy of an image-text model every so many steps (and at the end); 0 = never.
  zeroshot_every: int = 0
  zeroshot: Zeroshot = Zeroshot()
  # A split of tfds `imagenet2012_real` (e.g. 'validation'): ImageNet ReaL accuracy at every
  # evaluation ('' = none).
  real_split: str = ''


def _check_schedule(key: str, every: int, datasets) -> None:
  """`config.<key>_every` is >= 0, and names datasets to evaluate once it is set."""
  if every < 0:
    raise ValueError(f'config.{key}_every={every}; expected >= 0 (0 = never).')
  if every and not datasets:
    raise ValueError(f'config.{key}_every is set but config.{key}.datasets is empty.')


def check(evals: Evals) -> None:
  """The checks of the section that need no data: one-line ValueErrors naming the key."""
  fewshot = evals.fewshot
  _check_schedule('fewshot', evals.fewshot_every, fewshot.datasets)
  for entry in fewshot.datasets:
    triple = isinstance(entry, tuple | list) and len(entry) == 3
    if not (isinstance(entry, str) and entry) and not (triple and all(entry)):
      raise ValueError(
        f'config.fewshot.datasets entry {entry!r}: expected a dataset name or a triple '
        '(name, train split, test split).'
      )
  _check_zeroshot(evals)
  checks = {
    'shots': all(isinstance(n, int) and n > 0 for n in fewshot.shots) and fewshot.shots,
    'l2_reg': all(isinstance(v, int | float) and v > 0 for v in fewshot.l2_reg) and fewshot.l2_reg,
    'seeds': fewshot.seeds > 0,
  }
  for key, ok in checks.items():
    if not ok:
      value = getattr(fewshot, key)
      raise ValueError(f'config.fewshot.{key}={value!r}; expected positive numbers.')


def _check_zeroshot(evals: Evals) -> None:
  zeroshot = evals.zeroshot
  _check_schedule('zeroshot', evals.zeroshot_every, zeroshot.datasets)
  for entry in zeroshot.datasets:
    pair = isinstance(entry, tuple | list) and len(entry) == 2 and all(entry)
    if not (isinstance(entry, str) and entry) and not pair:
      raise ValueError(
        f'config.zeroshot.datasets entry {entry!r}: expected a dataset name or a pair '
        '(name, split).'
      )
  if zeroshot.batch_texts < 1 or zeroshot.max_len < 0:
    raise ValueError('config.zeroshot.batch_texts must be positive, max_len >= 0.')
