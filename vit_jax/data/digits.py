"""The bundled dataset: scikit-learn's 1,797 real handwritten digits, no download needed.

8x8 grayscale scans with 17 grey levels (0-16), 10 classes. They become uint8 RGB images
(levels scaled to 0-255, the grey value copied to three channels) so the standard image
pipeline applies unchanged. The split is fixed: a stratified 80/20 split with seed 0
(`sklearn.model_selection.train_test_split`), 1,437 train and 360 test images.
"""

import functools

import numpy as np

SPLITS = ('train', 'test')
NUM_CLASSES = 10
NUM_EXAMPLES = {'train': 1437, 'test': 360}
IMAGE_SIZE = 8
SPLIT_SEED = 0


@functools.cache
def _load_all() -> dict[str, tuple[np.ndarray, np.ndarray]]:
  from sklearn.datasets import load_digits
  from sklearn.model_selection import train_test_split

  digits = load_digits()
  images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)
  images = np.repeat(images[..., None], 3, axis=-1)  # (1797, 8, 8, 3)
  labels = digits.target.astype(np.int64)
  x_train, x_test, y_train, y_test = train_test_split(
    images, labels, test_size=0.2, stratify=labels, random_state=SPLIT_SEED
  )
  return {'train': (x_train, y_train), 'test': (x_test, y_test)}


def load(split: str) -> tuple[np.ndarray, np.ndarray]:
  """Images (N, 8, 8, 3) uint8 and labels (N,) int64 of `split` ('train' or 'test')."""
  if split not in SPLITS:
    raise ValueError(f'Unknown digits split {split!r}; expected one of {SPLITS}.')
  images, labels = _load_all()[split]
  return images.copy(), labels.copy()
