"""Folders of synthetic JPEGs for the benchmarks of what reads images (the input pipeline,
the embedder), written once and kept for reuse."""

import json
import os

import numpy as np
from PIL import Image

from vit_jax import files

_MARKER = 'synthetic.json'


def synthetic_image(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
  """A smooth random colour field with pixel noise: JPEGs of a photo's size and decode cost."""
  grid = rng.uniform(0, 255, (6, 8, 3)).astype(np.uint8)
  base = np.asarray(Image.fromarray(grid).resize((width, height), Image.BICUBIC), np.float32)
  noise = rng.normal(0, 12, (height, width, 3))
  return np.clip(base + noise, 0, 255).astype(np.uint8)


def write_folder(root: str, count: int, size: tuple[int, int], classes: int = 10) -> str:
  """`root/train/cNN/NNNNNN.jpg`: `count` synthetic JPEGs of `size` (W, H); kept for reuse."""
  spec = {'count': count, 'size': list(size), 'classes': classes, 'quality': 90}
  marker = os.path.join(root, _MARKER)
  if os.path.exists(marker):
    with open(marker) as f:
      if json.load(f) == spec:
        return root
  rng = np.random.default_rng(0)
  for i in range(count):
    folder = os.path.join(root, 'train', f'c{i % classes:02d}')
    os.makedirs(folder, exist_ok=True)
    image = Image.fromarray(synthetic_image(rng, size[1], size[0]))
    image.save(os.path.join(folder, f'{i:06d}.jpg'), quality=90)
  files.atomic_write_text(marker, json.dumps(spec))
  return root
