"""The run spec: every training config key, its type, default and meaning, defined once.

An experiment config (`configs/*.py`, an `ml_collections.ConfigDict` with `--config.X=...`
overrides) is resolved once by `from_config` into a frozen `RunSpec`; each part of training
receives the section it needs (`spec.optim` for the optimizer, `spec.data` for the input
pipeline, `spec.loop` for the periodic actions, ...), never the ConfigDict.

The config stays flat, as in the original vit_jax (`--config.base_lr`, `--config.pp.crop`):
the fields of each section below are its top-level keys, a nested section (`pp`) is a nested
dict, and `config.model` holds the model's constructor fields (checked by the model).
`configs/common.py` starts every experiment from `default_config()`, these defaults.

Some sections are defined below the trainer, beside the code they configure: `Data` (with
`Pp`) in vit_jax/data/spec.py, which the input pipeline takes whole, `Evals` (with
`Fewshot`) in vit_jax/evals/spec.py, which the evaluators are built from, and the tasks'
`Distill` and `Contrastive` in vit_jax/tasks/, whose checks are theirs. `from_config` is
the config's one way in; vit_jax/train/setup.py (`prepare`) then resolves the spec against
the data and the devices.
"""

import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping
from typing import Any

import ml_collections

from vit_jax import optim, parallel, tasks
from vit_jax.data import spec as data_spec
from vit_jax.data.spec import Data
from vit_jax.evals import spec as evals_spec
from vit_jax.evals.spec import Evals
from vit_jax.models import precision as precision_lib
from vit_jax.optim import Optim  # the optimizer section, defined beside the optimizer
from vit_jax.tasks.contrastive import Contrastive  # the tasks' sections, beside their tasks
from vit_jax.tasks.distillation import Distill

DTYPES = ('float32', 'bfloat16')
PRECISIONS = precision_lib.POLICIES
LOSSES = ('softmax_xent', 'sigmoid_xent')
STEPS = ('jit', 'shard_map')


@dataclasses.dataclass(frozen=True)
class Model:
  """The model and its compute dtype."""

  # Registry name (vit_jax.models.MODEL_CONFIGS) of the model: names the pretrained file and
  # the model in reports.
  name: str = dataclasses.field(default='', metadata={'key': 'model_name'})
  # The model's constructor fields (from the registry); overridable per field on the command
  # line (`--config.model.transformer.dropout_rate=0.1`). None: not chosen yet.
  fields: Mapping[str, Any] | None = dataclasses.field(default=None, metadata={'key': 'model'})
  # Compute dtype: 'float32', or 'bfloat16' for mixed precision (parameters stay float32).
  # float16 is refused: it needs loss scaling, which this trainer does not do.
  dtype: str = 'float32'
  # With dtype='bfloat16': 'matmul' (bfloat16 matmul operands, float32 activations and
  # residuals) or 'activations' (activations and residuals in bfloat16 too; LayerNorm
  # statistics, softmax and loss in float32); vit_jax/models/precision.py, docs/precision.md.
  precision: str = 'matmul'

  def constructor_fields(self) -> dict[str, Any]:
    """`fields` as keyword arguments of the module."""
    return dict(self.fields or {})


@dataclasses.dataclass(frozen=True)
class Init:
  """Where the first weights come from."""

  # Seed of the initialisation, the dropout keys and the data order.
  seed: int = 0
  # Pretrained checkpoints: `{pretrained_dir}/{model_name}.npz` (download from
  # gs://vit_models/imagenet21k), or one file in `pretrained_path` (any format
  # vit_jax.checkpoint reads). Both empty: train from scratch.
  pretrained_dir: str = '.'
  pretrained_path: str = ''
  # A pretrained file of another patch size: resample its patch embedding to the model's
  # (FlexiViT's resize, `checkpoint.merge_pretrained`) instead of stopping at its shape.
  resize_patch_embedding: bool = False
  # An image-text model's BERT text tower from a BERT file (task='contrastive'): a Hugging
  # Face BERT directory or .safetensors file (bert-base-uncased), or an original BERT TF
  # checkpoint (vit_jax/checkpoint/bert.py); its encoder is read, the text head starts
  # fresh. '' (default): the text tower as `pretrained_path` or the init gives it.
  text_pretrained_path: str = ''
  # AugReg: a model ('B_16', best i21k checkpoint by index.csv) or a full file name.
  model_or_filename: str = ''


@dataclasses.dataclass(frozen=True)
class Step:
  """The compiled training step: loss, micro-batches, parallelism."""

  # 'softmax_xent', or 'sigmoid_xent' (per-class sigmoid, summed over classes).
  loss: str = 'softmax_xent'
  label_smoothing: float = 0.0
  # mixup's Beta concentration p (big_vision's `mixup.p`; 0 = off) and CutMix's alpha (timm's
  # `cutmix_alpha`; 0 = off); both > 0: either one, with probability 1/2 each. Applied to
  # the global batch in the step (vit_jax/tasks/mixing.py).
  mixup: float = 0.0
  cutmix: float = 0.0
  # Split each batch into this many micro-batches and average their gradients (saves memory).
  accum_steps: int = 8
  # 'jit': one program for the global batch, partitioned by GSPMD (replicated or FSDP).
  # 'shard_map': the per-device step, gradients averaged by an explicit pmean (replicated).
  step: str = 'jit'
  # The device mesh: named axes and their sizes, one of them -1 (the rest of the devices):
  # 'data' and 'fsdp' split the batch, 'fsdp' the parameters too, 'model' each layer (tensor
  # parallelism); e.g. 'data:-1' (default), 'fsdp:-1,model:4' (vit_jax/parallel.py).
  mesh: str = parallel.DEFAULT_MESH
  # Parameters and optimizer state: 'replicate', 'fsdp' (over 'fsdp', else 'data'), 'tp'
  # (Megatron-style over 'model'), 'tp+fsdp', or ((regex, rule), ...) pairs whose rule is
  # one of these or a tuple of mesh axes for the leaf's trailing dimensions.
  sharding: Any = 'replicate'
  distill: Distill = dataclasses.field(default_factory=Distill)
  # Polyak averaging: an exponential moving average of the parameters with this decay, kept
  # in the state beside them and evaluated as `polyak/...` (0 = off; the paper's 0.9999).
  polyak_decay: float = 0.0
  # 'classification' (images and labels; with `distill.teacher_checkpoint` it distils), or
  # 'contrastive' (image-text pairs, a two-tower model: `contrastive`); vit_jax/tasks.
  task: str = 'classification'
  contrastive: Contrastive = dataclasses.field(default_factory=Contrastive)


@dataclasses.dataclass(frozen=True)
class Loop:
  """How long, and the periodic actions of the loop."""

  # Steps; set by the dataset preset unless given. total_epochs > 0 sets them from the
  # training split's size instead.
  total_steps: int = 0
  total_epochs: float = 0.0
  # Log progress every so many steps; checkpoint (0 = only at the end).
  progress_every: int = 10
  checkpoint_every: int = 1_000
  keep_checkpoints: int = 3
  # Trace this many steps (after the first two) for TensorBoard's profile plugin (0 = none).
  profile_steps: int = 0


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """A resolved training config: one section per part of training."""

  model: Model = Model()
  init: Init = Init()
  data: Data = dataclasses.field(default_factory=Data)
  optim: Optim = Optim()
  step: Step = Step()
  loop: Loop = Loop()
  evals: Evals = dataclasses.field(default_factory=Evals)


# ----------------------------------------------------------------------------------------
# The flat config keys of the sections, and their conversion.
# ----------------------------------------------------------------------------------------


def _key(field: dataclasses.Field) -> str:
  return field.metadata.get('key', field.name)


def _sections() -> dict[str, tuple[str, dataclasses.Field]]:
  """Config key -> (section name, field of that section)."""
  keys = {}
  for section in dataclasses.fields(RunSpec):
    for field in dataclasses.fields(section.type):
      keys[_key(field)] = (section.name, field)
  return keys


SECTIONS = _sections()
_HINTS = {f.name: typing.get_type_hints(f.type) for f in dataclasses.fields(RunSpec)}
# The keys a config may have, with their place: one definition, the dataclasses above.
CONFIG_KEYS = frozenset(SECTIONS)


def _unknown(key: str, known: frozenset[str], prefix: str = '') -> ValueError:
  close = difflib.get_close_matches(key, known, n=1)
  hint = f' Did you mean {prefix + close[0]!r}?' if close else ''
  return ValueError(f'Unknown config key {prefix + key!r}.{hint}')


def _convert(key: str, value: Any, kind: Any) -> Any:
  """`value` as the field's type (ints are floats where a float is wanted); a clear error."""
  origin = typing.get_origin(kind)
  if kind in (int, float, str, bool):
    numeric = isinstance(value, int | float) and not isinstance(value, bool)
    if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
      return value
    if kind is float and numeric:
      return float(value)
    if kind is int and numeric and float(value).is_integer():
      return int(value)
    raise ValueError(f'config.{key}={value!r}; expected {kind.__name__}.')
  if kind is tuple:  # a sequence; one value alone is a sequence of one
    return tuple(value) if isinstance(value, list | tuple) else (value,)
  if origin in (typing.Union, types.UnionType):  # the model's fields: a mapping or None
    if value is None:
      return None
    if not isinstance(value, Mapping):
      raise ValueError(f'config.{key}={value!r}; expected the model fields (a dict).')
    return ml_collections.FrozenConfigDict(value)
  return value


def _nested(key: str, kind: type, value: Any) -> Any:
  """A nested section (`pp`, `distill`, `fewshot`) from its dict; unknown keys rejected, the
  section's retired ones (`RETIRED`, of earlier versions' configs) dropped."""
  known = frozenset(f.name for f in dataclasses.fields(kind))
  if not isinstance(value, Mapping):
    raise ValueError(f'config.{key}={value!r}; expected a dict of {sorted(known)}.')
  retired = getattr(kind, 'RETIRED', frozenset())
  value = {name: v for name, v in value.items() if name not in retired}
  for name in value:
    if name not in known:
      raise _unknown(name, known, prefix=f'{key}.')
  hints = typing.get_type_hints(kind)
  fields = {k: _convert(f'{key}.{k}', v, hints[k]) for k, v in value.items()}
  return kind(**fields)


def _named_evals(value: Any) -> dict[str, evals_spec.Instance]:
  """`config.evals`: name -> {type, every, the type's settings} as Instances; one-line errors."""
  if not isinstance(value, Mapping):
    raise ValueError(
      f'config.evals={value!r}; expected evaluators by name: {{name: dict(type=...)}}.'
    )
  named = {}
  for name, entry in value.items():
    if not isinstance(entry, Mapping) or entry.get('type') not in evals_spec.TYPES:
      got = entry.get('type') if isinstance(entry, Mapping) else entry
      raise ValueError(
        f'config.evals.{name}: type={got!r}; expected one of {tuple(evals_spec.TYPES)}.'
      )
    if not name.isidentifier():
      raise ValueError(f'config.evals.{name}: a name of letters, digits and _ (it starts metrics).')
    settings = {k: v for k, v in entry.items() if k not in ('type', 'every')}
    every = _convert(f'evals.{name}.every', entry.get('every', 0), int)
    kind = evals_spec.TYPES[entry['type']]
    named[name] = evals_spec.Instance(
      entry['type'], every, _nested(f'evals.{name}', kind, settings)
    )
  return named


def _as_dict(config: ml_collections.ConfigDict | Mapping[str, Any]) -> dict[str, Any]:
  if isinstance(config, ml_collections.ConfigDict):
    return config.to_dict()
  return dict(config)


def from_config(config: ml_collections.ConfigDict | Mapping[str, Any]) -> RunSpec:
  """The RunSpec of `config`: defaults for missing keys, unknown keys and values rejected.

  Every error is one line that names the key (and the closest known key for a misspelling).
  """
  values = _as_dict(config)
  for key in values:
    if key not in CONFIG_KEYS:
      raise _unknown(key, CONFIG_KEYS)
  sections: dict[str, dict[str, Any]] = {f.name: {} for f in dataclasses.fields(RunSpec)}
  for key, value in values.items():
    section, field = SECTIONS[key]
    kind = _HINTS[section][field.name]
    if key == 'evals':
      converted = _named_evals(value)
    elif dataclasses.is_dataclass(kind):
      converted = _nested(key, kind, value)
    else:
      converted = _convert(key, value, kind)
    sections[section][field.name] = converted
  spec = RunSpec(**{f.name: f.type(**sections[f.name]) for f in dataclasses.fields(RunSpec)})
  check(spec)
  return spec


def _one_of(key: str, value: str, allowed: tuple[str, ...]) -> None:
  if value not in allowed:
    raise ValueError(f'config.{key}={value!r}; expected one of {allowed}.')


def check(spec: RunSpec) -> None:
  """The checks that need no data, device or file: one-line ValueErrors."""
  if spec.model.fields is None:
    raise ValueError('config.model is not set: use configs/vit.py:MODEL,DATASET or set the model.')
  if spec.model.dtype == 'float16':
    raise ValueError(
      "config.dtype='float16' is not supported: float16 training needs loss scaling, which this "
      "trainer does not do; use 'bfloat16' (the same speed, float32's range)."
    )
  _one_of('dtype', spec.model.dtype, DTYPES)
  _one_of('precision', spec.model.precision, PRECISIONS)
  _one_of('optim_dtype', spec.optim.optim_dtype, DTYPES)
  _one_of('loss', spec.step.loss, LOSSES)
  _one_of('decay_type', spec.optim.decay_type, optim.DECAY_TYPES)
  _one_of('optimizer', spec.optim.optimizer, optim.OPTIMIZERS)
  _one_of('step', spec.step.step, STEPS)
  rules = parallel.parse_rules(spec.step.sharding)
  if spec.step.step == 'shard_map' and any(rule != 'replicate' for _, rule in rules):
    raise ValueError(
      "config.step='shard_map' runs on replicated parameters; FSDP (config.sharding="
      f"{spec.step.sharding!r}) needs config.step='jit'."
    )
  axes = [name for name, _ in parallel.parse_mesh(spec.step.mesh)]
  if spec.step.step == 'shard_map' and axes != [parallel.DATA_AXIS]:
    raise ValueError(
      f"config.step='shard_map' runs on the 1-D mesh 'data:-1'; config.mesh="
      f"{spec.step.mesh!r} needs config.step='jit'."
    )
  data_spec.check(spec.data)
  for key in ('mixup', 'cutmix', 'label_smoothing'):
    if getattr(spec.step, key) < 0:
      raise ValueError(f'config.{key}={getattr(spec.step, key)}; expected >= 0 (0: off).')
  if spec.step.accum_steps < 1:
    raise ValueError(f'config.accum_steps={spec.step.accum_steps}; expected a positive integer.')
  if spec.loop.profile_steps < 0:
    raise ValueError(f'config.profile_steps={spec.loop.profile_steps}; expected >= 0.')
  if not 0.0 <= spec.step.polyak_decay < 1.0:
    raise ValueError(f'config.polyak_decay={spec.step.polyak_decay}; expected 0 <= decay < 1.')
  tasks.check(spec)
  evals_spec.check(spec.evals)


# ----------------------------------------------------------------------------------------
# Back to a config: the defaults, config.json, overrides.
# ----------------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
  if isinstance(value, evals_spec.Instance):
    return value.as_config()
  if dataclasses.is_dataclass(value):
    return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
  if isinstance(value, ml_collections.ConfigDict):
    return value.to_dict()
  if isinstance(value, Mapping):  # config.evals
    return {k: _plain(v) for k, v in value.items()}
  return value


def to_dict(spec: RunSpec) -> dict[str, Any]:
  """The flat config of `spec` (every key), as plain Python values: what config.json holds."""
  out = {}
  for key, (section, field) in SECTIONS.items():
    out[key] = _plain(getattr(getattr(spec, section), field.name))
  return out


def default_config() -> ml_collections.ConfigDict:
  """Every key at its default: the config that `configs/common.py` starts from."""
  return ml_collections.ConfigDict(to_dict(RunSpec()))


def with_overrides(
  config: ml_collections.ConfigDict, overrides: Mapping[str, Any]
) -> ml_collections.ConfigDict:
  """An unlocked copy of `config` with dotted keys ('pp.train') set; unknown keys rejected."""
  config = ml_collections.ConfigDict(config.to_dict())
  for key, value in overrides.items():
    *parents, leaf = key.split('.')
    node = config
    for parent in parents:
      node = node[parent]
    if leaf not in node:
      raise ValueError(f'The config has no key {key!r} to set.')
    node[leaf] = value
  return config
