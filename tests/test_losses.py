"""DeiT's distillation losses against hand computations in numpy (Touvron et al., eqs. 2, 3)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax.tasks import distillation_losses as losses


def _log_softmax(z):
  z = np.asarray(z, np.float64)
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


def _batch(seed=0, n=6, k=5):
  rng = np.random.default_rng(seed)
  cls, dist, teacher = (rng.normal(0, 2, (n, k)).astype(np.float32) for _ in range(3))
  targets = np.eye(k, dtype=np.float32)[rng.integers(0, k, n)]
  targets = 0.9 * targets + 0.1 / k  # smoothed labels: soft targets must work too
  return cls, dist, targets, teacher


def test_hard_distillation_by_hand_on_two_classes():
  # class head [0, ln 3]: p = (1/4, 3/4); label 1 -> -ln(3/4).
  # distillation head [ln 2, 0]: p = (2/3, 1/3); teacher argmax 1 -> -ln(1/3).
  cls = jnp.array([[0.0, np.log(3.0)]])
  dist = jnp.array([[np.log(2.0), 0.0]])
  loss = losses.hard_distillation_loss(cls, dist, jnp.array([[0.0, 1.0]]), jnp.array([[-1.0, 4.0]]))
  np.testing.assert_allclose(loss, [0.5 * -np.log(0.75) + 0.5 * -np.log(1 / 3)], rtol=1e-6)


@pytest.mark.parametrize('alpha', [0.5, 0.3])
def test_hard_distillation_is_eq3(alpha):
  cls, dist, targets, teacher = _batch()
  teacher_labels = teacher.argmax(-1)
  base = -(targets * _log_softmax(cls)).sum(-1)
  distill = -_log_softmax(dist)[np.arange(len(dist)), teacher_labels]
  want = (1 - alpha) * base + alpha * distill
  got = losses.hard_distillation_loss(cls, dist, targets, teacher, alpha=alpha)
  assert got.shape == (6,)
  np.testing.assert_allclose(got, want, rtol=1e-5)


def test_soft_distillation_by_hand_on_two_classes():
  # tau = 2: teacher [0, 2 ln 3] / 2 -> q = (1/4, 3/4); student [0, 0] -> p = (1/2, 1/2).
  # KL(q || p) = 1/4 ln(1/2) + 3/4 ln(3/2); the class head sees uniform logits: CE = ln 2.
  tau, lam = 2.0, 0.1
  kl = 0.25 * np.log(0.25 / 0.5) + 0.75 * np.log(0.75 / 0.5)
  want = (1 - lam) * np.log(2.0) + lam * tau**2 * kl
  loss = losses.soft_distillation_loss(
    jnp.zeros((1, 2)), jnp.zeros((1, 2)), jnp.array([[1.0, 0.0]]),
    jnp.array([[0.0, 2 * np.log(3.0)]]), temperature=tau, weight=lam,
  )  # fmt: skip
  np.testing.assert_allclose(loss, [want], rtol=1e-6)


@pytest.mark.parametrize('tau, lam', [(1.0, 0.5), (3.0, 0.1)])
def test_soft_distillation_is_eq2(tau, lam):
  cls, dist, targets, teacher = _batch(seed=1)
  q_log, p_log = _log_softmax(teacher / tau), _log_softmax(dist / tau)
  kl = (np.exp(q_log) * (q_log - p_log)).sum(-1)
  base = -(targets * _log_softmax(cls)).sum(-1)
  want = (1 - lam) * base + lam * tau**2 * kl
  got = losses.soft_distillation_loss(cls, dist, targets, teacher, temperature=tau, weight=lam)
  np.testing.assert_allclose(got, want, rtol=1e-5)


def test_a_student_equal_to_its_teacher_has_no_soft_distillation_term():
  cls, _, targets, teacher = _batch(seed=2)
  got = losses.soft_distillation_loss(cls, teacher, targets, teacher, temperature=3.0, weight=0.1)
  np.testing.assert_allclose(got, 0.9 * -(targets * _log_softmax(cls)).sum(-1), rtol=1e-5)


@pytest.mark.parametrize('kind', ['hard', 'soft'])
def test_no_gradient_reaches_the_teacher(kind):
  cls, dist, targets, teacher = _batch(seed=3)
  fn = {
    'hard': losses.hard_distillation_loss,
    'soft': lambda *a: losses.soft_distillation_loss(*a, temperature=3.0, weight=0.5),
  }[kind]
  grads = jax.grad(lambda c, d, t: fn(c, d, targets, t).sum(), argnums=(0, 1, 2))(
    cls, dist, teacher
  )
  assert np.abs(grads[0]).max() > 0.01 and np.abs(grads[1]).max() > 0.01
  np.testing.assert_array_equal(grads[2], 0.0)
