"""timm VisionTransformer and DeiT state dicts: our exports load in timm with our logits, files
timm writes load into ours with its logits (its tanh and its default exact GELU), round trips
are bit-exact, what we cannot compute is refused."""

import functools
import json
import re

import jax
import numpy as np
import pytest
import safetensors.torch as safetensors_torch
import timm  # an oracle pinned in requirements/test.in: missing, these tests fail
import torch
from conftest import SMALL

from vit_jax import checkpoint, families
from vit_jax.cli import convert
from vit_jax.models import get_config, get_model

# ViT-B/16's widths at two blocks; SMALL (conftest) for everything that does not need them.
B16_SHALLOW = {'transformer': {'num_layers': 2, 'num_heads': 12, 'mlp_dim': 3072}}
TIMM_SMALL = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, mlp_ratio=2.0)


@functools.cache
def _apply(model, blocks=None):
  return jax.jit(
    lambda p, x: model.apply({'params': p}, x, train=False, intermediate_blocks=blocks)
  )


def _images(size, seed=1):
  return np.random.default_rng(seed).uniform(-1, 1, (2, size, size, 3)).astype(np.float32)


def _timm_logits(model, images):
  with torch.no_grad():
    return model.eval()(torch.from_numpy(images.transpose(0, 3, 1, 2))).numpy()


def _timm_model(name='vit_base_patch16_224', seed=0, act_layer='gelu_tanh', scale=0.1, **kw):
  """A timm model, by default with the released weights' GELU (`act_layer=None`: the
  architecture's own), every weight replaced by N(0, scale) noise."""
  if act_layer is not None:
    kw['act_layer'] = act_layer
  model = timm.create_model(name, pretrained=False, **kw)
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for p in model.parameters():
      p.copy_(scale * torch.randn(p.shape, generator=gen))
  return model.eval()


def _save(state, path):
  path.parent.mkdir(parents=True, exist_ok=True)
  safetensors_torch.save_file({k: v.contiguous() for k, v in state.items()}, path)
  return path


def _config(name, **overrides):
  config = get_config(name)
  config.update(overrides)
  return config


# ---------------------------------------------------------------------------------------------
# Ours -> timm.


def test_b16_shaped_export_loads_in_timm_with_equal_logits(tmp_path, random_params):
  model = get_model('ViT-B_16', num_classes=1000, **B16_SHALLOW)
  params = random_params(families.param_shapes(model, 224), scale=0.05)
  checkpoint.export_timm(params, get_config('ViT-B_16'), tmp_path / 'timm')

  config = json.loads((tmp_path / 'timm' / 'config.json').read_text())
  args = config['model_args']
  assert config['architecture'] == 'vit_base_patch16_224'
  assert args['act_layer'] == 'gelu_tanh' and args['norm_layer'] == 'layernorm'
  assert (args['depth'], args['num_heads'], args['global_pool']) == (2, 12, 'token')
  theirs_model = timm.create_model(f'local-dir:{tmp_path / "timm"}', pretrained=True)
  assert (
    theirs_model.norm.eps == 1e-6 and type(theirs_model.blocks[0].mlp.act).__name__ == 'GELUTanh'
  )
  images = _images(224)
  ours = np.asarray(_apply(model)(params, images))
  theirs = _timm_logits(theirs_model, images)
  assert theirs.shape == (2, 1000) and np.abs(ours).max() > 0.1
  np.testing.assert_allclose(theirs, ours, atol=1e-5, rtol=0)


def test_gap_model_exports_with_the_norm_before_pooling(tmp_path, random_params):
  model = get_model('testing', num_classes=5, classifier='gap', **SMALL)
  params = random_params(families.param_shapes(model, 32))
  checkpoint.export_timm(params, _config('testing', classifier='gap'), tmp_path / 'timm')

  config = json.loads((tmp_path / 'timm' / 'config.json').read_text())
  # The plain way: create_model with the written arguments, then a strict load_state_dict.
  theirs_model = timm.create_model(config['architecture'], **config['model_args'])
  theirs_model.load_state_dict(safetensors_torch.load_file(tmp_path / 'timm' / 'model.safetensors'))
  assert theirs_model.cls_token is None and theirs_model.global_pool == 'avg'
  images = _images(32)
  ours = np.asarray(_apply(model)(params, images))
  assert np.abs(ours).max() > 0.1
  np.testing.assert_allclose(_timm_logits(theirs_model, images), ours, atol=1e-5, rtol=0)


def test_unpooled_model_exports_with_no_pooling(tmp_path, random_params):
  model = get_model('testing', num_classes=None, classifier='token_unpooled', **SMALL)
  params = random_params(families.param_shapes(model, 32))
  config = _config('testing', classifier='token_unpooled')
  checkpoint.export_timm(params, config, tmp_path / 'timm')
  theirs_model = timm.create_model(f'local-dir:{tmp_path / "timm"}', pretrained=True)
  images = _images(32)
  ours = np.asarray(_apply(model)(params, images))
  assert ours.shape == (2, 17, 32)
  np.testing.assert_allclose(_timm_logits(theirs_model, images), ours, atol=1e-5, rtol=0)


def test_intermediate_blocks_equal_timm_forward_intermediates(tmp_path, random_params):
  model = get_model('testing', num_classes=5, **SMALL)
  params = random_params(families.param_shapes(model, 32))
  checkpoint.export_timm(params, None, tmp_path / 'timm')
  theirs_model = timm.create_model(f'local-dir:{tmp_path / "timm"}', pretrained=True).eval()
  images = _images(32)
  ours = _apply(model, (0, 1))(params, images)
  with torch.no_grad():
    grids, prefixes = zip(
      *theirs_model.forward_intermediates(
        torch.from_numpy(images.transpose(0, 3, 1, 2)),
        indices=[0, 1],
        return_prefix_tokens=True,
        intermediates_only=True,
      ),
      strict=True,
    )
  for block, grid, prefix in zip((0, 1), grids, prefixes, strict=True):
    expected = grid.numpy().transpose(0, 2, 3, 1)  # NCHW -> our (B, h, w, D)
    assert expected.shape == (2, 4, 4, 32)
    np.testing.assert_allclose(ours[f'encoderblock_{block}'], expected, atol=1e-5, rtol=0)
    np.testing.assert_allclose(ours[f'encoderblock_{block}/prefix'], prefix.numpy(), atol=1e-5)


# ---------------------------------------------------------------------------------------------
# timm -> ours.


def test_folder_timm_writes_loads_into_ours_with_equal_logits(tmp_path):
  theirs_model = _timm_model(depth=2, num_classes=10)
  timm.models.save_for_hf(theirs_model, tmp_path / 'hub', safe_serialization=True)
  params, description = checkpoint.read(tmp_path / 'hub')  # heads from the config.json
  assert description.startswith('timm (model.safetensors') and 'tanh GELU' in description
  qkv = params['Transformer']['encoderblock_1']['MultiHeadDotProductAttention_0']['value']
  assert qkv['kernel'].shape == (768, 12, 64) and qkv['bias'].shape == (12, 64)

  model = get_model('ViT-B_16', num_classes=10, **B16_SHALLOW)
  images = _images(224)
  ours = np.asarray(_apply(model)(params, images))
  theirs = _timm_logits(theirs_model, images)
  assert np.abs(theirs).max() > 0.1
  np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
  ('timm_args', 'classifier', 'hub'),
  [
    ({'class_token': False, 'global_pool': 'avg', 'fc_norm': False}, 'gap', False),
    ({'no_embed_class': True}, 'token', False),  # DeiT III / big_vision layout: no class row
    # A LayerNorm after taking the token: only timm's config.json tells it from 'avg'.
    ({'global_pool': 'token', 'fc_norm': True}, 'token', True),
  ],
)
def test_timm_layouts_load_with_equal_logits(tmp_path, timm_args, classifier, hub):
  theirs_model = _timm_model(num_classes=6, **TIMM_SMALL, **timm_args)
  if hub:
    timm.models.save_for_hf(theirs_model, tmp_path / 'hub', safe_serialization=True)
    params = checkpoint.load(tmp_path / 'hub')
  else:
    params = checkpoint.load(
      _save(theirs_model.state_dict(), tmp_path / 'w.safetensors'), num_heads=4
    )
  if timm_args.get('no_embed_class'):
    posemb = params['Transformer']['posembed_input']['pos_embedding']
    assert posemb.shape == (1, 17, 32) and not posemb[0, 0].any()
  model = get_model('testing', num_classes=6, classifier=classifier, **SMALL)
  images = _images(32)
  theirs = _timm_logits(theirs_model, images)
  assert np.abs(theirs).max() > 0.1
  np.testing.assert_allclose(np.asarray(_apply(model)(params, images)), theirs, atol=1e-5, rtol=0)


def test_pth_loads_through_weights_only_as_the_safetensors_file(tmp_path):
  state = _timm_model(num_classes=3, **TIMM_SMALL).state_dict()
  a = checkpoint.flatten(checkpoint.load(_save(state, tmp_path / 'w.safetensors'), num_heads=4))
  torch.save({'model': state}, tmp_path / 'checkpoint.pth')  # as DeiT's training script saves
  b = checkpoint.flatten(checkpoint.load(tmp_path / 'checkpoint.pth', num_heads=4))
  assert a.keys() == b.keys() and len(a) == 16 * 2 + 8  # 16 per block; embeddings, norm, head
  for key in a:
    np.testing.assert_array_equal(a[key], b[key], err_msg=key)


@pytest.mark.parametrize(
  'timm_args', [{}, {'class_token': False, 'global_pool': 'avg', 'fc_norm': False}]
)
def test_timm_ours_timm_round_trip_is_bit_exact(tmp_path, timm_args):
  state = _timm_model(num_classes=3, **TIMM_SMALL, **timm_args).state_dict()
  params = checkpoint.load(_save(state, tmp_path / 'src.safetensors'), num_heads=4)
  back = checkpoint.to_timm_state_dict(params)
  assert sorted(back) == sorted(state)
  for key, value in state.items():
    np.testing.assert_array_equal(back[key], value.numpy(), err_msg=key)


def test_ours_timm_ours_round_trip_is_bit_exact(tmp_path, random_params):
  params = random_params(families.param_shapes(get_model('testing', num_classes=6, **SMALL), 32))
  checkpoint.export_timm(params, None, tmp_path / 'timm')
  back = checkpoint.flatten(checkpoint.load(tmp_path / 'timm'))
  assert back.keys() == checkpoint.flatten(params).keys()
  for key, value in checkpoint.flatten(params).items():
    np.testing.assert_array_equal(back[key], value, err_msg=key)


def test_deit_distillation_token_maps_to_dist_token_and_head_dist(tmp_path):
  theirs_model = _timm_model('deit_tiny_distilled_patch16_224', num_classes=4, **TIMM_SMALL)
  state = theirs_model.state_dict()
  params = checkpoint.load(_save(state, tmp_path / 'deit.safetensors'), num_heads=4)
  assert params['dist_token'].shape == (1, 1, 32) and params['head_dist']['kernel'].shape == (32, 4)
  np.testing.assert_array_equal(params['dist_token'], state['dist_token'].numpy())
  np.testing.assert_array_equal(params['head_dist']['kernel'], state['head_dist.weight'].numpy().T)
  assert params['Transformer']['posembed_input']['pos_embedding'].shape == (1, 2 + 16, 32)

  # Our distilled ViT on these weights: timm's logits, the mean of its two heads.
  model = get_model('DeiT-B_16-distilled', num_classes=4, **SMALL)
  images = _images(32)
  theirs = _timm_logits(theirs_model, images)
  assert np.abs(theirs).max() > 0.1
  np.testing.assert_allclose(np.asarray(_apply(model)(params, images)), theirs, atol=1e-5, rtol=0)

  # Written back, timm's distilled model takes it strictly, with the same logits.
  checkpoint.export_timm(params, None, tmp_path / 'out')
  config = json.loads((tmp_path / 'out' / 'config.json').read_text())
  assert config['architecture'] == 'deit_base_distilled_patch16_224'  # args set the sizes
  again = timm.create_model(f'local-dir:{tmp_path / "out"}', pretrained=True)
  np.testing.assert_array_equal(_timm_logits(again, images), theirs)


def test_deit_tiny_with_timm_default_exact_gelu_both_ways(tmp_path, random_params):
  """timm's deit_tiny_distilled_patch16_224 as timm builds it (exact GELU, two blocks): fit
  reads the GELU off its config.json and computes timm's logits; our exact-GELU DeiT, exported,
  is timm's model again."""
  theirs_model = _timm_model(
    'deit_tiny_distilled_patch16_224', act_layer=None, scale=0.3, depth=2, num_classes=10
  )
  assert type(theirs_model.blocks[0].mlp.act).__name__ == 'GELU'
  timm.models.save_for_hf(theirs_model, tmp_path / 'hub', safe_serialization=True)
  fitted = checkpoint.fit(tmp_path / 'hub')
  assert fitted.config.distilled and fitted.config.gelu_approximate is False
  assert 'exact GELU' in fitted.found.description
  differ = "so the model's inputs differ from the file's preprocessing"  # what fit warns of
  assert fitted.found.unlike == (
    f"config.json's pretrained_cfg resizes bicubic; the project resizes bilinear, {differ}",
    "config.json's pretrained_cfg normalises pixels x as (x / 255 - [0.485, 0.456, 0.406]) /"
    f' [0.229, 0.224, 0.225]; the project as (x - 127.5) / 127.5, to [-1, 1], {differ}',
    "config.json's pretrained_cfg keeps the central 0.9 of each side before resizing; the"
    f' project resizes the whole image, {differ}',
  )
  images = _images(224)
  theirs = _timm_logits(theirs_model, images)
  ours = np.asarray(_apply(fitted.model())(fitted.params, images))
  np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)
  # The tanh GELU on the same weights misses timm's logits by far more than the tolerance.
  tanh = np.asarray(_apply(fitted.model(gelu_approximate=True))(fitted.params, images))
  assert np.abs(tanh - theirs).max() > 1e-4

  model = get_model(
    'DeiT-Ti_16-distilled', num_classes=10, gelu_approximate=False, transformer={'num_layers': 2}
  )
  params = random_params(families.param_shapes(model, 224), scale=0.1)
  config = get_config('DeiT-Ti_16-distilled')
  config.gelu_approximate = False
  checkpoint.export_timm(params, config, tmp_path / 'out')
  args = json.loads((tmp_path / 'out' / 'config.json').read_text())['model_args']
  assert args['act_layer'] == 'gelu'
  again = timm.create_model(f'local-dir:{tmp_path / "out"}', pretrained=True)
  ours = np.asarray(_apply(model)(params, images))
  assert np.abs(ours).max() > 0.1
  np.testing.assert_allclose(_timm_logits(again, images), ours, atol=1e-5, rtol=0)


def test_vit_with_timm_default_exact_gelu_through_convert(tmp_path):
  """A plain timm vit_* (exact GELU by default) converted to timm again keeps its GELU
  (act_layer='gelu'), and fit computes it, with timm's logits."""
  theirs_model = _timm_model(act_layer=None, scale=0.5, num_classes=6, **TIMM_SMALL)
  timm.models.save_for_hf(theirs_model, tmp_path / 'hub', safe_serialization=True)
  lines = []
  convert.convert(str(tmp_path / 'hub'), str(tmp_path / 'back'), 'timm', out=lines.append)
  assert 'exact GELU' in lines[0] and "act_layer='gelu'" in lines[1]
  again = timm.create_model(f'local-dir:{tmp_path / "back"}', pretrained=True)
  assert type(again.blocks[0].mlp.act).__name__ == 'GELU'
  images = _images(32)
  np.testing.assert_array_equal(_timm_logits(again, images), _timm_logits(theirs_model, images))
  fitted = checkpoint.fit(tmp_path / 'back')
  theirs = _timm_logits(theirs_model, images)
  np.testing.assert_allclose(
    _apply(fitted.model())(fitted.params, images), theirs, atol=1e-5, rtol=0
  )
  tanh = np.asarray(_apply(fitted.model(gelu_approximate=True))(fitted.params, images))
  assert np.abs(tanh - theirs).max() > 1e-4  # 10x the tolerance


def test_deit_file_into_a_vit_without_distillation_token(tmp_path):
  state = _timm_model('deit_tiny_distilled_patch16_224', num_classes=4, **TIMM_SMALL).state_dict()
  path = _save(state, tmp_path / 'deit.safetensors')
  model = get_model('testing', num_classes=4, **SMALL)
  with pytest.raises(checkpoint.CheckpointError, match=r'dist_token \(1, 1, 32\)') as e:
    checkpoint.load_pretrained(path, families.param_shapes(model, 32), _config('testing', **SMALL))
  assert '\n' not in str(e.value)
  # strict=False drops the token, its position row and the second head.
  params = checkpoint.load(path, num_heads=4)
  shapes = families.param_shapes(model, 32)
  fitted, report = checkpoint.merge_pretrained(params, shapes, get_config('testing'), strict=False)
  posemb = state['pos_embed'].numpy()
  np.testing.assert_array_equal(
    fitted['Transformer']['posembed_input']['pos_embedding'], np.delete(posemb, 1, axis=1)
  )
  assert report.unexpected == ['dist_token'] and 'head_dist/kernel' in report.dropped


def test_file_without_qkv_bias_loads_with_zero_biases(tmp_path):
  theirs_model = _timm_model(num_classes=3, qkv_bias=False, **TIMM_SMALL)
  assert theirs_model.blocks[0].attn.qkv.bias is None
  path = _save(theirs_model.state_dict(), tmp_path / 'w.safetensors')
  params, description = checkpoint.read(path, num_heads=4)
  assert 'no qkv bias: zeros' in description
  attention = params['Transformer']['encoderblock_1']['MultiHeadDotProductAttention_0']
  assert all(not attention[n]['bias'].any() for n in ('query', 'key', 'value'))
  assert attention['query']['bias'].shape == (4, 8)
  model = get_model('testing', num_classes=3, **SMALL)
  images = _images(32)
  np.testing.assert_allclose(
    np.asarray(_apply(model)(params, images)),
    _timm_logits(theirs_model, images),
    atol=1e-5,
    rtol=0,
  )


@pytest.mark.slow
def test_architecture_heads_table_matches_timm():
  """Every timm architecture whose name gives the number of heads, instantiated on no memory."""
  checked = set()
  for name in timm.list_models(['vit_*', 'deit*']):
    heads = checkpoint.timm.heads_of_architecture(name)
    if heads is not None:
      with torch.device('meta'):
        model = timm.create_model(name)
      assert model.blocks[0].attn.num_heads == heads, name
      checked.add(name.split('_')[1])
  assert checked == set(checkpoint.timm.HEADS_BY_SIZE)


def test_exports_name_registered_architectures():
  registered = set(timm.list_models(['vit_*', 'deit*']))
  for (hidden, layers, heads), size in checkpoint.timm._SIZES.items():
    for patch in checkpoint.timm._PATCHES[size]:
      name = checkpoint.timm._architecture(size, (patch, patch), distilled=False)
      assert name == f'vit_{size}_patch{patch}_224' and name in registered
      with torch.device('meta'):
        model = timm.create_model(name)
      assert (model.embed_dim, len(model.blocks), model.blocks[0].attn.num_heads) == (
        hidden,
        layers,
        heads,
      )
  for size in ('tiny', 'small', 'base', None):
    assert checkpoint.timm._architecture(size, (16, 16), distilled=True) in registered


# ---------------------------------------------------------------------------------------------
# What we cannot compute, and bad input.


def _error(path, **kw):
  with pytest.raises(checkpoint.CheckpointError) as e:
    checkpoint.load(path, **kw)
  assert '\n' not in str(e.value)
  return str(e.value)


@pytest.mark.parametrize(
  ('timm_args', 'match'),
  [
    ({'global_pool': 'avg', 'fc_norm': False}, 'class token averages the patch tokens only'),
    ({'class_token': False, 'global_pool': 'avg'}, 'fc_norm normalises the average-pooled'),
    ({'reg_tokens': 4}, r"'reg_token' is register tokens"),
    ({'init_values': 0.1}, r"'blocks.0.ls1.gamma' is layer scale"),
    ({'qk_norm': True}, 'qk-norm'),
    ({'pre_norm': True}, 'pre_norm'),
  ],
)
def test_options_our_vit_does_not_compute_are_refused(tmp_path, timm_args, match):
  theirs_model = _timm_model(num_classes=3, **TIMM_SMALL, **timm_args)
  timm.models.save_for_hf(theirs_model, tmp_path / 'hub', safe_serialization=True)
  assert re.search(match, _error(tmp_path / 'hub'))


def test_bare_file_needs_the_number_of_heads(tmp_path):
  path = _save(_timm_model(num_classes=3, **TIMM_SMALL).state_dict(), tmp_path / 'w.safetensors')
  assert '--model' in _error(path)
  assert 'not divisible' in _error(path, num_heads=5)


def test_missing_key_is_named(tmp_path):
  state = _timm_model(num_classes=3, **TIMM_SMALL).state_dict()
  del state['blocks.1.mlp.fc2.weight']
  assert 'MlpBlock_0/Dense_1/kernel' in _error(
    _save(state, tmp_path / 'cut.safetensors'), num_heads=4
  )


@pytest.mark.parametrize(
  ('name', 'overrides', 'match'),
  [
    ('R+ViT-Ti_16', {'num_classes': 3}, 'hybrid'),
    ('testing', {'num_classes': 3, 'representation_size': 8}, 'pre_logits'),
    ('Mixer-S_32', {'num_classes': 3}, 'MLP-Mixer models have no timm VisionTransformer'),
    ('testing', {'num_classes': 3, 'posemb': 'sincos2d', 'hidden_size': 32}, 'sincos2d'),
  ],
)
def test_unexportable_models_fail_and_write_nothing(
  tmp_path, random_params, name, overrides, match
):
  params = random_params(families.param_shapes(get_model(name, **overrides), 64))
  with pytest.raises(checkpoint.CheckpointError, match=match):
    checkpoint.export_timm(params, _config(name, **overrides), tmp_path / 'out')
  assert not list(tmp_path.iterdir())


def test_convert_to_timm(tmp_path, random_params):
  model = get_model('testing', num_classes=4, **SMALL)
  params = random_params(families.param_shapes(model, 32))
  checkpoint.save_npz(params, tmp_path / 'src.npz')
  lines = []
  convert.convert(str(tmp_path / 'src.npz'), str(tmp_path / 'timm'), 'timm', out=lines.append)
  assert 'wrote' in lines[-1] and 'timm' in lines[-1]
  theirs_model = timm.create_model(f'local-dir:{tmp_path / "timm"}', pretrained=True)
  images = _images(32)
  ours = np.asarray(_apply(model)(params, images))
  np.testing.assert_allclose(_timm_logits(theirs_model, images), ours, atol=1e-5, rtol=0)


def test_labels_are_timm_label_names(tmp_path, random_params):
  params = random_params(families.param_shapes(get_model('testing', num_classes=3, **SMALL), 32))
  checkpoint.export_timm(params, None, tmp_path / 'timm', labels=['cat', 'dog', 'fox'])
  theirs_model = timm.create_model(f'local-dir:{tmp_path / "timm"}', pretrained=True)
  assert theirs_model.pretrained_cfg['label_names'] == ['cat', 'dog', 'fox']
  with pytest.raises(checkpoint.CheckpointError, match=r'^2 labels for a head of 3 classes$'):
    checkpoint.export_timm(params, None, tmp_path / 'bad', labels=['cat', 'dog'])
  assert not (tmp_path / 'bad').exists()
