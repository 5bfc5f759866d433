"""Training and evaluation on a device mesh: `train_and_evaluate(config, workdir)`.

A run is a directory:
  config.json              the resolved config
  metrics.jsonl            one JSON object per line with `step`: training lines (loss,
                           learning_rate, grad_norm, img_per_sec) and evaluation lines
                           (accuracy_test, accuracy_test_top5, loss_test, num_test)
  events.out.tfevents.*    the same scalars for TensorBoard
  checkpoints/<step>/      orbax: params, optimizer state, step, RNG, data position
  curves.png               loss and accuracy curves, written at the end

Running again with the same workdir resumes from the last complete checkpoint, and the
resumed run continues exactly as an uninterrupted one: the input stream is a function of
its position, dropout keys are a function of (seed, step, example), and metric lines past
the checkpoint are dropped. SIGTERM saves a checkpoint and returns; a non-finite loss
stops the run before any checkpoint of the bad state is written.
"""

import csv
import dataclasses
import difflib
import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging

from vit_jax import data as data_lib
from vit_jax import files, optim, parallel
from vit_jax.models import model_from_config

CHECKPOINT_DIR = 'checkpoints'
METRICS_FILE = 'metrics.jsonl'
CONFIG_FILE = 'config.json'
CURVES_FILE = 'curves.png'
DTYPES = ('float32', 'bfloat16', 'float16')
LOSSES = ('softmax_xent', 'sigmoid_xent')
# Top-level config keys train_and_evaluate reads (configs/common.py plus Adam's betas).
KNOWN_KEYS = frozenset(
  {
    *('seed', 'model_name', 'model', 'dtype', 'pretrained_dir', 'pretrained_path'),
    *('model_or_filename', 'dataset', 'tfds_data_dir', 'num_classes', 'pp', 'total_steps'),
    *('total_epochs', 'optimizer', 'momentum', 'b1', 'b2', 'weight_decay'),
    *('weight_decay_pattern', 'grad_norm_clip', 'optim_dtype', 'accum_steps', 'loss'),
    *('label_smoothing', 'batch', 'batch_eval', 'shuffle_buffer', 'prefetch', 'base_lr'),
    *('decay_type', 'warmup_steps', 'linear_end', 'sharding', 'eval_every', 'progress_every'),
    *('checkpoint_every', 'keep_checkpoints', 'data_shards'),
  }
)
PP_KEYS = frozenset({'train', 'test', 'crop', 'area_min', 'flip', 'subpixel'})
DOWNLOAD_ROOTS = {'augreg': 'gs://vit_models/augreg', 'default': 'gs://vit_models/imagenet21k'}


# ----------------------------------------------------------------------------------------
# Set-up: every check on the config, the data and the files, before any compute.
# ----------------------------------------------------------------------------------------


@dataclasses.dataclass
class Setup:
  """What a run needs, resolved and checked."""

  config: ml_collections.ConfigDict
  source: data_lib.Source
  model: Any
  num_classes: int
  total_steps: int
  mesh: jax.sharding.Mesh
  pp_train: data_lib.Preprocessing
  pp_eval: data_lib.Preprocessing
  pretrained_path: str | None


def _check_keys(config: ml_collections.ConfigDict) -> None:
  for key in config:
    if key not in KNOWN_KEYS:
      close = difflib.get_close_matches(key, KNOWN_KEYS, n=1)
      hint = f' Did you mean {close[0]!r}?' if close else ''
      raise ValueError(f'Unknown config key {key!r}.{hint}')
  for key in config.get('pp') or {}:
    if key not in PP_KEYS:
      raise ValueError(f'Unknown config key pp.{key!r}; known: {", ".join(sorted(PP_KEYS))}.')


def _augreg_filename(pretrained_dir: str, model: str) -> str:
  """The i21k AugReg file of `model` with the best final upstream validation accuracy."""
  index = os.path.join(pretrained_dir, 'index.csv')
  if not os.path.exists(index):
    raise ValueError(
      f'{index} not found: download it with `gsutil cp {DOWNLOAD_ROOTS["augreg"]}/index.csv '
      f'{pretrained_dir}/`, or give a full file name as configs/augreg.py:FILENAME.'
    )
  with open(index, newline='') as f:
    rows = [
      r for r in csv.DictReader(f) if r['filename'].split('-')[0] == model and r['ds'] == 'i21k'
    ]
  if not rows:
    raise ValueError(f'No i21k checkpoint of {model!r} in {index}.')
  return max(rows, key=lambda r: float(r['final_val']))['filename']


def resolve_pretrained_path(config: ml_collections.ConfigDict) -> str | None:
  """The pretrained file to fine-tune from, or None to train from scratch.

  `pretrained_path` if set, else `{pretrained_dir}/{name}.npz` with `name` the model name,
  or the AugReg file given (or selected by index.csv) in `model_or_filename`.
  """
  if config.get('pretrained_path'):
    path, root = config.pretrained_path, DOWNLOAD_ROOTS['default']
  elif config.get('pretrained_dir'):
    name, root = config.model_name, DOWNLOAD_ROOTS['default']
    if config.get('model_or_filename'):
      name, root = config.model_or_filename, DOWNLOAD_ROOTS['augreg']
      if '-' not in name:  # a model: its best i21k checkpoint by index.csv
        if config.pretrained_dir.startswith('gs://'):
          raise ValueError(
            f'AugReg model {name!r}: download {root}/index.csv and the file it selects into DIR '
            f'and set --config.pretrained_dir=DIR, or name the file: configs/augreg.py:FILENAME.'
          )
        name = _augreg_filename(config.pretrained_dir, name)
    path = os.path.join(config.pretrained_dir, f'{name}.npz')
  else:
    return None
  if path.startswith('gs://') or not os.path.exists(path):
    file = os.path.basename(path)
    url = path if path.startswith('gs://') else f'{root}/{file}'
    raise ValueError(
      f'Pretrained checkpoint {path} not found: download it with `gsutil cp {url} DIR/` and set '
      f"--config.pretrained_dir=DIR (or --config.pretrained_path=FILE; --config.pretrained_dir='' "
      'trains from scratch).'
    )
  return path


def _dtype(name: str, key: str) -> Any:
  if name not in DTYPES:
    raise ValueError(f'config.{key}={name!r}; expected one of {DTYPES}.')
  return jnp.dtype(name)


def prepare(
  config: ml_collections.ConfigDict,
  workdir: str,
  devices: Sequence[jax.Device] | None = None,
) -> Setup:
  """Checks the config, data, batch split and files; one-line ValueErrors, no compute."""
  _check_keys(config)
  if config.get('model') is None:
    raise ValueError('config.model is not set: use configs/vit.py:MODEL,DATASET or set the model.')
  _dtype(config.get('dtype', 'float32'), 'dtype')
  _dtype(config.get('optim_dtype', 'float32'), 'optim_dtype')
  if config.get('loss', 'softmax_xent') not in LOSSES:
    raise ValueError(f'config.loss={config.loss!r}; expected one of {LOSSES}.')
  if config.get('decay_type', 'cosine') not in optim.DECAY_TYPES:
    raise ValueError(
      f'config.decay_type={config.decay_type!r}; expected one of {optim.DECAY_TYPES}.'
    )
  if config.get('optimizer', 'sgd') not in optim.OPTIMIZERS:
    raise ValueError(f'config.optimizer={config.optimizer!r}; expected one of {optim.OPTIMIZERS}.')
  parallel.parse_rules(config.get('sharding', 'replicate'))
  resuming = _latest_step(workdir) is not None
  pretrained_path = None if resuming else resolve_pretrained_path(config)

  source = data_lib.get_source(config.dataset, config.get('tfds_data_dir') or None)
  num_classes = config.get('num_classes') or source.num_classes
  if num_classes < source.num_classes:
    raise ValueError(
      f'config.num_classes={num_classes} < the {source.num_classes} classes of {source.name}.'
    )
  pc, pi = jax.process_count(), jax.process_index()
  for split in (config.pp.train, config.pp.test):
    try:
      if source.num_examples(split, pi, pc) == 0:
        raise ValueError(f'split {split!r} of {source.name!r} is empty')
    except ValueError as e:
      raise ValueError(f'Dataset {source.name!r}, split {split!r}: {str(e).splitlines()[0]}') from e

  total_steps = int(config.get('total_steps') or 0)
  if config.get('total_epochs'):
    n_train = source.num_examples(config.pp.train, 0, 1)
    total_steps = math.ceil(config.total_epochs * n_train / config.batch)
  if total_steps <= 0:
    raise ValueError(
      'config.total_steps is not set: give --config.total_steps=N (or total_epochs).'
    )

  mesh = parallel.create_mesh(devices)
  parallel.check_batch(config.batch, mesh, config.get('accum_steps', 1), 'batch')
  if config.get('data_shards'):
    data_lib.check_data_shards(int(config.data_shards), config.batch, pc)
  parallel.check_batch(config.batch_eval, mesh, 1, 'batch_eval')

  model_config = config.model.to_dict()
  model_config.pop('model_name', None)
  try:
    model = model_from_config(
      model_config, num_classes=num_classes, dtype=_dtype(config.get('dtype', 'float32'), 'dtype')
    )
  except (TypeError, KeyError) as e:
    raise ValueError(f'Bad model config: {e}') from e

  crop = int(config.pp.crop)
  pp_train = data_lib.Preprocessing(
    crop=crop,
    area_min=float(config.pp.get('area_min', 0.05)),
    flip=bool(config.pp.get('flip', True)),
    subpixel=bool(config.pp.get('subpixel', False)),
  )
  return Setup(
    config=config,
    source=source,
    model=model,
    num_classes=num_classes,
    total_steps=total_steps,
    mesh=mesh,
    pp_train=pp_train,
    pp_eval=data_lib.Preprocessing(crop=crop),
    pretrained_path=pretrained_path,
  )


# ----------------------------------------------------------------------------------------
# The compiled functions.
# ----------------------------------------------------------------------------------------


def _uses_dropout(model) -> bool:
  t = getattr(model, 'transformer', None) or {}  # MLP-Mixer has neither dropout nor transformer
  return bool(t.get('dropout_rate', 0.0) or t.get('attention_dropout_rate', 0.0))


def make_loss_fn(model, config: ml_collections.ConfigDict, num_classes: int):
  """loss(params, images, labels, example_ids, rng) -> mean loss over the examples.

  With dropout, each example gets its own key fold_in(rng, global example id), so the
  masks do not depend on how the batch is split over devices or micro-batches.
  """
  loss_name = config.get('loss', 'softmax_xent')
  smoothing = config.get('label_smoothing', 0.0)
  dropout = _uses_dropout(model)

  def forward(params, images, ids, rng):
    variables = {'params': params}
    if not dropout:
      return model.apply(variables, images, train=True)

    def one(image, i):
      key = jax.random.fold_in(rng, i)
      return model.apply(variables, image[None], train=True, rngs={'dropout': key})[0]

    return jax.vmap(one)(images, ids)

  def loss_fn(params, images, labels, ids, rng):
    logits = forward(params, images, ids, rng)
    targets = jax.nn.one_hot(labels, num_classes)
    if loss_name == 'sigmoid_xent':
      return optax.sigmoid_binary_cross_entropy(logits, targets).sum(-1).mean()
    if smoothing:
      targets = optax.smooth_labels(targets, smoothing)
    return optax.softmax_cross_entropy(logits, targets).mean()

  return loss_fn


def make_train_step(model, tx, schedule, config, num_classes: int, batch_size: int):
  """The step on one global batch: gradient (accumulated), optimizer update, metrics."""
  loss_fn = make_loss_fn(model, config, num_classes)
  accum_steps = max(1, config.get('accum_steps', 1))

  def train_step(state, batch):
    step = state['step']
    rng = jax.random.fold_in(jax.random.wrap_key_data(state['rng']), step)
    ids = step.astype(jnp.int32) * batch_size + jnp.arange(batch_size, dtype=jnp.int32)

    def loss_and_grad(params, images, labels, ids):
      return jax.value_and_grad(loss_fn)(params, images, labels, ids, rng)

    loss, grads = optim.accumulate_gradient(
      loss_and_grad, state['params'], (batch['image'], batch['label'], ids), accum_steps
    )
    updates, opt_state = tx.update(grads, state['opt_state'], state['params'])
    params = optax.apply_updates(state['params'], updates)
    new_state = {'params': params, 'opt_state': opt_state, 'step': step + 1, 'rng': state['rng']}
    metrics = {
      'loss': loss,
      'grad_norm': optax.tree.norm(grads),
      'learning_rate': schedule(step + 1),
      'params_finite': jnp.all(jnp.stack([jnp.isfinite(x).all() for x in jax.tree.leaves(params)])),
    }
    return new_state, metrics

  return train_step


def make_eval_step(model, num_classes: int):
  """Masked sums over one batch: top-1 and top-5 hits, loss, and the number of real examples."""
  k = min(5, num_classes)

  def eval_step(params, batch):
    logits = model.apply({'params': params}, batch['image'], train=False)
    labels, mask = batch['label'], batch['mask']
    top1 = jnp.argmax(logits, -1) == labels
    topk = jnp.any(jax.lax.top_k(logits, k)[1] == labels[:, None], axis=-1)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    return {
      'correct': jnp.sum(top1 * mask),
      'correct_top5': jnp.sum(topk * mask),
      'loss': jnp.sum(jnp.where(mask > 0, loss, 0.0)),
      'count': jnp.sum(mask),
    }

  return eval_step


# ----------------------------------------------------------------------------------------
# Checkpoints, metrics, progress, preemption.
# ----------------------------------------------------------------------------------------


def _checkpoint_dir(workdir: str) -> str:
  return os.path.join(os.path.abspath(workdir), CHECKPOINT_DIR)


def _latest_step(workdir: str) -> int | None:
  """The last complete (committed) checkpoint step, without creating anything."""
  directory = _checkpoint_dir(workdir)
  if not os.path.isdir(directory):
    return None
  steps = [
    int(d)
    for d in os.listdir(directory)
    if d.isdigit() and os.path.exists(os.path.join(directory, d, '_CHECKPOINT_METADATA'))
  ]
  return max(steps) if steps else None


def checkpoint_manager(workdir: str, keep: int):
  """orbax CheckpointManager under WORKDIR/checkpoints: async saves, the last `keep` kept."""
  import orbax.checkpoint as ocp

  options = ocp.CheckpointManagerOptions(
    max_to_keep=max(1, keep),
    create=True,
    enable_async_checkpointing=True,
    cleanup_tmp_directories=True,
  )
  return ocp.CheckpointManager(
    _checkpoint_dir(workdir), options=options, item_names=('state', 'meta')
  )


def _save(manager, state, step: int, meta: dict) -> None:
  import orbax.checkpoint as ocp

  args = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))
  manager.save(step, args=args, force=True)


def _restore(manager, step: int, abstract_state):
  import orbax.checkpoint as ocp

  args = ocp.args.Composite(
    state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()
  )
  restored = manager.restore(step, args=args)
  return restored['state'], restored['meta']


def read_metrics(workdir: str) -> list[dict]:
  """The metric lines of a run (metrics.jsonl), in order."""
  path = os.path.join(workdir, METRICS_FILE)
  if not os.path.exists(path):
    return []
  metrics = []
  with open(path) as f:
    for line in f:
      try:
        metrics.append(json.loads(line))
      except json.JSONDecodeError:  # a line cut short by a kill: written again on resume
        continue
  return metrics


class MetricWriter:
  """metrics.jsonl (flushed line by line) and TensorBoard events, on the first host only."""

  def __init__(self, workdir: str, resume_step: int | None):
    self.enabled = jax.process_index() == 0
    self.path = os.path.join(workdir, METRICS_FILE)
    self.tb = None
    if not self.enabled:
      return
    if resume_step is not None:  # lines past the checkpoint will be written again
      kept = [m for m in read_metrics(workdir) if m['step'] <= resume_step]
      files.atomic_write_text(self.path, ''.join(json.dumps(m) + '\n' for m in kept))
    elif os.path.exists(self.path):
      os.remove(self.path)
    self.file = open(self.path, 'a')  # noqa: SIM115  (kept open for the run)
    try:
      from clu import metric_writers

      self.tb = metric_writers.SummaryWriter(workdir)
    except Exception as e:  # TensorBoard is optional for a run
      logging.warning('No TensorBoard events: %s', e)

  def write(self, step: int, scalars: dict[str, float]) -> None:
    if not self.enabled:
      return
    scalars = {k: v for k, v in scalars.items() if v is not None}
    self.file.write(json.dumps({'step': int(step), **scalars}) + '\n')
    self.file.flush()
    if self.tb is not None:
      self.tb.write_scalars(int(step), scalars)

  def close(self) -> None:
    if self.enabled:
      self.file.close()
      if self.tb is not None:
        self.tb.flush()
        self.tb.close()


def _format_time(seconds: float) -> str:
  seconds = int(max(0, seconds))
  h, rest = divmod(seconds, 3600)
  return f'{h}h{rest // 60:02d}m' if h else f'{rest // 60}m{rest % 60:02d}s'


class Progress:
  """A progress line: step, loss, img/s and ETA (redrawn in place on a terminal)."""

  def __init__(self, total_steps: int, start_step: int, batch: int, stream=None):
    self.total, self.batch = total_steps, batch
    self.stream = stream or sys.stdout
    self.tty = self.enabled = jax.process_index() == 0
    self.tty = self.enabled and self.stream.isatty()
    self.last_step, self.last_time = start_step, time.monotonic()
    self.paused = 0.0
    self.rate: float | None = None

  def restart(self, step: int) -> None:
    """Counts img/s from `step` on, as of now (after the first step has compiled)."""
    self.last_step, self.last_time, self.paused = step, time.monotonic(), 0.0

  def pause(self, seconds: float) -> None:
    """Time spent outside training (evaluation, checkpoints) is left out of img/s."""
    self.paused += seconds

  def update(self, step: int, loss: float) -> float | None:
    """Shows the line; returns img/s since the last update (None right after compilation)."""
    now = time.monotonic()
    img_per_sec = None
    if step > self.last_step:
      elapsed = max(1e-9, now - self.last_time - self.paused)
      img_per_sec = (step - self.last_step) * self.batch / elapsed
      self.last_step, self.last_time, self.paused = step, now, 0.0
      self.rate = img_per_sec
    rate = self.rate
    if self.enabled:
      frac = step / self.total
      bar = '#' * int(20 * frac) + '.' * (20 - int(20 * frac))
      speed = f'{rate:.0f} img/s' if rate else '- img/s'
      eta = _format_time((self.total - step) * self.batch / rate) if rate else '-'
      line = f'[{bar}] step {step}/{self.total} | loss {loss:.4f} | {speed} | ETA {eta}'
      self.stream.write(('\r' + line) if self.tty else line + '\n')
      self.stream.flush()
    return img_per_sec

  def message(self, text: str) -> None:
    if self.enabled:
      self.stream.write(('\n' if self.tty else '') + text + '\n')
      self.stream.flush()


class _Preemption:
  """Turns SIGTERM into a flag the loop checks after each step (main thread only)."""

  def __init__(self):
    self.requested = False
    self._previous = None

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._handle)
    return self

  def _handle(self, signum, frame):
    del signum, frame
    self.requested = True

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)


def plot_curves(workdir: str) -> str | None:
  """curves.png: training loss and test accuracy against the step (from metrics.jsonl)."""
  metrics = read_metrics(workdir)
  if not metrics or jax.process_index() != 0:
    return None
  import matplotlib

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt

  train = [(m['step'], m['loss']) for m in metrics if 'loss' in m]
  test = [(m['step'], m['accuracy_test']) for m in metrics if 'accuracy_test' in m]
  fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
  if train:
    ax_loss.plot(*zip(*train, strict=True), lw=1)
  ax_loss.set(xlabel='step', ylabel='training loss', yscale='log', title='Training loss')
  if test:
    ax_acc.plot(*zip(*test, strict=True), marker='o', ms=3)
    ax_acc.set_title(f'Test accuracy (final {test[-1][1]:.2%})')
  ax_acc.set(xlabel='step', ylabel='top-1 accuracy')
  ax_acc.grid(alpha=0.3)
  fig.tight_layout()
  path = os.path.join(workdir, CURVES_FILE)
  files.atomic_write(path, lambda f: fig.savefig(f, format='png', dpi=100))
  plt.close(fig)
  return path


# ----------------------------------------------------------------------------------------
# The run.
# ----------------------------------------------------------------------------------------


def _init_state(setup: Setup, tx, shardings, abstract, init_rng, dropout_rng):
  """Fresh train state on the mesh: scratch init, or a pretrained file merged into it."""
  model, crop = setup.model, setup.pp_train.crop
  dummy = jnp.zeros((1, crop, crop, 3), jnp.float32)

  def init(rng):
    return model.init(rng, dummy, train=False)['params']

  if setup.pretrained_path is None:

    def init_both(rng):
      params = init(rng)
      return params, tx.init(params)

    params, opt_state = jax.jit(
      init_both, out_shardings=(shardings['params'], shardings['opt_state'])
    )(init_rng)
  else:
    from vit_jax.checkpoint import load_pretrained

    host_params = jax.device_get(jax.jit(init)(init_rng))
    loaded = load_pretrained(
      setup.pretrained_path, host_params, setup.config.model, keep_head=False
    )
    loaded = jax.tree.map(lambda x, a: np.asarray(x, dtype=a.dtype), loaded, abstract['params'])
    params = jax.tree.map(
      lambda x, s: jax.make_array_from_callback(x.shape, s, lambda idx, x=x: x[idx]),
      loaded,
      shardings['params'],
    )
    opt_state = jax.jit(tx.init, out_shardings=shardings['opt_state'])(params)
  replicated = shardings['step']
  return {
    'params': params,
    'opt_state': opt_state,
    'step': jax.device_put(jnp.zeros((), jnp.int32), replicated),
    'rng': jax.device_put(jax.random.key_data(dropout_rng), replicated),
  }


def evaluate(eval_step, params, setup: Setup, batch_sharding) -> dict[str, float]:
  """One exact pass over the test split: every example counted once (padding is masked)."""
  config = setup.config
  ds = data_lib.eval_dataset(
    setup.source,
    config.pp.test,
    local_batch=parallel.local_batch_size(config.batch_eval),
    pp=setup.pp_eval,
    process_index=jax.process_index(),
    process_count=jax.process_count(),
    prefetch=config.get('prefetch', 2),
  )
  totals = None
  for local in ds.as_numpy_iterator():
    sums = eval_step(params, parallel.global_batch(local, batch_sharding))
    totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
  totals = jax.device_get(totals)
  count = int(totals['count'])
  return {
    'accuracy_test': float(totals['correct']) / count,
    'accuracy_test_top5': float(totals['correct_top5']) / count,
    'loss_test': float(totals['loss']) / count,
    'num_test': count,
  }


def _write_config(workdir: str, config: ml_collections.ConfigDict, setup: Setup) -> None:
  if jax.process_index() != 0:
    return
  resolved = json.loads(config.to_json_best_effort())
  resolved['_resolved'] = {
    'total_steps': setup.total_steps,
    'num_classes': setup.num_classes,
    'devices': setup.mesh.size,
    'processes': jax.process_count(),
    'pretrained_path': setup.pretrained_path,
  }
  text = json.dumps(resolved, indent=2, sort_keys=True)
  files.atomic_write_text(os.path.join(workdir, CONFIG_FILE), text)


def data_shards_for(config: ml_collections.ConfigDict, meta: dict) -> tuple[int, str | None]:
  """How many shards the training stream has, and a note when a resumed stream changes.

  config.data_shards if set; else the checkpoint's, so a run resumed on another number of
  processes continues the same stream (if they divide it); else one shard per process.
  """
  processes = jax.process_count()
  saved = int(meta.get('data_shards') or 0)
  shards = int(config.get('data_shards') or 0)
  if not shards:
    shards = saved if saved and saved % processes == 0 else processes
  data_lib.check_data_shards(shards, config.batch, processes)
  note = None
  if saved and saved != shards:
    note = (
      f'The checkpoint read its training data as {saved} shards, this run reads {shards} '
      f'({processes} processes): the example order differs from here on. Set '
      f'--config.data_shards={saved} with a process count that divides it to continue it exactly.'
    )
  return shards, note


def train_and_evaluate(
  config: ml_collections.ConfigDict,
  workdir: str,
  devices: Sequence[jax.Device] | None = None,
  stop_after: int | None = None,
) -> dict[str, Any]:
  """Trains and evaluates as `config` says, in `workdir`; resumes from its last checkpoint.

  Args:
    config: an experiment config (configs/*.py).
    workdir: the run directory.
    devices: the devices of the mesh (default: all).
    stop_after: return after this step (saving a checkpoint), as if preempted; for tests.

  Returns:
    {'step': last step, 'status': 'done' | 'preempted', 'params' and 'opt_state' (final,
    on the mesh), and the last evaluation's metrics}.
  """
  setup = prepare(config, workdir, devices)
  os.makedirs(workdir, exist_ok=True)
  model, mesh, total_steps = setup.model, setup.mesh, setup.total_steps

  schedule = optim.create_learning_rate_schedule(
    total_steps,
    config.base_lr,
    config.get('decay_type', 'cosine'),
    config.get('warmup_steps', 0),
    config.get('linear_end', 1e-5),
  )
  # The first update uses lr(1), not lr(0) (which is 0 with warmup).
  tx = optim.make_optimizer(config, lambda count: schedule(count + 1))

  root = jax.random.key(config.get('seed', 0))
  init_rng, dropout_rng = jax.random.split(root)
  crop = setup.pp_train.crop
  abstract_params = jax.eval_shape(
    lambda r: model.init(r, jnp.zeros((1, crop, crop, 3)), train=False)['params'], init_rng
  )
  abstract = {
    'params': abstract_params,
    'opt_state': jax.eval_shape(tx.init, abstract_params),
    'step': jax.ShapeDtypeStruct((), jnp.int32),
    'rng': jax.ShapeDtypeStruct((2,), jnp.uint32),
  }
  rules = config.get('sharding', 'replicate')
  shardings = {
    'params': parallel.tree_shardings(abstract['params'], mesh, rules),
    'opt_state': parallel.tree_shardings(abstract['opt_state'], mesh, rules),
    'step': parallel.replicated(mesh),
    'rng': parallel.replicated(mesh),
  }
  abstract_sharded = jax.tree.map(
    lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings
  )

  manager = checkpoint_manager(workdir, config.get('keep_checkpoints', 3))
  latest = manager.latest_step()
  progress = Progress(total_steps, latest or 0, config.batch)
  if latest is not None:
    try:
      state, meta = _restore(manager, latest, abstract_sharded)
    except Exception as e:  # orbax raises many kinds on a structure or shape mismatch
      manager.close()
      reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
      raise ValueError(
        f'Cannot resume from {_checkpoint_dir(workdir)}/{latest} ({reason}): the checkpoint does '
        'not fit this config (model, optimizer or dtype changed?); use a new --workdir.'
      ) from e
    progress.message(f'Resumed from checkpoint at step {latest} ({_checkpoint_dir(workdir)}).')
  else:
    state = _init_state(setup, tx, shardings, abstract, init_rng, dropout_rng)
    meta = {'step': 0, 'data_position': 0}
    if setup.pretrained_path:
      progress.message(f'Fine-tuning from {setup.pretrained_path}.')
  start = int(meta['step'])
  data_shards, note = data_shards_for(config, meta)
  if note:
    progress.message(note)
  if int(meta.get('global_batch', config.batch)) != config.batch:
    manager.close()
    raise ValueError(
      f'The checkpoint was written with batch {meta["global_batch"]}, the config says '
      f'{config.batch}: resume with --config.batch={meta["global_batch"]}.'
    )

  _write_config(workdir, config, setup)

  batch_sharding = parallel.batch_sharding(mesh)
  train_step = jax.jit(
    make_train_step(model, tx, schedule, config, setup.num_classes, config.batch),
    in_shardings=(shardings, batch_sharding),
    out_shardings=(shardings, parallel.replicated(mesh)),
    donate_argnums=(0,),
  )
  eval_step = jax.jit(
    make_eval_step(model, setup.num_classes),
    in_shardings=(shardings['params'], batch_sharding),
    out_shardings=parallel.replicated(mesh),
  )

  writer = MetricWriter(workdir, latest)
  train_ds = data_lib.host_train_dataset(
    setup.source,
    config.pp.train,
    global_batch=config.batch,
    data_shards=data_shards,
    pp=setup.pp_train,
    seed=config.get('seed', 0),
    step=start,
    shuffle_buffer=config.get('shuffle_buffer', 50_000),
    process_index=jax.process_index(),
    process_count=jax.process_count(),
    prefetch=config.get('prefetch', 2),
  )
  train_iter = train_ds.as_numpy_iterator()

  progress_every = config.get('progress_every', 10) or total_steps
  eval_every = config.get('eval_every', 0) or total_steps
  checkpoint_every = config.get('checkpoint_every', 0) or total_steps
  pending: list[tuple[int, dict]] = []  # step metrics not yet checked on the host
  last_saved = latest
  result: dict[str, Any] = {'status': 'done'}

  def check_finite():
    """Fetches pending metrics; stops the run on a non-finite loss or gradient."""
    fetched = jax.device_get([m for _, m in pending])
    for (step, _), m in zip(pending, fetched, strict=True):
      if not (np.isfinite(m['loss']) and np.isfinite(m['grad_norm']) and m['params_finite']):
        manager.wait_until_finished()
        kept = f'step {last_saved}' if last_saved is not None else 'none yet'
        raise FloatingPointError(
          f'Non-finite loss ({float(m["loss"])}), gradient or parameters at step {step}: run '
          'stopped. '
          f'Last good checkpoint ({kept}) in {_checkpoint_dir(workdir)} is untouched; lower '
          '--config.base_lr (or check the data) and rerun to resume from it.'
        )
    pending.clear()
    return fetched[-1] if fetched else None

  def save(step):
    nonlocal last_saved
    t0 = time.monotonic()
    check_finite()
    meta = {
      'step': step,
      'data_position': step * config.batch,
      'global_batch': config.batch,
      'data_shards': data_shards,
    }
    _save(manager, state, step, meta)
    last_saved = step
    progress.pause(time.monotonic() - t0)

  if start >= total_steps:
    evals = [m for m in read_metrics(workdir) if 'accuracy_test' in m]
    result.update({k: v for k, v in (evals[-1] if evals else {}).items() if k != 'step'})
    progress.message(f'Already trained for {total_steps} steps.')
  step = start
  with _Preemption() as preemption:
    try:
      for step in range(start + 1, total_steps + 1):
        local = next(train_iter)
        state, metrics = train_step(state, parallel.global_batch(local, batch_sharding))
        pending.append((step, metrics))
        if step == start + 1:  # leave compilation out of img/s
          jax.block_until_ready(metrics)
          progress.restart(step)

        if step % progress_every == 0 or step == total_steps:
          last = check_finite()
          loss = float(last['loss'])
          img_per_sec = progress.update(step, loss)
          writer.write(
            step,
            {
              'loss': loss,
              'learning_rate': float(last['learning_rate']),
              'grad_norm': float(last['grad_norm']),
              'img_per_sec': img_per_sec,
            },
          )
        if step % eval_every == 0 or step == total_steps:
          t0 = time.monotonic()
          check_finite()
          result.update(evaluate(eval_step, state['params'], setup, batch_sharding))
          writer.write(
            step,
            {
              k: result[k] for k in ('accuracy_test', 'accuracy_test_top5', 'loss_test', 'num_test')
            },
          )
          progress.message(
            f'step {step}: accuracy_test {result["accuracy_test"]:.4f} '
            f'(top-5 {result["accuracy_test_top5"]:.4f}, {result["num_test"]} examples)'
          )
          progress.pause(time.monotonic() - t0)
        if step % checkpoint_every == 0 or step == total_steps:
          save(step)
        if preemption.requested or (stop_after is not None and step >= stop_after):
          if last_saved != step:
            save(step)
          result['status'] = 'preempted'
          progress.message(f'Stopping at step {step}: checkpoint saved, rerun to resume.')
          break
      else:
        if start < total_steps:
          progress.message(f'Done: {total_steps} steps.')
    finally:
      manager.wait_until_finished()
      manager.close()
      writer.close()
  if result['status'] == 'done':
    plot_curves(workdir)
  result['step'] = step
  result['params'] = state['params']
  result['opt_state'] = state['opt_state']
  return result
