"""The contrastive losses (softmax, sigmoid) against a numpy computation written out pair by
pair, every device's embeddings as negatives, and the shard_map form against the jit form
(losses, metrics, gradients) on 8 devices, on 1 device, and under a permutation of the batch;
the chunked sigmoid loss against the gathered one (losses, metrics, gradients)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from scipy.special import expit, log_expit, logsumexp

from vit_jax import parallel
from vit_jax.tasks import contrastive_losses

BATCH, DIM = 64, 16  # 8 pairs per device on 8 devices
T, B = np.log(10.0), -2.71  # big_vision's siglip_lit_coco init
NAMES = contrastive_losses.LOSSES


def _normalise(x):
  return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def _pairs(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """Normalised embeddings whose texts are noisy copies of their images, so that some but
  not all pairs are each other's top-1 (accuracies strictly between 0 and 1)."""
  rng = np.random.default_rng(seed)
  zimg = rng.standard_normal((BATCH, DIM))
  ztxt = zimg + 1.2 * rng.standard_normal((BATCH, DIM))
  return _normalise(zimg), _normalise(ztxt)


# ----- the numpy oracle, written out from the papers' definitions, pair by pair -----


def _numpy_logits(zimg, ztxt, t, b):
  n = len(zimg)
  logits = np.empty((n, n))
  for i in range(n):
    for j in range(n):
      logits[i, j] = np.exp(t) * np.dot(zimg[i].astype(np.float64), ztxt[j]) + b
  return logits


def _numpy_pair_metrics(logits):
  n = len(logits)
  negatives = [logits[i, j] for i in range(n) for j in range(n) if i != j]
  return {
    'pos_logit': np.mean([logits[i, i] for i in range(n)]),
    'neg_logit': np.mean(negatives),
    'i2t_acc': np.mean([np.argmax(logits[i, :]) == i for i in range(n)]),
    't2i_acc': np.mean([np.argmax(logits[:, j]) == j for j in range(n)]),
  }


def numpy_softmax(zimg, ztxt, t, b=None):
  del b
  logits = _numpy_logits(zimg, ztxt, t, 0.0)
  n = len(logits)
  i2t = np.mean([logsumexp(logits[i, :]) - logits[i, i] for i in range(n)])
  t2i = np.mean([logsumexp(logits[:, j]) - logits[j, j] for j in range(n)])
  metrics = {'temperature': np.exp(t), 'i2t_loss': i2t, 't2i_loss': t2i}
  return (i2t + t2i) / 2, {**metrics, **_numpy_pair_metrics(logits)}


def numpy_sigmoid(zimg, ztxt, t, b):
  logits = _numpy_logits(zimg, ztxt, t, b)
  n = len(logits)
  total = 0.0
  for i in range(n):
    for j in range(n):
      label = 1.0 if i == j else -1.0
      total -= log_expit(label * logits[i, j])
  metrics = {'temperature': np.exp(t), 'bias': b}
  return total / n, {**metrics, **_numpy_pair_metrics(logits)}


ORACLES = {'softmax': numpy_softmax, 'sigmoid': numpy_sigmoid}


# ----- the two forms under test -----


def _bias(name):
  return None if name == 'softmax' else B


@functools.cache
def _jit(name):
  """loss(zimg, ztxt, t, b) on the global batch under jax.jit."""
  return jax.jit(lambda zimg, ztxt, t, b: contrastive_losses.loss(name, zimg, ztxt, t, b))


@functools.cache
def _shard_map(name, mesh):
  """loss(zimg, ztxt, t, b) per device under jax.shard_map over the mesh's data axis."""
  axis = parallel.DATA_AXIS
  fn = functools.partial(contrastive_losses.loss, name, axis=axis)
  specs = (P(axis), P(axis), P(), P())
  return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=specs, out_specs=P()))


def _on_mesh(mesh, zimg, ztxt, name):
  """The arguments placed as a training step sees them: rows split over the data axis."""
  rows, rep = parallel.batch_sharding(mesh), parallel.replicated(mesh)
  b = _bias(name)
  return (
    jax.device_put(zimg, rows),
    jax.device_put(ztxt, rows),
    jax.device_put(np.float32(T), rep),
    None if b is None else jax.device_put(np.float32(b), rep),
  )


def _form(kind, name, mesh):
  return _jit(name) if kind == 'jit' else _shard_map(name, mesh)


@functools.cache
def _grads(fn):
  """The gradient of the loss w.r.t. (zimg, ztxt, t, b), taken outside the compiled form."""
  return jax.jit(jax.grad(lambda *args: fn(*args)[0], argnums=(0, 1, 2, 3)))


def _assert_same(a, b, tol):
  """Losses and metrics equal to `tol`, relative or absolute (a sigmoid loss near 20 has a
  float32 spacing of 2e-6: summed in another order, it agrees to 1e-7 relative)."""
  (la, ma), (lb, mb) = a, b
  np.testing.assert_allclose(la, lb, atol=tol, rtol=tol)
  assert ma.keys() == mb.keys()
  for k in ma:
    np.testing.assert_allclose(ma[k], mb[k], atol=tol, rtol=tol, err_msg=k)


@pytest.mark.parametrize('kind', ['jit', 'shard_map'])
@pytest.mark.parametrize('name', NAMES)
def test_loss_and_metrics_equal_numpy(name, kind):
  mesh = parallel.create_mesh()
  zimg, ztxt = _pairs()
  loss, metrics = _form(kind, name, mesh)(*_on_mesh(mesh, zimg, ztxt, name))
  want_loss, want = ORACLES[name](zimg, ztxt, T, _bias(name))
  assert 0.1 < want['i2t_acc'] < 0.9 and 0.1 < want['t2i_acc'] < 0.9  # the data can tell
  np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
  assert metrics.keys() == want.keys()
  for k in want:
    np.testing.assert_allclose(metrics[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.mark.parametrize('name', NAMES)
def test_every_devices_embeddings_are_negatives(name):
  """Changing the last text (on device 7) changes the gradient at device 0's images (for the
  sigmoid by exactly the change of that one negative pair's term); for the symmetric
  softmax, changing the last image changes the gradient at device 0's texts."""
  mesh = parallel.create_mesh()
  zimg, ztxt = _pairs()
  grads = _grads(_shard_map(name, mesh))
  g_img, g_txt = (np.asarray(g) for g in grads(*_on_mesh(mesh, zimg, ztxt, name))[:2])
  other = _normalise(np.random.default_rng(9).standard_normal(DIM))
  ztxt_7, zimg_7 = ztxt.copy(), zimg.copy()
  ztxt_7[-1] = zimg_7[-1] = other
  change = np.asarray(grads(*_on_mesh(mesh, zimg, ztxt_7, name))[0])[:8] - g_img[:8]
  assert np.abs(change).max() > 1e-3
  if name == 'sigmoid':  # d/dzimg_i of -log_sigmoid(-l_i,63) / B = sigmoid(l_i,63) exp(t) z_63 / B
    term = lambda z: expit(np.exp(T) * zimg[:8] @ z + B)[:, None] * np.exp(T) * z / BATCH
    np.testing.assert_allclose(change, term(other) - term(ztxt[-1]), atol=1e-6)
  else:
    change = np.asarray(grads(*_on_mesh(mesh, zimg_7, ztxt, name))[1])[:8] - g_txt[:8]
    assert np.abs(change).max() > 1e-3


@pytest.mark.parametrize('name', NAMES)
def test_shard_map_equals_jit_on_8_devices(name):
  """Loss, metrics and the gradient w.r.t. the embeddings, t and b, to 1e-6."""
  mesh = parallel.create_mesh()
  args = _on_mesh(mesh, *_pairs(), name)
  jit, sharded = _jit(name), _shard_map(name, mesh)
  _assert_same(sharded(*args), jit(*args), 1e-6)
  for got, want in zip(_grads(sharded)(*args), _grads(jit)(*args), strict=True):
    if want is not None:  # the softmax has no b
      np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)


@pytest.mark.parametrize('kind', ['jit', 'shard_map'])
@pytest.mark.parametrize('name', NAMES)
def test_one_device_equals_eight(name, kind):
  pairs = _pairs()
  one, eight = parallel.create_mesh(jax.devices()[:1]), parallel.create_mesh()
  assert eight.size == 8
  got = _form(kind, name, one)(*_on_mesh(one, *pairs, name))
  _assert_same(got, _form(kind, name, eight)(*_on_mesh(eight, *pairs, name)), 1e-6)


@pytest.mark.parametrize('name', NAMES)
def test_a_permutation_of_the_pairs_across_devices_keeps_the_loss(name):
  """Each device finds its positives at its own offset: moving pairs to other devices (and
  positions) changes nothing, while shuffling the texts alone (breaking the pairs) does."""
  mesh = parallel.create_mesh()
  zimg, ztxt = _pairs()
  perm = np.random.default_rng(1).permutation(BATCH)
  assert (perm // 8 != np.arange(BATCH) // 8).mean() > 0.5  # most pairs change device
  sharded = _shard_map(name, mesh)
  base = sharded(*_on_mesh(mesh, zimg, ztxt, name))
  _assert_same(sharded(*_on_mesh(mesh, zimg[perm], ztxt[perm], name)), base, 1e-6)
  broken = sharded(*_on_mesh(mesh, zimg, ztxt[perm], name))[0]
  assert abs(float(broken) - float(base[0])) > 0.1


def _tower_params(seed: int = 0) -> dict:
  """A stand-in for the two towers: one linear map each, and LiT's (1,)-shaped `t` and `b`."""
  rng = np.random.default_rng(seed)
  return {
    'img': rng.standard_normal((5, DIM)).astype(np.float32),
    'txt': rng.standard_normal((7, DIM)).astype(np.float32),
    't': np.full((1,), T, np.float32),
    'b': np.full((1,), B, np.float32),
  }


def _tower_loss(name, axis=None, logits='gathered'):
  def loss_fn(params, images, texts):
    zimg = images @ params['img']
    ztxt = texts @ params['txt']
    zimg = zimg / jnp.linalg.norm(zimg, axis=-1, keepdims=True)
    ztxt = ztxt / jnp.linalg.norm(ztxt, axis=-1, keepdims=True)
    b = params['b'] if name == 'sigmoid' else None
    return contrastive_losses.loss(name, zimg, ztxt, params['t'], b, axis=axis, logits=logits)[0]

  return loss_fn


@pytest.mark.parametrize(
  'name, logits', [('softmax', 'gathered'), ('sigmoid', 'gathered'), ('sigmoid', 'chunked')]
)
def test_step_gradient_inside_shard_map_equals_jit(name, logits):
  """The trainer's use: the towers applied to this device's rows, then the loss, then the
  gradient w.r.t. the replicated parameters inside shard_map. As they arrive (invariant)
  it is the jit step's gradient with no reduction after; cast to device-varying, their
  psum is (and a pmean is 1/8 of it). The chunked loss's against the gathered jit step's."""
  mesh = parallel.create_mesh()
  axis = parallel.DATA_AXIS
  rows = parallel.batch_sharding(mesh)
  rng = np.random.default_rng(2)
  images = jax.device_put(rng.standard_normal((BATCH, 5), np.float32), rows)
  texts = jax.device_put(rng.standard_normal((BATCH, 7), np.float32), rows)
  params = jax.device_put(_tower_params(), parallel.replicated(mesh))
  want_loss, want = jax.jit(jax.value_and_grad(_tower_loss(name)))(params, images, texts)
  local = jax.value_and_grad(_tower_loss(name, axis, logits))

  def step(params, images, texts):
    loss, invariant = local(params, images, texts)
    _, own_copy = local(jax.lax.pcast(params, axis, to='varying'), images, texts)
    reduced = {'psum': jax.lax.psum(own_copy, axis), 'pmean': jax.lax.pmean(own_copy, axis)}
    return loss, {'invariant': invariant, **reduced}

  specs = (P(), P(axis), P(axis))
  sharded = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=specs, out_specs=P()))
  loss, got = sharded(params, images, texts)
  np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
  for key, scale in (('invariant', 1.0), ('psum', 1.0), ('pmean', 1 / 8)):
    for k in want:
      np.testing.assert_allclose(
        got[key][k], scale * want[k], rtol=1e-6, atol=1e-6, err_msg=f'{key} {k}'
      )
  assert np.abs(want['txt']).max() > 1e-2 and np.abs(want['t']).max() > 1e-3


# Tiles of 2 texts (the largest divisor of a block up to 3): 4 tiles of each device's
# visiting block under shard_map, 32 of the global batch under jit.
CHUNK = 3


@functools.cache
def _chunked(kind, devices=8):
  """(loss, metrics) and the gradient w.r.t. (zimg, ztxt, t, b) of the chunked sigmoid loss
  under `kind` ('jit' or 'shard_map') on the first `devices` devices, in one program."""
  mesh = parallel.create_mesh(jax.devices()[:devices])
  axis = parallel.DATA_AXIS if kind == 'shard_map' else None
  fn = functools.partial(contrastive_losses.chunked_sigmoid_loss, axis=axis, chunk=CHUNK)
  if kind == 'shard_map':
    fn = jax.shard_map(fn, mesh=mesh, in_specs=(P(axis), P(axis), P(), P()), out_specs=P())
  return mesh, jax.jit(jax.value_and_grad(fn, argnums=(0, 1, 2, 3), has_aux=True))


@pytest.mark.parametrize('kind, devices', [('jit', 8), ('shard_map', 8), ('shard_map', 1)])
def test_chunked_sigmoid_equals_gathered(kind, devices):
  """Loss, metrics and the gradient w.r.t. the embeddings, t and b, to 1e-6 (relative for
  those above one: t's gradient is near 35), against the gathered jit form on 8 devices,
  whose numbers the tests above pin."""
  mesh, chunked = _chunked(kind, devices)
  got, got_grads = chunked(*_on_mesh(mesh, *_pairs(), 'sigmoid'))
  eight = parallel.create_mesh()
  args = _on_mesh(eight, *_pairs(), 'sigmoid')
  _assert_same(got, _jit('sigmoid')(*args), 1e-6)
  want_grads = _grads(_jit('sigmoid'))(*args)
  for name, g, w in zip(('zimg', 'ztxt', 't', 'b'), got_grads, want_grads, strict=True):
    np.testing.assert_allclose(g, w, atol=1e-6, rtol=1e-6, err_msg=name)
  assert np.abs(want_grads[0]).max() > 1e-3 and abs(float(want_grads[3])) > 1.0


def test_loss_names():
  z = jnp.asarray(_pairs()[0])
  with pytest.raises(ValueError, match="Unknown contrastive loss 'clip'"):
    contrastive_losses.loss('clip', z, z, 0.0)
  with pytest.raises(ValueError, match='takes no bias b'):
    contrastive_losses.loss('softmax', z, z, 0.0, -10.0)
  with pytest.raises(ValueError, match="the softmax loss is 'gathered' only"):
    contrastive_losses.loss('softmax', z, z, 0.0, logits='chunked')
  with pytest.raises(ValueError, match="Unknown contrastive logits 'tiled'"):
    contrastive_losses.loss('sigmoid', z, z, 0.0, logits='tiled')
  # A model without a bias under the sigmoid loss: b = 0.
  without = jax.jit(lambda z: contrastive_losses.loss('sigmoid', z, z, 1.0))(z)
  _assert_same(without, jax.jit(lambda z: contrastive_losses.sigmoid_loss(z, z, 1.0, 0.0))(z), 0)


def test_a_chunked_softmax_is_a_one_line_config_error():
  """`config.contrastive.logits='chunked'` passes the config check with the sigmoid loss;
  with the softmax loss (gathered only), and a name that is no form, it is one line."""
  from configs import lit_digits
  from vit_jax.train import spec as spec_lib

  def check(variant, logits):
    config = lit_digits.get_config(variant)
    config.contrastive.logits = logits
    spec_lib.check(spec_lib.from_config(config))

  check('sigmoid', 'chunked')
  for variant, logits, match in (
    ('softmax', 'chunked', "^config.contrastive: logits='chunked' .* 'gathered' only"),
    ('sigmoid', 'tiled', r"^config.contrastive.logits='tiled'; expected one of"),
  ):
    with pytest.raises(ValueError, match=match) as stop:
      check(variant, logits)
    assert '\n' not in str(stop.value)


# ----- packed batches: the pairs' validity (`valid`) -----

MASKED_FORMS = [
  ('softmax', 'gathered', 'jit'),
  ('softmax', 'gathered', 'shard_map'),
  ('sigmoid', 'gathered', 'jit'),
  ('sigmoid', 'gathered', 'shard_map'),
  ('sigmoid', 'chunked', 'jit'),
  ('sigmoid', 'chunked', 'shard_map'),
]


@functools.cache
def _masked(name, logits, kind):
  """(loss, metrics) and the gradient w.r.t. (zimg, ztxt, t, b) of the loss with a validity
  `valid` (the 5th argument), on 8 devices (chunked: tiles of `CHUNK`), in one program."""
  axis = parallel.DATA_AXIS if kind == 'shard_map' else None

  def fn(zimg, ztxt, t, b, valid):
    if logits == 'chunked':
      return contrastive_losses.chunked_sigmoid_loss(
        zimg, ztxt, t, b, axis=axis, chunk=CHUNK, valid=valid
      )
    return contrastive_losses.loss(name, zimg, ztxt, t, b, axis=axis, valid=valid)

  if kind == 'shard_map':
    specs = (P(axis), P(axis), P(), P(), P(axis))
    fn = jax.shard_map(fn, mesh=parallel.create_mesh(), in_specs=specs, out_specs=P())
  return jax.jit(jax.value_and_grad(fn, argnums=(0, 1, 2, 3), has_aux=True))


@functools.cache
def _alone(name):
  """The loss without a mask under jit, (loss, metrics) and gradient: the reference."""
  fn = functools.partial(contrastive_losses.loss, name)
  return jax.jit(jax.value_and_grad(fn, argnums=(0, 1, 2, 3), has_aux=True))


def _packed_pairs() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """`_pairs` with 23 of the 64 invalid (empty slots): all 8 of device 3's, 15 elsewhere,
  holding what an empty slot may hold: large values, and a NaN."""
  zimg, ztxt = _pairs()
  rng = np.random.default_rng(5)
  valid = np.ones(BATCH, bool)
  valid[24:32] = False
  valid[rng.choice(np.flatnonzero(valid), 15, replace=False)] = False
  for z in (zimg, ztxt):
    z[~valid] = 50 * rng.standard_normal(((~valid).sum(), DIM))
  zimg[np.flatnonzero(~valid)[0]] = np.nan
  return zimg, ztxt, valid


def _masked_args(zimg, ztxt, valid, name):
  mesh = parallel.create_mesh()
  return (*_on_mesh(mesh, zimg, ztxt, name), jax.device_put(valid, parallel.batch_sharding(mesh)))


@pytest.mark.parametrize('name, logits, kind', MASKED_FORMS)
def test_a_masked_batch_equals_its_valid_pairs_alone(name, logits, kind):
  """The loss, metrics and gradients of a batch whose invalid pairs (empty slots: NaN and
  large values) are masked equal those of the valid pairs alone, the batch of 41 without a
  mask under jit (1e-6); the invalid pairs' embeddings get no gradient; a batch without a
  valid pair gives 0 and no NaN."""
  zimg, ztxt, valid = _packed_pairs()
  fn = _masked(name, logits, kind)
  (loss, metrics), grads = fn(*_masked_args(zimg, ztxt, valid, name))
  alone = (zimg[valid], ztxt[valid], np.float32(T), None if name == 'softmax' else np.float32(B))
  (want_loss, want), want_grads = _alone(name)(*alone)
  _assert_same((loss, metrics), (want_loss, want), 1e-6)
  for i, (g, w) in enumerate(zip(grads, want_grads, strict=True)):
    if i < 2:  # the embeddings': the valid pairs' rows, none at the others
      np.testing.assert_array_equal(np.asarray(g)[~valid], 0.0)
      g = np.asarray(g)[valid]
    if w is not None:
      np.testing.assert_allclose(g, w, atol=1e-6, rtol=1e-6, err_msg=str(i))
  assert np.abs(want_grads[0]).max() > 1e-3 and abs(float(want_grads[2])) > 1e-2
  (loss, metrics), grads = fn(*_masked_args(zimg, ztxt, np.zeros(BATCH, bool), name))
  assert float(loss) == 0.0 and all(np.isfinite(m) for m in metrics.values())
  assert all(not np.any(g) for g in jax.tree.leaves(grads))


@pytest.mark.parametrize('name, logits, kind', MASKED_FORMS)
def test_every_pair_valid_is_no_mask(name, logits, kind):
  """A mask of ones gives the same form's numbers without a mask (the tests above pin them)
  to 1e-6: not bit for bit, as XLA fuses the masks into the sums, which round apart by an ulp
  (without a mask the masks are no operation at all, bit for bit the losses before masks)."""
  mesh = parallel.create_mesh()
  zimg, ztxt = _pairs()
  got, got_grads = _masked(name, logits, kind)(
    *_masked_args(zimg, ztxt, np.ones(BATCH, bool), name)
  )
  args = _on_mesh(mesh, zimg, ztxt, name)
  if logits == 'chunked':
    want, want_grads = _chunked(kind, 8)[1](*args)
  else:
    want, want_grads = _form(kind, name, mesh)(*args), _grads(_form(kind, name, mesh))(*args)
  _assert_same(got, want, 1e-6)
  for g, w in zip(got_grads, want_grads, strict=True):
    if w is not None:
      np.testing.assert_allclose(g, w, atol=1e-6, rtol=1e-6)
