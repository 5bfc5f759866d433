r"""Top-k predictions with class names, and pre-logits embeddings, for image files.

  python -m vit_jax.predict --checkpoint PATH [--model NAME] [--resolution R] [--top_k 5] \
      [--json] [--features OUT.npy [--features_block K]] [--batch_size 32] IMAGE...
  python -m vit_jax.predict --checkpoint LIT --classes=cat,dog [--templates=...] IMAGE...

Images get the model's own preprocessing (`vit_jax.load`: its family's spec, the input
pipeline's evaluation): decode to RGB, resize to the resolution (`tf.image.resize`: bilinear,
half-pixel centres, no antialiasing, aspect ratio not kept), then `(im - 127.5) / 127.5`, i.e.
[-1, 1], as every released family expects: an image file becomes the tensor a run's evaluation
feeds the model (JPEGs and PNGs to TensorFlow's numbers without importing it,
`vit_jax.data.images`). A missing checkpoint, or images none of which are there, is one line
before jax loads. The model is inferred from the parameter shapes unless `--model` is given.

Class names: a training run's own (`vit_jax.rundir`); a `config.json`'s `class_names` (or
the label names of the tensorflow_datasets `dataset` it names) or a Hugging Face `id2label`;
the ImageNet-1k names (package data, vit_jax/data/imagenet_classes.py) for 1000-class heads;
indices otherwise.

A distilled model (DeiT) predicts with the mean of its two heads, as DeiT does; its features
are the class and distillation tokens side by side (2 x hidden), of which that mean is one
linear map.

An image-text model (LiT, SigLIP: a file or a training run) has no head: with
`--classes=a,b,c` (and `--templates`, `--max_patches` for a patch-sequence model) it classifies the
images zero-shot, as `vit-zeroshot` does with the same flags.

A head that is all zeros (the released imagenet21k files, whose heads Google zeroed on
purpose) gives a warning instead of meaningless predictions.
Unreadable images are named in a one-line error, the others are still predicted, and the
exit status is non-zero.
"""

import json
import sys
from collections.abc import Sequence
from typing import Any

from absl import flags
from etils import epy

from vit_jax import cli

with epy.lazy_imports():  # jax loads on first use, once the arguments are checked
  from vit_jax import inference
  from vit_jax.inference import predict, zeroshot


def _as_json(model, predictions, errors, warning, checkpoint) -> dict[str, Any]:
  results = []
  for p in predictions:
    top = [
      {
        'rank': r + 1,
        'class': int(j),
        'name': p.names[r] if p.names else None,
        'probability': float(q),
      }
      for r, (j, q) in enumerate(zip(p.indices, p.probabilities, strict=True))
    ]
    results.append({'image': p.image, 'predictions': None if warning else top})
  return {
    'checkpoint': str(checkpoint),
    'model': model.name,
    'resolution': model.resolution,
    'num_classes': model.num_classes,
    'class_names': model.class_names_source,
    'warning': warning,
    'results': results,
    'errors': errors,
  }


def format_table(predictions: Sequence['predict.Prediction']) -> str:
  """One block per image: rank, probability, class index and name."""
  lines = []
  for p in predictions:
    lines.append(p.image)
    for r, (j, q) in enumerate(zip(p.indices, p.probabilities, strict=True)):
      name = f'  {p.names[r]}' if p.names else ''
      lines.append(f'  {r + 1}. {100 * q:6.2f}%  {int(j):>5d}{name}')
  return '\n'.join(lines)


def _head_warning(model, checkpoint) -> str | None:
  if not model.num_classes:
    return (
      f'{checkpoint} has no classification head, so there are no predictions; '
      'use --features for its embeddings.'
    )
  if model.head_is_zero:
    return (
      f'the head of {checkpoint} ({model.num_classes} classes) is all zeros, as Google '
      'released the imagenet21k files on purpose: every class would get probability '
      f'1/{model.num_classes}, so no predictions are shown. Use --features for embeddings, '
      'or fine-tune the model first.'
    )
  return None


def _write_features(
  out: str,
  predictions: Sequence['predict.Prediction'],
  model,
  checkpoint: str,
  block: int | None,
) -> None:
  meta = {
    'checkpoint': str(checkpoint),
    'model': model.name,
    'resolution': model.resolution,
  }
  if block is not None:
    meta['block'] = block  # patch tokens after it, before the final LayerNorm
  npy, sidecar, shape = predict.save_features(out, predictions, meta)
  print(f'wrote features {shape} to {npy}, file list to {sidecar}', file=sys.stderr)


def _check_usage(images, features, features_block, classes: str, max_patches: int) -> None:
  """Flags that do not go together: a one-line ValueError."""
  if not images:
    raise ValueError('no images given; usage: python -m vit_jax.predict --checkpoint PATH IMAGE...')
  if classes and (features or features_block is not None):
    raise ValueError('--classes classifies zero-shot; it writes no --features')
  if max_patches and not classes:
    raise ValueError('--max_patches is for a patch-sequence image-text model, with --classes')
  if features:
    predict.features_path(features)
  if features_block is not None and not features:
    raise ValueError('--features_block: give --features OUT.npy to write the block features to')


def _classifier(checkpoint: str, model_name, resolution, dtype: str):
  """`vit_jax.load`'s model of `checkpoint`; an image-text model is a one-line ValueError."""
  model = inference.load(checkpoint, model=model_name, resolution=resolution, dtype=dtype)
  if model.image_text:
    raise ValueError(
      f'{checkpoint}: an image-text model (LiT, SigLIP) has no head: give its classes '
      f"(--classes=a,b,c) to classify zero-shot, or take its image tower's features from "
      f'{checkpoint}:img'
    )
  return model


def run(
  checkpoint: str,
  images: Sequence[str],
  model_name: str | None = None,
  resolution: int | None = None,
  k: int = 5,
  as_json: bool = False,
  features: str | None = None,
  batch_size: int = 32,
  features_block: int | None = None,
  classes: str = '',
  templates: str | None = None,
  max_patches: int = 0,
  dtype: str = 'float32',
) -> int:
  """The command line's work; returns the exit status: 2 for a usage error (flags that do not
  go together, or a value the model cannot take), 1 for anything else that failed. With
  `classes`, an image-text model classifies the images zero-shot (`vit-zeroshot`: the names
  in `templates`, default the checkpoint's own, else clip_best; a patch-sequence model's
  images as at most `max_patches` patches, 0: its own count)."""
  if cli.said_missing([checkpoint], images):  # before jax loads
    return 1
  try:
    _check_usage(images, features, features_block, classes, max_patches)
  except ValueError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  if classes:
    return _zero_shot(checkpoint, images, classes, templates, (k, as_json, batch_size, max_patches))
  try:
    model = _classifier(checkpoint, model_name, resolution, dtype)
  except (OSError, ValueError, KeyError) as e:
    message = str(e) if str(checkpoint) in str(e) else f'{checkpoint}: {e}'  # the path once
    print(f'error: {message}'.replace('\n', ' '), file=sys.stderr)
    return 1
  try:
    if features_block is not None:
      features_block = predict.feature_block(model, features_block)
  except ValueError as e:  # a flag value this model cannot take
    print(f'error: {e}', file=sys.stderr)
    return 2
  warning = _head_warning(model, checkpoint)
  if warning:
    print(f'warning: {warning}', file=sys.stderr)
  if warning and not features:
    _report(model, [], [], warning, checkpoint, as_json)
    return 1

  predictions, errors = predict.predict_files(model, images, k, batch_size, features_block)
  for error in errors:  # each unreadable image, one line; the others are still predicted
    print(f'error: {error}', file=sys.stderr)
  if features and predictions:
    _write_features(features, predictions, model, checkpoint, features_block)
  _report(model, predictions, errors, warning, checkpoint, as_json)
  return 1 if errors else 0


def _report(model, predictions, errors, warning, checkpoint, as_json: bool) -> None:
  """The predictions as JSON, or as a table unless the head was not trusted (`warning`)."""
  if as_json:
    print(json.dumps(_as_json(model, predictions, errors, warning, checkpoint), indent=1))
  elif not warning:
    source = model.class_names_source
    print(f'{model.name} at {model.resolution} px, {model.num_classes} classes (names: {source})')
    print(format_table(predictions))


def _zero_shot(checkpoint: str, images, classes: str, templates, options: tuple) -> int:
  """`--classes`: an image-text model's zero-shot classes of the images, as vit-zeroshot
  prints them."""
  k, as_json, batch_size, max_patches = options
  try:
    model = inference.load(checkpoint, max_patches=max_patches, batch_size=batch_size)
    if not model.image_text or model.tokenizer is None:
      raise ValueError(
        model.vocab_error or f'{checkpoint} is a classifier: --classes is not for it'
      )
    names, filled, _ = zeroshot.classes_and_templates(model, None, '', classes, templates, None)
    zcls, _ = zeroshot.class_embeddings(model, names, filled)
    good, probs, errors = zeroshot.classify_files(model, zcls, images, batch_size)
  except (OSError, ValueError, KeyError) as e:
    print(f'error: {e}'.replace('\n', ' '), file=sys.stderr)
    return 1
  if not as_json:
    print(f'{model.name}: {len(names)} classes x {len(filled)} templates')
  cli.print_zero_shot(zeroshot.predictions(model, good, probs, names, k, errors), as_json)
  return 1 if errors else 0


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """The command line's flags, on `flag_values`; defined at program start, so that importing
  this module (the visualiser does) registers none."""
  fv = flag_values
  cli.define_checkpoint_flags(fv)
  cli.define_dtype_flag(fv)
  flags.DEFINE_integer('top_k', 5, 'How many classes to show per image.', flag_values=fv)
  flags.DEFINE_bool('json', False, 'Print one JSON object instead of a table.', flag_values=fv)
  flags.DEFINE_string(
    'features',
    None,
    'Write the pre-logits features to this .npy (file list beside it: .json).',
    flag_values=fv,
  )
  flags.DEFINE_integer(
    'features_block',
    None,
    'With --features: write the patch tokens (N, h, w, D) after this encoder block instead'
    ' (0-based; -1 is the last), before the final LayerNorm.',
    flag_values=fv,
  )
  flags.DEFINE_integer('batch_size', 32, 'Images per forward pass.', flag_values=fv)
  flags.DEFINE_string(
    'classes',
    '',
    'An image-text model: class names a,b,c (or a file) to classify zero-shot.',
    flag_values=fv,
  )
  flags.DEFINE_string(
    'templates', None, 'With --classes: templates as vit-zeroshot takes them.', flag_values=fv
  )
  flags.DEFINE_integer(
    'max_patches',
    0,
    'With --classes: the patches an image of a patch-sequence model (0: its own).',
    flag_values=fv,
  )


def main(argv: Sequence[str]) -> None:
  f = flags.FLAGS
  cli.quiet_logs()  # orbax and JAX log at INFO on every restore
  sys.exit(
    run(
      f.checkpoint,
      argv[1:],
      f.model,
      f.resolution,
      f.top_k,
      f.json,
      f.features,
      f.batch_size,
      f.features_block,
      f.classes,
      f.templates,
      f.max_patches,
      f.dtype,
    )
  )


def run_cli() -> None:
  """The `vit-predict` console script (and `python -m vit_jax.predict`)."""
  cli.start(define_flags, main)
