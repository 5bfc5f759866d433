"""The data section of the run spec: the dataset, the batches, preprocessing, the pipeline.

One definition, with every default: the trainer's run spec (vit_jax/train/spec.py) holds a
`Data` as `spec.data`, and the pipeline builders (`train_dataset`, `host_train_dataset`,
`eval_dataset`) and the preprocessing ops take it, or its `pp`, whole. A new input option
is a field here, read where it acts. The config stays flat: the fields of `Data` are
top-level keys (`--config.shuffle_buffer`), those of `Pp` the nested `config.pp`.
"""

import dataclasses
from typing import ClassVar


@dataclasses.dataclass(frozen=True)
class Pp:
  """`config.pp`: splits and preprocessing."""

  # tfds split strings (or 'train'/'test' folders) for training and evaluation.
  train: str = 'train'
  test: str = 'test'
  # Output size; inception-crop area floor; random flip; crop box between pixels.
  crop: int = 384
  area_min: float = 0.05
  flip: bool = True
  subpixel: bool = False
  # RandAugment after the flip: layers (0 = off) and magnitude, big_vision's randaug(2, 10)
  # is 2 and 10 (vit_jax/data/randaugment.py).
  randaug_layers: int = 0
  randaug_magnitude: float = 10.0
  # A model that takes images as patch sequences (its family's preprocessing spec says so,
  # vit_jax/data/naflex.py): each image at its own aspect ratio as at most `max_patches`
  # patches of the model's patch size, instead of a crop; training flips it at random
  # (`flip`), nothing else. 0: the model's own inputs (square `crop` x `crop` images, or
  # patch sequences of the model's own number, SigLIP 2's 256).
  max_patches: int = 0
  # NaViT's Patch n' Pack (vit_jax/data/packing.py, docs/naflex-packing.md), training only:
  # rows of `pack_tokens` tokens holding at most `pack_images` images each (0: one image per
  # row); a batch of R rows reads R * `pack_read` images and leaves out those that fit no row.
  pack_tokens: int = 0
  pack_images: int = 8
  pack_read: int = 3
  # Resolution sampling: each training image's patch budget drawn uniformly from these
  # (NaViT's (64, 80, ..., 256)); (): the model's or `max_patches`.
  pack_budgets: tuple = ()
  # Token dropping: this fraction of each training image's patches dropped at random (the
  # bottom-right patch kept); drawn per image uniformly up to `token_drop_max` if larger.
  token_drop: float = 0.0
  token_drop_max: float = 0.0
  # Training patch sequences: each image's aspect ratio times r, log r uniform in
  # [-log aspect_range, log aspect_range] (its area kept), before its sequence; 1: none.
  aspect_range: float = 1.0
  # Training decodes only the inception crop's window of a JPEG (big_vision's
  # `decode_jpeg_and_inception_crop`); False: the whole image, then the crop.
  decode_window: bool = True
  # Image-text data (vit_jax/data/captions.py): the tokenizer ('bert', 'sentencepiece', 'gemma'),
  # its vocabulary file, and the ids per text.
  tokenizer: str = ''
  vocab: str = ''
  max_len: int = 16

  # Keys of earlier versions, accepted in a config (a run directory's config.json) and
  # ignored: `patch_size`, the patch of patch sequences, is the model's.
  RETIRED: ClassVar[frozenset[str]] = frozenset({'patch_size'})


@dataclasses.dataclass(frozen=True)
class Data:
  """The dataset, the batches and the input pipeline."""

  # 'digits' (bundled), a tfds name, or a folder `{train,test}/<class>/*.jpg`.
  dataset: str = ''
  # tensorflow_datasets data directory ('' = tfds default).
  tfds_data_dir: str = ''
  # Classes; 0 = from the dataset.
  num_classes: int = 0
  pp: Pp = Pp()
  # Global batch sizes (over all hosts and devices).
  batch: int = 512
  batch_eval: int = 512
  # Shuffle buffer of a dataset that can only be read in order (a tfds TFRecord build); the
  # others are shuffled whole, a new permutation each epoch.
  shuffle_buffer: int = 50_000
  # Batches the input pipeline prepares ahead; its threads (0 = the cores this process may use).
  prefetch: int = 2
  input_threads: int = 0
  # An unreadable training image (corrupt, truncated, empty, not an image) is skipped: replaced
  # by a copy of another image of its batch, counted (bad_images in metrics.jsonl) and named in
  # a warning; False stops the run instead. An unreadable test image stops the evaluation with
  # an error naming it unless skip_bad_test_images (it then leaves the count: num_test drops).
  skip_bad_images: bool = True
  skip_bad_test_images: bool = False
  # The training stream is read as this many shards, split over the processes (0 = one per
  # process). The batches depend on it, not on the process count: fix it to the largest
  # process count a run will use to make it reproducible (and resumable) on any of them.
  data_shards: int = 0
  # Image-text pairs from a labelled dataset: each example's captions are these templates
  # with its class name ('a photo of the digit {}.'); () = the dataset's own captions.
  caption_templates: tuple = ()


def check(data: Data) -> None:
  """The checks of the section that need no data: one-line ValueErrors naming the key."""
  if data.pp.randaug_layers < 0 or data.pp.randaug_magnitude < 0:
    raise ValueError(
      f'config.pp.randaug_layers={data.pp.randaug_layers}, config.pp.randaug_magnitude='
      f'{data.pp.randaug_magnitude}; expected >= 0 (0 layers: no RandAugment).'
    )
  if data.pp.max_patches < 0:
    raise ValueError(
      f"config.pp.max_patches={data.pp.max_patches}; expected >= 0 (0: the model's own inputs)."
    )
  _check_packing(data.pp)
  if data.input_threads < 0:
    raise ValueError(f'config.input_threads={data.input_threads}; expected >= 0 (0: all cores).')
  for key in ('batch', 'batch_eval'):
    if getattr(data, key) < 1:
      raise ValueError(f'config.{key}={getattr(data, key)}; expected a positive integer.')


def _check_packing(pp: Pp) -> None:
  """Patch n' Pack's fields (vit_jax/data/packing.py): one-line ValueErrors naming the key."""
  budgets = tuple(pp.pack_budgets)
  if any(not isinstance(b, int) or b < 1 for b in budgets):
    raise ValueError(f'config.pp.pack_budgets={budgets}; expected positive patch counts.')
  longest = max(budgets, default=pp.max_patches)  # 0: the model's own, checked by the pipeline
  if pp.pack_tokens < 0 or 0 < pp.pack_tokens < longest:
    raise ValueError(
      f'config.pp.pack_tokens={pp.pack_tokens}; expected 0 (one image per row) or at least '
      f'the patches of an image, {longest}.'
    )
  for key in ('pack_images', 'pack_read'):
    if getattr(pp, key) < 1:
      raise ValueError(f'config.pp.{key}={getattr(pp, key)}; expected a positive integer.')
  if not (0 <= pp.token_drop < 1 and 0 <= pp.token_drop_max < 1):
    raise ValueError(
      f'config.pp.token_drop={pp.token_drop}, token_drop_max={pp.token_drop_max}; expected '
      'fractions in [0, 1).'
    )
  if pp.aspect_range < 1:
    raise ValueError(f'config.pp.aspect_range={pp.aspect_range}; expected >= 1 (1: none).')
  if 0 < pp.token_drop_max < pp.token_drop:
    raise ValueError(
      f'config.pp.token_drop_max={pp.token_drop_max} is below config.pp.token_drop='
      f'{pp.token_drop}: give a larger maximum, or 0 for a fixed fraction.'
    )
