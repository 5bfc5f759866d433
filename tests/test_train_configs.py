"""Experiment configs: the original defaults, dataset presets, model names, pretrained files."""

import re

import ml_collections
import pytest

from configs import augreg, common, digits, models, vit, vit_s16_i1k
from vit_jax import families
from vit_jax.models import is_mixer
from vit_jax.train import setup, spec


def test_common_defaults_are_the_originals():
  config = common.get_config()
  assert (config.batch, config.batch_eval, config.accum_steps, config.grad_norm_clip) == (
    512,
    512,
    8,
    1.0,
  )
  assert (config.base_lr, config.decay_type, config.warmup_steps) == (0.03, 'cosine', 500)
  assert (config.eval_every, config.progress_every, config.checkpoint_every) == (100, 10, 1000)
  assert (config.shuffle_buffer, config.optimizer, config.momentum) == (50_000, 'sgd', 0.9)
  assert set(config.keys()) == spec.CONFIG_KEYS


@pytest.mark.parametrize(
  ('dataset', 'steps', 'train_split', 'test_split'),
  [
    ('cifar10', 10_000, 'train[:98%]', 'test'),
    ('cifar100', 10_000, 'train[:98%]', 'test'),
    ('imagenet2012', 20_000, 'train[:99%]', 'validation'),
    ('oxford_iiit_pet', 500, 'train[:90%]', 'test'),
    ('oxford_flowers102', 500, 'train[:90%]', 'test'),
  ],
)
def test_vit_presets(dataset, steps, train_split, test_split):
  config = vit.get_config(f'b32,{dataset}')
  assert config.model_name == 'ViT-B_32' and config.model.hidden_size == 768
  assert (config.total_steps, config.pp.train, config.pp.test, config.pp.crop) == (
    steps,
    train_split,
    test_split,
    384,
  )
  assert config.base_lr == 0.03


def test_b16_cifar10_has_the_original_learning_rate():
  assert vit.get_config('b16,cifar10').base_lr == 0.01
  assert vit.get_config('ViT-B_16,cifar10').base_lr == 0.01  # registry names work too


def test_every_registered_model_has_a_short_name():
  assert sorted(models.SHORT_NAMES.values()) == sorted(families.classifiers())
  assert models.SHORT_NAMES['r50_b16'] == 'R50+ViT-B_16'
  assert models.SHORT_NAMES['r_ti16'] == 'R+ViT-Ti_16'
  assert models.SHORT_NAMES['s16_gap_norep'] == 'ViT-S_16-gap-norep'


@pytest.mark.parametrize(
  ('prefix', 'name'),
  [
    ('B_16', 'ViT-B_16'),
    ('R_Ti_16', 'R+ViT-Ti_16'),
    ('R26_S_32', 'R26+ViT-S_32'),
    ('R50_L_32', 'R50+ViT-L_32'),
  ],
)
def test_augreg_names(prefix, name):
  assert augreg.augreg_model_name(prefix) == name
  config = augreg.get_config(f'{prefix}-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0')
  assert config.model_name == name
  assert config.model.transformer.dropout_rate == 0.0
  assert (config.total_steps, config.warmup_steps, config.base_lr) == (500, 100, 0.03)


def test_augreg_picks_the_best_i21k_checkpoint_from_index_csv(tmp_path):
  rows = [
    ('S_32-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0', 'i21k', '0.41'),
    ('S_32-i21k-300ep-lr_0.001-aug_none-wd_0.1-do_0.0-sd_0.0', 'i21k', '0.44'),
    ('S_32-i1k-300ep-lr_0.001-aug_none-wd_0.1-do_0.0-sd_0.0', 'i1k', '0.90'),
    ('B_32-i21k-300ep-lr_0.001-aug_none-wd_0.1-do_0.0-sd_0.0', 'i21k', '0.99'),
  ]
  lines = ['filename,ds,final_val'] + [','.join(r) for r in rows]
  (tmp_path / 'index.csv').write_text('\n'.join(lines) + '\n')
  best = rows[1][0]
  (tmp_path / f'{best}.npz').write_bytes(b'')
  config = ml_collections.ConfigDict(augreg.get_config('S_32').to_dict())
  config.pretrained_dir = str(tmp_path)
  assert setup.resolve_pretrained_path(spec.from_config(config)) == str(tmp_path / f'{best}.npz')


def test_augreg_model_without_index_says_what_to_download(tmp_path):
  # The default, gs://vit_models/augreg, is read in place: tests/test_cloud_paths.py.
  config = ml_collections.ConfigDict(augreg.get_config('S_32').to_dict())
  config.pretrained_dir = str(tmp_path)
  with pytest.raises(ValueError, match=r'index\.csv not found: download it with `gsutil cp'):
    setup.resolve_pretrained_path(spec.from_config(config))


def test_scratch_when_no_pretrained_location():
  assert setup.resolve_pretrained_path(spec.from_config(digits.get_config())) is None


def test_high_resolution_fine_tuning_follows_table_2():
  """512 px L/16 and 518 px H/14 on ImageNet: 32x32 and 37x37 patches, the Table 4 recipe
  otherwise, bfloat16 compute with full rematerialisation; 384 px keeps the defaults."""
  for arg, crop, patch in (('l16,imagenet2012,512', 512, 16), ('h14,imagenet2012,518', 518, 14)):
    config = vit.get_config(arg)
    assert config.pp.crop == crop and crop % patch == 0
    assert (config.dtype, config.model.remat_policy) == ('bfloat16', 'full')
    assert (config.optimizer, config.momentum, config.batch, config.total_steps) == (
      'sgd', 0.9, 512, 20_000,
    )  # fmt: skip
  assert vit.get_config('b16,cifar10,384').to_dict() == vit.get_config('b16,cifar10').to_dict()
  with pytest.raises(ValueError, match='RESOLUTION'):
    vit.get_config('l16,imagenet2012,big')


def test_s16_imagenet_recipe_is_big_visions():
  config = vit_s16_i1k.get_config()
  assert (config.batch, config.pp.crop, config.pp.train, config.total_epochs) == (
    1024, 224, 'train[:99%]', 90,
  )  # fmt: skip
  assert (config.pp.randaug_layers, config.pp.randaug_magnitude, config.mixup) == (2, 10, 0.2)
  assert (config.model.classifier, config.model.representation_size) == ('gap', 384)
  assert config.model.posemb == 'sincos2d'
  assert (config.optimizer, config.optim_dtype, config.base_lr, config.warmup_steps) == (
    'adam', 'bfloat16', 1e-3, 10_000,
  )  # fmt: skip
  # big_vision's wd 1e-4 scales with the schedule (lr_t / 1e-3); here it scales with lr_t.
  assert config.weight_decay * config.base_lr == pytest.approx(1e-4)
  assert vit_s16_i1k.get_config('300').total_epochs == 300
  with pytest.raises(ValueError, match='expected one of'):
    vit_s16_i1k.get_config('100')


def test_bad_config_arguments():
  with pytest.raises(ValueError, match='expected "MODEL,DATASET"'):
    vit.get_config('b16')
  with pytest.raises(ValueError, match="Unknown dataset preset 'mnist'"):
    common.with_dataset(common.get_config(), 'mnist')


# ----------------------------------------------------------------------------------------
# The run spec: every config resolves; one definition rejects what it does not know.
# ----------------------------------------------------------------------------------------


def _every_config():
  from configs import pretrain, vit_h14_fsdp
  from configs import vtab as vtab_config
  from vit_jax.reproduce import vtab

  yield 'digits', digits.get_config()
  yield 'digits.py:mixer', digits.get_config('mixer')
  yield 'digits.py:deit', digits.get_config('deit')
  for model in sorted(models.SHORT_NAMES):
    for dataset in common.DATASET_PRESETS:
      yield f'vit.py:{model},{dataset}', vit.get_config(f'{model},{dataset}')
    yield f'vit.py:{model},dtd', vit.get_config(f'{model},dtd')  # not a preset
    yield f'pretrain.py:{model}', pretrain.get_config(f'{model},imagenet2012')
    yield f'vtab.py:{model}', vtab_config.get_config(model)
  for model in ('B_16', 'S_32', 'R_Ti_16', 'R26_S_32', 'R50_L_32'):
    yield f'augreg.py:{model}', augreg.get_config(model)
  yield (
    'augreg.py:FILE',
    augreg.get_config('B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0'),
  )
  for task in vtab.TASKS:
    yield f'vtab.py:b16,{task}', vtab_config.get_config(f'b16,{task}')
  for dataset in ('imagenet2012', 'imagenet21k'):
    yield f'pretrain.py:b16,{dataset}', pretrain.get_config(f'b16,{dataset}')
    yield f'vit_h14_fsdp.py:{dataset}', vit_h14_fsdp.get_config(dataset)
  yield 'digits.py:regularised', digits.get_config('regularised')
  for arg in ('l16,imagenet2012,512', 'h14,imagenet2012,518'):
    yield f'vit.py:{arg}', vit.get_config(arg)
  for epochs in ('90', '150', '300'):
    yield f'vit_s16_i1k.py:{epochs}', vit_s16_i1k.get_config(epochs)


def test_every_config_resolves_into_a_run_spec_that_holds_all_of_it():
  import json

  names = []
  for name, config in _every_config():
    run = spec.from_config(config)
    # Nothing is lost or changed on the way: the spec gives back every key of the config.
    assert json.dumps(spec.to_dict(run), sort_keys=True) == json.dumps(
      config.to_dict(), sort_keys=True
    ), name
    model = setup.build_model(run.model, num_classes=10)  # the model accepts its fields
    width = 'hidden_dim' if is_mixer(config.model) else 'hidden_size'
    assert getattr(model, width) == config.model[width], name
    names.append(name)
  # 4 digits; 5 presets, dtd, pretrain and vtab per model name; 6 augreg; 19 tasks; 2 x 2
  # pretrain; 2 high-resolution, 3 S/16 ImageNet-1k.
  assert len(names) == 4 + 8 * len(models.SHORT_NAMES) + 6 + 19 + 4 + 2 + 3


def test_the_spec_is_typed_and_frozen():
  run = spec.from_config(digits.get_config())
  assert (run.data.batch, run.optim.optimizer, run.step.accum_steps) == (64, 'adam', 1)
  assert run.data.pp.crop == 8 and run.data.pp.subpixel is True
  assert run.model.name == 'ViT-digits' and run.model.fields.hidden_size == 64
  assert isinstance(run.optim.base_lr, float) and isinstance(run.loop.total_steps, int)
  with pytest.raises(AttributeError):
    run.optim.base_lr = 1.0  # frozen dataclass
  # Values the config leaves out take the spec's defaults, which configs/common.py uses too.
  partial = {k: v for k, v in digits.get_config().to_dict().items() if k != 'keep_checkpoints'}
  assert spec.from_config(partial).loop.keep_checkpoints == common.get_config().keep_checkpoints


@pytest.mark.parametrize(
  ('key', 'value', 'message'),
  [
    ('bathc', 64, "Unknown config key 'bathc'. Did you mean 'batch'?"),
    ('eval_evry', 5, "Unknown config key 'eval_evry'. Did you mean 'eval_every'?"),
    ('pp', {'crpo': 8}, "Unknown config key 'pp.crpo'. Did you mean 'pp.crop'?"),
    ('base_lr', 'fast', "config.base_lr='fast'; expected float."),
    ('total_steps', 2.5, 'config.total_steps=2.5; expected int.'),
    ('dtype', 'float16', "config.dtype='float16' is not supported: float16 training needs loss"),
    ('dtype', 'float64', "config.dtype='float64'; expected one of ('float32', 'bfloat16')."),
    ('step', 'pmap', "config.step='pmap'; expected one of ('jit', 'shard_map')."),
    ('accum_steps', 0, 'config.accum_steps=0; expected a positive integer.'),
  ],
)
def test_a_bad_key_or_value_is_one_line_naming_it(key, value, message):
  config = digits.get_config().to_dict()
  if key == 'pp':
    value = {**config['pp'], **value}
  config[key] = value
  with pytest.raises(ValueError, match=re.escape(message)) as info:
    spec.from_config(config)
  assert '\n' not in str(info.value)


def test_a_config_without_a_model_says_how_to_choose_one():
  with pytest.raises(ValueError, match=r'config.model is not set: use configs/vit.py:MODEL,'):
    spec.from_config(common.get_config())


def test_shard_map_step_needs_replicated_parameters():
  config = spec.with_overrides(digits.get_config(), {'step': 'shard_map', 'sharding': 'fsdp'})
  with pytest.raises(ValueError, match=r"config.step='shard_map' runs on replicated parameters"):
    spec.from_config(config)
  config.sharding = 'replicate'
  assert spec.from_config(config).step.step == 'shard_map'


def test_with_overrides_sets_dotted_keys_and_rejects_unknown_ones():
  config = spec.with_overrides(digits.get_config(), {'pp.crop': 16, 'model.hidden_size': 32})
  assert (config.pp.crop, config.model.hidden_size) == (16, 32)
  assert digits.get_config().pp.crop == 8  # a copy
  with pytest.raises(ValueError, match=r"no key 'pp\.crpo'"):
    spec.with_overrides(digits.get_config(), {'pp.crpo': 16})


def test_vit_configs_take_how_a_file_computes():
  """A fine-tune takes a Hugging Face file's exact GELU and LayerNorm epsilon by the keys
  that fit's warnings name."""
  file = {'model.gelu_approximate': False, 'model.layer_norm_epsilon': 1e-12}
  for config in (digits.get_config(), digits.get_config('deit'), vit.get_config('b16,cifar10')):
    run = spec.from_config(spec.with_overrides(config, file))
    model = setup.build_model(run.model, num_classes=10)
    assert (model.gelu_approximate, model.layer_norm_epsilon) == (False, 1e-12)


def test_resize_patch_embedding_is_a_key_of_fine_tuning(monkeypatch):
  """`--config.resize_patch_embedding=True` resamples a pretrained file's patch embedding."""
  from vit_jax import checkpoint, tasks

  config = spec.with_overrides(digits.get_config(), {'resize_patch_embedding': True})
  run = spec.from_config(config)
  task = tasks.build(run, setup.build_model(run.model, num_classes=10), 'FILE')
  options = {}
  monkeypatch.setattr(checkpoint, 'load_pretrained', lambda *args, **kw: options.update(kw))
  task.pretrained('FILE', {})
  assert options['resize_patch_embedding'] is True


def test_a_misspelt_model_field_names_the_closest_one():
  fields = {**digits.get_config().model.to_dict(), 'hiden_size': 64}
  bad = spec.from_config({**digits.get_config().to_dict(), 'model': fields})
  with pytest.raises(ValueError, match=r'model.hiden_size: did you mean model.hidden_size'):
    setup.build_model(bad.model, num_classes=10)


def test_shard_map_step_names_the_jit_step_on_an_n_d_mesh():
  config = spec.with_overrides(
    digits.get_config(), {'step': 'shard_map', 'mesh': 'data:-1,model:2'}
  )
  with pytest.raises(ValueError, match=r"config.mesh='data:-1,model:2' needs config.step='jit'"):
    spec.from_config(config)
  config.mesh = 'data:4,tensor:2'
  config.step = 'jit'
  with pytest.raises(ValueError, match=r"config.mesh='data:4,tensor:2': axes are"):
    spec.from_config(config)
