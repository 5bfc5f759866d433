"""`--packing`: the training step's images/s on NaFlex rows packed with several images
(NaViT's Patch n' Pack, vit_jax/data/packing.py) against one image a row, at equal tokens per
batch.

Both batches have `rows` rows of `tokens` patch slots, so both steps do the same work per
token; they differ in how many of the slots hold an image. Image sizes come from NaViT-style
resolution sampling (`packing.navit_lengths`): each image's patch budget uniform over a set,
its aspect ratio log-uniform. One image a row takes the stream's first `rows` images, each
padded to `tokens`; packed, a chunk of `rows * read` images is placed by the pipeline's own
`packing.plan` (first fit, longest first; the images that fit no row wait for no one: they
are left out, as in training). The patch values are random (a step's cost does not depend on
them). Both programs are the trainer's own step (a classification of `num_classes` on
`NaFlexViT`, `programs.trainer`), timed in interleaved rounds.
"""

import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.benchmark import programs
from vit_jax.data import packing
from vit_jax.models.naflex import NaFlexViT

# NaFlex tower of ViT-Ti/16's encoder: big enough that the encoder dominates the step.
TOWER = {
  'num_layers': 12,
  'mlp_dim': 768,
  'num_heads': 3,
  'dropout_rate': 0.0,
  'attention_dropout_rate': 0.0,
}


def tower(num_classes: int, patch: int, width: int = 192) -> NaFlexViT:
  """A NaFlex classifier of ViT-Ti/16's encoder, its position grid resized onto a canvas of
  32 patches a side (an image of 256 patches at 4:1 is 32 x 8)."""
  return NaFlexViT(
    num_classes=num_classes, patch_size=patch, hidden_size=width, transformer=TOWER,
    posemb_canvas=32, head_zeroinit=False,
  )  # fmt: skip


def sequences(lengths: np.ndarray, tokens: int, patch: int, rng) -> np.ndarray:
  """Unpacked sequences (C, tokens, P + 3) of images of `lengths` patches: random values, each
  image's patches on a near-square grid (the step's cost depends on the count alone)."""
  out = np.zeros((len(lengths), tokens, patch * patch * 3 + 3), np.float32)
  for i, n in enumerate(lengths):
    cols = int(np.ceil(np.sqrt(n)))
    y, x = np.divmod(np.arange(n), cols)
    out[i, :n, :-3] = rng.uniform(-1, 1, (n, patch * patch * 3))
    out[i, :n, -3:] = np.stack([np.ones(n), y, x], -1)
  return out


def batches(
  rows: int, tokens: int, images: int, read: int, patch: int, num_classes: int, seed: int
) -> dict[str, dict[str, np.ndarray]]:
  """{'one a row': ..., 'packed': ...}: the two training batches of one image stream
  (`packing.navit_lengths`), random labels."""
  rng = np.random.default_rng(seed)
  lengths = packing.navit_lengths(rows * read, seed, patch=patch)
  chunk = sequences(lengths, tokens, patch, rng)
  labels = rng.integers(0, num_classes, len(lengths)).astype(np.int32)
  packed = packing.pack_rows(chunk, tokens, images, rows, label=labels)
  return {
    'one a row': {'image': chunk[:rows], 'label': labels[:rows]},
    'packed': {k: packed[k] for k in ('image', 'label', 'slots')},
  }


def _program(model, params, batch: dict[str, np.ndarray]):
  """`run()`: one step of the trainer's own on `batch` (packed rows where it holds 'slots')."""
  rows, tokens = batch['image'].shape[:2]
  pack = (tokens, batch['slots'].shape[1]) if 'slots' in batch else ()
  tx, step = programs.trainer(model, rows, pack=pack)
  state = jax.jit(lambda p: programs.train_state(p, tx))(params)
  compiled = jax.jit(step, donate_argnums=0).lower(state, batch).compile()
  holder = {'state': state}

  def run():
    holder['state'], metrics = compiled(holder['state'], batch)
    return jax.block_until_ready(metrics['loss'])

  return run


def measure(
  rows: int = 16, tokens: int = 256, images: int = 8, read: int = 3, patch: int = 16,
  num_classes: int = 1000, rounds: int = 3, steps: int = 2, seed: int = 0,
) -> dict[str, Any]:  # fmt: skip
  """images/s and padding of both batches; `speedup`: packed images/s over one a row's."""
  data = batches(rows, tokens, images, read, patch, num_classes, seed)
  model = tower(num_classes, patch)
  sample = jnp.asarray(data['one a row']['image'][:1])
  params = jax.jit(model.init)(jax.random.key(seed), sample)['params']
  runs = {name: _program(model, params, batch) for name, batch in data.items()}
  best = {name: float('inf') for name in runs}
  for _ in range(rounds):
    for name, run in runs.items():
      run()  # the first step after another program's: not timed
      start = time.perf_counter()
      for _ in range(steps):
        run()
      best[name] = min(best[name], (time.perf_counter() - start) / steps)
  result = {}
  for name, batch in data.items():
    count = int(batch['slots'].sum()) if 'slots' in batch else len(batch['label'])
    result[name] = {
      'images': count,
      'padding': float(np.mean(batch['image'][..., packing.PTYPE] == 0)),
      'step_s': best[name],
      'images_per_s': count / best[name],
    }
  result['speedup'] = result['packed']['images_per_s'] / result['one a row']['images_per_s']
  return result
