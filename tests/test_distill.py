"""Distillation in the trainer (DeiT): the step's loss against vit_jax.tasks.distillation_losses
on logits computed here, no gradient to the teacher, exact resume, and one-line errors for a
teacher that does not fit. jit == shard_map with a teacher is in test_steps.py."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import tensorflow as tf
from conftest import TEACHER, TINY, randomize, train_error, write_teacher

from configs import digits as digits_config
from vit_jax import checkpoint, families, optim, parallel, rundir, train
from vit_jax.models import model_from_config
from vit_jax.tasks import distillation
from vit_jax.tasks import distillation_losses as losses
from vit_jax.train import setup, spec, steps
from vit_jax.train.spec import with_overrides


def distill_config(teacher_path: str, distilled: bool = True, **overrides):
  """The tiny digits config (conftest.TINY), a DeiT student (class and distillation token)
  unless `distilled=False`, distilled from `teacher_path`; '__' in names for '.'."""
  config = digits_config.get_config().to_dict()
  if distilled:
    config['model'].update(classifier='token', distilled=True)
  dotted = {**TINY, 'distill.teacher_checkpoint': teacher_path}
  dotted.update({k.replace('__', '.'): v for k, v in overrides.items()})
  return with_overrides(ml_collections.ConfigDict(config), dotted)


def _images(n=32, seed=0):
  rng = np.random.default_rng(seed)
  return rng.uniform(-1, 1, (n, 8, 8, 3)).astype(np.float32), rng.integers(0, 10, n)


def _student(run):
  model = setup.build_model(run.model, num_classes=10)
  return model, randomize(families.param_shapes(model, 8), seed=1)


def _oracle(run, model, params, teacher_params, images, labels):
  """The mean distillation loss of `distillation_losses` on logits computed here: the student's
  heads, and the teacher's on the images resized to 16 px by TensorFlow."""
  distilled = bool(run.model.fields.get('distilled'))
  apply = jax.jit(model.apply, static_argnames=('train', 'both_heads'))
  student = apply({'params': params}, images, train=True, both_heads=distilled)
  cls, dist = student if distilled else (student, student)
  assert np.abs(np.asarray(cls) - np.asarray(dist)).max() > (0.1 if distilled else -1)
  big = tf.image.resize(images, (16, 16), 'bilinear').numpy()
  teacher = jax.jit(model_from_config(TEACHER, num_classes=10).apply, static_argnames='train')
  teacher_logits = np.asarray(teacher({'params': teacher_params}, big, train=False))
  assert len(set(np.argmax(teacher_logits, -1))) > 1  # the hard targets vary
  smoothing = run.step.label_smoothing
  targets = jax.nn.one_hot(labels, 10) * (1 - smoothing) + smoothing / 10
  d = run.step.distill
  if d.kind == 'hard':
    want = losses.hard_distillation_loss(cls, dist, targets, teacher_logits, alpha=d.alpha)
  else:
    want = losses.soft_distillation_loss(
      cls, dist, targets, teacher_logits, temperature=d.temperature, weight=d.alpha
    )
  return float(np.mean(want))


@pytest.mark.slow
@pytest.mark.parametrize(
  ('kind', 'distilled', 'extra'),
  [
    ('hard', True, {}),
    ('soft', True, {'distill.temperature': 3.0, 'distill.alpha': 0.1, 'label_smoothing': 0.1}),
    ('hard', False, {'distill.alpha': 0.3}),  # one head takes both terms
  ],
)
def test_the_step_loss_is_the_losses_module_on_both_models_logits(tmp_path, kind, distilled, extra):
  path = write_teacher(tmp_path / 'teacher.npz')
  overrides = {'num_classes': 10, 'distill.kind': kind, **extra}  # as setup resolves it
  run = spec.from_config(distill_config(path, distilled, **overrides))
  model, params = _student(run)
  task = distillation.Task.build(run, model)
  assert task.teacher.resolution == (16, 16)
  loss_fn = jax.jit(task.loss)
  images, labels = _images()
  got = loss_fn(params, images, labels, jnp.arange(32), jax.random.key(0), task.teacher_params)
  want = _oracle(run, model, params, task.teacher_params, images, labels)
  np.testing.assert_allclose(got, want, rtol=2e-6)


@pytest.mark.slow
def test_the_teacher_gets_no_gradient_and_stays_as_loaded(tmp_path):
  """The gradient reaches the student only; the compiled step (8 devices, 2 micro-batches)
  reports the same loss, leaves the teacher's arrays as loaded and keeps it out of the state."""
  path = write_teacher(tmp_path / 'teacher.npz')
  config = distill_config(path, num_classes=10, **{'distill.kind': 'soft', 'distill.alpha': 0.9})
  run = spec.from_config(with_overrides(config, {'accum_steps': 2}))
  model, params = _student(run)
  task = distillation.Task.build(run, model)
  host = task.teacher_params
  images, labels = _images()
  ids, rng = jnp.arange(32), jax.random.key(0)
  grads = jax.jit(jax.grad(task.loss, argnums=(0, 5)))(params, images, labels, ids, rng, host)
  assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grads[0])) > 1e-3
  assert all(not np.any(g) for g in jax.tree.leaves(grads[1]))  # exactly zero

  mesh = parallel.create_mesh()
  tx, schedule = optim.for_training(run.optim, 10)
  state = {'params': params, 'opt_state': tx.init(params), 'step': jnp.zeros((), jnp.int32)}
  state['rng'] = jax.random.key_data(jax.random.key(0))
  shardings = parallel.tree_shardings(state, mesh)
  (placed,) = task.inputs(mesh)
  step = steps.train_step_for(run, task, tx, schedule, mesh, shardings)
  batch = parallel.global_batch({'image': images, 'label': labels}, parallel.batch_sharding(mesh))
  state, metrics = step(jax.device_put(state, shardings), batch)
  want = _oracle(run, model, params, host, images, labels)
  np.testing.assert_allclose(metrics['loss'], want, rtol=2e-6)
  state, _ = step(state, batch)
  assert set(state) == {'params', 'opt_state', 'step', 'rng'} and 'head_dist' in state['params']
  for a, b in zip(jax.tree.leaves(placed), jax.tree.leaves(host), strict=True):
    np.testing.assert_array_equal(np.asarray(a), b)


def _metrics(workdir):
  keys = ('step', 'loss', 'accuracy_test', 'loss_test')
  return [{k: m[k] for k in keys if k in m} for m in rundir.read_metrics(workdir)]


def _flat(params):
  return checkpoint.flatten(jax.tree.map(np.asarray, jax.device_get(params)))


@pytest.mark.slow
def test_stop_and_resume_with_a_teacher_is_exact(tmp_path, capsys):
  """6 steps == a copy of the run resumed from its step-3 checkpoint for 3 more: the resumed
  run reads the teacher again."""
  path = write_teacher(tmp_path / 'teacher.npz')
  config = distill_config(path)
  ref = train.train_and_evaluate(config, str(tmp_path / 'ref'))
  workdir = str(tmp_path / 'run')
  shutil.copytree(tmp_path / 'ref', workdir)
  shutil.rmtree(os.path.join(rundir.checkpoint_dir(workdir), '6'))
  capsys.readouterr()
  second = train.train_and_evaluate(config, workdir)
  assert 'Resumed from checkpoint at step 3' in capsys.readouterr().out
  assert second['status'] == 'done' and second['step'] == 6
  a, b = _flat(ref['params']), _flat(second['params'])
  assert a.keys() == b.keys() and 'dist_token' in a
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)
  assert _metrics(workdir) == _metrics(str(tmp_path / 'ref'))
  assert len(_metrics(workdir)) == 8  # 6 training lines, 2 evaluations
  # The checkpoint holds the student only, and config.json names the teacher.
  assert _flat(checkpoint.load(workdir)).keys() == a.keys()
  with open(os.path.join(workdir, 'config.json')) as f:
    resolved = json.load(f)['_resolved']
  assert resolved['teacher'].endswith(f'at 16x16 px from {path}')


def test_a_teacher_that_does_not_fit_is_a_one_line_error(tmp_path):
  missing = str(tmp_path / 'missing.npz')
  train_error(
    distill_config(missing), tmp_path, f'Teacher config.distill.teacher_checkpoint={missing}: '
  )
  seven = write_teacher(tmp_path / 'seven.npz', classes=7)
  train_error(
    distill_config(seven), tmp_path, 'has a head of 7 classes; the run trains 10: a teacher must'
  )
  ten = write_teacher(tmp_path / 'ten.npz')
  train_error(
    distill_config(ten, **{'distill.teacher': 'ViT-B_16'}),
    tmp_path,
    r'config.distill.teacher ViT-B_16 does not fit the checkpoint',
  )
  wide = {**TEACHER, 'hidden_size': 32}  # constructor fields, used as given
  train_error(
    distill_config(ten, **{'distill.teacher_model': wide}),
    tmp_path,
    r'embedding/kernel has shape \(4, 4, 3, 16\) in the checkpoint but \(4, 4, 3, 32\)',
  )
  train_error(
    distill_config('', **{'distill.teacher': 'ViT-B_16'}),
    tmp_path,
    'config.distill names a teacher but not its weights',
  )
  train_error(
    distill_config(ten, loss='sigmoid_xent'), tmp_path, 'distillation trains softmax heads'
  )
