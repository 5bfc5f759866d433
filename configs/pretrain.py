r"""Pretrains a ViT from scratch, the paper's Table 3 recipe: `configs/pretrain.py:MODEL,DATASET`.

DATASET is 'imagenet21k' or 'imagenet2012' (ImageNet-1k). Common to both: Adam (0.9, 0.999),
batch 4096, 10k warmup steps, 224 px, dropout 0.1, decoupled weight decay on the kernels,
a representation layer (pre_logits) of the model width, clipping at global norm 1.

  ImageNet-21k: 90 epochs (B, L/32; L/16 also 30), lr 1e-3, linear decay, weight decay 0.03,
    sigmoid cross-entropy with head bias -10 (the original recipe, vision_transformer #2).
  ImageNet-1k:  300 epochs, lr 3e-3, cosine decay, weight decay 0.3.

An MLP-Mixer takes the same recipe without dropout and pre_logits (it has neither), a distilled
DeiT without pre_logits (its two heads read the tokens directly).

ImageNet-21k is not in public tfds: point --config.dataset at your tfds build or an image
folder, and set --config.pp.train / --config.pp.test to its splits.

  python -m vit_jax.main --config=configs/pretrain.py:b16,imagenet2012 --workdir=runs/b16_i1k
"""

import ml_collections

from configs import common, models
from vit_jax.models import is_mixer

RECIPES = {
  'imagenet21k': dict(
    total_epochs=90,
    base_lr=1e-3,
    decay_type='linear',
    weight_decay=0.03,
    loss='sigmoid_xent',
    head_bias_init=-10.0,
    train='train',
    test='validation',
  ),
  'imagenet2012': dict(
    total_epochs=300,
    base_lr=3e-3,
    decay_type='cosine',
    weight_decay=0.3,
    loss='softmax_xent',
    head_bias_init=0.0,
    train='train[:99%]',
    test='validation',
  ),
}


def get_config(model_dataset: str = 'b16,imagenet2012') -> ml_collections.ConfigDict:
  """The Table 3 pretraining config for 'MODEL,DATASET'."""
  parts = model_dataset.split(',')
  if len(parts) != 2 or parts[1].strip() not in RECIPES:
    raise ValueError(
      f'Config argument {model_dataset!r}: expected "MODEL,DATASET" with DATASET in '
      f'{", ".join(RECIPES)}, e.g. "b16,imagenet2012".'
    )
  model, dataset = (p.strip() for p in parts)
  recipe = RECIPES[dataset]
  config = common.get_config()
  config.dataset = dataset
  config.model_name = models.registry_name(model)
  config.model = models.model_config(model)
  if not is_mixer(config.model):
    config.model.transformer.dropout_rate = 0.1
    if not config.model.get('distilled'):
      config.model.representation_size = config.model.hidden_size
  config.model.head_bias_init = recipe['head_bias_init']
  config.pretrained_dir = ''  # from scratch

  config.optimizer = 'adam'
  config.b1 = 0.9
  config.b2 = 0.999
  config.weight_decay = recipe['weight_decay']
  config.grad_norm_clip = 1.0
  config.loss = recipe['loss']
  config.base_lr = recipe['base_lr']
  config.decay_type = recipe['decay_type']
  config.warmup_steps = 10_000
  config.total_epochs = recipe['total_epochs']
  config.total_steps = 0  # from total_epochs and the training split's size
  config.batch = 4096
  config.batch_eval = 4096
  config.accum_steps = 1
  config.pp.train = recipe['train']
  config.pp.test = recipe['test']
  config.pp.crop = 224
  config.eval_every = 2_000
  config.progress_every = 100
  config.checkpoint_every = 2_000
  return config.lock()
