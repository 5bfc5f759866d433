"""The task interface: what the trainer asks of the kind of training a run does.

A task (vit_jax/tasks/__init__.py lists them) is resolved from the run spec once, in
vit_jax/train/setup.py (`tasks.build`), and the trainer then calls it
without asking which one it is:

  check           its config checks that need no data, device or file (`spec.check`)
  build           the task of a resolved run: its files checked, or read (a teacher)
  batch_keys      the batch's arrays the step reads (those of them the batch holds)
  tokenizer       the tokenizer of the batch's texts, or None (the pipeline makes no texts)
  class_logits    the model gives class logits: the test split's pass (and ReaL) run
  init_fn         rng -> the model's initial parameters (on its family's inputs)
  pretrained      the pretrained file fitted to those parameters
  optimizer       the run's optimizer, masked where the task trains less (LiT's lock)
  inputs          the step's inputs beside the state and the batch, on the mesh (a teacher's
                  parameters): constant, never trained nor checkpointed
  loss_and_grad   (loss, gradient, metrics) of a batch: the global one under `jax.jit`, this
                  device's rows inside `jax.shard_map`
  reduce          inside `jax.shard_map`, the per-device results made the global batch's

A task's methods take the run spec (vit_jax/train/spec.py:RunSpec) as `spec`; its config
section is defined in its module (`Distill`, `Contrastive`), and `spec.py` holds it.
"""

import abc
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import optax

from vit_jax import families

Batch = dict[str, jax.Array]
Metrics = dict[str, jax.Array]


def one_of(key: str, value: str, allowed: tuple[str, ...]) -> None:
  if value not in allowed:
    raise ValueError(f'config.{key}={value!r}; expected one of {allowed}.')


def check_image_inputs(spec: Any) -> None:
  """`config.pp.max_patches` asks for patch sequences (`pp.pack_tokens`, several a row): of a
  model that takes them (its family says), whose patch they take; every other model takes
  `crop` x `crop` images."""
  fields, pp = spec.model.fields, spec.data.pp
  if pp.max_patches and not families.takes_patch_sequences(fields):
    raise ValueError(
      f'config.pp.max_patches={pp.max_patches}: patch sequences, but this model takes'
      ' config.pp.crop x config.pp.crop images: set it to 0.'
    )
  if pp.pack_tokens and not families.takes_patch_sequences(fields):
    raise ValueError(
      f'config.pp.pack_tokens={pp.pack_tokens} packs patch sequences, and this model takes'
      ' config.pp.crop x config.pp.crop images: set it to 0.'
    )
  if pp.pack_tokens and spec.step.distill.enabled:
    raise ValueError(
      f"config.pp.pack_tokens={pp.pack_tokens}: packed rows have no teacher's pixel images:"
      ' set it to 0 to distil.'
    )


class Task(abc.ABC):
  """One kind of training on the run's model (`model`, the flax module) and spec (`spec`)."""

  # 'slots' where the batch holds it (packed NaFlex rows): a key the batch lacks is not passed.
  batch_keys: ClassVar[tuple[str, ...]] = ('image', 'label', 'slots')
  class_logits: ClassVar[bool] = True
  # The tokenizer of the batch's texts (the input pipeline's), for a task that reads them.
  tokenizer: Any = None

  def __init__(self, spec: Any, model: Any):
    self.spec = spec
    self.model = model
    self.family = families.of_module(model)

  @classmethod
  def check(cls, spec: Any) -> None:
    """The task's config checks that need no data, device or file: one-line ValueErrors."""
    del spec  # none beyond the run spec's own

  @classmethod
  def build(
    cls, spec: Any, model: Any, pretrained_path: str | None = None, resuming: bool = False
  ) -> 'Task':
    """The task of the resolved run `spec` (whose pretrained file is `pretrained_path`, or
    which resumes from its run directory); one-line ValueErrors, no compute."""
    del pretrained_path, resuming
    return cls(spec, model)

  def init_fn(self) -> Callable[[jax.Array], Any]:
    """rng -> the model's initial parameters, initialised on the family's inputs at the
    run's crop (and text length)."""
    crop, max_len = self.spec.data.pp.crop, self.spec.data.pp.max_len or None
    return lambda rng: families.init_params(self.model, rng, crop, max_len)

  def has_pretrained(self, path: str | None) -> bool:
    """Whether the run starts from files (`pretrained` is called): a pretrained file `path`."""
    return path is not None

  @abc.abstractmethod
  def pretrained(self, path: str | None, host_params: Any) -> Any:
    """`host_params` (numpy) with the file at `path` fitted in (checkpoint surgery); `path`
    is None only where `has_pretrained` says a task's own files start the run."""

  def optimizer(self, tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """The optimizer of the parameters the task trains: `tx`."""
    return tx

  def inputs(self, mesh: jax.sharding.Mesh) -> tuple[Any, ...]:
    """The step's inputs beside the state and the batch, placed on `mesh`: none."""
    del mesh
    return ()

  def resolved(self) -> dict[str, Any]:
    """What the task read beside the spec, for config.json's `_resolved`: nothing."""
    return {}

  def describe(self) -> str:
    """A line for the start of the run, or ''."""
    return ''

  @abc.abstractmethod
  def loss_and_grad(
    self, params: Any, batch: Batch, rng: jax.Array, first_id: jax.Array, inputs: tuple,
    axis: str | None = None,
  ) -> tuple[jax.Array, Any, Metrics]:  # fmt: skip
    """(loss, gradient, metrics) of `batch` at `params`: its first example has the global id
    `first_id`, `rng` is the step's key, `inputs` those of `inputs`; `axis`: the mesh axis the
    results vary over, inside `jax.shard_map`."""

  @abc.abstractmethod
  def reduce(
    self, loss: jax.Array, grads: Any, metrics: Metrics, axis: str
  ) -> tuple[jax.Array, Any, Metrics]:
    """Inside `jax.shard_map`: this device's (loss, gradient, metrics) made the global
    batch's, replicated over `axis`."""
