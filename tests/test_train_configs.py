"""Experiment configs: the original defaults, dataset presets, model names, pretrained files."""

import ml_collections
import pytest

from configs import augreg, common, digits, models, vit
from vit_jax import train
from vit_jax.models import MODEL_CONFIGS


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
  assert set(config.keys()) <= train.KNOWN_KEYS


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
  assert sorted(models.SHORT_NAMES.values()) == sorted(MODEL_CONFIGS)
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
  assert train.resolve_pretrained_path(config) == str(tmp_path / f'{best}.npz')


def test_augreg_model_without_index_says_what_to_download(tmp_path):
  config = ml_collections.ConfigDict(augreg.get_config('S_32').to_dict())
  with pytest.raises(ValueError, match=r'download gs://vit_models/augreg/index\.csv'):
    train.resolve_pretrained_path(config)
  config.pretrained_dir = str(tmp_path)
  with pytest.raises(ValueError, match=r'index\.csv not found: download it with `gsutil cp'):
    train.resolve_pretrained_path(config)


def test_scratch_when_no_pretrained_location():
  assert train.resolve_pretrained_path(digits.get_config()) is None


def test_bad_config_arguments():
  with pytest.raises(ValueError, match='expected "MODEL,DATASET"'):
    vit.get_config('b16')
  with pytest.raises(ValueError, match="Unknown dataset preset 'mnist'"):
    common.with_dataset(common.get_config(), 'mnist')
