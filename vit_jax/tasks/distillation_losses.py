"""Knowledge-distillation losses of DeiT (Touvron et al., arXiv:2012.12877), as pure functions.

A distilled student (`VisionTransformer(distilled=True)`, applied with `both_heads=True`) gives
two logits per image: the class head's, trained on the labels, and the distillation head's,
trained on the teacher. A student without a distillation token passes its logits twice. The
teacher's logits come from any model run in inference mode on the same (augmented) batch;
no gradient flows into them.

Each function returns the per-example loss, shape (batch,): the caller averages it (over the
real examples of a padded batch, say). `targets` are probability vectors over the classes:
one-hot labels, smoothed (`optax.smooth_labels`) or mixed (mixup), as the trainer builds them.
"""

import jax
import jax.numpy as jnp
import optax


def hard_distillation_loss(
  class_logits: jax.Array,
  dist_logits: jax.Array,
  targets: jax.Array,
  teacher_logits: jax.Array,
  alpha: float = 0.5,
) -> jax.Array:
  """(1 - alpha) CE(class head, targets) + alpha CE(distillation head, argmax of the teacher).

  With alpha = 1/2 this is the paper's hard-label distillation, eq. (3):
  1/2 L_CE(psi(Z_s), y) + 1/2 L_CE(psi(Z_s), y_t), y_t = argmax_c Z_t(c); the distillation
  head's target is the teacher's hard decision, without label smoothing (as DeiT's code).
  """
  teacher_labels = jnp.argmax(jax.lax.stop_gradient(teacher_logits), axis=-1)
  base = optax.softmax_cross_entropy(class_logits, targets)
  distill = optax.softmax_cross_entropy_with_integer_labels(dist_logits, teacher_labels)
  return (1 - alpha) * base + alpha * distill


def soft_distillation_loss(
  class_logits: jax.Array,
  dist_logits: jax.Array,
  targets: jax.Array,
  teacher_logits: jax.Array,
  temperature: float,
  weight: float,
) -> jax.Array:
  """(1 - lambda) CE(class head, targets) + lambda tau^2 KL(teacher_tau || student_tau).

  The paper's soft distillation, eq. (2), with lambda = `weight` and tau = `temperature`:
  the KL divergence of the distillation head's softmax(logits / tau) from the teacher's,
  sum_c p_t(c) (log p_t(c) - log p_s(c)) (the direction of DeiT's `kl_div(..., log_target=True)`),
  per example; tau^2 keeps the gradient's scale independent of tau (Hinton et al.). DeiT's
  command line defaults to tau = 1, lambda = 0.5. Note: DeiT's code divides the summed KL by
  batch x classes instead of batch, i.e. its soft term is this one over the number of classes.
  """
  t = temperature
  teacher = jax.nn.log_softmax(jax.lax.stop_gradient(teacher_logits) / t, axis=-1)
  student = jax.nn.log_softmax(dist_logits / t, axis=-1)
  kl = jnp.sum(jnp.exp(teacher) * (teacher - student), axis=-1)
  base = optax.softmax_cross_entropy(class_logits, targets)
  return (1 - weight) * base + weight * t**2 * kl
