r"""Fine-tunes on one VTAB-1k task with the paper's setting: `configs/vtab.py:MODEL,TASK`.

TASK is one of the 19 tasks in vit_jax/data/vtab.py (caltech101, cifar100, dtd,
oxford_flowers102, oxford_iiit_pet, sun397, svhn, patch_camelyon, eurosat, resisc45,
diabetic_retinopathy, clevr_count, clevr_distance, dmlab, kitti_distance, dsprites_location,
dsprites_orientation, smallnorb_azimuth, smallnorb_elevation). Paper Table 4: 2500 steps at
learning rate 0.01 for every task, SGD momentum 0.9, batch 512, cosine decay, clipping at 1,
384 px. Training data: the 1,000 examples of train800val200; evaluation: the task's test split
(--config.pp.train=train800 --config.pp.test=val200 gives the development setting).

Images are only resized to 384 x 384 (no random crop, no flip): flips and crops change the
answer of several structured tasks (positions, orientations, counts). The warmup is not given
in the paper: the original code's default of 500 steps is kept.

  python -m vit_jax.main --config=configs/vtab.py:b16,dtd --workdir=runs/vtab_b16/dtd/seed_0 \
      --config.pretrained_dir=checkpoints
  python -m vit_jax.reproduce vtab --config=configs/vtab.py:b16 --workdir=runs/vtab_b16  # all 19
"""

import ml_collections

from configs import common, models

STEPS = 2500
BASE_LR = 0.01


def get_config(model_task: str = 'b16,caltech101') -> ml_collections.ConfigDict:
  """The VTAB-1k config for 'MODEL,TASK' (TASK defaults to caltech101 when only MODEL is given)."""
  from vit_jax.data import vtab

  model, _, task = (p.strip() for p in model_task.partition(','))
  task = task or 'caltech101'
  if task not in vtab.TASKS:
    raise ValueError(f'Unknown VTAB task {task!r}; expected one of {", ".join(vtab.TASKS)}.')
  config = common.get_config()
  config.model_name = models.registry_name(model)
  config.model = models.model_config(model)
  config.dataset = f'vtab/{task}'
  config.pp.train = 'train800val200'
  config.pp.test = 'test'
  config.pp.crop = 384
  config.pp.area_min = 1.0  # the whole image: a plain resize
  config.pp.flip = False
  config.total_steps = STEPS
  config.base_lr = BASE_LR
  config.shuffle_buffer = 1_000
  config.eval_every = STEPS
  return config.lock()
