"""mixup and CutMix of a batch: the weights read back from the mixed pixels, the labels
against the convex combination written out here with numpy."""

import jax
import numpy as np
import pytest

from vit_jax.tasks import mixing

K = 7


def _batch(n: int = 6, size: int = 16, seed: int = 0):
  rng = np.random.default_rng(seed)
  images = rng.uniform(-1, 1, (n, size, size, 3)).astype(np.float32)
  labels = rng.integers(0, K, n).astype(np.int32)
  return images, labels


def _one_hot(labels):
  return np.eye(K, dtype=np.float32)[labels]


@pytest.mark.parametrize('seed', range(5))
def test_mixup_mixes_each_example_with_its_predecessor_by_one_weight_above_one_half(seed):
  images, labels = _batch(seed=seed)
  mix = mixing.make_mix(mixup=0.2, cutmix=0.0, num_classes=K)
  mixed, targets = map(np.asarray, mix(images, labels, jax.random.key(seed)))
  prev = np.roll(images, 1, axis=0)
  # mixed - prev = a (x - prev): a by least squares over every pixel.
  d = (images - prev).ravel().astype(np.float64)
  a = float(d @ (mixed - prev).ravel() / (d @ d))
  assert 0.5 <= a <= 1.0
  np.testing.assert_allclose(mixed, a * images + (1 - a) * prev, atol=1e-6)
  expected = a * _one_hot(labels) + (1 - a) * _one_hot(np.roll(labels, 1))
  np.testing.assert_allclose(targets, expected, atol=1e-5)  # a read back in float32
  np.testing.assert_allclose(targets.sum(-1), 1.0, atol=1e-6)


@pytest.mark.parametrize('seed', range(5))
def test_cutmix_pastes_one_box_and_weights_labels_by_the_area_left(seed):
  images, labels = _batch(size=20, seed=seed)
  mix = mixing.make_mix(mixup=0.0, cutmix=1.0, num_classes=K)
  mixed, targets = map(np.asarray, mix(images, labels, jax.random.key(seed)))
  prev = np.roll(images, 1, axis=0)
  pasted = np.all(mixed == prev, axis=(0, 3))  # (H, W), the same box in every image
  np.testing.assert_array_equal(mixed[:, ~pasted], images[:, ~pasted])
  rows, cols = np.nonzero(pasted)
  if rows.size:  # a rectangle
    box = np.zeros_like(pasted)
    box[rows.min() : rows.max() + 1, cols.min() : cols.max() + 1] = True
    np.testing.assert_array_equal(pasted, box)
  left = 1.0 - pasted.mean()
  expected = left * _one_hot(labels) + (1 - left) * _one_hot(np.roll(labels, 1))
  np.testing.assert_allclose(targets, expected, atol=1e-6)
  np.testing.assert_allclose(targets.sum(-1), 1.0, atol=1e-6)


@pytest.mark.slow
def test_cutmix_box_area_follows_beta_and_both_switch_half_the_time():
  """CutMix alpha 1: lam ~ U(0, 1), so the pasted area averages 1/2 of the image (less a
  little for clipping at the edges and rounding the sides down); with mixup also on, about
  half of the batches are CutMix (a 0/1 weight map) and the rest mixup (a constant)."""
  cut = [np.asarray(mixing.cutmix_weights(jax.random.key(s), 1.0, 64, 64)) for s in range(400)]
  pasted = np.mean([1 - m.mean() for m in cut])
  assert 0.3 < pasted < 0.5
  mix = mixing.make_mix(mixup=0.2, cutmix=1.0, num_classes=K)
  images, labels = _batch(n=2)
  kinds = []
  for s in range(200):
    mixed = np.asarray(mix(images, labels, jax.random.key(s))[0])
    kinds.append(np.any(mixed == images) or np.all(mixed == np.roll(images, 1, 0)))
  assert 70 < sum(kinds) < 130  # binomial(200, 1/2): mean 100, std 7


def test_no_mixing_without_concentrations():
  assert mixing.make_mix(0.0, 0.0, K) is None
