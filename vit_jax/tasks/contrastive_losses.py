"""Contrastive image-text losses over every device: CLIP/LiT's softmax and SigLIP's sigmoid.

Both take the two towers' embeddings of one batch of pairs, already L2-normalised, shape
(batch, d), where image i and text i are a positive pair and every other pairing in the
*global* batch is a negative, and the model's scalar parameters: `t`, the log temperature
(logits are exp(t) * zimg . ztxt), and for the sigmoid loss `b`, the learned bias.

  softmax  CLIP (Radford et al., arXiv:2103.00020) and LiT (Zhai et al., arXiv:2111.07991):
           logits = exp(t) zimg ztxt^T; the mean of the image->text and text->image
           cross-entropies, each over the B candidates of the global batch (big_vision's
           `_deprecated_contrastive.softmax_loss`).
  sigmoid  SigLIP (Zhai et al., arXiv:2303.15343): logits = exp(t) zimg ztxt^T + b, label +1
           on the diagonal and -1 elsewhere, loss = -sum over all B^2 pairs of
           log_sigmoid(label * logit) / B (big_vision's `trainers/proj/image_text/siglip.py`).

Initialisation (the model holds `t` and `b`; these functions only read them): LiT's `t`
starts at 0 (temperature 1, big_vision's `two_towers.Model` default, which has no `b`);
SigLIP's at log(10) and `b` at -10 (the paper, and big_vision's SigLIP colab:
temperature_init=10, bias_init=-10); big_vision's public
`configs/proj/image_text/siglip_lit_coco.py` uses temperature_init 10 (t = log 10) and
bias_init -2.71. A large negative `b` starts the loss small: almost every pair is a negative.

Two forms of the same number. With `axis=None` the embeddings are the global batch's, as in
the `jax.jit` step, where GSPMD partitions the (B, B) logits over the mesh. With `axis` (the
mesh's data axis) the function runs inside `jax.shard_map` on this device's rows (n, d) of
the batch: it all-gathers the texts (and, for the softmax's text->image direction, the
images), computes its n rows of logits against all B = n * devices candidates with its
positives at columns device_index * n + i, and averages over devices, so it returns the
global loss and metrics, the same on every device (mesh-invariant).

How the contrastive task (vit_jax/tasks/contrastive.py) calls it: it applies the model to
its batch (the global one under jit, this device's rows under shard_map), then the loss:

  def loss_fn(params, batch):
    zimg, ztxt, _ = model.apply({'params': params}, images=batch['image'],
                                tokens=batch['text'], train=False)
    return contrastive_losses.loss(name, zimg, ztxt, params['t'], params.get('b'), axis=axis)

  (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)

Under shard_map, differentiate w.r.t. the replicated parameters as they arrive (mesh-
invariant): the returned loss is already the global mean, and JAX's transpose of their
implicit broadcast sums the devices' contributions, so `grads` is the global gradient with
no pmean after. A step that first casts the parameters to device-varying (`lax.pcast`, as
the trainer's shard_map step does) gets on each device the derivative w.r.t. its own
copy; their `lax.psum` is the gradient (a `pmean` would give 1/devices of it). The
gradients through the all-gather (a reduce-scatter in the backward pass) carry every
device's loss terms back to the rows that produced the embeddings.

Gradient accumulation does not split a contrastive batch exactly: each micro-batch would be
its own set of negatives. The (n, B) logits of a device are held at once (big_vision's
chunked variant trades that memory for B / n passes; not needed at these sizes). Logits are
float32 at full matmul precision whatever the towers' dtype: the matmul is a negligible part
of the step, and exp(t) (tens to a hundred when trained) magnifies the similarities' rounding.
"""

import jax
import jax.numpy as jnp

Metrics = dict[str, jax.Array]
LOSSES = ('softmax', 'sigmoid')


def _scalar(x) -> jax.Array:
  """A () float32 from a parameter of shape () or (1,) (the original LiT's `t` is (1,))."""
  return jnp.reshape(jnp.asarray(x, jnp.float32), ())


def _gather(x: jax.Array, axis: str | None) -> tuple[jax.Array, jax.Array | int]:
  """The global batch's rows of `x`, and the index of this device's first row in it."""
  if axis is None:
    return x, 0
  return jax.lax.all_gather(x, axis, tiled=True), jax.lax.axis_index(axis) * x.shape[0]


def _mean(x: jax.Array, axis: str | None) -> jax.Array:
  """The mean over the global batch of per-row values (every device holds as many rows)."""
  m = jnp.mean(x)
  return m if axis is None else jax.lax.pmean(m, axis)


def _sum(x: jax.Array, axis: str | None) -> jax.Array:
  s = jnp.sum(x)
  return s if axis is None else jax.lax.psum(s, axis)


def _logits(rows: jax.Array, cols: jax.Array, scale: jax.Array, bias=0.0) -> jax.Array:
  dot = jnp.dot(rows, cols.T, precision=jax.lax.Precision.HIGHEST)
  return scale * dot + bias


def _positives(logits: jax.Array, offset) -> jax.Array:
  """(n, B) mask of the positive pairs: row i's is column offset + i."""
  n, size = logits.shape
  return jnp.arange(size)[None, :] == (offset + jnp.arange(n))[:, None]


# The metrics below read the logits through stop_gradient: they are reported, not trained
# (and `lax.pmax` has no derivative).


def _row_top1(logits: jax.Array, pos: jax.Array, axis: str | None) -> jax.Array:
  """Fraction of rows whose positive has the largest logit of the row (ties count as hits)."""
  logits = jax.lax.stop_gradient(logits)
  positive = jnp.max(jnp.where(pos, logits, -jnp.inf), axis=-1)
  return _mean(positive >= jnp.max(logits, axis=-1), axis)


def _column_top1(logits: jax.Array, offset, axis: str | None) -> jax.Array:
  """Fraction of columns whose positive has the largest logit of the column, from this
  device's rows (n, B): the column maxima are combined over devices (B floats), so the
  text->image accuracy needs no second gather of the images."""
  logits = jax.lax.stop_gradient(logits)
  n = logits.shape[0]
  column_max = jnp.max(logits, axis=0)
  if axis is not None:
    column_max = jax.lax.pmax(column_max, axis)
  mine = jax.lax.dynamic_slice_in_dim(column_max, offset, n)  # the columns of my rows' texts
  positive = jnp.max(jnp.where(_positives(logits, offset), logits, -jnp.inf), axis=-1)
  return _mean(positive >= mine, axis)


def _pair_logits(logits: jax.Array, pos: jax.Array, axis: str | None) -> Metrics:
  """The mean logit of the B positive pairs and of the B (B - 1) negative ones."""
  logits = jax.lax.stop_gradient(logits)
  size = logits.shape[1]
  positive = _sum(jnp.where(pos, logits, 0.0), axis)
  total = _sum(logits, axis)
  return {'pos_logit': positive / size, 'neg_logit': (total - positive) / (size * (size - 1))}


def softmax_loss(
  zimg: jax.Array, ztxt: jax.Array, t: jax.Array, *, axis: str | None = None
) -> tuple[jax.Array, Metrics]:
  """CLIP/LiT's symmetric softmax loss of the global batch, and its metrics.

  zimg, ztxt: (n, d) L2-normalised embeddings of n pairs (the global batch, or under
  `jax.shard_map` over `axis` this device's rows); t: the log temperature, shape () or (1,).
  Metrics: `temperature` exp(t), `i2t_loss` and `t2i_loss` (the two cross-entropies, whose
  mean is the loss), `i2t_acc` and `t2i_acc` (top-1 over the B candidates), `pos_logit` and
  `neg_logit`.
  """
  zimg, ztxt = zimg.astype(jnp.float32), ztxt.astype(jnp.float32)
  scale = jnp.exp(_scalar(t))
  metrics = {'temperature': scale}
  for name, rows, cols in (('i2t', zimg, ztxt), ('t2i', ztxt, zimg)):
    cols, offset = _gather(cols, axis)
    logits = _logits(rows, cols, scale)
    pos = _positives(logits, offset)
    nll = jax.nn.logsumexp(logits, axis=-1) - jnp.sum(jnp.where(pos, logits, 0.0), axis=-1)
    metrics[f'{name}_loss'] = _mean(nll, axis)
    metrics[f'{name}_acc'] = _row_top1(logits, pos, axis)
    if name == 'i2t':
      metrics.update(_pair_logits(logits, pos, axis))
  loss = 0.5 * (metrics['i2t_loss'] + metrics['t2i_loss'])
  return loss, metrics


def sigmoid_loss(
  zimg: jax.Array, ztxt: jax.Array, t: jax.Array, b: jax.Array, *, axis: str | None = None
) -> tuple[jax.Array, Metrics]:
  """SigLIP's sigmoid loss of the global batch, and its metrics.

  zimg, ztxt: (n, d) L2-normalised embeddings of n pairs (the global batch, or under
  `jax.shard_map` over `axis` this device's rows); t: the log temperature and b: the bias,
  each of shape () or (1,). Only the texts travel: each device scores its images against
  all B texts. Metrics: `temperature` exp(t), `bias` b, `i2t_acc` and `t2i_acc` (top-1 over
  the B candidates), `pos_logit` and `neg_logit`.
  """
  zimg, ztxt = zimg.astype(jnp.float32), ztxt.astype(jnp.float32)
  scale, bias = jnp.exp(_scalar(t)), _scalar(b)
  texts, offset = _gather(ztxt, axis)
  logits = _logits(zimg, texts, scale, bias)
  pos = _positives(logits, offset)
  labels = jnp.where(pos, 1.0, -1.0)
  nll = -jnp.sum(jax.nn.log_sigmoid(labels * logits), axis=-1)
  metrics = {
    'temperature': scale,
    'bias': bias,
    'i2t_acc': _row_top1(logits, pos, axis),
    't2i_acc': _column_top1(logits, offset, axis),
    **_pair_logits(logits, pos, axis),
  }
  return _mean(nll, axis), metrics


def loss(
  name: str, zimg: jax.Array, ztxt: jax.Array, t: jax.Array, b: jax.Array | None = None,
  *, axis: str | None = None,
) -> tuple[jax.Array, Metrics]:  # fmt: skip
  """The contrastive loss `name` ('softmax' or 'sigmoid') and its metrics; `b` is the
  model's learned bias (None when it has none: the sigmoid loss then uses 0)."""
  if name == 'softmax':
    if b is not None:
      raise ValueError(
        'The softmax loss takes no bias b (a constant added to every logit cancels in the '
        "softmax): build the model without one, or use loss='sigmoid'."
      )
    return softmax_loss(zimg, ztxt, t, axis=axis)
  if name == 'sigmoid':
    return sigmoid_loss(zimg, ztxt, t, 0.0 if b is None else b, axis=axis)
  raise ValueError(f'Unknown contrastive loss {name!r}: expected one of {LOSSES}.')
