"""Training defaults of the original vit_jax (`configs/common.py`) and the dataset presets.

The defaults themselves live in the run spec (vit_jax/train/spec.py; its data and evaluation
sections in vit_jax/data/spec.py and vit_jax/evals/spec.py), where each key is defined with
its type and meaning; this module hands them to the experiment configs.

Differences from the original, on purpose: `optim_dtype` defaults to float32 (the
original declared bfloat16 but never read the key), evaluation counts every test example
(the original dropped the last partial batch), and checkpoints follow `checkpoint_every`
(the original saved on `eval_every`).
"""

import ml_collections

from vit_jax.train import spec


def get_config() -> ml_collections.ConfigDict:
  """Every run parameter at its default; the model and the dataset are set by the caller.

  The keys, their types, defaults and meaning are defined once, in the run spec.
  """
  return spec.default_config()


def _preset(total_steps: int, train: str, test: str, crop: int = 384) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(
    {'total_steps': total_steps, 'pp': {'train': train, 'test': test, 'crop': crop}}
  )


# The original presets, plus the paper's Table 4 steps for pets and flowers (10% of train
# held out, as the paper chose its learning rate on it).
DATASET_PRESETS = {
  'cifar10': _preset(10_000, 'train[:98%]', 'test'),
  'cifar100': _preset(10_000, 'train[:98%]', 'test'),
  'imagenet2012': _preset(20_000, 'train[:99%]', 'validation'),
  'oxford_iiit_pet': _preset(500, 'train[:90%]', 'test'),
  'oxford_flowers102': _preset(500, 'train[:90%]', 'test'),
}


def with_dataset(config: ml_collections.ConfigDict, dataset: str) -> ml_collections.ConfigDict:
  """`config` with `dataset` and its preset (steps, splits, crop); unknown names list presets."""
  if dataset not in DATASET_PRESETS:
    raise ValueError(
      f'Unknown dataset preset {dataset!r}; presets: {", ".join(DATASET_PRESETS)} '
      '(any other dataset: set --config.dataset).'
    )
  config = ml_collections.ConfigDict(config.to_dict())
  config.dataset = dataset
  preset = DATASET_PRESETS[dataset]
  config.total_steps = preset.total_steps
  config.pp.update(preset.pp)
  return config
