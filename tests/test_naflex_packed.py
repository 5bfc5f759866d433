"""NaFlex Patch n' Pack, the model side: rows of several images (`NaFlexViT`'s
`images_per_row`), checked against the same images one a row, the unpacked path that
tests/test_naflex.py checks against transformers and timm."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax.models.naflex import NaFlexViT
from vit_jax.models.two_towers import TwoTowerModel, image_inputs

PATCH, WIDTH, CLASSES = 4, 16, 5
TRANSFORMER = {'num_layers': 1, 'mlp_dim': 32, 'num_heads': 2}
TRANSFORMER |= {'dropout_rate': 0.0, 'attention_dropout_rate': 0.0}
# Seven images' patch grids (rows, columns): wide, tall, square, one patch high, ...
GRIDS = ((2, 6), (4, 3), (3, 3), (1, 5), (5, 2), (2, 2), (3, 4))
# The last one with two patches dropped, as token dropping leaves it (its bottom-right kept).
DROPPED = {6: (1, 5)}
# Three rows of mixed sizes (33, 15 and 14 of 40 tokens), at most 3 images a row, then a row
# with none; slot 3 of rows 1 and 2 is empty.
ROWS, TOKENS, K, SLOTS = ((0, 1, 2), (3, 4), (5, 6), ()), 40, 3, 12


def _images(seed=0):
  """Each image's patches in [-1, 1] with its rows and columns, row-major, less `DROPPED`."""
  rng = np.random.default_rng(seed)
  images = []
  for i, (rows, cols) in enumerate(GRIDS):
    keep = np.setdiff1d(np.arange(rows * cols), DROPPED.get(i, ()))
    y, x = np.divmod(keep, cols)
    images.append((rng.uniform(-1, 1, (len(keep), PATCH * PATCH * 3)), y, x))
  return images


def _row(images, tokens, rng=None):
  """One float32 (tokens, P + 3) row: the images' patches, then segment (slot k = k + 1),
  row and column, padded with zeros; with `rng` the tokens in a random order."""
  values = [np.concatenate([p, np.stack([np.full(len(p), k + 1), y, x], -1)], -1)
            for k, (p, y, x) in enumerate(images)]  # fmt: skip
  values = np.concatenate(values) if values else np.zeros((0, PATCH * PATCH * 3 + 3))
  if rng is not None:
    values = values[rng.permutation(len(values))]
  return np.pad(values, ((0, tokens - len(values)), (0, 0))).astype(np.float32)


def _unpacked(images):
  """One image a row, today's layout (ptype 1 for a patch)."""
  return np.stack([_row([image], SLOTS) for image in images])


def _packed(images, seed=1):
  """`ROWS` of the images, each row's tokens shuffled (the tower reads segments, not order)."""
  rng = np.random.default_rng(seed)
  return np.stack([_row([images[i] for i in row], TOKENS, rng) for row in ROWS])


def _slots():
  """(row, slot) of each image in `ROWS`."""
  return [(r, k) for r, row in enumerate(ROWS) for k in range(len(row))]


def _tower(classifier, num_classes):
  """A tiny NaFlex tower and random parameters (normal, 0.3: the probe, head and LayerNorms
  far from their initial values)."""
  model = NaFlexViT(
    num_classes, PATCH, WIDTH, TRANSFORMER, classifier=classifier, posemb_grid=4, posemb_canvas=8
  )
  shapes = jax.eval_shape(model.init, jax.random.key(0), _unpacked(_images()))['params']
  rng = np.random.default_rng(2)
  params = jax.tree.map(lambda s: rng.normal(0, 0.3, s.shape).astype(np.float32), shapes)
  return model, params


def _outputs(classifier, num_classes):
  """A tiny NaFlex tower, its parameters and its outputs on the seven images: one a row
  (`alone`), one a row as slot 1 of 1 (`one_slot`) and packed in `ROWS`."""
  model, params = _tower(classifier, num_classes)

  @jax.jit
  def outputs(p, unpacked, packed):
    return {
      'alone': model.apply({'params': p}, unpacked),
      'one_slot': model.apply({'params': p}, unpacked, images_per_row=1),
      'packed': model.apply({'params': p}, packed, images_per_row=K),
    }

  out = outputs(params, _unpacked(_images()), _packed(_images()))
  return model, params, {k: np.asarray(v) for k, v in out.items()}


@pytest.fixture(scope='module')
def map_classifier():
  """MAP pooling with a head of `CLASSES`."""
  return _outputs('map', CLASSES)


@pytest.fixture(scope='module')
def gap_tower():
  """GAP pooling, no head: the pooled features."""
  return _outputs('gap', None)


@pytest.fixture(params=['map_classifier', 'gap_tower'])
def tower(request):
  return request.getfixturevalue(request.param)


def test_an_image_packed_with_others_gives_its_features_alone(tower):
  """Seven images of mixed sizes (one with patches dropped) in three rows of up to three,
  tokens shuffled, and an empty row: each slot's output equals the image's one a row to
  1e-5; the empty slots' are finite."""
  alone, packed = tower[2]['alone'], tower[2]['packed']
  assert packed.shape == (len(ROWS), K, alone.shape[-1])
  for i, (r, k) in enumerate(_slots()):
    np.testing.assert_allclose(packed[r, k], alone[i], atol=1e-5, rtol=0, err_msg=f'image {i}')
  assert np.isfinite(packed).all()
  different = ~np.eye(len(GRIDS), dtype=bool)
  assert np.abs(alone[:, None] - alone[None]).max(-1)[different].min() > 1e-2  # the images differ


def test_one_image_a_row_as_one_slot_is_the_unpacked_output_bit_for_bit(tower):
  """images_per_row=1 on today's rows (ptype 1 = slot 1) gives today's output exactly."""
  alone, one_slot = tower[2]['alone'], tower[2]['one_slot']
  assert one_slot.shape == (len(GRIDS), 1, alone.shape[-1])
  np.testing.assert_array_equal(one_slot[:, 0], alone)


def _packed_labels():
  """Each image's label (its index mod CLASSES) in its slot, and which slots hold one."""
  labels, valid = np.zeros((len(ROWS), K), np.int32), np.zeros((len(ROWS), K), bool)
  for i, (r, k) in enumerate(_slots()):
    labels[r, k], valid[r, k] = i % CLASSES, True
  return labels, valid


def test_gradients_with_empty_slots_are_finite(map_classifier):
  """The packed classifier's softmax cross-entropy over the valid slots, the empty slots and
  the empty row masked out by `where` as a task does (a NaN there would still poison the
  gradient): the loss is that of the images' logits one a row, every gradient finite."""
  model, params, out = map_classifier
  labels, valid = _packed_labels()

  def loss(p):
    logits = model.apply({'params': p}, _packed(_images()), images_per_row=K)
    losses = -jnp.take_along_axis(jax.nn.log_softmax(logits), labels[..., None], -1)[..., 0]
    return jnp.sum(jnp.where(valid, losses, 0.0))

  value, grads = jax.jit(jax.value_and_grad(loss))(params)
  alone = out['alone'].astype(np.float64)
  log_probs = alone - np.log(np.exp(alone).sum(-1, keepdims=True))
  want = -log_probs[np.arange(len(GRIDS)), np.arange(len(GRIDS)) % CLASSES].sum()
  np.testing.assert_allclose(value, want, rtol=1e-5)
  for path, g in jax.tree_util.tree_leaves_with_path(grads):
    assert np.isfinite(g).all() and np.abs(g).max() > 0, jax.tree_util.keystr(path)


def _normalized(z):
  return z / np.linalg.norm(z, axis=-1, keepdims=True)


def test_a_packed_two_tower_call_embeds_each_image_as_unpacked(map_classifier):
  """A NaFlex image-text model with the MAP tower as its image tower: zimg of packed rows
  is (rows, K, D), each slot the image's zimg one a row (its tower output, normalised) to
  1e-5, the empty slots' finite; its family's image features of the rows are the head's
  input, and the NaFlex classifier family's too."""
  from vit_jax import families

  classifier, params, out = map_classifier
  image = {'patch_size': PATCH, 'hidden_size': WIDTH, 'transformer': TRANSFORMER}
  image |= {'posemb_grid': 4, 'posemb_canvas': 8}
  text = {'width': 16, 'num_layers': 1, 'mlp_dim': 32, 'num_heads': 2, 'vocab_size': 64}
  two_towers = TwoTowerModel(image, text, 'text_transformer', 'naflex', out_dim=(CLASSES, 8))
  both = {'img': params, 't': np.zeros(1, np.float32)}
  features = families.of_module(two_towers).image_features(two_towers)
  classifier_features = families.of_module(classifier).image_features(classifier)

  @jax.jit
  def packed(p, x):
    zimg = two_towers.apply({'params': p}, images=x, images_per_row=K)[0]
    return zimg, features(p, x, K), classifier_features(p['img'], x, images_per_row=K)

  zimg, pre_logits, same = (np.asarray(a) for a in packed(both, _packed(_images())))
  assert zimg.shape == (len(ROWS), K, CLASSES) and pre_logits.shape == (len(ROWS), K, WIDTH)
  assert np.isfinite(zimg).all()
  np.testing.assert_array_equal(same, pre_logits)
  for i, (r, k) in enumerate(_slots()):
    np.testing.assert_allclose(zimg[r, k], _normalized(out['alone'][i]), atol=1e-5, rtol=0)
  head = params['head']
  np.testing.assert_allclose(
    zimg, _normalized(pre_logits @ head['kernel'] + head['bias']), atol=1e-5, rtol=0
  )


def test_packing_a_vit_tower_or_a_negative_count_is_refused():
  """images_per_row needs a NaFlex tower, and is 0 or more: one-line ValueErrors."""
  with pytest.raises(ValueError, match="packs NaFlex images; image_model='vit'"):
    image_inputs('vit', np.zeros((1, 8, 8, 3)), 2)
  model = NaFlexViT(None, PATCH, WIDTH, TRANSFORMER, posemb_grid=4)
  with pytest.raises(ValueError, match='images_per_row=-1'):
    model.init(jax.random.key(0), _unpacked(_images()), images_per_row=-1)
