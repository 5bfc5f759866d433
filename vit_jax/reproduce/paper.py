"""Published numbers to compare against: the ViT paper's Tables 2 and 5, and the original README.

Sources: arXiv:2010.11929 (ICLR 2021 version) Table 2 (mean ± std of three fine-tuning runs;
ImageNet at 512 px for L/16 and 518 px for H/14, with Polyak averaging), Table 5 (384 px, no
Polyak averaging) and the fine-tuning table of the google-research/vision_transformer README
(released imagenet21k checkpoints, 384 px, 10k steps for CIFAR and 20k for ImageNet, batch
512; one run per cell, dropout 0.0 on A100 and dropout 0.1 on V100).

Keys: model = registry name ('ViT-B_16', 'R50+ViT-B_16'); pretrain = 'imagenet2012',
'imagenet21k' or 'jft300m'; dataset = the tfds name ('cifar10', 'imagenet2012',
'imagenet2012_real' for ImageNet ReaL, 'oxford_iiit_pet', 'oxford_flowers102'), 'vtab'
for the 19-task VTAB-1k mean, or 'fewshot/<tfds name>/<n>shot' for linear few-shot accuracy
on frozen features (the training metric of that name, vit_jax/evals/fewshot.py), or
'zeroshot/<tfds name>' for an image-text model's zero-shot top-1 (vit_jax/evals/zeroshot.py;
the LiT model card's, pretrain 'cc12m+yfcc100m'). Accuracies are in
percent. Each number carries the setting it was measured in (crop, Polyak decay) where the
source gives it, so that a run in another setting is not compared as if it were like.
"""

import dataclasses

DATASET_TITLES = {
  'imagenet2012': 'ImageNet',
  'imagenet2012_real': 'ImageNet ReaL',
  'cifar10': 'CIFAR-10',
  'cifar100': 'CIFAR-100',
  'oxford_iiit_pet': 'Oxford-IIIT Pets',
  'oxford_flowers102': 'Oxford Flowers-102',
  'vtab': 'VTAB (19 tasks)',
}
PRETRAIN_TITLES = {
  'imagenet2012': 'ImageNet',
  'imagenet21k': 'ImageNet-21k',
  'jft300m': 'JFT-300M',
  'cc12m+yfcc100m': 'CC12M + YFCC100M (LiT)',
}


@dataclasses.dataclass(frozen=True)
class Reference:
  """One published accuracy (%), with its spread where the source gives one."""

  source: str  # 'Table 2', 'Table 5', 'README dropout=0.0', ...
  model: str
  pretrain: str
  dataset: str
  accuracy: float
  std: float | None = None
  dropout: float | None = None  # README rows: the fine-tuning dropout of that column
  note: str = ''
  crop: int | None = None  # the fine-tuning resolution, where the source gives it
  polyak: float = 0.0  # the Polyak averaging decay of the fine-tuning (0: none)


_T2_COLUMNS = (('ViT-H_14', 'jft300m'), ('ViT-L_16', 'jft300m'), ('ViT-L_16', 'imagenet21k'))
_T2 = {
  'imagenet2012': ((88.55, 0.04), (87.76, 0.03), (85.30, 0.02)),
  'imagenet2012_real': ((90.72, 0.05), (90.54, 0.03), (88.62, 0.05)),
  'cifar10': ((99.50, 0.06), (99.42, 0.03), (99.15, 0.03)),
  'cifar100': ((94.55, 0.04), (93.90, 0.05), (93.25, 0.05)),
  'oxford_iiit_pet': ((97.56, 0.03), (97.32, 0.11), (94.67, 0.15)),
  'oxford_flowers102': ((99.68, 0.02), (99.74, 0.00), (99.61, 0.02)),
  'vtab': ((77.63, 0.23), (76.28, 0.46), (72.72, 0.21)),
}
# ImageNet fine-tuning in Table 2 ran at 512 px (L/16) or 518 px (H/14) with Polyak averaging
# 0.9999; the other columns at 384 px (Table 4's resolution).
_T2_IMAGENET = ('imagenet2012', 'imagenet2012_real')
_T2_IMAGENET_CROP = {'ViT-H_14': 518, 'ViT-L_16': 512}
_T2_POLYAK = 0.9999

# Table 8: ImageNet 5-shot linear accuracy of ViT-B/16 pretrained on JFT-300M, by position
# embedding; the learned 1-D embedding is the models' default ('learn').
_T8 = {'fewshot/imagenet2012/5shot': 64.206}

_T5_MODELS = ('ViT-B_16', 'ViT-B_32', 'ViT-L_16', 'ViT-L_32', 'ViT-H_14')
_T5 = {
  'imagenet2012': {
    'cifar10': (98.13, 97.77, 97.86, 97.94, None),
    'cifar100': (87.13, 86.31, 86.35, 87.07, None),
    'imagenet2012': (77.91, 73.38, 76.53, 71.16, None),
    'imagenet2012_real': (83.57, 79.56, 82.19, 77.83, None),
    'oxford_flowers102': (89.49, 85.43, 89.66, 86.36, None),
    'oxford_iiit_pet': (93.81, 92.04, 93.64, 91.35, None),
  },
  'imagenet21k': {
    'cifar10': (98.95, 98.79, 99.16, 99.13, 99.27),
    'cifar100': (91.67, 91.97, 93.44, 93.04, 93.82),
    'imagenet2012': (83.97, 81.28, 85.15, 80.99, 85.13),
    'imagenet2012_real': (88.35, 86.63, 88.40, 85.65, 88.70),
    'oxford_flowers102': (99.38, 99.11, 99.61, 99.19, 99.51),
    'oxford_iiit_pet': (94.43, 93.02, 94.73, 93.09, 94.82),
  },
  'jft300m': {
    'cifar10': (99.00, 98.61, 99.38, 99.19, 99.50),
    'cifar100': (91.87, 90.49, 94.04, 92.52, 94.55),
    'imagenet2012': (84.15, 80.73, 87.12, 84.37, 88.04),
    'imagenet2012_real': (88.85, 86.27, 89.99, 88.28, 90.33),
    'oxford_flowers102': (99.56, 99.27, 99.56, 99.45, 99.68),
    'oxford_iiit_pet': (95.80, 93.40, 97.11, 95.83, 97.56),
  },
}

# The LiT model card (google-research/vision_transformer `model_cards/lit.md`): zero-shot
# top-1 of the released image-text models, trained on CC12M and YFCC100M, at 224 px.
_LIT_CARD = {
  'LiT-B16B_2': {'imagenet2012': 73.9, 'cifar100': 79.0, 'oxford_iiit_pet': 83.3},
  'LiT-L16L': {'imagenet2012': 75.7, 'cifar100': 80.5, 'oxford_iiit_pet': 83.3},
}
LIT_PRETRAIN = 'cc12m+yfcc100m'

# README: {model: {dataset: (dropout 0.0, dropout 0.1)}}, imagenet21k checkpoints.
_README = {
  'R50+ViT-B_16': {
    'cifar10': (98.72, 98.94),
    'cifar100': (90.88, 92.30),
    'imagenet2012': (83.72, 85.08),
  },
  'ViT-B_16': {
    'cifar10': (99.02, 98.76),
    'cifar100': (92.06, 91.92),
    'imagenet2012': (84.53, 84.12),
  },
  'ViT-B_32': {
    'cifar10': (98.88, 98.75),
    'cifar100': (92.31, 92.05),
    'imagenet2012': (81.66, 81.31),
  },
  'ViT-L_16': {
    'cifar10': (99.13, 99.14),
    'cifar100': (92.91, 93.22),
    'imagenet2012': (84.47, 85.05),
  },
  'ViT-L_32': {
    'cifar10': (99.06, 99.09),
    'cifar100': (93.29, 93.34),
    'imagenet2012': (81.89, 81.13),
  },
}


def _build() -> tuple[Reference, ...]:
  refs = []
  for dataset, cells in _T2.items():
    for (model, pretrain), (acc, std) in zip(_T2_COLUMNS, cells, strict=True):
      imagenet = dataset in _T2_IMAGENET
      crop, polyak = (_T2_IMAGENET_CROP[model], _T2_POLYAK) if imagenet else (384, 0.0)
      note = f'{crop} px' + (f', Polyak {polyak}' if polyak else '') + ', mean ± std of 3 runs'
      refs.append(
        Reference(
          'Table 2', model, pretrain, dataset, acc, std, note=note, crop=crop, polyak=polyak
        )
      )
  for pretrain, rows in _T5.items():
    for dataset, cells in rows.items():
      for model, acc in zip(_T5_MODELS, cells, strict=True):
        if acc is not None:
          refs.append(Reference('Table 5', model, pretrain, dataset, acc, note='384 px', crop=384))
  for dataset, acc in _T8.items():
    note = 'learned 1-D position embedding'
    refs.append(Reference('Table 8', 'ViT-B_16', 'jft300m', dataset, acc, note=note))
  for model, rows in _LIT_CARD.items():
    for dataset, acc in rows.items():
      key = f'zeroshot/{dataset}'
      refs.append(
        Reference('LiT model card', model, LIT_PRETRAIN, key, acc, note='224 px', crop=224)
      )
  for model, rows in _README.items():
    for dataset, cells in rows.items():
      for dropout, acc in zip((0.0, 0.1), cells, strict=True):
        refs.append(
          Reference(
            f'README dropout={dropout}',
            model,
            'imagenet21k',
            dataset,
            acc,
            dropout=dropout,
            note='384 px, 10k/20k steps',
            crop=384,
          )
        )
  return tuple(refs)


REFERENCES: tuple[Reference, ...] = _build()


def title(dataset: str) -> str:
  """A dataset key as the tables name it: 'CIFAR-10', 'ImageNet 5-shot linear'."""
  if dataset.startswith('zeroshot/'):
    name = dataset.removeprefix('zeroshot/')
    return f'{DATASET_TITLES.get(name, name)} zero-shot'
  if dataset.startswith('fewshot/'):
    _, name, shots = dataset.split('/')
    return f'{DATASET_TITLES.get(name, name)} {shots.removesuffix("shot")}-shot linear'
  return DATASET_TITLES.get(dataset, dataset)


def references(
  model: str, pretrain: str, dataset: str, dropout: float | None = None
) -> list[Reference]:
  """The published numbers for a (model, pretraining, dataset); README rows match the dropout."""
  out = []
  for ref in REFERENCES:
    if (ref.model, ref.pretrain, ref.dataset) != (model, pretrain, dataset):
      continue
    if ref.dropout is not None and dropout is not None and abs(ref.dropout - dropout) > 1e-9:
      continue
    out.append(ref)
  return out
