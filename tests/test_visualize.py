"""visualize: the paper's Figure 6/7 computations on hand-built inputs, and the PNGs."""

import itertools
import math
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from PIL import Image

import vit_jax
from vit_jax import checkpoint
from vit_jax.inference import attention, figures
from vit_jax.models import get_config, model_from_config

REPO = Path(__file__).resolve().parents[1]


def _mean_pairwise_distance(rows, cols, patch):
  """The mean distance between patch centres over all ordered pairs (self pairs included)."""
  centres = [(patch * r, patch * c) for r in range(rows) for c in range(cols)]
  total = sum(math.dist(a, b) for a, b in itertools.product(centres, centres))
  return total / len(centres) ** 2


def test_attention_on_itself_has_distance_zero():
  grid, heads, tokens = (3, 4), 5, 12
  attn = np.broadcast_to(np.eye(tokens), (2, heads, tokens, tokens))
  np.testing.assert_array_equal(attention.mean_attention_distance(attn, grid, 16), np.zeros(5))
  # With a class token that takes half of every row: still zero after it is left out.
  with_cls = np.zeros((heads, tokens + 1, tokens + 1))
  with_cls[:, :, 0] = 0.5
  with_cls[:, 1:, 1:] += 0.5 * np.eye(tokens)
  with_cls[:, 0, 0] = 1.0
  np.testing.assert_allclose(attention.mean_attention_distance(with_cls, grid, 16), 0, atol=1e-12)


@pytest.mark.parametrize('grid,patch', [((3, 4), 16), ((14, 14), 16), ((2, 2), 32)])
def test_uniform_attention_gives_the_mean_distance_of_the_grid(grid, patch):
  tokens = grid[0] * grid[1] + 1  # class token included: uniform over all of them
  attn = np.full((1, 3, tokens, tokens), 1 / tokens)
  expected = _mean_pairwise_distance(*grid, patch)
  np.testing.assert_allclose(attention.mean_attention_distance(attn, grid, patch), [expected] * 3)
  if grid == (2, 2):  # by hand: from each corner 0, 32, 32 and 32*sqrt(2)
    np.testing.assert_allclose(expected, (64 + 32 * math.sqrt(2)) / 4)


def test_attention_to_a_neighbour_has_distance_one_patch():
  rows, cols = 3, 5
  attn = np.zeros((2, rows * cols, rows * cols))
  for r, c in itertools.product(range(rows), range(cols)):
    q = r * cols + c
    attn[0, q, q + 1 if c + 1 < cols else q - 1] = 1  # the horizontal neighbour
    attn[1, q, (r + 1 if r + 1 < rows else r - 1) * cols + c] = 1  # the vertical one
  np.testing.assert_allclose(attention.mean_attention_distance(attn, (rows, cols), 16), [16, 16])


def test_attention_with_the_wrong_token_count_is_an_error():
  with pytest.raises(ValueError, match=r'11 tokens; a 3x3 grid needs 9 \(or 10'):
    attention.mean_attention_distance(np.ones((2, 11, 11)), (3, 3), 16)


def test_posemb_similarity_of_a_hand_built_table():
  rows, cols = 2, 3
  # Each column is an angle of 60 degrees more; rows are scaled copies (same direction).
  angle = np.pi / 3 * np.arange(cols)
  table = [(r + 1) * np.array([np.cos(a), np.sin(a), 0.0]) for r in range(rows) for a in angle]
  posemb = np.concatenate([[[7.0, -3.0, 5.0]], table])[None]  # with a class row, (1, 7, 3)
  sim = attention.posemb_similarity(posemb, (rows, cols))
  assert sim.shape == (rows, cols, rows, cols)
  for r1, c1, r2, c2 in itertools.product(range(rows), range(cols), range(rows), range(cols)):
    np.testing.assert_allclose(sim[r1, c1, r2, c2], np.cos(np.pi / 3 * (c1 - c2)), atol=1e-12)
  np.testing.assert_allclose(sim[0, 0, 0, 2], -0.5)


def test_rollout_of_identity_attention_is_the_identity():
  eye = np.broadcast_to(np.eye(6), (2, 4, 6, 6))  # (batch, heads, T, T)
  np.testing.assert_array_equal(
    attention.rollout([eye, eye, eye]), np.broadcast_to(np.eye(6), (2, 6, 6))
  )


def test_rollout_adds_the_residual_and_multiplies_layers():
  t = 4
  uniform = np.full((2, t, t), 1 / t)  # two heads
  one = 0.5 * np.eye(t) + 0.5 / t  # (A + I) renormalised
  np.testing.assert_allclose(attention.rollout([uniform]), one)
  # Heads are averaged before the residual: a head on itself and a uniform one.
  mixed = np.stack([np.eye(t), np.full((t, t), 1 / t)])
  expected = (0.5 * np.eye(t) + 0.5 / t + np.eye(t)) / 2
  np.testing.assert_allclose(attention.rollout([mixed, uniform]), one @ expected)
  joint = attention.rollout([mixed, uniform])
  np.testing.assert_allclose(joint.sum(-1), 1)


def test_rollout_map_reads_the_class_token_row():
  joint = np.zeros((5, 5))
  joint[0] = [0.5, 0.1, 0.2, 0.0, 0.2]
  np.testing.assert_allclose(attention.rollout_map(joint, (2, 2)), [[0.5, 1.0], [0.0, 1.0]])


def test_patch_filter_pcs_recover_the_directions_of_variation():
  rng = np.random.default_rng(0)
  ph, pw, c, d = 4, 4, 3, 200
  u, v = np.linalg.qr(rng.standard_normal((ph * pw * c, 2)))[0].T  # orthonormal directions
  # Zero-mean, uncorrelated coefficients with variances 9:1, so the PCs are exactly u, v.
  m = rng.standard_normal((d, 2))
  a, b = np.linalg.qr(m - m.mean(axis=0))[0].T * np.array([[3.0], [1.0]])
  filters = 5.0 + a[:, None] * u + b[:, None] * v  # (D, ph*pw*c), offset removed by centring
  kernel = filters.T.reshape(ph, pw, c, d)
  pcs = attention.patch_filter_pcs(kernel, num_components=2)
  assert pcs.shape == (2, ph, pw, c)
  np.testing.assert_allclose(abs(pcs[0].ravel() @ u), 1, atol=1e-9)
  np.testing.assert_allclose(abs(pcs[1].ravel() @ v), 1, atol=1e-9)
  assert pcs[0].ravel()[np.argmax(abs(pcs[0]))] > 0  # sign convention
  assert attention.patch_filter_pcs(kernel).shape[0] == 28


def _tiny_checkpoint(tmp_path, random_params, resolution=64):
  """A 2-layer, 16-pixel-patch ViT (unregistered) with random weights, as a .npz."""
  config = get_config('testing')
  model = model_from_config(config, num_classes=3, transformer={'num_layers': 2})
  x = np.zeros((1, resolution, resolution, 3), np.float32)
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), x, train=False))['params']
  path = tmp_path / 'tiny.npz'
  checkpoint.save_npz(random_params(shapes, scale=0.5), path)
  return path


def test_attention_weights_come_from_every_layer(tmp_path, random_params):
  loaded = vit_jax.load(_tiny_checkpoint(tmp_path, random_params))
  assert loaded.grid == (4, 4) and loaded.patch_pixels == 16
  images = np.random.default_rng(0).uniform(-1, 1, (3, 64, 64, 3)).astype(np.float32)
  attn = attention.attention_weights(loaded, images)
  assert len(attn) == 2
  for a in attn:
    assert a.shape == (3, 2, 17, 17)
    np.testing.assert_allclose(a.sum(-1), 1, atol=1e-5)


def _png_size(path):
  with Image.open(path) as im:
    return im.size


@pytest.mark.slow
def test_cli_writes_every_figure_at_its_size(tmp_path, random_params):
  path = _tiny_checkpoint(tmp_path, random_params)
  rng = np.random.default_rng(1)
  images = []
  for name in ('cat', 'dog'):
    images.append(tmp_path / f'{name}.png')
    Image.fromarray(rng.integers(0, 256, (40, 50, 3), dtype=np.uint8)).save(images[-1])
  bad = tmp_path / 'notes.png'
  bad.write_text('not an image')
  out = tmp_path / 'figures'
  argv = ['--checkpoint', str(path), '--out', str(out)]
  argv += [f'--image={p}' for p in (images[0], bad, images[1])]
  proc = subprocess.run(
    [sys.executable, '-m', 'vit_jax.visualize', *argv],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
    env={**os.environ, 'JAX_PLATFORMS': 'cpu'},
  )
  assert proc.returncode == 1, proc.stderr  # the bad image
  assert [line for line in proc.stderr.splitlines() if line.startswith('error:')] == [
    f'error: {bad}: cannot read image (cannot identify image file {str(bad)!r})'
  ]
  expected = {
    'patch_filters.png': figures.SIZES['patch_filters'],
    'posemb_similarity.png': figures.SIZES['posemb_similarity'],
    'attention_distance.png': figures.SIZES['attention_distance'],
    'attention_rollout_cat.png': figures.SIZES['attention_rollout'],
    'attention_rollout_dog.png': figures.SIZES['attention_rollout'],
  }
  assert sorted(p.name for p in out.iterdir()) == sorted(expected)
  for name, size in expected.items():
    with Image.open(out / name) as im:
      assert im.size == size, name
      pixels = np.asarray(im.convert('RGB')).reshape(-1, 3)
    assert len(np.unique(pixels, axis=0)) > 100, name  # drawn, not blank
    assert f'wrote {out / name}' in proc.stdout


def test_without_images_only_the_weight_figures_are_drawn(tmp_path, random_params):
  loaded = vit_jax.load(_tiny_checkpoint(tmp_path, random_params, resolution=32))
  written, errors = figures.visualize(loaded, tmp_path / 'out')
  assert errors == []
  assert [p.name for p in written] == ['patch_filters.png', 'posemb_similarity.png']
  assert _png_size(written[1]) == figures.SIZES['posemb_similarity']
