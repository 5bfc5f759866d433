"""A run spec resolved against the world: the dataset, the devices, the pretrained file.

`prepare` is the one way from a config to a run: it resolves the config into the run spec
(spec.py, `from_config`), does every check that needs the data or the files, before any compute,
and fills in what the spec leaves to them (the number of classes, the steps of `total_epochs`,
the evaluators and their data, and the run's task, vit_jax/tasks: resolved here once, with what
it reads, such as a distillation teacher's checkpoint, and the optimizer the task trains with).
Errors are one-line ValueErrors. `Setup.spec` is the resolved spec: what the run uses and what
its config.json holds.
"""

import csv
import dataclasses
import difflib
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax

from vit_jax import data as data_lib
from vit_jax import families, files, optim, parallel, rundir, tasks
from vit_jax.evals import common as evals_common
from vit_jax.evals import registry as evals_registry
from vit_jax.families.preprocessing import Preprocessing
from vit_jax.train import spec as spec_lib

DOWNLOAD_ROOTS = {'augreg': 'gs://vit_models/augreg', 'default': 'gs://vit_models/imagenet21k'}


@dataclasses.dataclass(frozen=True)
class Setup:
  """What a run needs, resolved and checked: `spec.data.num_classes` and
  `spec.loop.total_steps` hold the resolved values."""

  spec: spec_lib.RunSpec
  source: data_lib.Source
  model: Any
  mesh: jax.sharding.Mesh
  pretrained_path: str | None
  # The run's task (vit_jax/tasks), built on `model`: the trainer's one view of it.
  task: tasks.common.Task
  # The optimizer (masked by the task: LiT's locked tower has no update and no state) and
  # its learning-rate schedule.
  tx: optax.GradientTransformation
  schedule: optax.Schedule
  # The evaluators the spec asks for, by name (vit_jax/evals/registry.py), their data checked.
  evaluators: Mapping[str, evals_common.Evaluator] = dataclasses.field(default_factory=dict)
  # How an image becomes the model's input (its family's spec at the run's crop or patches):
  # the training pipeline's (patch sequences: the model's patch) and the evaluators'.
  preprocessing: Preprocessing | None = None

  @property
  def num_classes(self) -> int:
    return self.spec.data.num_classes

  @property
  def total_steps(self) -> int:
    return self.spec.loop.total_steps


def _augreg_filename(pretrained_dir: str, model: str) -> str:
  """The i21k AugReg file of `model` with the best final upstream validation accuracy."""
  index = files.path(pretrained_dir) / 'index.csv'
  if not index.exists():
    raise ValueError(
      f'{index} not found: download it with `gsutil cp {DOWNLOAD_ROOTS["augreg"]}/index.csv '
      f'{pretrained_dir}/`, or give a full file name as configs/augreg.py:FILENAME.'
    )
  with index.open('r') as f:
    rows = [
      r for r in csv.DictReader(f) if r['filename'].split('-')[0] == model and r['ds'] == 'i21k'
    ]
  if not rows:
    raise ValueError(f'No i21k checkpoint of {model!r} in {index}.')
  return max(rows, key=lambda r: float(r['final_val']))['filename']


def _pretrained_candidate(init: spec_lib.Init, model_name: str) -> tuple[str, str] | None:
  """(path, download root) of the pretrained file the spec names, or None (from scratch)."""
  if init.pretrained_path:
    return init.pretrained_path, DOWNLOAD_ROOTS['default']
  if not init.pretrained_dir:
    return None
  name, root = model_name, DOWNLOAD_ROOTS['default']
  if init.model_or_filename:
    name, root = init.model_or_filename, DOWNLOAD_ROOTS['augreg']
    if '-' not in name:  # a model: its best i21k checkpoint by index.csv
      name = _augreg_filename(init.pretrained_dir, name)
  return files.join(init.pretrained_dir, f'{name}.npz'), root


def resolve_pretrained_path(spec: spec_lib.RunSpec) -> str | None:
  """The pretrained file to fine-tune from, or None to train from scratch.

  `pretrained_path` if set, else `{pretrained_dir}/{name}.npz` with `name` the model name,
  or the AugReg file given (or selected by index.csv) in `model_or_filename`. `FILE:img`
  names the image tower of an image-text file: FILE must exist.
  """
  from vit_jax.checkpoint.two_towers import split_tower

  candidate = _pretrained_candidate(spec.init, spec.model.name)
  if candidate is None:
    return None
  path, root = candidate
  if not files.path(split_tower(path)[0]).exists():
    if not files.is_local(path):
      raise ValueError(f'Pretrained checkpoint {path} not found: no such object in the bucket.')
    url = f'{root}/{os.path.basename(path)}'
    raise ValueError(
      f'Pretrained checkpoint {path} not found: download it with `gsutil cp {url} DIR/` and set '
      f"--config.pretrained_dir=DIR (or --config.pretrained_path=FILE; --config.pretrained_dir='' "
      'trains from scratch).'
    )
  return path


def _source(data: data_lib.Data) -> tuple[data_lib.Source, int]:
  """The dataset and the number of classes; its splits checked for examples."""
  source = data_lib.get_source(data.dataset, data.tfds_data_dir or None)
  if data.caption_templates:  # image-text pairs from the class names
    from vit_jax.data import captions  # here: the run spec's users need no TensorFlow

    source = captions.ClassCaptions(source, data.caption_templates)
  num_classes = data.num_classes or source.num_classes
  if num_classes < source.num_classes:
    raise ValueError(
      f'config.num_classes={num_classes} < the {source.num_classes} classes of {source.name}.'
    )
  pc, pi = jax.process_count(), jax.process_index()
  for split in (data.pp.train, data.pp.test):
    try:
      if source.num_examples(split, pi, pc) == 0:
        raise ValueError(f'split {split!r} of {source.name!r} is empty')
    except ValueError as e:
      raise ValueError(f'Dataset {source.name!r}, split {split!r}: {str(e).splitlines()[0]}') from e
  return source, num_classes


def _total_steps(spec: spec_lib.RunSpec, source: data_lib.Source) -> int:
  total_steps = spec.loop.total_steps
  if spec.loop.total_epochs:
    n_train = source.num_examples(spec.data.pp.train, 0, 1)
    total_steps = math.ceil(spec.loop.total_epochs * n_train / spec.data.batch)
  if total_steps <= 0:
    raise ValueError(
      'config.total_steps is not set: give --config.total_steps=N (or total_epochs).'
    )
  return total_steps


def build_model(model: spec_lib.Model, num_classes: int) -> Any:
  """The module of the spec's model fields, built by their family; a misspelt field names
  the closest one."""
  fields = model.constructor_fields()
  family = families.of_config(fields)
  try:
    return family.build(
      fields, num_classes=num_classes, dtype=jnp.dtype(model.dtype), precision=model.precision
    )
  except (TypeError, KeyError) as e:
    raise ValueError(f'Bad model config: {e}{_field_hint(fields, family.MODULE)}') from e


def _field_hint(fields: dict[str, Any], module: type) -> str:
  known = {f.name for f in dataclasses.fields(module)} - {'parent', 'name'}
  for key in fields:
    close = difflib.get_close_matches(key, known, n=1)
    if key not in known and close:
      return f' (model.{key}: did you mean model.{close[0]}?)'
  return ''


def _check_batches(spec: spec_lib.RunSpec, mesh: jax.sharding.Mesh) -> None:
  data = spec.data
  parallel.check_batch(data.batch, mesh, spec.step.accum_steps, 'batch')
  if data.data_shards:
    data_lib.check_data_shards(data.data_shards, data.batch, jax.process_count())
  parallel.check_batch(data.batch_eval, mesh, 1, 'batch_eval')


def prepare(
  config: spec_lib.RunSpec | ml_collections.ConfigDict | Mapping[str, Any],
  workdir: str,
  devices: Sequence[jax.Device] | None = None,
) -> Setup:
  """The run of `config` (an experiment config, or its RunSpec) in `workdir`: the spec
  resolved and checked against the data, batch split and files; one-line ValueErrors, no
  compute."""
  spec = config if isinstance(config, spec_lib.RunSpec) else spec_lib.from_config(config)
  resuming = rundir.latest_step(workdir) is not None
  pretrained_path = None if resuming else resolve_pretrained_path(spec)
  source, num_classes = _source(spec.data)
  total_steps = _total_steps(spec, source)
  mesh = parallel.create_mesh(devices, spec.step.mesh)
  _check_batches(spec, mesh)
  model = build_model(spec.model, num_classes)
  spec = dataclasses.replace(
    spec,
    data=dataclasses.replace(spec.data, num_classes=num_classes),
    loop=dataclasses.replace(spec.loop, total_steps=total_steps),
  )
  task = tasks.build(spec, model, pretrained_path, resuming)
  if task.tokenizer is not None:  # the task reads texts
    from vit_jax.data import captions  # here: the run spec's users need no TensorFlow

    captions.check_captioned(source)
  tx, schedule = optim.for_training(spec.optim, total_steps)
  pp = spec.data.pp
  images = families.run_preprocessing(spec.model.constructor_fields(), pp.crop, pp.max_patches)
  context = evals_common.Context(
    spec.evals, spec.data, model, mesh, source, task.tokenizer, preprocessing=images
  )
  evaluators = evals_registry.build(context, task.class_logits)
  return Setup(
    spec=spec,
    source=source,
    model=model,
    mesh=mesh,
    task=task,
    tx=task.optimizer(tx),  # LiT: no update, no state for a locked tower
    schedule=schedule,
    pretrained_path=pretrained_path,
    evaluators=evaluators,
    preprocessing=images,
  )
