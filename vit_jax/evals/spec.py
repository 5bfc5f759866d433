"""The evaluations' section of the run spec: which evaluators run, how often, on what.

The trainer's run spec (vit_jax/train/spec.py) holds an `Evals` as `spec.evals`; the
evaluators (vit_jax/evals/registry.py) are built from it. Evaluators by name, big_vision's
way, any number of each type:

  config.evals.fewshot_5 = dict(type='fewshot', every=500, datasets=('digits',), shots=(5,))
  config.evals.coco = dict(type='retrieval', every=1000, datasets=('coco_captions',))

each `config.evals.<name>` a `type` (a key of `TYPES`), `every` (steps between its runs; 0:
at the last step only) and the fields of its type's settings (`Fewshot`, `Zeroshot`,
`Retrieval`); its metrics are named `<name>/...`. The flat keys of before stay: with
`fewshot_every` (`zeroshot_every`) set, `config.fewshot` (`config.zeroshot`) is the evaluator
named 'fewshot' ('zeroshot'), as if written in `config.evals` (`instances`); a config gives
one form or the other. The test split's pass (`eval_every`) and ImageNet ReaL's (`real_split`)
are the classification task's, on the top-level keys.
"""

import dataclasses
from collections.abc import Mapping
from typing import Any


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
class Retrieval:
  """Image-to-text and text-to-image recall@1/5/10 of an image-text model (evals/retrieval.py)."""

  # Datasets with captions (a captions folder, `coco_captions`, a tfds dataset with a
  # `captions` sequence), each a name (its 'test' split) or a pair (name, split); COCO's
  # 'test' is Karpathy's 5,000 images. With `caption_templates`, labelled datasets: the
  # templates filled with each class name are the captions, matching every image of the class.
  datasets: tuple = ()
  caption_templates: tuple = ()
  # The first so many captions of each image (COCO's protocol: 5); 0: all of them.
  max_texts: int = 0
  # Captions per text-tower batch.
  batch_texts: int = 256


# The evaluator types `config.evals.<name>.type` names, and their settings.
TYPES = {'fewshot': Fewshot, 'zeroshot': Zeroshot, 'retrieval': Retrieval}


@dataclasses.dataclass(frozen=True)
class Instance:
  """One evaluator of `config.evals`: its type, schedule and its type's settings."""

  type: str
  every: int
  settings: Any

  def as_config(self) -> dict[str, Any]:
    """Back to the config entry it was read from."""
    settings = {f.name: getattr(self.settings, f.name) for f in dataclasses.fields(self.settings)}
    return {'type': self.type, 'every': self.every, **settings}


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
  # The evaluators by name (see above): name -> Instance.
  named: Mapping[str, Instance] = dataclasses.field(default_factory=dict, metadata={'key': 'evals'})


def instances(evals: Evals) -> dict[str, Instance]:
  """The run's evaluators beside the test split's, by name: `config.evals`, or the flat keys'
  'fewshot' and 'zeroshot' (one line when a config gives both forms)."""
  flat = {
    name: Instance(name, every, getattr(evals, name))
    for name, every in (('fewshot', evals.fewshot_every), ('zeroshot', evals.zeroshot_every))
    if every
  }
  if flat and evals.named:
    keys = ', '.join(f'config.{name}_every' for name in flat)
    raise ValueError(
      f'{keys} and config.evals both name evaluators: move the first into config.evals '
      "(config.evals.fewshot = dict(type='fewshot', every=..., datasets=...)) and set it to 0."
    )
  return flat or dict(evals.named)


def config_key(evals: Evals, name: str) -> str:
  """Where evaluator `name`'s settings are in the config, for messages: 'evals.<name>', or
  'fewshot' ('zeroshot') when the flat keys made it."""
  return f'evals.{name}' if evals.named else name


def _check_schedule(key: str, every: int, datasets) -> None:
  """`config.<key>_every` is >= 0, and names datasets to evaluate once it is set."""
  if every < 0:
    raise ValueError(f'config.{key}_every={every}; expected >= 0 (0 = never).')
  if every and not datasets:
    raise ValueError(f'config.{key}_every is set but config.{key}.datasets is empty.')


def _check_datasets(key: str, datasets, entry: str, size: int) -> None:
  """Each entry a dataset name or a tuple of `size` non-empty strings (name, splits)."""
  for item in datasets:
    sized = isinstance(item, tuple | list) and len(item) == size and all(item)
    if not (isinstance(item, str) and item) and not sized:
      raise ValueError(f'config.{key}.datasets entry {item!r}: expected a dataset name or {entry}.')


def _check_fewshot(key: str, fewshot: Fewshot) -> None:
  _check_datasets(key, fewshot.datasets, 'a triple (name, train split, test split)', 3)
  checks = {
    'shots': all(isinstance(n, int) and n > 0 for n in fewshot.shots) and fewshot.shots,
    'l2_reg': all(isinstance(v, int | float) and v > 0 for v in fewshot.l2_reg) and fewshot.l2_reg,
    'seeds': fewshot.seeds > 0,
  }
  for name, ok in checks.items():
    if not ok:
      value = getattr(fewshot, name)
      raise ValueError(f'config.{key}.{name}={value!r}; expected positive numbers.')


def _check_zeroshot(key: str, zeroshot: Zeroshot) -> None:
  _check_datasets(key, zeroshot.datasets, 'a pair (name, split)', 2)
  if zeroshot.batch_texts < 1 or zeroshot.max_len < 0:
    raise ValueError(f'config.{key}.batch_texts must be positive, max_len >= 0.')


def _check_retrieval(key: str, retrieval: Retrieval) -> None:
  _check_datasets(key, retrieval.datasets, 'a pair (name, split)', 2)
  if retrieval.batch_texts < 1 or retrieval.max_texts < 0:
    raise ValueError(f'config.{key}.batch_texts must be positive, max_texts >= 0.')


_CHECKS = {'fewshot': _check_fewshot, 'zeroshot': _check_zeroshot, 'retrieval': _check_retrieval}


def check(evals: Evals) -> None:
  """The checks of the section that need no data: one-line ValueErrors naming the key."""
  _check_schedule('fewshot', evals.fewshot_every, evals.fewshot.datasets)
  _check_schedule('zeroshot', evals.zeroshot_every, evals.zeroshot.datasets)
  _check_fewshot('fewshot', evals.fewshot)
  _check_zeroshot('zeroshot', evals.zeroshot)
  for name, instance in evals.named.items():
    key = f'evals.{name}'
    if instance.every < 0:
      raise ValueError(f'config.{key}.every={instance.every}; expected >= 0 (0: the last step).')
    if not getattr(instance.settings, 'datasets', True):
      raise ValueError(f'config.{key}.datasets is empty: name the datasets it evaluates on.')
    _CHECKS.get(instance.type, lambda key, settings: None)(key, instance.settings)
  instances(evals)  # one form of the two
