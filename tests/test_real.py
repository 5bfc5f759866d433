"""ImageNet ReaL: a prediction is right if it is in the image's set of real labels, and images
with an empty set are left out; on synthetic logits and through the pipeline on tfds mock data."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import tensorflow_datasets as tfds

from configs import vit as vit_config
from vit_jax.data import real
from vit_jax.evals import classification, common, registry
from vit_jax.train import setup


class _Logits:
  """A stand-in model: the logits are written into the image's first pixel row."""

  def __init__(self, num_classes: int):
    self.num_classes = num_classes

  def apply(self, variables, images, train):
    del variables, train
    return images[:, 0, : self.num_classes, 0]


def _multi_hot(sets, num_classes):
  return np.array([[int(c in s) for c in range(num_classes)] for s in sets], np.int32)


def test_real_accuracy_on_synthetic_logits_against_a_hand_count():
  predicted = [0, 1, 2, 3, 4, 0, 2]
  sets = [{0, 2}, {0}, {2, 3}, set(), {4}, {1}, {2}]
  mask = [1, 1, 1, 1, 1, 1, 0]  # the last row is padding
  # Rows 0, 2, 4 are right, 1 and 5 wrong, 3 has no label (left out), 6 is padding: 3 of 5.
  images = np.zeros((7, 1, 5, 1), np.float32)
  images[np.arange(7), 0, predicted, 0] = 1.0
  batch = {
    'image': images,
    'label': np.array([0, 0, 2, 3, 1, 1, 2], np.int32),
    'mask': np.array(mask, np.int32),
    'real': _multi_hot(sets, 5),
  }
  sums = jax.jit(classification.make_eval_step(_Logits(5), num_classes=5))(None, batch)
  assert int(sums['real_correct']) == 3 and int(sums['real_count']) == 5
  assert int(sums['correct']) == 3  # the original labels: rows 0, 2 and 3; padding not counted
  assert int(sums['count']) == 6


@pytest.mark.slow
def test_real_through_the_pipeline_on_mock_data(tmp_path):
  """`config.real_split` evaluates tfds imagenet2012_real; the stand-in model predicts one
  class for every image, so ReaL accuracy is the share of labelled images whose set holds it,
  counted here from the records themselves."""
  config = ml_collections.ConfigDict(vit_config.get_config('testing,imagenet2012').to_dict())
  config.pretrained_dir = ''
  config.pp.crop = 32
  config.batch = config.batch_eval = 8
  config.accum_steps = 1
  config.real_split = 'validation'
  with tfds.testing.mock_data(num_examples=21):
    builder = tfds.builder(real.NAME)
    records = builder.as_dataset(split='validation', shuffle_files=False)
    sets = [set(r['real_label'].tolist()) for r in tfds.as_numpy(records)]
    labelled = [s for s in sets if s]
    counts = np.bincount(np.concatenate([sorted(s) for s in labelled]), minlength=1000)
    chosen = int(np.argmax(counts))  # the label most sets hold
    prepared = setup.prepare(config, str(tmp_path), jax.devices()[:1])
    assert list(prepared.evaluators) == ['test', 'real']

    class _Constant:
      def apply(self, variables, images, train):
        return jnp.zeros((images.shape[0], 1000)).at[:, chosen].set(1.0)

    run = prepared.spec
    context = common.Context(run.evals, run.data, _Constant(), prepared.mesh, prepared.source)
    metrics = {}
    for evaluator in registry.build(context).values():
      metrics |= common.evaluate(evaluator, {'': None})
  assert len(sets) == 21 and counts[chosen] >= 1
  assert metrics['num_real'] == len(labelled)
  assert metrics['accuracy_real'] == pytest.approx(counts[chosen] / len(labelled))
  assert metrics['num_test'] == 21  # the imagenet2012 validation split, as before


def test_real_split_needs_a_thousand_class_model(tmp_path):
  config = ml_collections.ConfigDict(vit_config.get_config('testing,cifar10').to_dict())
  config.pretrained_dir = ''
  config.real_split = 'validation'
  with tfds.testing.mock_data(num_examples=4), pytest.raises(ValueError, match='1000-class'):
    setup.prepare(config, str(tmp_path), jax.devices()[:1])
