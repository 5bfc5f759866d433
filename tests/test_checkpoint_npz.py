"""Google .npz checkpoints (original, AugReg, big_vision): synthetic files in the exact on-disk
layouts, written here by hand (not by the library), load to the same logits; save_npz writes
the released layout bit for bit; bad files give one-line errors."""

import functools
import re
import zipfile

import jax
import numpy as np
import pytest

from vit_jax import checkpoint, families
from vit_jax.checkpoint import npz
from vit_jax.models import get_model

# Linen name -> the pre-Linen name on disk, inside each encoder block (reference §1.3).
ON_DISK = {
  'LayerNorm_0': 'LayerNorm_0',
  'MultiHeadDotProductAttention_0': 'MultiHeadDotProductAttention_1',
  'LayerNorm_1': 'LayerNorm_2',
  'MlpBlock_0': 'MlpBlock_3',
}
POSEMB = 'Transformer/posembed_input/pos_embedding'


def _flat(params) -> dict[str, np.ndarray]:
  return {
    '/'.join(k.key for k in path): np.asarray(leaf)
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
  }


def released_layout(params) -> dict[str, np.ndarray]:
  """Our tree as the original/AugReg files store it: pre-Linen names, GroupNorm (1,1,1,C)."""
  out = {}
  for key, leaf in _flat(params).items():
    names = key.split('/')
    if names[0] == 'Transformer' and names[1].startswith('encoderblock_'):
      names[2] = ON_DISK[names[2]]
    if len(names) > 1 and re.fullmatch(r'gn(\d+|_root|_proj)', names[-2]):
      leaf = leaf.reshape(1, 1, 1, -1)
    out['/'.join(names)] = leaf
  return out


def big_vision_layout(params, prefix: str = 'params/', scan: bool = True) -> dict[str, np.ndarray]:
  """Our tree as big_vision stores it: prefix, top-level posemb without the class row (folded
  into `cls` as `fix_old_checkpoints` does), blocks stacked on a leading depth axis."""
  flat = _flat(params)
  posemb = flat.pop(POSEMB)
  if 'cls' in flat:
    flat['cls'] = flat['cls'] + posemb[:, :1]
    posemb = posemb[:, 1:]
  flat['pos_embedding'] = posemb
  if scan:
    blocks = {}
    for key in [k for k in flat if k.startswith('Transformer/encoderblock_')]:
      _, block, rest = key.split('/', 2)
      blocks.setdefault(rest, {})[int(block.split('_')[1])] = flat.pop(key)
    for rest, per_layer in blocks.items():
      flat[f'Transformer/encoderblock/{rest}'] = np.stack([per_layer[i] for i in sorted(per_layer)])
  return {prefix + k: v for k, v in flat.items()}


def _model_and_params(random_params, name, size, seed=0, **overrides):
  model = get_model(name, **overrides)
  params = random_params(families.param_shapes(model, size), seed=seed, scale=0.1)
  return model, params


@functools.cache
def _apply(model):
  return jax.jit(lambda p, x: model.apply({'params': p}, x, train=False))


def _logits(model, params, size, seed=1):
  images = np.random.default_rng(seed).uniform(-1, 1, (2, size, size, 3)).astype(np.float32)
  return np.asarray(_apply(model)(params, images))


def _assert_trees_equal(a, b):
  fa, fb = _flat(a), _flat(b)
  assert sorted(fa) == sorted(fb)
  for key in fa:
    assert fa[key].shape == fb[key].shape, key
    np.testing.assert_array_equal(fa[key], fb[key], err_msg=key)


@pytest.mark.slow
def test_original_release_b16_in21k_loads_with_equal_logits(tmp_path, random_params):
  # Full-size ViT-B/16 as in the imagenet21k release: pre_logits and a 21843-class head.
  model = get_model('ViT-B_16', num_classes=21843, representation_size=768)
  params = random_params(families.param_shapes(model, 224), scale=0.05)
  on_disk = released_layout(params)
  assert len(on_disk) == 202  # 200 + pre_logits (reference §1.2)
  assert on_disk[
    'Transformer/encoderblock_11/MultiHeadDotProductAttention_1/query/kernel'
  ].shape == (
    768,
    12,
    64,
  )
  path = tmp_path / 'ViT-B_16.npz'
  np.savez(path, **on_disk)

  loaded, description = checkpoint.read(path)
  assert 'pre-Linen names' in description
  _assert_trees_equal(loaded, params)
  ours, theirs = _logits(model, params, 224), _logits(model, loaded, 224)
  assert ours.shape == (2, 21843) and np.abs(ours).max() > 0.1
  np.testing.assert_allclose(theirs, ours, atol=1e-6, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize(
  ('name', 'size', 'overrides', 'groupnorms'),
  [
    # AugReg R+Ti/16 i21k: the real architecture, no pre_logits, a 21843-class head.
    ('R+ViT-Ti_16', 224, {'num_classes': 21843}, 1),
    # The R50+ViT-B/16 stem with fewer units per stage (conv_proj/gn_proj in each unit1,
    # widths 64..1024 as released), pre_logits, a small transformer.
    (
      'R50+ViT-B_16',
      64,
      {
        'num_classes': 7,
        'representation_size': 32,
        'hidden_size': 32,
        'resnet': {'num_layers': (1, 2, 1)},
        'transformer': {'num_layers': 2, 'num_heads': 4, 'mlp_dim': 64},
      },
      1 + 3 * (1 + 2 + 1) + 3,
    ),
  ],
)
def test_hybrid_with_1x1x1c_groupnorm_loads_with_equal_logits(
  tmp_path, random_params, name, size, overrides, groupnorms
):
  model, params = _model_and_params(random_params, name, size, **overrides)
  on_disk = released_layout(params)
  four_d = [k for k, v in on_disk.items() if v.ndim == 4 and v.shape[:3] == (1, 1, 1)]
  assert len([k for k in four_d if k.endswith('/scale')]) == groupnorms
  np.savez(tmp_path / 'hybrid.npz', **on_disk)

  loaded = checkpoint.load(tmp_path / 'hybrid.npz')
  _assert_trees_equal(loaded, params)
  ours = _logits(model, params, size)
  assert np.abs(ours).max() > 0.1
  np.testing.assert_allclose(_logits(model, loaded, size), ours, atol=1e-6, rtol=0)


@pytest.mark.parametrize('prefix', ['params/', 'params/img/', 'opt/target/'])
def test_big_vision_scan_stacked_with_top_level_posemb_gives_equal_logits(
  tmp_path, random_params, prefix
):
  model, params = _model_and_params(
    random_params,
    'testing',
    32,
    num_classes=5,
    hidden_size=32,
    patches={'size': (8, 8)},
    transformer={'num_layers': 3, 'num_heads': 4, 'mlp_dim': 64},
  )
  on_disk = big_vision_layout(params, prefix)
  assert on_disk[f'{prefix}pos_embedding'].shape == (1, 16, 32)
  assert on_disk[f'{prefix}Transformer/encoderblock/MlpBlock_0/Dense_0/kernel'].shape == (3, 32, 64)
  np.savez(tmp_path / 'bv.npz', **on_disk)

  loaded, description = checkpoint.read(tmp_path / 'bv.npz')
  assert 'big_vision' in description and 'scan-stacked' in description
  # Our equivalent of "posemb before cls": a zero class row, cls as stored.
  np.testing.assert_array_equal(loaded['Transformer']['posembed_input']['pos_embedding'][:, 0], 0)
  np.testing.assert_array_equal(loaded['cls'], on_disk[f'{prefix}cls'])
  ours = _logits(model, params, 32)
  np.testing.assert_allclose(_logits(model, loaded, 32), ours, atol=1e-6, rtol=0)


def test_big_vision_gap_model_unscanned_loads_exactly(tmp_path, random_params):
  model, params = _model_and_params(
    random_params,
    'testing',
    32,
    num_classes=4,
    classifier='gap',
    hidden_size=16,
    patches={'size': (8, 8)},
    transformer={'num_layers': 2, 'num_heads': 2, 'mlp_dim': 32},
  )
  np.savez(tmp_path / 'bv.npz', **big_vision_layout(params, 'params/', scan=False))
  loaded = checkpoint.load(tmp_path / 'bv.npz')
  _assert_trees_equal(loaded, params)  # no class token: the embedding is taken as is
  np.testing.assert_array_equal(_logits(model, loaded, 32), _logits(model, params, 32))


def test_big_vision_old_posemb_with_class_row_is_kept(tmp_path, random_params):
  # Checkpoints from before 2022 kept the class row in `Transformer/pos_embedding`.
  _, params = _model_and_params(
    random_params, 'testing', 32, num_classes=3, patches={'size': (8, 8)}
  )
  flat = _flat(params)
  flat['Transformer/pos_embedding'] = flat.pop(POSEMB)
  np.savez(tmp_path / 'old.npz', **{'params/' + k: v for k, v in flat.items()})
  _assert_trees_equal(checkpoint.load(tmp_path / 'old.npz'), params)


def test_save_npz_writes_the_released_layout_bit_for_bit(tmp_path, random_params):
  _, params = _model_and_params(
    random_params,
    'R+ViT-Ti_16',
    64,
    num_classes=3,
    hidden_size=24,
    transformer={'num_layers': 2, 'num_heads': 3, 'mlp_dim': 48},
  )
  checkpoint.save_npz(params, tmp_path / 'ours.npz')
  with np.load(tmp_path / 'ours.npz', allow_pickle=False) as f:
    written = {k: f[k] for k in f.files}
  expected = released_layout(params)
  assert sorted(written) == sorted(expected)
  for key, value in expected.items():
    assert written[key].dtype == np.float32 and written[key].shape == value.shape, key
    np.testing.assert_array_equal(written[key], value, err_msg=key)
  # A plain zip of .npy members, as np.savez writes (what timm and vit_jax open).
  with zipfile.ZipFile(tmp_path / 'ours.npz') as z:
    assert 'Transformer/encoderblock_1/MlpBlock_3/Dense_1/kernel.npy' in z.namelist()


def test_the_original_vit_jax_loader_reads_save_npz(tmp_path, random_params):
  """vit_jax's own recipe: recover_tree -> flax convert_pre_linen -> _fix_groupnorm squeeze."""
  from flax.training import checkpoints

  _, params = _model_and_params(
    random_params,
    'R+ViT-Ti_16',
    64,
    num_classes=3,
    hidden_size=24,
    transformer={'num_layers': 11, 'num_heads': 3, 'mlp_dim': 48},  # encoderblock_10 sorts
  )
  checkpoint.save_npz(params, tmp_path / 'ours.npz')
  with np.load(tmp_path / 'ours.npz', allow_pickle=False) as f:
    tree = {}
    for key in f.files:
      node = tree
      *parents, leaf = key.split('/')
      for part in parents:
        node = node.setdefault(part, {})
      node[leaf] = f[key]
  restored = dict(checkpoints.convert_pre_linen(tree))
  restored = jax.tree_util.tree_map_with_path(
    lambda path, x: (
      x.squeeze()
      if len(path) > 1
      and re.match(r'gn(\d+|_root|_proj)$', path[-2].key)
      and path[-1].key in ('scale', 'bias')
      else x
    ),
    restored,
  )
  _assert_trees_equal(restored, params)


@pytest.mark.parametrize('layout', ['released', 'big_vision_scan'])
def test_npz_round_trip_is_bit_exact(tmp_path, random_params, layout):
  _, params = _model_and_params(
    random_params,
    'R+ViT-Ti_16' if layout == 'released' else 'testing',
    64,
    num_classes=3,
    hidden_size=24,
    transformer={'num_layers': 2, 'num_heads': 3, 'mlp_dim': 48},
  )
  src = released_layout(params) if layout == 'released' else big_vision_layout(params)
  np.savez(tmp_path / 'src.npz', **src)
  checkpoint.save_npz(checkpoint.load(tmp_path / 'src.npz'), tmp_path / 'dst.npz')
  checkpoint.save_npz(checkpoint.load(tmp_path / 'dst.npz'), tmp_path / 'dst2.npz')
  with np.load(tmp_path / 'dst.npz') as a, np.load(tmp_path / 'dst2.npz') as b:
    first, second = {k: a[k] for k in a.files}, {k: b[k] for k in b.files}
  if layout == 'released':  # npz -> ours -> npz gives back the very file contents
    assert sorted(first) == sorted(src)
    for key in src:
      assert first[key].dtype == src[key].dtype and first[key].shape == src[key].shape
      np.testing.assert_array_equal(first[key], src[key], err_msg=key)
  assert sorted(first) == sorted(second)  # and is a fixed point
  for key in first:
    np.testing.assert_array_equal(first[key], second[key], err_msg=key)


def test_convert_pre_linen_renumbers_per_class_and_is_idempotent():
  pre = {
    'encoderblock_10': {'LayerNorm_0': 1, 'MultiHeadDotProductAttention_1': 2, 'LayerNorm_2': 3},
    'encoderblock_2': {'MlpBlock_3': {'Dense_0': 4, 'Dense_1': 5}},
    'gn_root': 6,
  }
  linen = npz.convert_pre_linen(pre)
  assert list(linen) == ['encoderblock_0', 'encoderblock_1', 'gn_root']  # 2 < 10 (natural)
  assert linen['encoderblock_1'] == {
    'LayerNorm_0': 1,
    'MultiHeadDotProductAttention_0': 2,
    'LayerNorm_1': 3,
  }
  assert linen['encoderblock_0'] == {'MlpBlock_0': {'Dense_0': 4, 'Dense_1': 5}}
  assert npz.convert_pre_linen(linen) == linen


# ---------------------------------------------------------------------------------------------
# Bad input: one line, the file named, nothing unpickled, nothing half-written.


def _error(path, **kwargs) -> str:
  with pytest.raises(checkpoint.CheckpointError) as e:
    checkpoint.load(path, **kwargs)
  message = str(e.value)
  assert '\n' not in message
  return message


@pytest.fixture
def small_npz(tmp_path, random_params):
  _, params = _model_and_params(random_params, 'testing', 32, num_classes=3)
  path = tmp_path / 'good.npz'
  np.savez(path, **released_layout(params))
  return path


def test_truncated_npz_is_refused(tmp_path, small_npz):
  data = small_npz.read_bytes()
  (tmp_path / 'cut.npz').write_bytes(data[: len(data) // 2])
  message = _error(tmp_path / 'cut.npz')
  assert 'cut.npz' in message and 'truncated' in message


def test_corrupt_member_is_refused(tmp_path, small_npz):
  data = bytearray(small_npz.read_bytes())
  start = data.index(b'\x93NUMPY')  # first member's array header
  data[start + 200 : start + 260] = b'\xff' * 60  # inside the member: a CRC mismatch
  (tmp_path / 'bad.npz').write_bytes(bytes(data))
  assert 'not a readable .npz' in _error(tmp_path / 'bad.npz')


def test_object_arrays_are_never_unpickled(tmp_path):
  np.savez(tmp_path / 'pickle.npz', **{'embedding/kernel': np.array([{'a': 1}], dtype=object)})
  assert 'pickled Python objects, which are never loaded' in _error(tmp_path / 'pickle.npz')


def test_unknown_npz_layout(tmp_path):
  np.savez(tmp_path / 'other.npz', weights=np.zeros(3, np.float32))
  message = _error(tmp_path / 'other.npz')
  assert 'unknown .npz layout' in message and 'weights' in message


def test_integer_arrays_are_refused(tmp_path, small_npz):
  with np.load(small_npz) as f:
    flat = {k: f[k] for k in f.files}
  flat['cls'] = flat['cls'].astype(np.int32)
  np.savez(tmp_path / 'int.npz', **flat)
  message = _error(tmp_path / 'int.npz')
  assert "'cls'" in message and 'int32' in message


def test_missing_file_and_unknown_format(tmp_path):
  assert 'no such file' in _error(tmp_path / 'absent.npz')
  (tmp_path / 'notes.txt').write_text('hello')
  assert 'unknown checkpoint layout' in _error(tmp_path / 'notes.txt')


def test_save_npz_failure_leaves_the_old_file_and_no_temp(tmp_path, small_npz, monkeypatch):
  before = small_npz.read_bytes()
  params = checkpoint.load(small_npz)

  def boom(*args, **kwargs):
    raise OSError('disk full')

  monkeypatch.setattr(np, 'savez', boom)
  with pytest.raises(OSError, match='disk full'):
    checkpoint.save_npz(params, small_npz)
  assert small_npz.read_bytes() == before
  assert sorted(p.name for p in tmp_path.iterdir()) == ['good.npz']


def test_save_npz_refuses_non_float_leaves(tmp_path):
  with pytest.raises(checkpoint.CheckpointError, match="'step' has dtype int64"):
    checkpoint.save_npz({'cls': np.zeros((1, 1, 4)), 'step': np.int64(3)}, tmp_path / 'x.npz')
  assert not list(tmp_path.iterdir())


@pytest.mark.parametrize('dtype', ['bfloat16', 'float16'])
@pytest.mark.parametrize('layout', ['released', 'big_vision_scan', 'big_vision_two_towers'])
def test_narrow_float_npz_as_big_vision_writes_it_gives_the_logits_of_its_float32_cast(
  tmp_path, random_params, layout, dtype
):
  """big_vision saves bfloat16 weights with np.savez, which stores them as void |V2 (numpy has
  no bfloat16): read back as bfloat16, exactly, and the logits are those of the file cast to
  float32; save_npz(dtype=) writes that dtype back, the default float32."""
  import ml_dtypes

  model, params = _model_and_params(
    random_params, 'testing', 32, num_classes=5, hidden_size=32, patches={'size': (8, 8)},
    transformer={'num_layers': 2, 'num_heads': 4, 'mlp_dim': 64},
  )  # fmt: skip
  narrow = ml_dtypes.bfloat16 if dtype == 'bfloat16' else np.float16
  params = jax.tree.map(lambda x: np.asarray(x).astype(narrow), params)
  prefix = 'params/img/' if layout == 'big_vision_two_towers' else 'params/'
  src = released_layout(params) if layout == 'released' else big_vision_layout(params, prefix)
  np.savez(tmp_path / 'bv.npz', **src)
  with np.load(tmp_path / 'bv.npz') as stored:
    kinds = {stored[k].dtype.str for k in stored.files}
  assert kinds == ({'|V2'} if dtype == 'bfloat16' else {'<f2'})  # as big_vision's files hold
  loaded = checkpoint.load(tmp_path / 'bv.npz')
  leaves = jax.tree.leaves(loaded)
  assert {x.dtype for x in leaves} == {np.dtype(narrow)}
  np.savez(tmp_path / 'f32.npz', **{k: v.astype(np.float32) for k, v in src.items()})
  widened = checkpoint.load(tmp_path / 'f32.npz')  # the file's float32 cast
  np.testing.assert_array_equal(
    _logits(model, jax.tree.map(lambda x: np.asarray(x, np.float32), loaded), 32),
    _logits(model, widened, 32),
  )
  checkpoint.save_npz(loaded, tmp_path / 'again.npz', dtype=dtype)
  with np.load(tmp_path / 'again.npz') as again:
    assert {again[k].dtype.str for k in again.files} == kinds
  checkpoint.save_npz(loaded, tmp_path / 'wide.npz')  # the default: float32, exactly
  _assert_trees_equal(checkpoint.load(tmp_path / 'wide.npz'), widened)
