"""Training defaults of the original vit_jax (`configs/common.py`) and the dataset presets.

Differences from the original, on purpose: `optim_dtype` defaults to float32 (the
original declared bfloat16 but never read the key), evaluation counts every test example
(the original dropped the last partial batch), and checkpoints follow `checkpoint_every`
(the original saved on `eval_every`).
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  """Run parameters other than the model's; the model and the dataset are set by the caller."""
  config = ml_collections.ConfigDict()

  config.seed = 0
  # Registry name (vit_jax.models.MODEL_CONFIGS) of the model: names the pretrained file and
  # the model in reports.
  config.model_name = ''
  # The model's constructor fields (from the registry); overridable per field on the command line.
  config.model = None
  # Compute dtype: 'float32', or 'bfloat16' for mixed precision (parameters stay float32).
  config.dtype = 'float32'

  # Where to find pretrained checkpoints: `{pretrained_dir}/{model_name}.npz`
  # (download from gs://vit_models/imagenet21k), or one file in `pretrained_path`.
  # Both empty: train from scratch.
  config.pretrained_dir = '.'
  config.pretrained_path = ''
  # AugReg: a model ('B_16', best i21k checkpoint by index.csv) or a full file name (augreg.py).
  config.model_or_filename = ''

  # 'digits' (bundled), a tfds name, or a folder `{train,test}/<class>/*.jpg`.
  config.dataset = ''
  # tensorflow_datasets data directory ('' = tfds default).
  config.tfds_data_dir = ''
  # Classes; 0 = from the dataset.
  config.num_classes = 0
  # Splits, output size, inception-crop area floor, random flip, crop box between pixels.
  config.pp = ml_collections.ConfigDict(
    {
      'train': 'train',
      'test': 'test',
      'crop': 384,
      'area_min': 0.05,
      'flip': True,
      'subpixel': False,
    }
  )
  # Steps; set by the dataset preset unless given. total_epochs > 0 sets them from the
  # training split's size instead.
  config.total_steps = 0
  config.total_epochs = 0.0

  # Optimizer: 'sgd' (momentum) for fine-tuning, 'adam' for pretraining.
  config.optimizer = 'sgd'
  config.momentum = 0.9
  # Decoupled weight decay (AdamW convention, see vit_jax/optim.py) on `weight_decay_pattern`.
  config.weight_decay = 0.0
  config.weight_decay_pattern = r'.*/kernel'
  # Clip gradients to this global norm (0 = no clipping).
  config.grad_norm_clip = 1.0
  # dtype of the first moment (SGD momentum, Adam mu): 'float32' or 'bfloat16'.
  config.optim_dtype = 'float32'
  # Split each batch into this many micro-batches and average their gradients (saves memory).
  config.accum_steps = 8
  # 'softmax_xent', or 'sigmoid_xent' (per-class sigmoid, summed over classes).
  config.loss = 'softmax_xent'
  config.label_smoothing = 0.0

  # Global batch sizes (over all hosts and devices).
  config.batch = 512
  config.batch_eval = 512
  config.shuffle_buffer = 50_000
  config.prefetch = 2

  config.base_lr = 0.03
  # 'cosine', 'linear' (to `linear_end`) or 'constant', after `warmup_steps` of linear warmup.
  config.decay_type = 'cosine'
  config.warmup_steps = 500
  config.linear_end = 1e-5

  # Parameters and optimizer state: 'replicate', 'fsdp', or ((regex, rule), ...) pairs.
  config.sharding = 'replicate'
  # The training stream is read as this many shards, split over the processes (0 = one per
  # process). The batches depend on it, not on the process count: fix it to the largest
  # process count a run will use to make it reproducible (and resumable) on any of them.
  config.data_shards = 0

  # Evaluate every so many steps (and at the end); log progress; checkpoint (0 = only at the end).
  config.eval_every = 100
  config.progress_every = 10
  config.checkpoint_every = 1_000
  config.keep_checkpoints = 3
  return config


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
