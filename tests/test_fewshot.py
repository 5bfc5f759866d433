"""Few-shot linear evaluation: the ridge solution against numpy's least squares and
scikit-learn's Ridge, big_vision's draw, the subset source, and the evaluator against features
computed directly; on digits the 10-shot accuracy rises above chance while training."""

import jax
import ml_collections
import numpy as np
import pytest
from conftest import TINY
from sklearn.linear_model import Ridge as SklearnRidge

from configs import digits as digits_config
from vit_jax import data as data_lib
from vit_jax import parallel, rundir, train
from vit_jax.data import digits as digits_data
from vit_jax.evals import common, fewshot
from vit_jax.train import setup, spec


def _augmented(x_train, x_test):
  """The solver's inputs written out: standardised by the training set, a column of 100."""
  mean, std = x_train.mean(0), x_train.std(0) + 1e-5
  return [np.hstack([(x - mean) / std, np.full((len(x), 1), 100.0)]) for x in (x_train, x_test)]


def _problem(n, dim, classes, seed=0):
  rng = np.random.default_rng(seed)
  centers = rng.normal(size=(classes, dim))
  labels = np.arange(n) % classes
  x = centers[labels] + 0.8 * rng.normal(size=(n, dim)) + 3.0  # off-centre, unscaled
  return x * rng.uniform(0.5, 4, dim), labels


@pytest.mark.parametrize(('n', 'dim'), [(60, 8), (12, 40)], ids=['primal', 'dual'])
@pytest.mark.parametrize('l2', [1024.0, 0.5])
def test_ridge_equals_least_squares_and_sklearn(n, dim, l2):
  """min |A W - Y|^2 + l2 |W|^2 as the least-squares problem [A; sqrt(l2) I] W = [Y; 0], and
  as scikit-learn's Ridge without intercept (the bias is A's constant column)."""
  classes = 4
  x, labels = _problem(n, dim, classes)
  x_test, _ = _problem(30, dim, classes, seed=1)
  a, a_test = _augmented(x, x_test)
  y = np.where(labels[:, None] == np.arange(classes), 1.0, -1.0)
  stacked = np.vstack([a, np.sqrt(l2) * np.eye(dim + 1)])
  targets = np.vstack([y, np.zeros((dim + 1, classes))])
  expected = np.linalg.lstsq(stacked, targets, rcond=None)[0]
  sklearn = SklearnRidge(alpha=l2, fit_intercept=False, solver='svd').fit(a, y).coef_.T

  ridge = fewshot.fit(x, labels, classes)
  weights = ridge.weights(l2)
  scale = np.abs(expected).max()
  np.testing.assert_allclose(weights, expected, atol=1e-9 * scale, rtol=0)
  np.testing.assert_allclose(weights, sklearn, atol=1e-9 * scale, rtol=0)
  np.testing.assert_array_equal(ridge.predict(x_test, l2), np.argmax(a_test @ expected, 1))


def test_accuracies_average_the_seeds_of_each_shot_count():
  classes = 3
  x, labels = _problem(90, 5, classes)
  x_test, y_test = _problem(45, 5, classes, seed=2)
  got = fewshot.accuracies((x, labels), (x_test, y_test), classes, (2, 5), (1.0, 100.0), 2)
  assert sorted(got) == [(2, 1.0), (2, 100.0), (5, 1.0), (5, 100.0)]
  a_test = None
  for (shots, l2), value in got.items():
    per_seed = []
    for seed in range(2):
      chosen = fewshot.draw(labels, classes, shots, seed)
      a, a_test = _augmented(x[chosen], x_test)
      y = np.where(labels[chosen][:, None] == np.arange(classes), 1.0, -1.0)
      stacked = np.vstack([a, np.sqrt(l2) * np.eye(a.shape[1])])
      w = np.linalg.lstsq(stacked, np.vstack([y, np.zeros((a.shape[1], classes))]), rcond=None)[0]
      per_seed.append(np.mean(np.argmax(a_test @ w, 1) == y_test))
    assert value == pytest.approx(np.mean(per_seed), abs=1e-12)


def test_draw_takes_shots_per_class_nested_and_seeded():
  labels = np.array([0] * 7 + [1] * 3 + [2] * 12)
  rng_order = np.random.default_rng(5).permutation(len(labels))
  labels = labels[rng_order]
  ten = fewshot.draw(labels, 3, 10, seed=0)
  five = fewshot.draw(labels, 3, 5, seed=0)
  assert np.bincount(labels[ten], minlength=3).tolist() == [7, 3, 10]  # class 1 has only 3
  assert np.bincount(labels[five], minlength=3).tolist() == [5, 3, 5]
  assert set(five) <= set(ten)  # the 5-shot set is inside the 10-shot set
  np.testing.assert_array_equal(ten, fewshot.draw(labels, 3, 10, seed=0))
  assert set(fewshot.draw(labels, 3, 5, seed=1)) != set(five)


def test_subset_reads_the_chosen_examples_with_their_positions_over_processes():
  source = data_lib.get_source('digits')
  images, labels = digits_data.load('train')
  chosen = [3, 0, 900, 17, 1436, 17]
  subset = data_lib.Subset(source, 'train', chosen)
  seen = []
  for process in range(2):
    records = list(subset.records('train', process, 2).as_numpy_iterator())
    assert len(records) == subset.num_examples('train', process, 2)
    seen += records
  assert sorted(r['index'] for r in seen) == [0, 3, 17, 900, 1436]
  for r in seen:
    assert r['label'] == labels[r['index']]
    np.testing.assert_array_equal(r['image'], images[r['index']])
  with pytest.raises(ValueError, match="holds split 'train'"):
    subset.records('test')


def _tiny_spec(**overrides):
  dotted = {**TINY, **{k.replace('__', '.'): v for k, v in overrides.items()}}
  return spec.from_config(spec.with_overrides(digits_config.get_config(), dotted))


@pytest.mark.slow
def test_evaluator_equals_accuracies_on_features_computed_directly(tmp_path):
  """The evaluator on 8 devices (subset of drawn images, gathered features, positions) gives
  exactly the numbers of `accuracies` on features of whole splits computed with model.apply."""
  run = _tiny_spec(fewshot_every=1, fewshot__datasets=('digits',), fewshot__shots=(1, 10))
  prepared = setup.prepare(run, str(tmp_path))
  model = prepared.model
  params = model.init(jax.random.key(0), np.zeros((1, 8, 8, 3)), train=False)['params']
  shardings = parallel.tree_shardings(params, prepared.mesh)
  evaluator = prepared.evaluators['fewshot']
  assert isinstance(evaluator, fewshot.Evaluator) and evaluator.every == 1
  got = common.evaluate(evaluator, {'': jax.device_put(params, shardings)})

  headless = model.clone(num_classes=None)
  direct = {}
  for split in ('train', 'test'):
    ds = data_lib.eval_dataset(prepared.source, split, prepared.spec.data, local_batch=360)
    batches = list(ds.as_numpy_iterator())
    feats = np.concatenate(
      [headless.apply({'params': params}, b['image'], train=False) for b in batches]
    )
    mask = np.concatenate([b['mask'] for b in batches]) > 0
    direct[split] = (feats[mask], np.concatenate([b['label'] for b in batches])[mask])
  expected = fewshot.accuracies(direct['train'], direct['test'], 10, (1, 10), (1024.0,), 3)
  assert sorted(got) == ['fewshot/digits/10shot', 'fewshot/digits/1shot']
  for shots in (1, 10):
    assert got[f'fewshot/digits/{shots}shot'] == pytest.approx(expected[(shots, 1024.0)], abs=1e-6)


@pytest.mark.slow
def test_fewshot_accuracy_on_digits_rises_above_chance_while_training(tmp_path):
  """configs/digits.py with 2 blocks for 300 steps, few-shot every 150 steps on digits.

  Chance is 1/10; with 360 test images a chance-level score has a standard deviation of
  sqrt(0.1 * 0.9 / 360) = 1.6%, so the bar is chance + 5 standard deviations. Measured
  10-shot: 77.5% at step 150, 91.6% at step 300.
  """
  config = ml_collections.ConfigDict(digits_config.get_config().to_dict())
  config.model.transformer.num_layers = 2
  config.total_steps = 300
  config.warmup_steps = 40
  config.eval_every = config.checkpoint_every = 300
  config.fewshot_every = 150
  config.fewshot.datasets = ('digits',)
  train.train_and_evaluate(config, str(tmp_path), devices=jax.devices()[:1])
  lines = [m for m in rundir.read_metrics(str(tmp_path)) if 'fewshot/digits/10shot' in m]
  assert [m['step'] for m in lines] == [150, 300]
  assert {k for k in lines[0] if k.startswith('fewshot/')} == {
    f'fewshot/digits/{n}shot' for n in (1, 5, 10, 25)
  }
  bar = 0.1 + 5 * np.sqrt(0.1 * 0.9 / 360)
  assert lines[-1]['fewshot/digits/10shot'] > bar, lines
  assert lines[-1]['fewshot/digits/10shot'] > lines[0]['fewshot/digits/10shot'], lines


def test_fewshot_config_errors_are_one_line():
  for overrides, match in [
    ({'fewshot_every': 10}, 'fewshot.datasets is empty'),
    ({'fewshot.shots': (0, 5)}, r'fewshot\.shots=\(0, 5\)'),
    ({'fewshot.l2_reg': (-1.0,)}, r'fewshot\.l2_reg=\(-1\.0,\)'),
    ({'fewshot.datasets': (('digits', 'train'),)}, 'entry'),
    ({'polyak_decay': 1.0}, 'polyak_decay=1.0'),
  ]:
    with pytest.raises(ValueError, match=match) as info:
      spec.from_config(spec.with_overrides(digits_config.get_config(), overrides))
    assert '\n' not in str(info.value)


def test_unreadable_shots_are_left_out_and_counted_and_the_evaluation_goes_on(tmp_path):
  """A few-shot folder whose train split holds 3 unreadable files among 13 images: every
  draw that picks one fits without it (as `accuracies(..., unreadable=)` computes it from
  the readable features), and `bad_images` counts them (the old code stopped with 'asked
  for an example whose features were not computed')."""
  from conftest import unreadable_files, write_image_folder

  root = write_image_folder(tmp_path / 'shots', {'train': 13, 'test': 5}, unreadable_files())
  run = _tiny_spec(fewshot_every=1, fewshot__datasets=(root,), fewshot__shots=(2, 5))
  prepared = setup.prepare(run, str(tmp_path / 'run'))
  params = prepared.model.init(jax.random.key(0), np.zeros((1, 8, 8, 3)), train=False)['params']
  shardings = parallel.tree_shardings(params, prepared.mesh)
  got = common.evaluate(prepared.evaluators['fewshot'], {'': jax.device_put(params, shardings)})
  assert got['fewshot/shots/bad_images'] == 3
  assert sorted(got) == ['fewshot/shots/2shot', 'fewshot/shots/5shot', 'fewshot/shots/bad_images']
  assert all(0 <= got[f'fewshot/shots/{n}shot'] <= 1 for n in (2, 5))


def test_accuracies_leave_the_unreadable_positions_out_of_each_draw():
  x, y = _problem(60, 8, 3)
  x_test, y_test = _problem(30, 8, 3, seed=1)
  unreadable = fewshot.draw(y, 3, 5, 0)[::3]  # some of seed 0's draw
  got = fewshot.accuracies((x, y), (x_test, y_test), 3, (5,), (1.0,), 2, unreadable)
  scores = []
  for seed in range(2):
    chosen = [i for i in fewshot.draw(y, 3, 5, seed) if i not in set(unreadable)]
    ridge = fewshot.fit(x[chosen], y[chosen], 3)
    scores.append(np.mean(ridge.predict(x_test, 1.0) == y_test))
  assert got[(5, 1.0)] == pytest.approx(np.mean(scores), abs=1e-12)
  assert got != fewshot.accuracies((x, y), (x_test, y_test), 3, (5,), (1.0,), 2)
