"""NaViT's Patch n' Pack on the data side (vit_jax/data/packing.py): the plan worked by hand and
its properties on random lengths, host rows == tf.data rows, token dropping, resolution
sampling, the padding on the issue's distribution, and the packed training stream: exact
resume, the packed batch equal to the unpacked images packed on the host, shards concatenated."""

import pytest

from vit_jax import data
from vit_jax.data import spec as data_spec

# ----------------------------------------------------------------------------------------
# Configuration.
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
  ('fields', 'message'),
  [
    ({'pack_tokens': 100, 'max_patches': 256}, 'pack_tokens=100; expected 0'),
    ({'pack_tokens': 200, 'pack_budgets': (64, 256)}, 'at least the patches of an image, 256'),
    ({'pack_images': 0}, 'pack_images=0; expected a positive'),
    ({'pack_read': 0}, 'pack_read=0; expected a positive'),
    ({'pack_budgets': (64, 0)}, 'expected positive patch counts'),
    ({'token_drop': 1.0}, 'fractions in'),
    ({'token_drop': 0.5, 'token_drop_max': 0.25}, 'token_drop_max=0.25 is below'),
  ],
)
def test_packing_options_are_checked(fields, message):
  with pytest.raises(ValueError, match=message):
    data_spec.check(data.Data(pp=data.Pp(**fields)))
