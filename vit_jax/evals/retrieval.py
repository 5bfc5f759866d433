"""Image-text retrieval: image-to-text and text-to-image recall@k (big_vision's
`image_text_retrieval`, the R@1 of the LiT model card).

  recalls(zimg, ztxt, text_image, ks=(1, 5, 10), image_labels=None)
    -> {'img2txt/r@1': ..., 'txt2img/r@1': ..., ...}

`zimg` (N, D) and `ztxt` (M, D) are the normalised embeddings (any scale works: only the
order of the similarities zimg . ztxt counts); `text_image` (M,) the image each caption
belongs to, so an image may have several captions. Image to text: an image is a hit at k when
any of its captions is among the k most similar texts. Text to image: a caption is a hit when
its image is among the k most similar images. With `image_labels` (N,) the captions are shared
by class (class names as captions, or any dataset whose captions describe the class): a
caption matches every image of its image's class, both ways. A tie counts for the match (its
rank is the number of strictly more similar candidates). The similarities are computed in
blocks of `block` rows, so 5,000 images x 25,000 captions (COCO) need no 500 MB matrix.
"""

from collections.abc import Sequence

import numpy as np

KS = (1, 5, 10)


def _ranks(queries: np.ndarray, keys: np.ndarray, matches, block: int) -> np.ndarray:
  """For each query row, how many keys are strictly more similar than its best match;
  `matches(rows)` gives the (len(rows), len(keys)) boolean matrix of a block of queries."""
  ranks = np.empty(len(queries), np.int64)
  for start in range(0, len(queries), block):
    rows = np.arange(start, min(start + block, len(queries)))
    sims = queries[rows] @ keys.T
    match = matches(rows)
    if not match.any(axis=1).all():
      raise ValueError(f'query {rows[~match.any(axis=1)][0]} has no matching item to retrieve.')
    best = np.where(match, sims, -np.inf).max(axis=1, keepdims=True)
    ranks[rows] = np.sum(sims > best, axis=1)
  return ranks


def recalls(
  zimg: np.ndarray,
  ztxt: np.ndarray,
  text_image: Sequence[int] | np.ndarray,
  ks: Sequence[int] = KS,
  image_labels: Sequence[int] | np.ndarray | None = None,
  block: int = 1024,
) -> dict[str, float]:
  """Recall@k both ways: {'img2txt/r@k', 'txt2img/r@k'} for each k, as fractions."""
  zimg, ztxt = np.asarray(zimg, np.float32), np.asarray(ztxt, np.float32)
  text_image = np.asarray(text_image, np.int64)
  if len(text_image) != len(ztxt) or not len(zimg) or not len(ztxt):
    raise ValueError(
      f'{len(ztxt)} caption embeddings, {len(text_image)} caption owners, {len(zimg)} images: '
      'expected one owner per caption and at least one of each.'
    )
  if text_image.min() < 0 or text_image.max() >= len(zimg):
    raise ValueError(f'a caption belongs to image {text_image.max()}; there are {len(zimg)}.')
  # What each image and each caption is matched by: the image itself, or its class.
  if image_labels is None:
    image_key, text_key = np.arange(len(zimg)), text_image
  else:
    image_key = np.asarray(image_labels, np.int64)
    text_key = image_key[text_image]
  i2t = _ranks(zimg, ztxt, lambda rows: image_key[rows, None] == text_key[None], block)
  t2i = _ranks(ztxt, zimg, lambda rows: text_key[rows, None] == image_key[None], block)
  results = {}
  for k in ks:
    results[f'img2txt/r@{k}'] = float(np.mean(i2t < k))
    results[f'txt2img/r@{k}'] = float(np.mean(t2i < k))
  return results
