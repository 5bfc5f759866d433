"""The dataset a run names (`config.dataset`), opened as its `Source`.

'digits' is the bundled digits, an existing folder is an image folder (or, with
`<split>/captions.tsv`, images with captions), 'vtab/<task>' a
VTAB-1k task, anything else a tfds name, checked against tfds's builders (a misspelling
names the closest ones).
"""

import difflib

import tensorflow_datasets as tfds

from vit_jax import files
from vit_jax.data import captions, sources, vtab


def get_source(dataset: str, data_dir: str | None = None) -> sources.Source:
  """'digits', a folder `root/<split>/<class>/*.jpg`, a VTAB-1k task ('vtab/dtd'), or a tfds
  name ('cifar10', 'imagenet2012')."""
  if not dataset:
    raise ValueError('No dataset: set --config.dataset (digits, a tfds name, or an image folder).')
  if dataset == 'digits':
    return sources.DigitsSource()
  if dataset.startswith('vtab/'):  # the VTAB-1k tasks: labels and splits of their own
    return vtab.VtabSource(dataset.removeprefix('vtab/'), data_dir)
  if files.path(dataset).is_dir():
    if captions.has_captions(dataset):
      return captions.FolderCaptions(dataset)
    return sources.FolderSource(dataset)
  if '/' in dataset or dataset.startswith('.'):
    raise ValueError(
      f'Image folder {dataset!r} does not exist; expected {dataset}/train/<class>/*.jpg.'
    )
  builders = tfds.list_builders(with_community_datasets=False)  # community: a bucket read
  if dataset.split(':')[0] not in builders:
    close = difflib.get_close_matches(dataset, [*builders, 'digits'], n=3, cutoff=0.6)
    hint = f' Did you mean: {", ".join(close)}?' if close else ''
    if dataset == 'imagenet21k':
      hint = ' ImageNet-21k is not in public tfds: give your tfds build or an image folder.'
    raise ValueError(
      f'Unknown dataset {dataset!r}: not "digits", an existing image folder, or a tfds name.{hint}'
    )
  try:
    if captions.is_tfds_captions(tfds.builder(dataset, data_dir=data_dir)):
      return captions.TfdsCaptions(dataset, data_dir)
    return sources.TfdsSource(dataset, data_dir)
  except Exception as e:  # tfds raises many kinds here
    raise ValueError(f'Cannot open tfds dataset {dataset!r}: {str(e).splitlines()[0]}') from e
