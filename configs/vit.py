r"""Fine-tunes a pretrained ViT, hybrid or MLP-Mixer: `--config=configs/vit.py:MODEL,DATASET`.

MODEL is a short name (ti16, s16, s32, b8, b16, b32, l16, l32, h14, r50_b16, r26_s32,
mixer_b16, mixer_l16, deit_b16_distilled, ...) or a registry name (ViT-B_16, Mixer-B_16);
DATASET a preset (cifar10, cifar100, imagenet2012, oxford_iiit_pet, oxford_flowers102) or any
tfds name / image folder (then set --config.total_steps). Paper Table 4 recipe: SGD momentum
0.9, batch 512, cosine decay, clip 1, no weight decay, 384 px; Mixers at 224 px, as the
original `mixer_base16_cifar10.py` (their token-mixing MLPs fix the resolution).

  python -m vit_jax.main --config=configs/vit.py:b16,cifar10 --workdir=runs/b16_cifar10 \
      --config.pretrained_dir=checkpoints   # holds ViT-B_16.npz (gs://vit_models/imagenet21k)
  python -m vit_jax.main --config=configs/vit.py:mixer_b16,cifar10 --workdir=runs/mixer \
      --config.pretrained_dir=checkpoints   # Mixer-B_16.npz (gs://mixer_models/imagenet21k)

Not run here (no checkpoint or dataset can be downloaded). Published for `b16,cifar10`, by the
original vit_jax README (ViT-B/16 from imagenet21k on CIFAR-10 at 384 px, 10k steps): 99.02% top-1
with dropout 0.0 (this config's), 98.76% with 0.1; `python -m vit_jax.reproduce report runs/`
puts a run beside it.

High-resolution fine-tuning (paper Table 2: ImageNet at 512 px for ViT-L/16, 518 px for
ViT-H/14): `MODEL,DATASET,RESOLUTION`, e.g. `configs/vit.py:l16,imagenet2012,512` or
`h14,imagenet2012,518`. The position embeddings are resized to the new grid when the
pretrained file is loaded (32x32 and 37x37 patches). Above 384 px the config computes in
bfloat16 (float32 weights and momentum) and rematerialises every encoder block
(`remat_policy='full'`). The fewest `accum_steps` whose pass fits a device, for a global batch
of 512 on 8 devices (XLA's memory analysis of the compiled step, docs/training.md): L/16 at 512
px 4 on 16 GB devices, 1 on 40 and 80 GB; H/14 at 518 px 16, 2 and 1. The default (8) fits all
but H/14 on 16 GB devices. Table 2 also averaged the parameters: add
`--config.polyak_decay=0.9999` (4 B more per parameter on the device; H/14 then needs 32 on 16
GB devices and 4 on 40 GB ones).
"""

import ml_collections

from configs import common, models
from vit_jax.models import is_mixer

# Above this resolution, the config turns on bfloat16 compute and full rematerialisation.
_HIGH_RESOLUTION = 384


def get_config(model_dataset: str = 'b16,cifar10') -> ml_collections.ConfigDict:
  """The fine-tuning config for 'MODEL,DATASET' or 'MODEL,DATASET,RESOLUTION'."""
  parts = [p.strip() for p in model_dataset.split(',')]
  if len(parts) not in (2, 3) or (len(parts) == 3 and not parts[2].isdigit()):
    raise ValueError(
      f'Config argument {model_dataset!r}: expected "MODEL,DATASET" or "MODEL,DATASET,'
      'RESOLUTION", e.g. "b16,cifar10" or "l16,imagenet2012,512".'
    )
  model, dataset = parts[:2]
  config = common.get_config()
  if dataset in common.DATASET_PRESETS:
    config = common.with_dataset(config, dataset)
  else:
    config.dataset = dataset
  config.model_name = models.registry_name(model)
  config.model = models.model_config(model)
  if (config.model_name, dataset) == ('ViT-B_16', 'cifar10'):
    config.base_lr = 0.01  # the original's only per-pair setting
  if is_mixer(config.model):
    config.pp.crop = 224  # the resolution of the released Mixer checkpoints
  if len(parts) == 3:
    config.pp.crop = int(parts[2])
    if config.pp.crop > _HIGH_RESOLUTION and not is_mixer(config.model):
      config.dtype = 'bfloat16'
      config.model.remat_policy = 'full'
  return config.lock()
