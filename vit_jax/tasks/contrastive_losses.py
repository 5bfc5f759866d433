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

Packed batches (NaFlex Patch n' Pack: rows of up to K images, some slots empty) give every
form a validity `valid` (n,) bool or 0/1 beside the embeddings: an invalid pair is in no row
or column of the logits, neither a positive nor a negative, and the loss and the metrics are
the means over the V valid pairs of the global batch (V positives, V (V - 1) negatives), so
the loss and gradients are those of the batch with the invalid pairs removed (tested to
1e-6). An invalid pair's embeddings are zeroed first: whatever an empty slot holds (NaN
included) reaches no number, and their gradient is 0. Under shard_map the validity travels
with the embeddings (gathered, or round the ring); a batch without a valid pair gives 0,
not NaN. None (every pair valid) adds no operation: bit for bit the numbers without a mask.

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


# The validity of the pairs (`valid`, the module's docstring). None, every pair valid, adds
# no operation: the helpers below then compute what the losses computed before masks, bit for
# bit (a mask of ones rounds a few sums apart, 1 ulp, as XLA fuses the masks into them).


def _valid_pairs(zimg, ztxt, valid) -> tuple[jax.Array, jax.Array, jax.Array | None]:
  """The embeddings as float32, an invalid pair's zeroed (whatever it held, even NaN, reaches
  no loss or gradient), and the (n,) bool validity of the pairs (None: all valid)."""
  zimg, ztxt = zimg.astype(jnp.float32), ztxt.astype(jnp.float32)
  if valid is None:
    return zimg, ztxt, None
  valid = jnp.asarray(valid).astype(bool)
  keep = lambda z: jnp.where(valid[:, None], z, 0.0)
  return keep(zimg), keep(ztxt), valid


def _where(mask: jax.Array | None, x: jax.Array, other) -> jax.Array:
  """`x` where `mask` holds, else `other`; `x` where there is no mask (None)."""
  return x if mask is None else jnp.where(mask, x, other)


def _pair_mask(rows: jax.Array | None, cols: jax.Array | None) -> jax.Array | None:
  """The (n, B) validity of the pairs of valid `rows` (n,) and `cols` (B,), or None."""
  return None if rows is None else rows[:, None] & cols


def _gathered(valid: jax.Array | None, axis: str | None) -> jax.Array | None:
  """The global batch's validity (the columns of the logits), or None."""
  return None if valid is None else _gather(valid, axis)[0]


def _count(valid: jax.Array | None, n: int, axis: str | None) -> jax.Array | int:
  """The number of valid pairs of the global batch, of n pairs a device: a static int with
  every pair valid (None)."""
  if valid is None:
    return n * (1 if axis is None else jax.lax.axis_size(axis))
  return _sum(valid.astype(jnp.float32), axis)


def _per(total: jax.Array, count: jax.Array | int) -> jax.Array:
  """`total` / `count`, a counted count at least 1: a batch without valid pairs (sums 0)
  gives 0, not NaN."""
  return total / (count if isinstance(count, int) else jnp.maximum(count, 1.0))


def _valid_mean(x: jax.Array, valid: jax.Array | None, axis: str | None) -> jax.Array:
  """The mean of per-row values `x` over the global batch's valid rows (all: None)."""
  if valid is None:
    return _mean(x, axis)
  return _per(_sum(jnp.where(valid, x, jnp.zeros_like(x)), axis), _count(valid, len(x), axis))


def _logits(rows: jax.Array, cols: jax.Array, scale: jax.Array, bias=0.0) -> jax.Array:
  dot = jnp.dot(rows, cols.T, precision=jax.lax.Precision.HIGHEST)
  return scale * dot + bias


def _positives(logits: jax.Array, offset) -> jax.Array:
  """(n, B) mask of the positive pairs: row i's is column offset + i."""
  n, size = logits.shape
  return jnp.arange(size)[None, :] == (offset + jnp.arange(n))[:, None]


# The metrics below read the logits through stop_gradient: they are reported, not trained
# (and `lax.pmax` has no derivative).


def _row_top1(logits: jax.Array, pos: jax.Array, rows, cols, axis: str | None) -> jax.Array:
  """Fraction of the valid rows (`rows` (n,) bool) whose positive has the largest logit of
  the row's valid columns (`cols` (B,)); ties count as hits."""
  logits = jax.lax.stop_gradient(logits)
  positive = jnp.max(jnp.where(pos, logits, -jnp.inf), axis=-1)
  largest = jnp.max(_where(cols, logits, -jnp.inf), axis=-1)
  return _valid_mean(positive >= largest, rows, axis)


def _column_top1(logits: jax.Array, offset, rows, axis: str | None) -> jax.Array:
  """Fraction of the valid columns whose positive has the largest logit of the column's
  valid rows, from this device's rows (n, B) (valid: `rows` (n,) bool): the column maxima
  are combined over devices (B floats), so the text->image accuracy needs no second gather
  of the images. Column offset + i is valid where row i is (one pair)."""
  logits = jax.lax.stop_gradient(logits)
  n = logits.shape[0]
  column_max = jnp.max(_where(None if rows is None else rows[:, None], logits, -jnp.inf), 0)
  if axis is not None:
    column_max = jax.lax.pmax(column_max, axis)
  mine = jax.lax.dynamic_slice_in_dim(column_max, offset, n)  # the columns of my rows' texts
  positive = jnp.max(jnp.where(_positives(logits, offset), logits, -jnp.inf), axis=-1)
  return _valid_mean(positive >= mine, rows, axis)


def _pair_logits(logits: jax.Array, pos: jax.Array, rows, cols, axis: str | None) -> Metrics:
  """The mean logit of the V positive pairs and of the V (V - 1) negative ones of the V
  valid pairs (rows (n,) and columns (B,) bool)."""
  logits = jax.lax.stop_gradient(_where(_pair_mask(rows, cols), logits, 0.0))
  positive = _sum(jnp.where(pos, logits, 0.0), axis)
  return _pair_means(positive, _sum(logits, axis), _count(rows, len(logits), axis))


def _pair_means(positive, total, count) -> Metrics:
  """`pos_logit` and `neg_logit` from the sums of the positive and of all valid pairs'
  logits, and the number of valid pairs `count` (V pairs: V positives, V (V - 1) negatives)."""
  return {
    'pos_logit': _per(positive, count),
    'neg_logit': _per(total - positive, count * (count - 1)),
  }


def softmax_loss(
  zimg: jax.Array, ztxt: jax.Array, t: jax.Array, *, axis: str | None = None,
  valid: jax.Array | None = None,
) -> tuple[jax.Array, Metrics]:  # fmt: skip
  """CLIP/LiT's symmetric softmax loss of the global batch, and its metrics.

  zimg, ztxt: (n, d) L2-normalised embeddings of n pairs (the global batch, or under
  `jax.shard_map` over `axis` this device's rows); t: the log temperature, shape () or (1,);
  valid: (n,) bool or 0/1, the pairs that count (the module's docstring), None: all.
  Metrics: `temperature` exp(t), `i2t_loss` and `t2i_loss` (the two cross-entropies, whose
  mean is the loss), `i2t_acc` and `t2i_acc` (top-1 over the B candidates), `pos_logit` and
  `neg_logit`.
  """
  zimg, ztxt, valid = _valid_pairs(zimg, ztxt, valid)
  scale = jnp.exp(_scalar(t))
  cols_valid = _gathered(valid, axis)
  metrics = {'temperature': scale}
  for name, rows, cols in (('i2t', zimg, ztxt), ('t2i', ztxt, zimg)):
    cols, offset = _gather(cols, axis)
    logits = _logits(rows, cols, scale)
    pos = _positives(logits, offset)
    # An invalid candidate's logit is the lowest float: exp of it is 0 in every valid row,
    # and a batch with no valid pair stays finite (its loss 0, no NaN gradient).
    candidates = _where(cols_valid, logits, jnp.finfo(jnp.float32).min)
    nll = jax.nn.logsumexp(candidates, axis=-1) - jnp.sum(jnp.where(pos, logits, 0.0), axis=-1)
    metrics[f'{name}_loss'] = _valid_mean(nll, valid, axis)
    metrics[f'{name}_acc'] = _row_top1(logits, pos, valid, cols_valid, axis)
    if name == 'i2t':
      metrics.update(_pair_logits(logits, pos, valid, cols_valid, axis))
  loss = 0.5 * (metrics['i2t_loss'] + metrics['t2i_loss'])
  return loss, metrics


def sigmoid_loss(
  zimg: jax.Array, ztxt: jax.Array, t: jax.Array, b: jax.Array, *, axis: str | None = None,
  valid: jax.Array | None = None,
) -> tuple[jax.Array, Metrics]:  # fmt: skip
  """SigLIP's sigmoid loss of the global batch, and its metrics.

  zimg, ztxt: (n, d) L2-normalised embeddings of n pairs (the global batch, or under
  `jax.shard_map` over `axis` this device's rows); t: the log temperature and b: the bias,
  each of shape () or (1,); valid: (n,) bool or 0/1, the pairs that count (the module's
  docstring), None: all. Only the texts travel: each device scores its images against
  all B texts. Metrics: `temperature` exp(t), `bias` b, `i2t_acc` and `t2i_acc` (top-1 over
  the B candidates), `pos_logit` and `neg_logit`.
  """
  zimg, ztxt, valid = _valid_pairs(zimg, ztxt, valid)
  scale, bias = jnp.exp(_scalar(t)), _scalar(b)
  texts, offset = _gather(ztxt, axis)
  cols_valid = _gathered(valid, axis)
  logits = _logits(zimg, texts, scale, bias)
  pos = _positives(logits, offset)
  labels = jnp.where(pos, 1.0, -1.0)
  terms = jax.nn.log_sigmoid(labels * logits)
  nll = -jnp.sum(_where(cols_valid, terms, 0.0), axis=-1)
  metrics = {
    'temperature': scale,
    'bias': bias,
    'i2t_acc': _row_top1(logits, pos, valid, cols_valid, axis),
    't2i_acc': _column_top1(logits, offset, valid, axis),
    **_pair_logits(logits, pos, valid, cols_valid, axis),
  }
  return _valid_mean(nll, valid, axis), metrics


# ----- the chunked sigmoid loss -----
# A tile's statistics, all it leaves of its logits for the metrics: `sums` (2,) the sum of
# its valid pairs' logits and of its positive ones; `rows` (2, n) and `cols` (2, c) each
# row's and column's largest valid logit and positive logit (-inf where it has none: an
# invalid row or column has no positive).
Stats = tuple[jax.Array, jax.Array, jax.Array]


def _tile(rows, texts, scale, bias, offset, rows_valid, texts_valid) -> tuple[jax.Array, Stats]:
  """The sum of the sigmoid loss's terms over one tile's valid pairs, row i's positive at
  column offset + i, and the tile's statistics."""
  logits = _logits(rows, texts, scale, bias)
  pair = _pair_mask(rows_valid, texts_valid)
  pos = _positives(logits, offset)
  nll = -jnp.sum(_where(pair, jax.nn.log_sigmoid(jnp.where(pos, logits, -logits)), 0.0))
  logits = jax.lax.stop_gradient(logits)
  pos = _where(pair, pos, False)
  positive = jnp.where(pos, logits, -jnp.inf)
  sums = jnp.stack([jnp.sum(_where(pair, logits, 0.0)), jnp.sum(jnp.where(pos, logits, 0.0))])
  largest = _where(pair, logits, -jnp.inf)
  tops = [jnp.stack([jnp.max(largest, axis), jnp.max(positive, axis)]) for axis in (1, 0)]
  return nll, (sums, *tops)


def _block(rows, texts, scale, bias, offset, valid, chunk: int) -> tuple[jax.Array, Stats]:
  """`_tile` over all of `texts`, in tiles of the largest divisor of their count up to
  `chunk`; each tile's logits are recomputed in the backward pass, not kept. `valid`: the
  (rows, texts) validity."""
  m, d = texts.shape
  size = max(k for k in range(1, min(chunk, m) + 1) if m % k == 0)
  tile = jax.checkpoint(_tile)
  rows_valid, texts_valid = valid

  def body(carry, x):
    i, cols, cols_valid = x
    nll, (sums, top, col) = tile(rows, cols, scale, bias, offset - i * size, rows_valid, cols_valid)
    return (carry[0] + nll, carry[1] + sums, jnp.maximum(carry[2], top)), col

  zero = jnp.zeros_like(rows, shape=())  # typed as `rows` (device-varying in shard_map)
  init = (
    zero,
    jnp.zeros_like(rows, shape=(2,)),
    jnp.full_like(rows, -jnp.inf, shape=(2, len(rows))),
  )
  tiles = (texts.reshape(m // size, size, d), _tiled(texts_valid, m // size))
  (nll, sums, top), cols = jax.lax.scan(body, init, (jnp.arange(m // size), *tiles))
  return nll, (sums, top, cols.transpose(1, 0, 2).reshape(2, m))


def _tiled(valid: jax.Array | None, tiles: int) -> jax.Array | None:
  """A block's validity split into `tiles` tiles, or None."""
  return None if valid is None else valid.reshape(tiles, -1)


def _next(x, axis: str):
  """`x` of the previous device in the ring, over `axis`."""
  devices = jax.lax.axis_size(axis)
  return jax.lax.ppermute(x, axis, [(i, (i + 1) % devices) for i in range(devices)])


def _ring(zimg, ztxt, scale, bias, valid, axis: str, chunk: int) -> tuple[jax.Array, Stats]:
  """This device's images against every device's texts, which visit in turn with their
  validity: its sum of terms, its rows' statistics, and the column statistics of the block
  it holds last (a block's travel with its texts, complete once they have visited every
  device)."""
  n = zimg.shape[0]
  nll, stats = _block(zimg, ztxt, scale, bias, 0, (valid, valid), chunk)

  def visit(carry, _):
    nll, (sums, top, col), block = carry
    block, col = _next((block, col), axis)
    texts, texts_valid = block  # offset n: no positives
    more, (s, t, c) = _block(zimg, texts, scale, bias, n, (valid, texts_valid), chunk)
    return (nll + more, (sums + s, jnp.maximum(top, t), jnp.maximum(col, c)), block), None

  steps = jax.lax.axis_size(axis) - 1
  (nll, stats, _), _ = jax.lax.scan(visit, (nll, stats, (ztxt, valid)), length=steps)
  return nll, stats


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _ring_loss(zimg, ztxt, scale, bias, valid, axis: str, chunk: int) -> tuple[jax.Array, Stats]:
  return _ring(zimg, ztxt, scale, bias, valid, axis, chunk)


def _ring_fwd(zimg, ztxt, scale, bias, valid, axis, chunk):
  return _ring(zimg, ztxt, scale, bias, valid, axis, chunk), (zimg, ztxt, scale, bias, valid)


def _ring_bwd(axis, chunk, inputs, cotangents):
  """The ring again: each block's texts visit with their validity and the gradient of their
  terms so far, which the last step brings home; this device's images' gradient stays (the
  statistics have none, nor has the validity)."""
  zimg, ztxt, scale, bias, valid = inputs
  n = zimg.shape[0]

  def visit(carry, k):
    (texts, texts_valid), d_texts, grads = carry
    offset = jnp.where(k == 0, 0, n)  # this device's own texts first, then the others'
    pairs = (valid, texts_valid)
    terms = lambda z, x, s, b: _block(z, x, s, b, offset, pairs, chunk)[0]
    d_zimg, d_block, d_scale, d_bias = jax.vjp(terms, zimg, texts, scale, bias)[1](cotangents[0])
    block, d_texts = _next(((texts, texts_valid), d_texts + d_block), axis)
    return (block, d_texts, jax.tree.map(jnp.add, grads, (d_zimg, d_scale, d_bias))), None

  zeros = jax.tree.map(jnp.zeros_like, (ztxt, (zimg, scale, bias)))
  (_, d_ztxt, (d_zimg, d_scale, d_bias)), _ = jax.lax.scan(
    visit, ((ztxt, valid), *zeros), jnp.arange(jax.lax.axis_size(axis))
  )
  return d_zimg, d_ztxt, d_scale, d_bias, None


_ring_loss.defvjp(_ring_fwd, _ring_bwd)


def chunked_sigmoid_loss(
  zimg: jax.Array, ztxt: jax.Array, t: jax.Array, b: jax.Array, *, axis: str | None = None,
  chunk: int = CHUNK, valid: jax.Array | None = None,
) -> tuple[jax.Array, Metrics]:  # fmt: skip
  """`sigmoid_loss`'s loss and metrics, its logits computed `chunk` texts at a time (the
  module's docstring): O(B) memory per device, under jit over the global batch and under
  `jax.shard_map` over `axis`, where the texts visit every device in a ring (with their
  validity `valid`, as `sigmoid_loss`'s)."""
  zimg, ztxt, valid = _valid_pairs(zimg, ztxt, valid)
  scale, bias = jnp.exp(_scalar(t)), _scalar(b)
  if axis is None:
    nll, (sums, top, col) = _block(zimg, ztxt, scale, bias, 0, (valid, valid), chunk)
  else:
    # Typed device-varying as the images are (a no-op where they are already): the custom
    # VJP returns each device's share of their gradient, which the implicit cast sums.
    zero = jnp.zeros_like(zimg, shape=())
    nll, (sums, top, col) = _ring_loss(zimg, ztxt, scale + zero, bias + zero, valid, axis, chunk)
  count = _count(valid, len(zimg), axis)
  # The columns of the block held last that count are those with a positive (a finite
  # largest positive logit): the valid pairs'.
  t2i = _where(None if valid is None else col[1] > -jnp.inf, col[1] >= col[0], False)
  metrics = {
    'temperature': scale,
    'bias': bias,
    'i2t_acc': _valid_mean(top[1] >= top[0], valid, axis),
    't2i_acc': _per(_sum(t2i, axis), count),
    **_pair_means(_sum(sums[1], axis), _sum(sums[0], axis), count),
  }
  return _per(_sum(nll, axis), count), metrics


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
  *, axis: str | None = None, logits: str = 'gathered', valid: jax.Array | None = None,
) -> tuple[jax.Array, Metrics]:  # fmt: skip
  """The contrastive loss `name` ('softmax' or 'sigmoid') and its metrics, its logits
  `gathered` or (the sigmoid's) `chunked`; `b` is the model's learned bias (None when it has
  none: the sigmoid loss then uses 0); `valid` (n,) the pairs that count, None: all."""
  check(name, logits)
  if name == 'softmax':
    if b is not None:
      raise ValueError(
        'The softmax loss takes no bias b (a constant added to every logit cancels in the '
        "softmax): build the model without one, or use loss='sigmoid'."
      )
    return softmax_loss(zimg, ztxt, t, axis=axis, valid=valid)
  b = 0.0 if b is None else b
  if logits == 'chunked':
    return chunked_sigmoid_loss(zimg, ztxt, t, b, axis=axis, valid=valid)
  return sigmoid_loss(zimg, ztxt, t, b, axis=axis, valid=valid)
