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
its own set of negatives. Logits are float32 at full matmul precision whatever the towers'
dtype: the matmul is a negligible part of the step, and exp(t) (tens to a hundred when
trained) magnifies the similarities' rounding.

Gathered or chunked (`logits`). The forms above hold a device's (n, B) logits at once (and
the jit step's (B, B), partitioned): per device, memory grows with the square of the batch.
The sigmoid loss is a sum over pairs, so `chunked_sigmoid_loss` computes the same number one
(rows, `CHUNK`) tile of logits at a time, its backward pass recomputing each tile, and holds
O(B) per device (docs/benchmarks.md has the measured bytes):
  jit        a loop over the global batch's texts, `CHUNK` at a time, against all B images:
             GSPMD partitions each tile's rows over the mesh as it partitions the gathered
             form's. The step stays one program for the global batch, blind to the mesh (the
             loss sees no mesh to `shard_map` over); each device holds the B texts (B x d,
             linear) and its tile.
  shard_map  SigLIP's chunked loss (arXiv:2303.15343, section 3.1): the texts visit every
             device in a ring (`lax.ppermute`), each device scoring its n images against the n
             visiting texts, `CHUNK` columns at a time. A custom VJP runs the ring a second
             time in the backward pass, each block's gradient travelling with its texts and
             arriving home with the last step, so a device holds O(n d) whatever the number
             of devices (autodiff of the loop would keep every visiting block: the B texts).
             big_vision's `chunked_sigmoid_loss` broadcasts each device's texts with a psum
             per step (its comment says a ppermute ring used more memory), open_clip's
             `SigLipLoss` passes them around a bidirectional ring.
"""

import functools

import jax
import jax.numpy as jnp

Metrics = dict[str, jax.Array]
LOSSES = ('softmax', 'sigmoid')
LOGITS = ('gathered', 'chunked')
# Text columns per tile of the chunked form: a device holds (rows, CHUNK) logits at once.
CHUNK = 256


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


# ----- the chunked sigmoid loss -----
# A tile's statistics, all it leaves of its logits for the metrics: `sums` (2,) the sum of
# its logits and of its positive ones; `rows` (2, n) and `cols` (2, c) each row's and
# column's largest logit and positive logit (-inf where it has none).
Stats = tuple[jax.Array, jax.Array, jax.Array]


def _tile(rows, texts, scale, bias, offset) -> tuple[jax.Array, Stats]:
  """The sum of the sigmoid loss's terms over one tile of pairs, row i's positive at column
  offset + i, and the tile's statistics."""
  logits = _logits(rows, texts, scale, bias)
  pos = _positives(logits, offset)
  nll = -jnp.sum(jax.nn.log_sigmoid(jnp.where(pos, logits, -logits)))
  logits = jax.lax.stop_gradient(logits)
  positive = jnp.where(pos, logits, -jnp.inf)
  sums = jnp.stack([jnp.sum(logits), jnp.sum(jnp.where(pos, logits, 0.0))])
  tops = [jnp.stack([jnp.max(logits, axis), jnp.max(positive, axis)]) for axis in (1, 0)]
  return nll, (sums, *tops)


def _block(rows, texts, scale, bias, offset, chunk: int) -> tuple[jax.Array, Stats]:
  """`_tile` over all of `texts`, in tiles of the largest divisor of their count up to
  `chunk`; each tile's logits are recomputed in the backward pass, not kept."""
  m, d = texts.shape
  size = max(k for k in range(1, min(chunk, m) + 1) if m % k == 0)
  tile = jax.checkpoint(_tile)

  def body(carry, x):
    i, cols = x
    nll, (sums, top, col) = tile(rows, cols, scale, bias, offset - i * size)
    return (carry[0] + nll, carry[1] + sums, jnp.maximum(carry[2], top)), col

  zero = jnp.zeros_like(rows, shape=())  # typed as `rows` (device-varying in shard_map)
  init = (
    zero,
    jnp.zeros_like(rows, shape=(2,)),
    jnp.full_like(rows, -jnp.inf, shape=(2, len(rows))),
  )
  xs = (jnp.arange(m // size), texts.reshape(m // size, size, d))
  (nll, sums, top), cols = jax.lax.scan(body, init, xs)
  return nll, (sums, top, cols.transpose(1, 0, 2).reshape(2, m))


def _next(x, axis: str):
  """`x` of the previous device in the ring, over `axis`."""
  devices = jax.lax.axis_size(axis)
  return jax.lax.ppermute(x, axis, [(i, (i + 1) % devices) for i in range(devices)])


def _ring(zimg, ztxt, scale, bias, axis: str, chunk: int) -> tuple[jax.Array, Stats]:
  """This device's images against every device's texts, which visit in turn: its sum of
  terms, its rows' statistics, and the column statistics of the block it holds last (a
  block's travel with its texts, complete once they have visited every device)."""
  n = zimg.shape[0]
  nll, stats = _block(zimg, ztxt, scale, bias, 0, chunk)

  def visit(carry, _):
    nll, (sums, top, col), texts = carry
    texts, col = _next((texts, col), axis)
    more, (s, t, c) = _block(zimg, texts, scale, bias, n, chunk)  # offset n: no positives
    return (nll + more, (sums + s, jnp.maximum(top, t), jnp.maximum(col, c)), texts), None

  steps = jax.lax.axis_size(axis) - 1
  (nll, stats, _), _ = jax.lax.scan(visit, (nll, stats, ztxt), length=steps)
  return nll, stats


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _ring_loss(zimg, ztxt, scale, bias, axis: str, chunk: int) -> tuple[jax.Array, Stats]:
  return _ring(zimg, ztxt, scale, bias, axis, chunk)


def _ring_fwd(zimg, ztxt, scale, bias, axis, chunk):
  return _ring(zimg, ztxt, scale, bias, axis, chunk), (zimg, ztxt, scale, bias)


def _ring_bwd(axis, chunk, inputs, cotangents):
  """The ring again: each block's texts visit with the gradient of their terms so far,
  which the last step brings home; this device's images' gradient stays (the statistics
  have none)."""
  zimg, ztxt, scale, bias = inputs
  n = zimg.shape[0]

  def visit(carry, k):
    texts, d_texts, grads = carry
    offset = jnp.where(k == 0, 0, n)  # this device's own texts first, then the others'
    terms = lambda z, x, s, b: _block(z, x, s, b, offset, chunk)[0]
    d_zimg, d_block, d_scale, d_bias = jax.vjp(terms, zimg, texts, scale, bias)[1](cotangents[0])
    texts, d_texts = _next((texts, d_texts + d_block), axis)
    return (texts, d_texts, jax.tree.map(jnp.add, grads, (d_zimg, d_scale, d_bias))), None

  zeros = jax.tree.map(jnp.zeros_like, (ztxt, (zimg, scale, bias)))
  (_, d_ztxt, (d_zimg, d_scale, d_bias)), _ = jax.lax.scan(
    visit, (ztxt, *zeros), jnp.arange(jax.lax.axis_size(axis))
  )
  return d_zimg, d_ztxt, d_scale, d_bias


_ring_loss.defvjp(_ring_fwd, _ring_bwd)


def chunked_sigmoid_loss(
  zimg: jax.Array, ztxt: jax.Array, t: jax.Array, b: jax.Array, *, axis: str | None = None,
  chunk: int = CHUNK,
) -> tuple[jax.Array, Metrics]:  # fmt: skip
  """`sigmoid_loss`'s loss and metrics, its logits computed `chunk` texts at a time (the
  module's docstring): O(B) memory per device, under jit over the global batch and under
  `jax.shard_map` over `axis`, where the texts visit every device in a ring."""
  zimg, ztxt = zimg.astype(jnp.float32), ztxt.astype(jnp.float32)
  scale, bias = jnp.exp(_scalar(t)), _scalar(b)
  if axis is None:
    nll, (sums, top, col) = _block(zimg, ztxt, scale, bias, 0, chunk)
  else:
    # Typed device-varying as the images are (a no-op where they are already): the custom
    # VJP returns each device's share of their gradient, which the implicit cast sums.
    zero = jnp.zeros_like(zimg, shape=())
    nll, (sums, top, col) = _ring_loss(zimg, ztxt, scale + zero, bias + zero, axis, chunk)
  size = zimg.shape[0] * (1 if axis is None else jax.lax.axis_size(axis))
  positive = _sum(sums[1], axis)
  metrics = {
    'temperature': scale,
    'bias': bias,
    'i2t_acc': _mean(top[1] >= top[0], axis),
    't2i_acc': _sum(col[1] >= col[0], axis) / size,
    'pos_logit': positive / size,
    'neg_logit': (_sum(sums[0], axis) - positive) / (size * (size - 1)),
  }
  return _sum(nll, axis) / size, metrics


def check(name: str, logits: str = 'gathered') -> None:
  """One-line ValueErrors for a loss `name` or logits form `logits` that there is not."""
  if name not in LOSSES:
    raise ValueError(f'Unknown contrastive loss {name!r}: expected one of {LOSSES}.')
  if logits not in LOGITS:
    raise ValueError(f'Unknown contrastive logits {logits!r}: expected one of {LOGITS}.')
  if name == 'softmax' and logits == 'chunked':
    raise ValueError(
      "logits='chunked' computes the sigmoid loss in chunks; the softmax loss is "
      "'gathered' only: use logits='gathered', or loss='sigmoid'."
    )


def loss(
  name: str, zimg: jax.Array, ztxt: jax.Array, t: jax.Array, b: jax.Array | None = None,
  *, axis: str | None = None, logits: str = 'gathered',
) -> tuple[jax.Array, Metrics]:  # fmt: skip
  """The contrastive loss `name` ('softmax' or 'sigmoid') and its metrics, its logits
  `gathered` or (the sigmoid's) `chunked`; `b` is the model's learned bias (None when it has
  none: the sigmoid loss then uses 0)."""
  check(name, logits)
  if name == 'softmax':
    if b is not None:
      raise ValueError(
        'The softmax loss takes no bias b (a constant added to every logit cancels in the '
        "softmax): build the model without one, or use loss='sigmoid'."
      )
    return softmax_loss(zimg, ztxt, t, axis=axis)
  b = 0.0 if b is None else b
  if logits == 'chunked':
    return chunked_sigmoid_loss(zimg, ztxt, t, b, axis=axis)
  return sigmoid_loss(zimg, ztxt, t, b, axis=axis)
