"""NaFlex preprocessing (vit_jax/data/naflex.py): big_vision's `resize_to_sequence` sizes and
`patchify` layout."""

import jax
import ml_collections
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


def _naflex_embeddings(sd, theirs: str, ours: str) -> dict:
  """transformers' Siglip2 vision embeddings (a Linear over flattened patches, the position
  grid as (G * G, D) rows) in big_vision's NaFlex names."""
  patch, posemb = f'{theirs}embeddings.patch_embedding', f'{theirs}embeddings.position_embedding'
  return {
    f'{ours}embedding/kernel': sd[f'{patch}.weight'].T,
    f'{ours}embedding/bias': sd[f'{patch}.bias'],
    f'{ours}pos_embedding': sd[f'{posemb}.weight'].reshape(GRID, GRID, WIDTH),
  }


def _from_siglip2(sd) -> dict:
  """transformers' Siglip2VisionModel weights -> the NaFlex tower's tree (big_vision's names,
  blocks unrolled): the encoder, post_layernorm and MAP head through `hf_siglip`'s vision map
  (SiglipModel's), the embeddings here."""
  from vit_jax.checkpoint import hf_siglip

  keys = hf_siglip.vision_encoder_map('', '', LAYERS)
  flat = hf_siglip.to_flat({k: sd[k] for k in keys}, keys, lambda name: HEADS, 'siglip2')
  flat |= _naflex_embeddings(sd, '', '')
  return unflatten({k: np.float32(v) for k, v in flat.items()})


def _siglip2_to_big_vision(sd) -> dict:
  """transformers' Siglip2Model weights -> a big_vision SigLIP 2 NaFlex .npz's arrays: every
  tensor but the vision embeddings through `hf_siglip`'s SigLIP map, in conftest's big_vision
  layout (`params/`, blocks scan-stacked)."""
  from conftest import big_vision_siglip

  from vit_jax.checkpoint import hf_siglip

  keys = hf_siglip.key_map(LAYERS, LAYERS)
  keys = {k: v for k, v in keys.items() if not k.startswith('vision_model.embeddings.')}
  flat = hf_siglip.to_flat({k: sd[k] for k in keys}, keys, lambda name: HEADS, 'siglip2')
  flat |= _naflex_embeddings(sd, 'vision_model.', 'img/')
  return big_vision_siglip(unflatten(flat))


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


def _theirs(x):
  """The batch `x` (of `GRIDS`) as transformers' Siglip2 models take it."""
  import torch

  return {
    'pixel_values': torch.tensor(x['patches']).double(),
    'pixel_attention_mask': torch.tensor(x['ptype']),
    'spatial_shapes': torch.tensor(GRIDS),
  }


def test_naflex_tower_equals_transformers_siglip2_on_three_aspect_ratios(siglip2_vision):
  """Three images (2 x 6, 4 x 3 and 3 x 3 patches) batched in 12 slots: the pooled features
  equal transformers' Siglip2VisionModel (its own position-embedding resize) to 1e-5, and
  are the same for the wide image alone, without padding, and for all three in 20 slots."""
  import torch

  hf, model, params = siglip2_vision
  x = _inputs(GRIDS, SLOTS)
  ours = _ours(model, params, x)
  with torch.no_grad():
    want = hf(**_theirs(x)).pooler_output.numpy()
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


@pytest.mark.slow
@pytest.mark.parametrize('variant', ['B', 'So400m'])
def test_naflex_siglip2_counts_by_hand_and_by_transformers(variant):
  """SigLIP2-{B,So400m}16-naflex: a Dense over 16 x 16 x 3 values has the conv's parameters
  and the 16 x 16 position grid is a 256 px model's, so each counts as SigLIP 2 at 256 px
  by hand, and as transformers' Siglip2Model; the registry names its shapes."""
  import torch
  from test_two_towers import BV_SIZES, _siglip2_by_hand
  from transformers import Siglip2Config, Siglip2Model

  from vit_jax import families
  from vit_jax.families import two_towers
  from vit_jax.models import get_model, stats

  name = f'SigLIP2-{variant}16-naflex'
  model = get_model(name)
  assert model.pp.to_dict() == {
    'tokenizer_name': 'gemma', 'max_len': 64, 'lower_case': True, 'max_patches': 256,
  }  # fmt: skip
  shapes = families.param_shapes(model)
  assert stats.count_params(shapes) == _siglip2_by_hand(variant, 16, 256)
  assert two_towers.match_registry(two_towers.infer_config(shapes)) == name
  width, layers, mlp, heads = BV_SIZES[variant]
  tower = {'hidden_size': width, 'num_hidden_layers': layers}
  tower |= {'intermediate_size': mlp, 'num_attention_heads': heads}
  text = {**tower, 'vocab_size': 256_000, 'max_position_embeddings': 64}
  vision = {**tower, 'patch_size': 16, 'num_patches': 256}
  with torch.device('meta'):  # shapes only
    hf = Siglip2Model(Siglip2Config(text_config=text, vision_config=vision))
  assert stats.count_params(shapes) == sum(p.numel() for p in hf.parameters())


def test_naflex_siglip2_file_equals_transformers_siglip2_model(tmp_path):
  """A SigLIP 2 NaFlex file in big_vision's layout (`params/`, both towers scan-stacked, the
  2-D patch embedding, the (16, 16, D) grid; a narrow text tower keeping Gemma's 256,000
  rows) reads by name as a NaFlex two-tower model with Gemma's tokenizer; its embeddings and
  logits of three aspect ratios batched with padding equal transformers' Siglip2Model."""
  import torch
  from test_two_towers import _hf_randomize
  from transformers import Siglip2Config, Siglip2Model

  from vit_jax import checkpoint

  tower = {'hidden_size': WIDTH, 'num_hidden_layers': LAYERS, 'num_attention_heads': HEADS}
  tower['intermediate_size'] = MLP
  config = Siglip2Config(
    text_config={**tower, 'vocab_size': 256_000, 'max_position_embeddings': 16},
    vision_config={**tower, 'patch_size': PATCH, 'num_patches': GRID * GRID},
  )
  config.text_config._attn_implementation = config.vision_config._attn_implementation = 'eager'
  hf = _hf_randomize(Siglip2Model(config), seed=4)
  sd = {k: v.numpy() for k, v in hf.state_dict().items()}
  np.savez(tmp_path / 'siglip2_naflex.npz', **_siglip2_to_big_vision(sd))

  fitted = checkpoint.fit(tmp_path / 'siglip2_naflex.npz')
  assert fitted.config.image_model == 'naflex' and fitted.config.image.posemb_grid == GRID
  assert fitted.config.pp.to_dict() == {
    'tokenizer_name': 'gemma', 'max_len': 16, 'lower_case': True, 'max_patches': 256,
  }  # fmt: skip
  assert 'NaFlex, scan-stacked blocks' in fitted.found.description
  x = _inputs(GRIDS, SLOTS, seed=5)
  tokens = np.random.default_rng(6).integers(5, 256_000, (3, 16)).astype(np.int32)
  apply = jax.jit(fitted.model().apply)
  zimg, ztxt, out = apply({'params': fitted.params}, images=x, tokens=tokens)
  with torch.no_grad():
    want = hf(
      input_ids=torch.tensor(tokens).long(),
      **_theirs(x),
    )
  np.testing.assert_allclose(zimg, want.image_embeds.numpy(), atol=1e-5, rtol=0)
  np.testing.assert_allclose(ztxt, want.text_embeds.numpy(), atol=1e-5, rtol=0)
  logits = out['t'] * zimg @ ztxt.T + out['b']
  np.testing.assert_allclose(logits, want.logits_per_image.numpy(), atol=1e-4, rtol=1e-5)


# A tiny SigLIP 2 NaFlex model for training: patches of 4 on a 4 x 4 grid, at most 16 an
# image; a one-block text transformer on tests/data/sp_bpe.model's 1,200 pieces.
TINY_NAFLEX = {
  'image': {
    'patch_size': 4, 'hidden_size': 32, 'classifier': 'map', 'posemb_grid': 4,
    'posemb_canvas': 16,  # at most 16 patches a side
    'transformer': {'num_layers': 1, 'mlp_dim': 32, 'num_heads': 2, 'dropout_rate': 0.0,
                    'attention_dropout_rate': 0.0, 'drop_path_rate': 0.0},
  },
  'text': {'width': 16, 'num_layers': 1, 'mlp_dim': 32, 'num_heads': 2, 'vocab_size': 1200},
  'out_dim': (None, 32),
  'pp': {'tokenizer_name': 'sentencepiece', 'max_len': 16, 'lower_case': True, 'max_patches': 16},
}  # fmt: skip
# Images of mixed aspect ratios: wide, tall, square, and one that rounds to whole patches.
SHAPES = ((12, 40), (40, 12), (20, 20), (17, 29), (44, 8), (8, 8), (30, 18), (16, 36))


def _naflex_finetune(tmp_path, pretrained):
  """configs/siglip2_finetune.py:B16-naflex with TINY_NAFLEX on a captions folder of SHAPES,
  4 steps of 8 pairs, a checkpoint every 2, retrieval at the end."""
  from conftest import jpeg_bytes
  from test_lit import SP_MODEL

  from configs import siglip2_finetune
  from vit_jax.data import captions

  folder = tmp_path / 'pairs'
  if not folder.exists():
    (folder / 'train').mkdir(parents=True)
    rng = np.random.default_rng(0)
    lines = []
    for i, (h, w) in enumerate(SHAPES):
      (folder / 'train' / f'{i}.jpg').write_bytes(jpeg_bytes(rng, h, w))
      lines.append(f'{i}.jpg\ta picture {h} by {w}, number {i}.')
    (folder / 'train' / captions.CAPTIONS_FILE).write_text('\n'.join(lines) + '\n')
    (folder / 'test').symlink_to('train')  # retrieval reads the test split
  config = siglip2_finetune.get_config('B16-naflex')
  config.model = {**config.model.to_dict(), **TINY_NAFLEX}
  config.pp.tokenizer, config.pp.max_len = 'sentencepiece', 16  # TINY_NAFLEX's
  config.dataset, config.pp.test = str(folder), 'test'
  config.pp.max_patches, config.pp.patch_size, config.pp.vocab = 16, 4, SP_MODEL
  config.pretrained_path = pretrained
  config.total_steps, config.batch, config.batch_eval = 4, 8, 8
  config.checkpoint_every, config.warmup_steps, config.progress_every = 2, 1, 1
  config.base_lr = 1e-3
  config.evals = {'retrieval': {'type': 'retrieval', 'every': 0, 'datasets': (str(folder),)}}
  return config


@pytest.mark.slow
def test_a_naflex_tower_fine_tunes_on_mixed_aspect_ratios_and_resumes_exactly(
  tmp_path, monkeypatch, capsys
):
  """configs/siglip2_finetune.py on a NaFlex SigLIP 2 file: both towers start from the file,
  images of 8 aspect ratios are batched as patch sequences, the loss falls, and a SIGTERM
  at step 2 then a rerun gives the uninterrupted run's parameters and metrics bit for bit;
  vit-zeroshot on the run prints its retrieval numbers."""
  import json

  from conftest import randomize
  from test_lit import _flat, _lines, sigterm_at

  from vit_jax import checkpoint, families, train
  from vit_jax.models import get_config, model_from_config
  from vit_jax.train import loop as loop_lib

  model = model_from_config({**get_config('SigLIP2-B16-naflex').to_dict(), **TINY_NAFLEX})
  start = randomize(families.param_shapes(model), seed=3, scale=0.3)
  checkpoint.save_npz(start, tmp_path / 'siglip2_tiny_naflex.npz')
  pretrained = str(tmp_path / 'siglip2_tiny_naflex.npz')

  ref = train.train_and_evaluate(_naflex_finetune(tmp_path, pretrained), str(tmp_path / 'ref'))
  losses = [m['loss'] for m in _lines(tmp_path / 'ref') if 'loss' in m]
  assert len(losses) == 4 and losses[-1] < losses[0]
  recall = 'retrieval/pairs/img2txt_recall@1'
  recalls = [m[recall] for m in _lines(tmp_path / 'ref') if recall in m]
  assert len(recalls) == 1 and 0 <= recalls[0] <= 1

  workdir = str(tmp_path / 'run')
  with monkeypatch.context() as m:
    m.setattr(loop_lib, '_train_batches', sigterm_at(loop_lib._train_batches, 1))
    first = train.train_and_evaluate(_naflex_finetune(tmp_path, pretrained), workdir)
  assert first['status'] == 'preempted' and first['step'] == 2
  second = train.train_and_evaluate(_naflex_finetune(tmp_path, pretrained), workdir)
  assert second['status'] == 'done' and second['step'] == 4
  ours, theirs = _flat(second['params']), _flat(ref['params'])
  assert ours.keys() == theirs.keys()
  for key in ours:
    np.testing.assert_array_equal(ours[key], theirs[key], err_msg=key)
  assert _lines(workdir) == _lines(tmp_path / 'ref')

  # vit-zeroshot on the run takes the images as the run's evaluator did: its recalls.
  from vit_jax.cli import zeroshot as zeroshot_cli

  options = {'json': True, 'cache_dir': ''}
  folder = str(tmp_path / 'pairs')
  capsys.readouterr()  # the runs' progress lines
  assert zeroshot_cli.run(workdir, [], dataset=folder, options=options) == 0
  printed = json.loads(capsys.readouterr().out)
  ran = next(m for m in _lines(workdir) if recall in m)
  assert printed['num_images'] == 8
  metrics = [k for k in printed if 'recall@' in k]
  assert len(metrics) == 6
  for key in metrics:
    assert printed[key] == ran[f'retrieval/pairs/{key}'], key
  assert zeroshot_cli.run(workdir, [], dataset=folder, options={**options, 'max_patches': 4}) == 0
  assert json.loads(capsys.readouterr().out)['num_images'] == 8  # 4 patches an image: runs


def _packed(x) -> np.ndarray:
  """`_inputs`' arrays packed as the input pipeline packs them (one array per image)."""
  index = np.stack([x['ptype'], x['yidx'], x['xidx']], -1).astype(np.float32)
  return np.concatenate([x['patches'], index], -1)


def test_a_bare_naflex_tower_file_fits_as_a_naflex_classifier(siglip2_vision, tmp_path):
  """A NaFlex tower's .npz alone (big_vision's `naflex_vit.Model` params, no `img/`: a
  top-level 2-D `embedding/kernel`, a (G, G, D) `pos_embedding`, scan-stacked blocks, its
  MAP head and a head of 10 classes) reads as a NaFlex classifier: its pooled features on
  three aspect ratios equal transformers' Siglip2VisionModel's to 1e-5, its logits are
  them through the head, and it takes the packed sequences of a batch as the four arrays."""
  import torch
  from conftest import big_vision_siglip

  from vit_jax import checkpoint, families

  hf, _, params = siglip2_vision
  rng = np.random.default_rng(7)
  head = {'kernel': rng.normal(0, 0.3, (WIDTH, 10)), 'bias': rng.normal(0, 0.3, 10)}
  stacked = big_vision_siglip({**params, 'head': head})  # `params/...`, blocks stacked
  np.savez(tmp_path / 'naflex.npz', **{k.removeprefix('params/'): v for k, v in stacked.items()})
  assert stacked['params/pos_embedding'].shape == (GRID, GRID, WIDTH)

  fitted = checkpoint.fit(tmp_path / 'naflex.npz')
  family = families.of_config(fitted.config)
  assert (family.name, fitted.config.num_classes, fitted.resolution) == ('naflex', 10, None)
  assert fitted.found.description.endswith('(NaFlex, scan-stacked blocks)')
  assert family.preprocessing(fitted.config).patch_size == PATCH
  x = _inputs(GRIDS, SLOTS)
  model = fitted.model()
  features = jax.jit(family.image_features(model))(fitted.params, _packed(x))
  with torch.no_grad():
    want = hf(**_theirs(x)).pooler_output.numpy()
  np.testing.assert_allclose(features, want, atol=1e-5, rtol=0)
  logits = jax.jit(model.apply)({'params': fitted.params}, _packed(x))
  np.testing.assert_allclose(logits, want @ head['kernel'] + head['bias'], atol=1e-5, rtol=0)
  np.testing.assert_array_equal(logits, _ours(model, fitted.params, x))
  with pytest.raises(checkpoint.CheckpointError, match='no --resolution'):
    checkpoint.fit(tmp_path / 'naflex.npz', resolution=32)


def _digit_sequences(images: np.ndarray) -> np.ndarray:
  """8x8 digits as 16 packed patches of 2, by hand: an 8x8 image is its own 16-patch size,
  so each patch is a 2x2 block of [-1, 1] pixels, (row, column, channel), row-major."""
  values = (images.astype(np.float32) - 127.5) / 127.5
  n = len(images)
  patches = values.reshape(n, 4, 2, 4, 2, 3).transpose(0, 1, 3, 2, 4, 5).reshape(n, 16, 12)
  rows, cols = np.divmod(np.arange(16), 4)
  index = np.broadcast_to(np.stack([np.ones(16), rows, cols], -1), (n, 16, 3))
  return np.concatenate([patches, index], -1).astype(np.float32)


def test_a_naflex_classifier_trains_on_digits_as_patch_sequences(tmp_path):
  """configs/digits_naflex.py with one block of width 32, 150 steps at lr 0.01 on one device:
  the digits come as sequences of the model's 2-pixel patches (the run states no patch
  size), the loss falls to a sixth and the test accuracy is far above chance (measured
  79.7%); the run read back by `checkpoint.fit` gives, on the digits cut into patches by
  hand, the run's own test accuracy."""
  from configs import digits_naflex
  from vit_jax import checkpoint, rundir, train
  from vit_jax.data import digits

  config = ml_collections.ConfigDict(digits_naflex.get_config().to_dict())
  config.model.hidden_size, config.model.transformer.mlp_dim = 32, 64
  config.model.transformer.num_layers, config.model.transformer.num_heads = 1, 2
  config.total_steps = config.eval_every = config.checkpoint_every = 150
  config.warmup_steps, config.batch, config.progress_every, config.base_lr = 6, 32, 10, 0.01
  result = train.train_and_evaluate(config, str(tmp_path), devices=jax.devices()[:1])
  losses = [m['loss'] for m in rundir.read_metrics(str(tmp_path)) if 'loss' in m]
  assert losses[-1] < losses[0] / 4, losses
  assert result['accuracy_test'] > 0.6, result['accuracy_test']

  fitted = checkpoint.fit(str(tmp_path))
  assert fitted.config.patch_size == 2 and fitted.config.num_classes == 10
  images, labels = digits.load('test')
  logits = jax.jit(fitted.model().apply)({'params': fitted.params}, _digit_sequences(images))
  correct = int(np.sum(np.argmax(np.asarray(logits), -1) == labels))
  assert correct / len(labels) == result['accuracy_test']
