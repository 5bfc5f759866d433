"""NaFlex preprocessing (vit_jax/data/naflex.py): big_vision's `resize_to_sequence` sizes and
`patchify` layout."""

import jax
import numpy as np
import pytest
import tensorflow as tf

from vit_jax.data import naflex
from vit_jax.flat import unflatten

# big_vision's ops_naflex_test.py: (image size, patch, max patches, the size it resizes to).
SIZES = [
  ((48, 48), 3, 121, (33, 33)),
  ((112, 109), 7, 225, (105, 105)),
  ((176, 176), 11, 64, (88, 88)),
  ((256, 64), 16, 12, (96, 32)),
  ((256, 64), 8, 15, (56, 16)),
  ((63, 241), 16, 16, (32, 128)),
  ((16, 512), 16, 16, (16, 256)),
]


@pytest.mark.parametrize('image_size, patch, max_len, expected', SIZES)
def test_resize_to_sequence_gives_big_visions_sizes(image_size, patch, max_len, expected):
  """The sizes of big_vision's op test, on the host and in a tf.data map."""
  assert naflex.sequence_size(*image_size, patch, max_len) == expected
  image = tf.cast(tf.random.uniform((*image_size, 3), 0, 255, tf.int32), tf.uint8)
  assert naflex.resize_to_sequence(image, patch, max_len).shape == (*expected, 3)
  ds = tf.data.Dataset.from_tensors(image).map(
    lambda x: naflex.resize_to_sequence(x, patch, max_len)
  )
  assert next(ds.as_numpy_iterator()).shape == (*expected, 3)


def test_patchify_rows_columns_channels_then_padding():
  """A 6 x 9 image in patches of 3: 2 x 3 patches, each flattened in (row, column, channel)
  order, row-major over the grid, then padding to 8 slots of type 0."""
  image = np.arange(6 * 9 * 3, dtype=np.float32).reshape(6, 9, 3)
  out = {k: v.numpy() for k, v in naflex.patchify(tf.constant(image), 3, 8).items()}
  assert out['patches'].shape == (8, 27)
  for i, (y, x) in enumerate((y, x) for y in range(2) for x in range(3)):
    np.testing.assert_array_equal(
      out['patches'][i], image[3 * y : 3 * y + 3, 3 * x : 3 * x + 3].ravel()
    )
  assert out['ptype'].tolist() == [1] * 6 + [0] * 2 and not out['patches'][6:].any()
  assert out['yidx'].tolist() == [0, 0, 0, 1, 1, 1, 0, 0]
  assert out['xidx'].tolist() == [0, 1, 2, 0, 1, 2, 0, 0]
  with pytest.raises(tf.errors.InvalidArgumentError, match='more than 5 patches'):
    naflex.patchify(tf.constant(image), 3, 5)


# A tiny NaFlex tower: patches of 4, a 4 x 4 position grid, width 32, 2 layers, 4 heads.
PATCH, GRID, WIDTH, LAYERS, HEADS, MLP = 4, 4, 32, 2, 4, 64
# Three images' patch grids (rows, columns): wide, tall, square; 12 slots each.
GRIDS, SLOTS = ((2, 6), (4, 3), (3, 3)), 12


def _inputs(grids, slots, seed=0):
  """Random patches in [-1, 1] of images with these grids, row-major, padded to `slots`."""
  rng = np.random.default_rng(seed)
  out = {k: np.zeros((len(grids), slots), np.int32) for k in ('ptype', 'yidx', 'xidx')}
  out['patches'] = np.zeros((len(grids), slots, PATCH * PATCH * 3), np.float32)
  for i, (rows, cols) in enumerate(grids):
    n = rows * cols
    out['patches'][i, :n] = rng.uniform(-1, 1, (n, PATCH * PATCH * 3))
    out['ptype'][i, :n] = 1
    out['yidx'][i, :n], out['xidx'][i, :n] = np.divmod(np.arange(n), cols)
  return out


def _from_siglip2(sd) -> dict:
  """transformers' Siglip2VisionModel weights -> the NaFlex tower's tree (big_vision's names,
  blocks unrolled), through test_two_towers' SigLIP mapping of each part."""
  from test_two_towers import hf_dense, hf_encoder_block, hf_map_head

  flat = {}
  for i in range(LAYERS):
    block = hf_encoder_block(sd, f'encoder.layers.{i}', WIDTH, HEADS)
    flat |= {f'Transformer/encoderblock_{i}/{k}': v for k, v in block.items()}
  flat['Transformer/encoder_norm/scale'] = sd['post_layernorm.weight']
  flat['Transformer/encoder_norm/bias'] = sd['post_layernorm.bias']
  embed = hf_dense(
    sd['embeddings.patch_embedding.weight'], sd['embeddings.patch_embedding.bias'], WIDTH, HEADS
  )
  flat |= {f'embedding/{k}': v for k, v in embed.items()}
  flat['pos_embedding'] = sd['embeddings.position_embedding.weight'].reshape(GRID, GRID, WIDTH)
  flat |= {f'MAPHead_0/{k}': v for k, v in hf_map_head(sd, 'head', WIDTH, HEADS).items()}
  return unflatten({k: np.float32(v) for k, v in flat.items()})


@pytest.fixture(scope='module')
def siglip2_vision():
  """transformers' Siglip2VisionModel, random weights (float64), and our tower on them."""
  from test_two_towers import _hf_randomize
  from transformers import Siglip2VisionConfig, Siglip2VisionModel

  from vit_jax.models.naflex import NaFlexViT

  config = Siglip2VisionConfig(
    hidden_size=WIDTH, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
    intermediate_size=MLP, patch_size=PATCH, num_patches=GRID * GRID,
  )  # fmt: skip
  config._attn_implementation = 'eager'
  hf = _hf_randomize(Siglip2VisionModel(config), seed=2)
  params = _from_siglip2({k: v.numpy() for k, v in hf.state_dict().items()})
  transformer = {'num_layers': LAYERS, 'mlp_dim': MLP, 'num_heads': HEADS}
  transformer |= {'dropout_rate': 0.0, 'attention_dropout_rate': 0.0}
  model = NaFlexViT(None, PATCH, WIDTH, transformer, posemb_grid=GRID)
  return hf, model, params


def _ours(model, params, x):
  apply = jax.jit(model.apply)
  return np.asarray(apply({'params': params}, x['patches'], x['ptype'], x['yidx'], x['xidx']))


def test_naflex_tower_equals_transformers_siglip2_on_three_aspect_ratios(siglip2_vision):
  """Three images (2 x 6, 4 x 3 and 3 x 3 patches) batched in 12 slots: the pooled features
  equal transformers' Siglip2VisionModel (its own position-embedding resize) to 1e-5, and
  are the same for the wide image alone, without padding, and for all three in 20 slots."""
  import torch

  hf, model, params = siglip2_vision
  x = _inputs(GRIDS, SLOTS)
  ours = _ours(model, params, x)
  with torch.no_grad():
    want = hf(
      pixel_values=torch.tensor(x['patches']).double(),
      pixel_attention_mask=torch.tensor(x['ptype']),
      spatial_shapes=torch.tensor(GRIDS),
    ).pooler_output.numpy()
  np.testing.assert_allclose(ours, want, atol=1e-5, rtol=0)
  alone = {k: v[:1, :12] for k, v in x.items()}  # 2 x 6: no padding
  np.testing.assert_allclose(_ours(model, params, alone)[0], ours[0], atol=1e-5, rtol=0)
  wider = {k: np.pad(v, [(0, 0), (0, 8)] + [(0, 0)] * (v.ndim - 2)) for k, v in x.items()}
  np.testing.assert_allclose(_ours(model, params, wider), ours, atol=1e-5, rtol=0)
  assert np.abs(ours[0] - ours[1]).max() > 1e-2  # the images differ


def test_naflex_tower_in_big_visions_names_equals_timms_naflexvit(tmp_path):
  """The scanned tower's tree is big_vision's NaFlex layout by name: written as a
  `params/img/...` .npz, timm's NaFlexVit (`naflexvit_base_patch16_siglip`'s recipe, tiny)
  reads it with its big_vision loader and gives our pooled features to 1e-5 on the three
  aspect ratios."""
  import timm
  import torch

  from vit_jax.flat import flatten
  from vit_jax.models.naflex import NaFlexViT

  transformer = {'num_layers': LAYERS, 'mlp_dim': MLP, 'num_heads': HEADS}
  transformer |= {'dropout_rate': 0.0, 'attention_dropout_rate': 0.0}
  model = NaFlexViT(None, PATCH, WIDTH, transformer, posemb_grid=GRID, scan_layers=True)
  x = _inputs(GRIDS, SLOTS)
  shapes = jax.eval_shape(
    model.init, jax.random.key(0), x['patches'], x['ptype'], x['yidx'], x['xidx']
  )['params']
  rng = np.random.default_rng(3)
  flat = {k: rng.normal(0, 0.3, s.shape).astype(np.float32) for k, s in flatten(shapes).items()}
  assert 'Transformer/encoderblock/MlpBlock_0/Dense_0/kernel' in flat  # scan-stacked
  assert flat['embedding/kernel'].shape == (PATCH * PATCH * 3, WIDTH)
  assert flat['pos_embedding'].shape == (GRID, GRID, WIDTH)
  np.savez(tmp_path / 'naflex.npz', **{f'params/img/{k}': v for k, v in flat.items()})
  theirs = timm.create_model(
    'naflexvit_base_patch16_siglip', pretrained=False, num_classes=0, embed_dim=WIDTH,
    depth=LAYERS, num_heads=HEADS, patch_size=PATCH, pos_embed_grid_size=(GRID, GRID),
    mlp_ratio=MLP / WIDTH,
  ).eval()  # fmt: skip
  theirs.load_pretrained(str(tmp_path / 'naflex.npz'), prefix='params/img/')
  params = unflatten(flat)
  ours = _ours(model, params, x)
  coord = torch.tensor(np.stack([x['yidx'], x['xidx']], -1)).long()
  with torch.no_grad():
    want = theirs(
      {'patches': torch.tensor(x['patches']), 'patch_coord': coord,
       'patch_valid': torch.tensor(x['ptype'] > 0)}
    ).numpy()  # fmt: skip
  np.testing.assert_allclose(ours, want, atol=1e-5, rtol=0)
