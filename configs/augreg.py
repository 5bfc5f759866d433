r"""Fine-tunes an AugReg checkpoint ("How to train your ViT?", arXiv:2106.10270).

`--config=configs/augreg.py:MODEL_OR_FILENAME`, where MODEL_OR_FILENAME is a full file
name without '.npz' (e.g. B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0), or a
model (B_16, S_32, R_Ti_16, R26_S_32, ...): then the i21k checkpoint with the best final
upstream validation accuracy in `{pretrained_dir}/index.csv` is chosen. `pretrained_dir`
defaults to gs://vit_models/augreg, read in place (index.csv and the chosen .npz); a local
copy works too (`--config.pretrained_dir=DIR`). The dataset must be given:

  python -m vit_jax.main --config=configs/augreg.py:B_16 --workdir=runs/augreg_pets \
      --config.dataset=oxford_iiit_pet --config.pp.train='train[:90%]' --config.base_lr=0.01
"""

import ml_collections

from configs import common, models


def augreg_model_name(model: str) -> str:
  """AugReg file prefix -> registry name: 'B_16' -> 'ViT-B_16', 'R_Ti_16' -> 'R+ViT-Ti_16'."""
  if model.startswith('R'):
    stem, _, vit = model.partition('_')
    return f'{stem}+ViT-{vit}'
  return f'ViT-{model}'


def get_config(model_or_filename: str = 'B_16') -> ml_collections.ConfigDict:
  """AugReg fine-tuning defaults (500 steps, 100 warmup, lr 0.03, no dropout, 384 px)."""
  config = common.get_config()
  config.pretrained_dir = 'gs://vit_models/augreg'
  config.model_or_filename = model_or_filename
  config.model_name = augreg_model_name(model_or_filename.split('-')[0])
  config.model = models.model_config(config.model_name)
  config.model.transformer.dropout_rate = 0.0  # no AugReg during fine-tuning
  config.base_lr = 0.03
  config.total_steps = 500
  config.warmup_steps = 100
  config.pp.train = 'train'
  config.pp.test = 'test'
  config.pp.crop = 384
  config.dataset = ''  # must be set on the command line
  return config.lock()
