"""Image-text retrieval recall@k against a plain loop over sorted similarities: several
captions per image (uneven counts), captions shared by class, blocks smaller than the data."""

import numpy as np
import pytest

from vit_jax.evals import retrieval


def _embeddings(n_images, owners, seed=0, dim=8):
  """Captions near their image (so recall is neither 0 nor 1), all L2-normalised."""
  rng = np.random.default_rng(seed)
  zimg = rng.normal(size=(n_images, dim))
  ztxt = zimg[owners] + 1.2 * rng.normal(size=(len(owners), dim))
  normalize = lambda z: z / np.linalg.norm(z, axis=1, keepdims=True)
  return normalize(zimg), normalize(ztxt)


def oracle(zimg, ztxt, owners, ks, labels=None):
  """For each query: sort the candidates by similarity, look for a match in the first k."""
  same = (
    (lambda i, j: i == owners[j])
    if labels is None
    else (lambda i, j: labels[i] == labels[owners[j]])
  )
  sims = zimg @ ztxt.T
  out = {}
  for k in ks:
    hits = [any(same(i, j) for j in np.argsort(-sims[i])[:k]) for i in range(len(zimg))]
    out[f'img2txt_recall@{k}'] = sum(hits) / len(hits)
    hits = [any(same(i, j) for i in np.argsort(-sims[:, j])[:k]) for j in range(len(ztxt))]
    out[f'txt2img_recall@{k}'] = sum(hits) / len(hits)
  return out


@pytest.mark.parametrize('shared', [False, True], ids=['per_image', 'class_shared'])
def test_recalls_equal_the_loop(shared):
  rng = np.random.default_rng(3)
  n = 60
  owners = np.concatenate([np.arange(n), rng.integers(0, n, 90)])  # 1 to ~5 captions each
  rng.shuffle(owners)
  labels = rng.integers(0, 12, n) if shared else None
  zimg, ztxt = _embeddings(n, owners)
  ks = (1, 5, 10)
  got = retrieval.recalls(zimg, ztxt, owners, ks, image_labels=labels, block=7)
  want = oracle(zimg, ztxt, owners, ks, labels)
  assert got == pytest.approx(want, abs=1e-12)
  assert len(got) == 6 and all(0 < v < 1 for k, v in got.items() if k.endswith('recall@1'))
  # whole-matrix blocks give the same
  assert retrieval.recalls(zimg, ztxt, owners, ks, image_labels=labels) == got


def test_class_shared_captions_count_any_caption_of_the_class():
  """Two images of one class, one caption each: the caption of the other image of the class is
  a hit for image-to-text at 1 only with shared captions."""
  zimg = np.array([[1.0, 0.0], [0.0, 1.0]])
  ztxt = np.array([[0.0, 1.0], [1.0, 0.0]])  # caption 0 (of image 0) looks like image 1
  owners = [0, 1]
  assert retrieval.recalls(zimg, ztxt, owners, (1,)) == {
    'img2txt_recall@1': 0.0,
    'txt2img_recall@1': 0.0,
  }
  shared = retrieval.recalls(zimg, ztxt, owners, (1,), image_labels=[4, 4])
  assert shared == {'img2txt_recall@1': 1.0, 'txt2img_recall@1': 1.0}


def test_bad_inputs_are_one_line_errors():
  zimg, ztxt = np.eye(3), np.eye(3)
  with pytest.raises(ValueError, match='one owner per caption'):
    retrieval.recalls(zimg, ztxt, [0, 1])
  with pytest.raises(ValueError, match='belongs to image 3; there are 3'):
    retrieval.recalls(zimg, ztxt, [0, 1, 3])
  with pytest.raises(ValueError, match='query 2 has no matching item'):
    retrieval.recalls(zimg, ztxt, [0, 1, 1])  # image 2 has no caption
