"""A model's preprocessing spec: given by its family, computed once on the host and once in
the input pipeline, the two equal."""

import json

import numpy as np
import pytest
from PIL import Image

from vit_jax import data, families
from vit_jax.data import images
from vit_jax.families import preprocessing
from vit_jax.models import get_config

SPECS = {
  'square': preprocessing.square(12),
  'lit': preprocessing.square((10, 14), round_to_uint8=True),
  'crop': preprocessing.square(9, crop=0.75, method='bicubic'),
  'naflex': preprocessing.patches(4, 16),
  'range': preprocessing.square(8, offset=0.0, scale=255.0),
}


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
  """An image folder of RGB pictures of odd sizes, whose resized pixels are not integers."""
  root = tmp_path_factory.mktemp('images')
  rng = np.random.default_rng(0)
  for split in ('train', 'test'):
    for i, (h, w) in enumerate([(17, 23), (31, 9), (8, 40)]):
      (root / split / f'c{i}').mkdir(parents=True)
      pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
      Image.fromarray(pixels).save(root / split / f'c{i}' / 'a.png')
  return root


@pytest.mark.parametrize('name', sorted(SPECS))
def test_the_host_and_the_pipeline_compute_the_same_input(folder, name):
  spec = SPECS[name]
  source = data.get_source(str(folder))
  (batch,) = data.eval_dataset(
    source, 'test', data=data.Data(), local_batch=3, preprocessing=spec
  ).as_numpy_iterator()
  paths = sorted(folder.glob('test/*/a.png'))
  host = np.stack([images.host_input(spec, images.read_image(p)) for p in paths])
  assert host.shape == (3, *spec.input_shape())
  np.testing.assert_array_equal(host, batch['image'])


def test_the_value_range_and_the_uint8_rounding_are_those_stated():
  """(x - offset) / scale of the resized pixels, truncated to uint8 first where stated."""
  image = np.array([[[0, 100, 255], [51, 52, 53]]], np.uint8)  # 1 x 2
  wide = preprocessing.square((1, 1))
  # A 2-to-1 bilinear resize with half-pixel centres samples x = 0.5: the mean of both pixels.
  mean = image.astype(np.float64).mean(axis=1, keepdims=True)
  np.testing.assert_allclose(images.host_input(wide, image), (mean - 127.5) / 127.5, atol=1e-7)
  lit = preprocessing.square((1, 1), round_to_uint8=True)
  np.testing.assert_allclose(
    images.host_input(lit, image), (np.floor(mean) - 127.5) / 127.5, atol=1e-7
  )
  unit = preprocessing.square((1, 1), offset=0.0, scale=255.0)
  np.testing.assert_allclose(images.host_input(unit, image), mean / 255, atol=1e-7)


def test_the_spec_reads_back_from_its_json_and_says_itself_in_words():
  for spec in SPECS.values():
    entry = json.loads(json.dumps(spec.to_json()))
    assert preprocessing.Preprocessing.from_json(entry) == spec
    assert entry['kind'] == spec.kind and entry['text'] == spec.describe()
  assert 'cast to uint8' in SPECS['lit'].describe()
  assert 'cast to uint8' not in SPECS['square'].describe()
  assert 'at most 16 patches of 4 x 4' in SPECS['naflex'].describe()


def test_each_family_gives_its_models_spec():
  vit = get_config('ViT-B_16')
  assert families.of_config(vit).preprocessing(vit, 384) == preprocessing.square(384)
  mixer = get_config('Mixer-B_16')
  assert families.of_config(mixer).preprocessing(mixer, 224) == preprocessing.square(224)
  lit = get_config('LiT-B16B')
  assert families.of_config(lit).preprocessing(lit) == preprocessing.square(224)
  naflex = get_config('SigLIP2-B16-naflex')
  spec = families.of_config(naflex).preprocessing(naflex, max_patches=64)
  assert spec == preprocessing.patches(16, 64) and spec.input_shape() == (64, 16 * 16 * 3 + 3)
  with pytest.raises(ValueError, match='square images, not patches'):
    families.of_config(vit).preprocessing(vit, 224, max_patches=64)
  with pytest.raises(ValueError, match='no resolution'):
    families.of_config(naflex).preprocessing(naflex, 224)
