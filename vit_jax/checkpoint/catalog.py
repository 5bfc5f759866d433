"""The released Google ViT and MLP-Mixer checkpoints: which file to fetch, which `--model`.

Facts from the original release's bucket listings (`gs://vit_models/`, `gs://mixer_models/`),
the AugReg README's recommended checkpoints and the Hugging Face hub copies. `size` is the
published file size.
AugReg has ~52k more files (`gs://vit_models/augreg/index.csv`); the ones listed here are the
README's recommended upstream (`i21k`) checkpoints and their ImageNet fine-tunes at 384 px;
every AugReg file follows the same layout and loads the same way.
"""

import dataclasses
from typing import Any

GCS = 'https://storage.googleapis.com/vit_models'
MIXER_GCS = 'https://storage.googleapis.com/mixer_models'
HF_HUB = 'https://huggingface.co'


@dataclasses.dataclass(frozen=True)
class Entry:
  """One released checkpoint."""

  name: str  # unique id, e.g. 'imagenet21k/ViT-B_16'
  family: str  # 'original', 'augreg', 'mixer' or 'hf'
  file: str  # file name to fetch (for hub repos: the repo id)
  url: str
  model: str  # the registry name for --model
  resolution: int  # pixels the position embeddings are laid out for
  num_classes: int | None  # head classes; 0: no head; None: not verified
  pre_logits: bool | None  # has the representation layer; None: not verified
  size: str = ''  # as published (MiB/GiB from the bucket listing, MB from the hub)
  notes: str = ''


def _npz(bucket: str, path: str, notes: str, name: str = '', **fields: Any) -> Entry:
  """The released file `{bucket}/{path}.npz`, named `path` unless `name` is given."""
  file = path.rsplit('/', 1)[-1] + '.npz'
  return Entry(name=name or path, file=file, url=f'{bucket}/{path}.npz', notes=notes, **fields)


# gs://vit_models/imagenet21k: (model, size).
_IN21K = [
  ('ViT-B_16', '393.69 MiB'),
  ('ViT-B_32', '400.01 MiB'),
  ('ViT-B_8', '393.72 MiB'),
  ('ViT-L_16', '1.22 GiB'),
  ('ViT-L_32', '1.23 GiB'),
  ('ViT-H_14', '2.46 GiB'),
  ('R50+ViT-B_16', '439.85 MiB'),
  ('R26+ViT-B_32', '450.23 MiB'),
  ('R50+ViT-L_32', '1.31 GiB'),
]
# gs://vit_models/imagenet21k+imagenet2012: (file stem, model, resolution, size).
_IN1K = [
  ('ViT-B_16', 'ViT-B_16', 384, '331.4 MiB'),
  ('ViT-B_16-224', 'ViT-B_16', 224, '330.29 MiB'),
  ('ViT-B_32', 'ViT-B_32', 384, '336.89 MiB'),
  ('ViT-B_8', 'ViT-B_8', 384, '334.78 MiB'),
  ('ViT-L_16', 'ViT-L_16', 384, '1.14 GiB'),
  ('ViT-L_16-224', 'ViT-L_16', 224, '1.13 GiB'),
  ('ViT-L_32', 'ViT-L_32', 384, '1.14 GiB'),
  ('R50+ViT-B_16', 'R50+ViT-B_16', 384, '377.57 MiB'),
]


def _original() -> list[Entry]:
  in21k = {'family': 'original', 'resolution': 224, 'num_classes': 21843, 'pre_logits': True}
  notes = 'ImageNet-21k pre-training; the 21843-class head is all zeros'
  entries = [_npz(GCS, f'imagenet21k/{m}', notes, model=m, size=s, **in21k) for m, s in _IN21K]
  in1k = {'family': 'original', 'num_classes': 1000, 'pre_logits': False}
  notes = 'ImageNet-21k pre-training, ImageNet-1k fine-tune'
  for stem, model, resolution, size in _IN1K:
    path = f'imagenet21k+imagenet2012/{stem}'
    entries.append(_npz(GCS, path, notes, model=model, resolution=resolution, size=size, **in1k))
  return entries


# The AugReg README's recommended checkpoints: (model, upstream file stem, fine-tune lr, MiB).
_AUGREG = [
  ('ViT-L_16', 'L_16-i21k-300ep-lr_0.001-aug_strong1-wd_0.1-do_0.0-sd_0.0', '0.01', 1243),
  ('ViT-B_16', 'B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0', '0.03', 391),
  ('ViT-S_16', 'S_16-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0', '0.03', 115),
  ('R50+ViT-L_32', 'R50_L_32-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.1-sd_0.1', '0.01', 1337),
  ('R26+ViT-S_32', 'R26_S_32-i21k-300ep-lr_0.001-aug_light1-wd_0.1-do_0.0-sd_0.0', '0.01', 170),
  ('ViT-Ti_16', 'Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0', '0.03', 37),
  ('ViT-B_32', 'B_32-i21k-300ep-lr_0.001-aug_light1-wd_0.1-do_0.0-sd_0.0', '0.01', 398),
  ('ViT-S_32', 'S_32-i21k-300ep-lr_0.001-aug_none-wd_0.1-do_0.0-sd_0.0', '0.01', 118),
  ('R+ViT-Ti_16', 'R_Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0', '0.03', 40),
]


def _augreg() -> list[Entry]:
  upstream = {'family': 'augreg', 'resolution': 224, 'num_classes': 21843, 'pre_logits': False}
  tuned = {'family': 'augreg', 'resolution': 384, 'num_classes': 1000, 'pre_logits': False}
  notes = 'AugReg ImageNet-21k pre-training (README recommended)'
  tuned_notes = 'AugReg ImageNet-1k fine-tune (README recommended)'
  entries = []
  for model, stem, lr, size in _AUGREG:
    name = 'augreg/' + model.replace('ViT-', '').replace('+', '_') + '-i21k'
    size = f'{size} MiB'
    entries.append(_npz(GCS, f'augreg/{stem}', notes, name, model=model, size=size, **upstream))
    path = f'augreg/{stem}--imagenet2012-steps_20k-lr_{lr}-res_384'
    entries.append(_npz(GCS, path, tuned_notes, f'{name}-imagenet2012-384', model=model, **tuned))
  return entries


# Hub copies converted by the HF team: (repo, model, resolution, classes, pre_logits, size, notes).
_HF = [
  ('google/vit-base-patch16-224', 'ViT-B_16', 224, 1000, False, '346 MB', ''),
  ('google/vit-base-patch16-384', 'ViT-B_16', 384, 1000, False, '348 MB', ''),
  ('google/vit-base-patch32-384', 'ViT-B_32', 384, 1000, False, '353 MB', ''),
  ('google/vit-large-patch16-224', 'ViT-L_16', 224, 1000, False, '1.22 GB', ''),
  ('google/vit-large-patch16-384', 'ViT-L_16', 384, 1000, False, '1.22 GB', ''),
  ('google/vit-large-patch32-384', 'ViT-L_32', 384, 1000, False, '1.23 GB', ''),
  ('google/vit-base-patch16-224-in21k', 'ViT-B_16', 224, 0, True, '346 MB', 'ViTModel + pooler'),
  ('google/vit-base-patch32-224-in21k', 'ViT-B_32', 224, None, None, '', 'keys not verified'),
  (
    'google/vit-large-patch16-224-in21k',
    'ViT-L_16',
    224,
    None,
    None,
    '1.31 GB',
    'keys not verified',
  ),
  (
    'google/vit-large-patch32-224-in21k',
    'ViT-L_32',
    224,
    None,
    None,
    '1.32 GB',
    'keys not verified',
  ),
  (
    'google/vit-huge-patch14-224-in21k',
    'ViT-H_14',
    224,
    None,
    None,
    '2.64 GB',
    'keys not verified',
  ),
]


def _hf() -> list[Entry]:
  return [
    Entry(
      name=f'hf/{repo.split("/")[1]}',
      family='hf',
      file=repo,
      url=f'{HF_HUB}/{repo}',
      model=model,
      resolution=resolution,
      num_classes=classes,
      pre_logits=pre_logits,
      size=size or '',
      notes=('hub copy of the original release; ' + notes).rstrip('; '),
    )
    for repo, model, resolution, classes, pre_logits, size, notes in _HF
  ]


# gs://mixer_models (the listing stored in the original vit_jax.ipynb): (folder, model, MiB,
# classes, notes). The folders are named imagenet1k, not imagenet2012; sam/gsam are models
# trained from scratch on ImageNet with (G)SAM (arXiv:2106.01548, arXiv:2203.08065).
_MIXER = [
  ('imagenet1k', 'Mixer-B_16', '228.47', 1000, 'ImageNet-1k pre-training'),
  ('imagenet1k', 'Mixer-L_16', '794.29', 1000, 'ImageNet-1k pre-training'),
  ('imagenet21k', 'Mixer-B_16', '289.61', 21843, 'ImageNet-21k pre-training'),
  ('imagenet21k', 'Mixer-L_16', '875.78', 21843, 'ImageNet-21k pre-training'),
  ('sam', 'Mixer-B_16', '228.47', 1000, 'ImageNet-1k from scratch with SAM'),
  ('sam', 'Mixer-B_32', '230.04', 1000, 'ImageNet-1k from scratch with SAM'),
  ('gsam', 'Mixer-B_16', '228.47', 1000, 'ImageNet-1k from scratch with GSAM'),
  ('gsam', 'Mixer-B_32', '230.04', 1000, 'ImageNet-1k from scratch with GSAM'),
  ('gsam', 'Mixer-S_16', '70.71', 1000, 'ImageNet-1k from scratch with GSAM'),
  ('gsam', 'Mixer-S_32', '72.91', 1000, 'ImageNet-1k from scratch with GSAM'),
  ('gsam', 'Mixer-S_8', '78.79', 1000, 'ImageNet-1k from scratch with GSAM'),
]


def _mixer() -> list[Entry]:
  # The token-mixing MLPs are sized for 224 px (the file sizes say so).
  fields = {'family': 'mixer', 'resolution': 224, 'pre_logits': False}
  return [
    _npz(
      MIXER_GCS,
      f'{folder}/{model}',
      notes,
      model=model,
      num_classes=n,
      size=f'{size} MiB',
      **fields,
    )
    for folder, model, size, n, notes in _MIXER
  ]


CATALOG: tuple[Entry, ...] = tuple(_original() + _augreg() + _mixer() + _hf())


def find(query: str = '') -> list[Entry]:
  """Entries whose name, file or model contains `query` (case-insensitive)."""
  q = query.lower()
  return [e for e in CATALOG if not q or q in f'{e.name} {e.file} {e.model}'.lower()]


def format_table(entries: list[Entry]) -> str:
  """A plain-text table: name, --model, resolution, classes, pre_logits, size, URL."""

  def fmt(value):
    return '?' if value is None else ('yes' if value is True else 'no' if value is False else value)

  rows = [('name', 'model', 'res', 'classes', 'pre_logits', 'size', 'url')]
  for e in entries:
    rows.append(
      (
        e.name,
        e.model,
        str(e.resolution),
        str(fmt(e.num_classes) if e.num_classes != 0 else '-'),
        str(fmt(e.pre_logits)),
        e.size or '?',
        e.url,
      )
    )
  widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
  return '\n'.join(
    '  '.join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)) + '  ' + r[-1] for r in rows
  )
