"""Hugging Face ViT checkpoints: our export loads in transformers with our logits; files that
transformers writes load into ours; round trips are bit-exact; bad input gives one-line errors."""

import functools
import json
import shutil
import sys

import jax
import numpy as np
import pytest
import safetensors.torch as safetensors_torch
import torch  # the oracles are test requirements (requirements/test.in): missing, they fail
import transformers
from conftest import SMALL
from safetensors.numpy import load_file

from vit_jax import checkpoint, families
from vit_jax.checkpoint import hf_siglip
from vit_jax.models import get_config, get_model


@functools.cache
def _apply(model):
  return jax.jit(lambda p, x: model.apply({'params': p}, x, train=False))


def _images(size, seed=1):
  return np.random.default_rng(seed).uniform(-1, 1, (2, size, size, 3)).astype(np.float32)


def _torch_images(images):
  return torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2)))


def _hf_config(**kw):
  """SMALL in Hugging Face's terms, with the GELU and LayerNorm epsilon of the released weights."""
  base = dict(
    hidden_size=SMALL['hidden_size'],
    num_hidden_layers=SMALL['transformer']['num_layers'],
    num_attention_heads=SMALL['transformer']['num_heads'],
    intermediate_size=SMALL['transformer']['mlp_dim'],
    image_size=32,
    patch_size=SMALL['patches']['size'][0],
    hidden_act='gelu_pytorch_tanh',
    layer_norm_eps=1e-6,
  )
  return transformers.ViTConfig(**{**base, **kw})


def _randomise(hf_model, seed=0, scale=0.1):
  """Every weight replaced by noise, so nothing sits at an initial value (zeros, ones)."""
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for p in hf_model.parameters():
      p.copy_(scale * torch.randn(p.shape, generator=gen))
  return hf_model.eval()


def _assert_no_loading_issues(info):
  for kind in ('missing_keys', 'unexpected_keys', 'mismatched_keys'):
    assert not info[kind], (kind, info[kind])


def _tensors(path):
  return load_file(str(path))


def _assert_same_tensors(a, b):
  assert sorted(a) == sorted(b)
  for key in a:
    assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
    np.testing.assert_array_equal(a[key], b[key], err_msg=key)


@pytest.mark.slow
def test_b16_export_loads_with_from_pretrained_and_equal_logits(tmp_path, random_params):
  model = get_model('ViT-B_16', num_classes=1000)
  params = random_params(families.param_shapes(model, 224), scale=0.05)
  checkpoint.export_hf(params, get_config('ViT-B_16'), tmp_path / 'hf')

  config = json.loads((tmp_path / 'hf' / 'config.json').read_text())
  assert config['hidden_act'] == 'gelu_pytorch_tanh' and config['layer_norm_eps'] == 1e-6
  assert config['architectures'] == ['ViTForImageClassification'] and config['image_size'] == 224
  hf, info = transformers.ViTForImageClassification.from_pretrained(
    tmp_path / 'hf', output_loading_info=True
  )
  _assert_no_loading_issues(info)
  images = _images(224)
  ours = np.asarray(_apply(model)(params, images))
  with torch.no_grad():
    theirs = hf.eval()(pixel_values=_torch_images(images)).logits.numpy()
  assert theirs.shape == (2, 1000) and np.abs(ours).max() > 0.1
  np.testing.assert_allclose(theirs, ours, atol=1e-5, rtol=0)


def test_features_model_exports_as_vitmodel_whose_pooler_is_pre_logits(tmp_path, random_params):
  model = get_model('testing', num_classes=None, representation_size=24, **SMALL)
  params = random_params(families.param_shapes(model, 32), scale=0.2)
  checkpoint.export_hf(params, None, tmp_path / 'hf')

  assert json.loads((tmp_path / 'hf' / 'config.json').read_text())['architectures'] == ['ViTModel']
  hf, info = transformers.ViTModel.from_pretrained(tmp_path / 'hf', output_loading_info=True)
  _assert_no_loading_issues(info)
  images = _images(32)
  ours = np.asarray(_apply(model)(params, images))  # tanh(pre_logits(token 0))
  with torch.no_grad():
    theirs = hf.eval()(pixel_values=_torch_images(images)).pooler_output.numpy()
  assert ours.shape == theirs.shape == (2, 24)
  np.testing.assert_allclose(theirs, ours, atol=1e-5, rtol=0)


def test_save_pretrained_model_loads_into_ours_with_equal_logits(tmp_path):
  hf = _randomise(transformers.ViTForImageClassification(_hf_config(num_labels=5)))
  hf.save_pretrained(tmp_path / 'hf')
  params, description = checkpoint.read(tmp_path / 'hf')
  assert '4.x names' in description and 'ViTForImageClassification' in description

  model = get_model('testing', num_classes=5, **SMALL)
  fitted, report = checkpoint.merge_pretrained(
    params, families.param_shapes(model, 32), get_config('testing'), keep_head=True
  )
  assert not report.missing and not report.unexpected and len(report.loaded) == 40
  images = _images(32)
  with torch.no_grad():
    theirs = hf(pixel_values=_torch_images(images)).logits.numpy()
  ours = np.asarray(_apply(model)(fitted, images))
  assert np.abs(theirs).max() > 0.1
  np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)


def test_hidden_act_and_layer_norm_eps_of_config_json_hold_both_ways(tmp_path):
  """transformers' defaults hidden_act='gelu' and layer_norm_eps=1e-12 (the hub configs of
  Google's ViTs say both): fit computes the exact GELU and that epsilon with transformers'
  logits, and exports them again."""
  config = _hf_config(num_labels=5, hidden_act='gelu', layer_norm_eps=1e-12)
  hf = _randomise(transformers.ViTForImageClassification(config), scale=0.5)
  with torch.no_grad():  # small embeddings: the first LayerNorm's input variance is ~1e-4
    for p in hf.vit.embeddings.parameters():
      p.mul_(0.01)
  hf.save_pretrained(tmp_path / 'hf')
  fitted = checkpoint.fit(tmp_path / 'hf')
  assert fitted.config.gelu_approximate is False and fitted.config.layer_norm_epsilon == 1e-12
  assert 'exact GELU, LayerNorm epsilon 1e-12' in families.of_config(fitted.config).describe(
    fitted.config
  )
  images = _images(32)
  with torch.no_grad():
    theirs = hf(pixel_values=_torch_images(images)).logits.numpy()
  ours = np.asarray(_apply(fitted.model())(fitted.params, images))
  np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)
  for ours_otherwise in ({'gelu_approximate': True}, {'layer_norm_epsilon': 1e-6}):
    other = np.asarray(_apply(fitted.model(**ours_otherwise))(fitted.params, images))
    assert np.abs(other - theirs).max() > 1e-4, ours_otherwise  # 10x the tolerance

  checkpoint.export_hf(fitted.params, fitted.config, tmp_path / 'back')
  written = json.loads((tmp_path / 'back' / 'config.json').read_text())
  assert (written['hidden_act'], written['layer_norm_eps']) == ('gelu', 1e-12)
  again = transformers.ViTForImageClassification.from_pretrained(tmp_path / 'back').eval()
  with torch.no_grad():
    np.testing.assert_array_equal(again(pixel_values=_torch_images(images)).logits, theirs)


def test_a_model_config_given_keeps_its_fields_and_each_line_names_the_key(tmp_path, caplog):
  """Fine-tuning builds the model of its config: what the file states otherwise is one
  complete warning line a field, naming the config key that follows the file."""
  config = _hf_config(num_labels=3, hidden_act='gelu', layer_norm_eps=1e-12)
  transformers.ViTForImageClassification(config).save_pretrained(tmp_path / 'hf')
  given = {**get_config('testing').to_dict(), **SMALL, 'layer_norm_epsilon': 1e-6}
  with caplog.at_level('WARNING'):
    fitted = checkpoint.fit(tmp_path / 'hf', given, num_classes=3)
  assert 'gelu_approximate' not in fitted.config and fitted.config.layer_norm_epsilon == 1e-6
  source = tmp_path / 'hf'
  assert [r.getMessage() for r in caplog.records] == [
    f'{source}: the file states gelu_approximate=False; the model config given sets no'
    ' gelu_approximate, and the model computes with its default: to compute as the file does,'
    ' set gelu_approximate=False in it (a fine-tune: --config.model.gelu_approximate=False)',
    f'{source}: the file states layer_norm_epsilon=1e-12; the model config given has'
    ' layer_norm_epsilon=1e-06, and the model computes with that: to compute as the file does,'
    ' set layer_norm_epsilon=1e-12 in it (a fine-tune: --config.model.layer_norm_epsilon=1e-12)',
  ]


def test_what_an_image_processor_states_otherwise_is_a_warning_line(hf_dir, tmp_path, caplog):
  """A directory's preprocessor_config.json that transformers' processors write: ViT's with
  DeiT's ImageNet statistics and bicubic resize, SigLIP's (bicubic by default)."""
  imagenet = {'image_mean': [0.485, 0.456, 0.406], 'image_std': [0.229, 0.224, 0.225]}
  transformers.ViTImageProcessor(resample=3, **imagenet).save_pretrained(hf_dir)
  with caplog.at_level('WARNING'):
    found = checkpoint.fit(hf_dir).found
  differ = "so the model's inputs differ from the file's preprocessing"
  bicubic = f'preprocessor_config.json resizes bicubic; the project resizes bilinear, {differ}'
  assert found.unlike == (
    bicubic,
    'preprocessor_config.json normalises pixels x as (x / 255 - [0.485, 0.456, 0.406]) /'
    f' [0.229, 0.224, 0.225]; the project as (x - 127.5) / 127.5, to [-1, 1], {differ}',
  )
  assert [r.getMessage() for r in caplog.records] == [f'{hf_dir}: {u}' for u in found.unlike]
  transformers.SiglipImageProcessor().save_pretrained(tmp_path / 'siglip')
  assert hf_siglip.unlike(tmp_path / 'siglip') == [bicubic]


def test_another_hidden_act_is_refused(tmp_path):
  hf = _randomise(transformers.ViTModel(_hf_config(hidden_act='relu')))
  hf.save_pretrained(tmp_path / 'hf')
  with pytest.raises(checkpoint.CheckpointError, match=r"hidden_act='relu'.*GELU only") as e:
    checkpoint.fit(tmp_path / 'hf')
  assert '\n' not in str(e.value)


def test_vitmodel_pooler_loads_as_pre_logits(tmp_path):
  hf = _randomise(transformers.ViTModel(_hf_config(pooler_output_size=24)))
  hf.save_pretrained(tmp_path / 'hf')
  params = checkpoint.load(tmp_path / 'hf')
  assert params['pre_logits']['kernel'].shape == (32, 24) and 'head' not in params
  model = get_model('testing', num_classes=None, representation_size=24, **SMALL)
  images = _images(32)
  with torch.no_grad():
    theirs = hf(pixel_values=_torch_images(images)).pooler_output.numpy()
  np.testing.assert_allclose(np.asarray(_apply(model)(params, images)), theirs, atol=1e-5, rtol=0)


def test_transformers_5_in_memory_names_load_too(tmp_path):
  hf = _randomise(transformers.ViTForImageClassification(_hf_config(num_labels=3)))
  hf.save_pretrained(tmp_path / 'v4')  # what save_pretrained and the hub hold: 4.x names
  (tmp_path / 'v5').mkdir()
  state = {k: v.contiguous() for k, v in hf.state_dict().items()}
  assert any('.layers.0.attention.q_proj.' in k for k in state)  # the 5.x names
  safetensors_torch.save_file(state, tmp_path / 'v5' / 'model.safetensors', {'format': 'pt'})
  shutil.copy(tmp_path / 'v4' / 'config.json', tmp_path / 'v5' / 'config.json')
  v4, v5 = checkpoint.load(tmp_path / 'v4'), checkpoint.load(tmp_path / 'v5')
  assert checkpoint.flatten(v4).keys() == checkpoint.flatten(v5).keys()
  for key, value in checkpoint.flatten(v4).items():
    np.testing.assert_array_equal(checkpoint.flatten(v5)[key], value, err_msg=key)


@pytest.mark.parametrize('cls', ['ViTForImageClassification', 'ViTModel'])
def test_hf_round_trip_is_bit_exact(tmp_path, cls):
  kw = {'num_labels': 4} if cls == 'ViTForImageClassification' else {}
  hf = _randomise(getattr(transformers, cls)(_hf_config(**kw)))
  hf.save_pretrained(tmp_path / 'src')
  checkpoint.export_hf(checkpoint.load(tmp_path / 'src'), None, tmp_path / 'dst')
  _assert_same_tensors(
    _tensors(tmp_path / 'dst' / 'model.safetensors'),
    _tensors(tmp_path / 'src' / 'model.safetensors'),
  )


def test_our_tree_survives_ours_hf_ours_bit_exact(tmp_path, random_params):
  model = get_model('testing', num_classes=6, **SMALL)
  params = random_params(families.param_shapes(model, 32))
  checkpoint.export_hf(params, get_config('testing'), tmp_path / 'hf')
  back = checkpoint.flatten(checkpoint.load(tmp_path / 'hf'))
  for key, value in checkpoint.flatten(params).items():
    assert back[key].shape == value.shape
    np.testing.assert_array_equal(back[key], value, err_msg=key)


def test_pytorch_bin_loads_through_weights_only(tmp_path):
  hf = _randomise(transformers.ViTForImageClassification(_hf_config(num_labels=3)))
  hf.save_pretrained(tmp_path / 'st')
  (tmp_path / 'bin').mkdir()
  state = safetensors_torch.load_file(tmp_path / 'st' / 'model.safetensors')  # 4.x names
  torch.save(state, tmp_path / 'bin' / 'pytorch_model.bin')
  shutil.copy(tmp_path / 'st' / 'config.json', tmp_path / 'bin' / 'config.json')
  a, b = (
    checkpoint.flatten(checkpoint.load(tmp_path / 'st')),
    checkpoint.flatten(checkpoint.load(tmp_path / 'bin')),
  )
  assert a.keys() == b.keys()
  for key in a:
    np.testing.assert_array_equal(a[key], b[key], err_msg=key)


class _Payload:
  """A pickle that would create a file when unpickled: it must never run."""

  def __init__(self, marker):
    self.marker = marker

  def __reduce__(self):
    return (open, (str(self.marker), 'w'))


def test_pickled_code_in_a_bin_never_runs(tmp_path):
  marker = tmp_path / 'pwned'
  torch.save({'vit.embeddings.cls_token': _Payload(marker)}, tmp_path / 'evil.bin')
  with pytest.raises(checkpoint.CheckpointError, match='weights_only') as e:
    checkpoint.load(tmp_path / 'evil.bin', num_heads=4)
  assert '\n' not in str(e.value) and 'safetensors' in str(e.value)
  assert not marker.exists()


def test_bin_without_torch_asks_for_safetensors(tmp_path, monkeypatch):
  (tmp_path / 'pytorch_model.bin').write_bytes(b'not read')
  monkeypatch.setitem(sys.modules, 'torch', None)  # `import torch` raises ImportError
  with pytest.raises(checkpoint.CheckpointError, match=r'need torch.*safetensors'):
    checkpoint.load(tmp_path / 'pytorch_model.bin', num_heads=4)


# ---------------------------------------------------------------------------------------------
# Bad input.


@pytest.fixture
def hf_dir(tmp_path):
  hf = _randomise(transformers.ViTForImageClassification(_hf_config(num_labels=3)))
  hf.save_pretrained(tmp_path / 'hf')
  return tmp_path / 'hf'


def _error(path, **kw) -> str:
  with pytest.raises(checkpoint.CheckpointError) as e:
    checkpoint.load(path, **kw)
  assert '\n' not in str(e.value)
  return str(e.value)


def test_fit_errors_give_the_heads_of_config_json_or_say_they_are_inferred(tmp_path, hf_dir):
  """The file's heads are config.json's, not the model's given (at 21178fb: '2 heads', the
  model's, for a file of 4); a file without config.json takes the model's, a guess its errors
  say. Another patch size names the key that resamples it."""
  testing = {**get_config('testing').to_dict(), **SMALL}
  two_heads = {**testing, 'transformer': {**SMALL['transformer'], 'num_heads': 2}}
  with pytest.raises(checkpoint.CheckpointError) as e:
    checkpoint.fit(hf_dir, two_heads, num_classes=3)
  assert 'the checkpoint has hidden_size 32, 2 layers, 4 heads,' in str(e.value)
  assert 'inferred' not in str(e.value)
  shutil.copy(hf_dir / 'model.safetensors', tmp_path / 'bare.safetensors')  # no config.json
  with pytest.raises(checkpoint.CheckpointError) as e:
    checkpoint.fit(tmp_path / 'bare.safetensors', {**testing, 'patches': {'size': (4, 4)}})
  assert str(e.value).endswith(
    'patch 8x8, classifier token (its 4 heads inferred: the file states none); or resample it'
    ' (FlexiViT): resize_patch_embedding=True, in a fine-tune --config.resize_patch_embedding=True'
  )


def test_truncated_safetensors(tmp_path, hf_dir):
  data = (hf_dir / 'model.safetensors').read_bytes()
  (tmp_path / 'cut.safetensors').write_bytes(data[: len(data) - 1000])
  message = _error(tmp_path / 'cut.safetensors', num_heads=4)
  assert 'cut.safetensors' in message and 'truncated or corrupt' in message


def test_bare_safetensors_needs_the_number_of_heads(tmp_path, hf_dir):
  shutil.copy(hf_dir / 'model.safetensors', tmp_path / 'weights.safetensors')
  assert '--model' in _error(tmp_path / 'weights.safetensors')
  params = checkpoint.load(tmp_path / 'weights.safetensors', num_heads=4)
  kernel = params['Transformer']['encoderblock_0']['MultiHeadDotProductAttention_0']['query']
  assert kernel['kernel'].shape == (32, 4, 8)
  assert 'not divisible' in _error(tmp_path / 'weights.safetensors', num_heads=5)


def test_unexpected_key_is_named(tmp_path, hf_dir):
  state = _tensors(hf_dir / 'model.safetensors')
  state['vit.embeddings.distillation_token'] = np.zeros((1, 1, 32), np.float32)
  (tmp_path / 'deit').mkdir()
  shutil.copy(hf_dir / 'config.json', tmp_path / 'deit' / 'config.json')
  safetensors_torch.save_file(
    {k: torch.from_numpy(v) for k, v in state.items()}, tmp_path / 'deit' / 'model.safetensors'
  )
  message = _error(tmp_path / 'deit')
  assert "'vit.embeddings.distillation_token' (1, 1, 32)" in message


def test_missing_key_is_named(tmp_path, hf_dir):
  state = _tensors(hf_dir / 'model.safetensors')
  del state['vit.encoder.layer.1.output.dense.weight']
  (tmp_path / 'cut').mkdir()
  shutil.copy(hf_dir / 'config.json', tmp_path / 'cut' / 'config.json')
  safetensors_torch.save_file(
    {k: torch.from_numpy(v) for k, v in state.items()}, tmp_path / 'cut' / 'model.safetensors'
  )
  assert 'MlpBlock_0/Dense_1/kernel' in _error(tmp_path / 'cut')


def test_other_model_types_are_refused(hf_dir):
  config = json.loads((hf_dir / 'config.json').read_text())
  (hf_dir / 'config.json').write_text(json.dumps({**config, 'model_type': 'deit'}))
  assert "model_type='deit'" in _error(hf_dir)


@pytest.mark.parametrize(
  ('name', 'overrides', 'match'),
  [
    ('R+ViT-Ti_16', {'num_classes': 3}, 'hybrid'),
    ('testing', {'num_classes': 3, 'classifier': 'gap'}, "'gap'"),
    ('testing', {'num_classes': 3, 'representation_size': 8}, 'both pre_logits'),
    ('Mixer-S_32', {'num_classes': 3}, 'MLP-Mixer models have no Hugging Face ViT'),
    ('testing', {'num_classes': 3, 'posemb': 'sincos2d', 'hidden_size': 32}, 'sincos2d'),
  ],
)
def test_unexportable_models_fail_and_write_nothing(
  tmp_path, random_params, name, overrides, match
):
  config = get_config(name)
  config.update(overrides)
  params = random_params(families.param_shapes(get_model(name, **overrides), 64))
  with pytest.raises(checkpoint.CheckpointError, match=match):
    checkpoint.export_hf(params, config, tmp_path / 'out')
  assert not list(tmp_path.iterdir())


def test_export_refuses_a_directory_with_other_files(tmp_path, random_params):
  params = random_params(families.param_shapes(get_model('testing', num_classes=3, **SMALL), 32))
  (tmp_path / 'out').mkdir()
  (tmp_path / 'out' / 'notes.txt').write_text('keep me')
  with pytest.raises(checkpoint.CheckpointError, match='choose a new or empty directory'):
    checkpoint.export_hf(params, None, tmp_path / 'out')
  assert [p.name for p in (tmp_path / 'out').iterdir()] == ['notes.txt']
  assert sorted(p.name for p in tmp_path.iterdir()) == ['out']  # no temp folder left


def test_export_replaces_an_earlier_export(tmp_path, random_params):
  shapes = families.param_shapes(get_model('testing', num_classes=3, **SMALL), 32)
  checkpoint.export_hf(random_params(shapes, seed=1), None, tmp_path / 'out')
  second = random_params(shapes, seed=2)
  checkpoint.export_hf(second, None, tmp_path / 'out')
  np.testing.assert_array_equal(checkpoint.load(tmp_path / 'out')['cls'], second['cls'])
  assert sorted(p.name for p in tmp_path.iterdir()) == ['out']


def test_labels_name_the_head_classes_in_transformers(tmp_path, random_params):
  params = random_params(families.param_shapes(get_model('testing', num_classes=3, **SMALL), 32))
  checkpoint.export_hf(params, None, tmp_path / 'hf', labels=['cat', 'dog', 'fox'])
  config = transformers.AutoConfig.from_pretrained(tmp_path / 'hf')
  assert config.id2label == {0: 'cat', 1: 'dog', 2: 'fox'}
  assert config.label2id == {'cat': 0, 'dog': 1, 'fox': 2}
  features = random_params(families.param_shapes(get_model('testing', num_classes=0, **SMALL), 32))
  for p, labels in ((params, ['cat', 'dog']), (features, ['cat'])):
    with pytest.raises(checkpoint.CheckpointError, match=f'^{len(labels)} labels for a head of'):
      checkpoint.export_hf(p, None, tmp_path / 'bad', labels=labels)
  assert not (tmp_path / 'bad').exists()


def test_export_writes_the_formats_of_the_table_and_refuses_others(tmp_path, random_params):
  params = random_params(families.param_shapes(get_model('testing', num_classes=3, **SMALL), 32))
  checkpoint.export_hf(params, None, tmp_path / 'hf')
  checkpoint.export(params, None, tmp_path / 'by_name', to='hf')
  for name in ('model.safetensors', 'config.json'):
    assert (tmp_path / 'by_name' / name).read_bytes() == (tmp_path / 'hf' / name).read_bytes()
  with pytest.raises(checkpoint.CheckpointError, match=r"^'npz': .*choose timm or hf$"):
    checkpoint.export(params, None, tmp_path / 'npz', to='npz')
  assert sorted(p.name for p in tmp_path.iterdir()) == ['by_name', 'hf']
