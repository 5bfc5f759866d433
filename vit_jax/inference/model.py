"""`Model`: a loaded model with its preprocessing, tokenizer and class names, as functions of
images and texts.

  model = vit_jax.load('ViT-B_16.npz')                 # any checkpoint, or a registry name
  model.classify(['cat.jpg'])[0]                       # [('tabby', 0.61), ...]: top 5
  x = model.preprocess(['a.jpg', b'...', pil_image])   # (N, 224, 224, 3) float32
  model.logits(x), model.features(x)

  lit = vit_jax.load('LiT-B16B.npz')                   # an image-text model
  lit.similarity(['cat.jpg'], ['a cat', 'a dog'])      # (1, 2) probabilities
  lit.embed_images(x), lit.embed_texts(['a cat']), lit.classify(x, classes=['cat', 'dog'])

Every method that takes images takes them as the model's inputs (a float array already
preprocessed: (N, *model.preprocessing.input_shape())) or as images (paths, encoded bytes,
PIL images, uint8 arrays (H, W, 3), or a list of them), which it preprocesses first. Batches
run `batch_size` at a time, the last one padded, so one compiled program serves them all.
"""

import dataclasses
import functools
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import families
from vit_jax.families.preprocessing import PATCHES, Preprocessing
from vit_jax.models import precision

TOP_K = 5


@dataclasses.dataclass(frozen=True)
class Programs:
  """The model's compiled functions of one batch: (features, logits) of a classifier, or the
  image tower's pre-logits, normalised image embeddings and text embeddings of an image-text
  model; None where the model has none. An exported model has its StableHLO here."""

  classifier: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray | None]] | None = None
  image_features: Callable[[np.ndarray], np.ndarray] | None = None
  image: Callable[[np.ndarray], np.ndarray] | None = None
  text: Callable[[np.ndarray], np.ndarray] | None = None


@dataclasses.dataclass(eq=False)
class Model:
  """A model ready to use (`vit_jax.load`).

  Attributes:
    name: the registered name, or the architecture in words.
    kind: 'ViT', 'ViT hybrid', 'DeiT (distilled)', 'MLP-Mixer', 'LiT', 'SigLIP', ... (the
      family's word).
    image_text: an image-text model (texts, embeddings, zero-shot) rather than a classifier.
    preprocessing: how its images are prepared (its family's spec, `families.preprocessing`).
    dtype: the compute dtype ('float32' or 'bfloat16').
    source: where it was loaded from (a path, a registry name).
    config, module, params: its constructor fields, the flax module (in `dtype`) and its
      parameters (the matmul kernels already in `dtype`); None for an exported model.
    resolution: the image size its parameters are fitted to; None for patch sequences.
    grid, patch_pixels: its patch tokens (rows, cols) at `resolution` and one token's side
      in pixels (a classifier's; None otherwise).
    class_names, class_names_source: a classifier's names (None: indices) and their origin.
    tokenizer, vocab: an image-text model's tokenizer and its vocabulary file (None where
      no vocabulary was found: `vocab_error` says where it looked).
    t, b: exp of the temperature and SigLIP's bias (an image-text model's).
    templates: the zero-shot templates the model was evaluated with, or None.
    canonicalize: whether its class names and templates were canonicalised.
    batch_size: images or texts per compiled call.
    found: what the checkpoint file holds as it states it (`checkpoint.Found`: its format,
      architecture, counts, and what the project computes otherwise than it states); None
      for a registered name or an exported model.
  """

  name: str
  kind: str
  image_text: bool
  preprocessing: Preprocessing
  dtype: str
  source: str
  programs: Programs
  config: Any = None
  module: Any = None
  params: Any = None
  resolution: Any = None
  grid: tuple[int, int] | None = None
  patch_pixels: int | None = None
  num_classes: int | None = None
  class_names: list[str] | None = None
  class_names_source: str = 'indices'
  head_is_zero: bool = False
  tokenizer: Any = None
  vocab: str | None = None
  vocab_error: str = ''
  t: float | None = None
  b: float | None = None
  templates: tuple[str, ...] | None = None
  canonicalize: bool = True
  batch_size: int = 32
  found: Any = None

  # --- inputs -----------------------------------------------------------------------------

  def preprocess(self, images: Any) -> np.ndarray:
    """Images (paths, bytes, PIL images, uint8 arrays (H, W, 3); one or a list, or a uint8
    batch (N, H, W, 3)) -> the model's inputs (N, *preprocessing.input_shape()), float32;
    an unreadable one raises `ImageError` naming it."""
    from vit_jax.data import images as host

    return np.stack([host.host_input(self.preprocessing, _pixels(x)) for x in _many(images)])

  def inputs(self, images: Any) -> np.ndarray:
    """`images` as the model's inputs: a float array of the input shape as it is, anything
    else preprocessed."""
    shape = self.preprocessing.input_shape()
    if isinstance(images, np.ndarray | jax.Array) and np.issubdtype(images.dtype, np.floating):
      if tuple(images.shape[1:]) != shape:
        raise ValueError(f'inputs of shape {images.shape}: this model takes (N, *{shape})')
      return np.asarray(images, np.float32)
    return self.preprocess(images)

  def tokenize(self, texts: str | Sequence[str]) -> np.ndarray:
    """Texts -> int32 token ids (N, max_len), by the model's own tokenizer."""
    if self.tokenizer is None:
      raise ValueError(self.vocab_error or f'{self.name} has no text tower')
    texts = [texts] if isinstance(texts, str) else list(texts)
    return np.asarray(self.tokenizer(texts), np.int32)

  # --- outputs ----------------------------------------------------------------------------

  def features_and_logits(self, images: Any) -> tuple[np.ndarray, np.ndarray | None]:
    """A classifier's pre-logits features (N, D) and logits (N, classes; None without a
    head), from one pass."""
    if self.programs.classifier is None:
      raise ValueError(f'{self.name} is an image-text model: it has no class logits')
    return self._batched(self.programs.classifier, self.inputs(images))

  def logits(self, images: Any) -> np.ndarray:
    """A classifier's logits (N, classes); a distilled model's: the mean of its two heads."""
    logits = self.features_and_logits(images)[1] if self.num_classes else None
    if logits is None:
      raise ValueError(f'{self.name} has no classification head: use features()')
    return logits

  def features(self, images: Any) -> np.ndarray:
    """The pre-logits features (N, D): a classifier's (a distilled model's two tokens side by
    side), an image-text model's image tower's (what a linear probe reads)."""
    if self.programs.classifier is not None:
      features = self.features_and_logits(images)[0]
    elif self.programs.image_features is not None:
      features = self._batched(self.programs.image_features, self.inputs(images))
    else:
      features = None
    if features is None:
      raise ValueError(f'{self.name}: exported without its pre-logits features')
    return features

  def embed_images(self, images: Any) -> np.ndarray:
    """An image-text model's L2-normalised image embeddings (N, D); a classifier's
    pre-logits features."""
    if self.programs.image is None:
      return self.features(images)
    return self._batched(self.programs.image, self.inputs(images))

  def embed_texts(self, texts: Any) -> np.ndarray:
    """An image-text model's L2-normalised text embeddings (N, D) of texts (or int32 token
    ids (N, max_len))."""
    if self.programs.text is None:
      raise ValueError(f'{self.name} has no text tower')
    tokens = texts if isinstance(texts, np.ndarray) and texts.dtype.kind == 'i' else None
    return self._batched(self.programs.text, self.tokenize(texts) if tokens is None else tokens)

  def similarity(self, images: Any, texts: Sequence[str]) -> np.ndarray:
    """(N images, T texts) probabilities: LiT's softmax over the texts of exp(t) times the
    cosine similarities, SigLIP's sigmoid(exp(t) * similarity + b) of each pair alone."""
    from vit_jax.evals import zeroshot

    zimg, ztxt = self.embed_images(images), self.embed_texts(texts)
    return np.asarray(zeroshot.probabilities(zimg, ztxt, self.t, self.b))

  def class_embeddings(self, classes: Sequence[str], templates: Any = None) -> np.ndarray:
    """(C, D): each class's prompts (`templates`, default the model's own, else CLIP's best)
    embedded, averaged and renormalised, as the zero-shot evaluator computes them."""
    from vit_jax.evals import zeroshot

    filled = self.prompt_templates(templates)
    tokens = self.tokenize(zeroshot.prompt_texts(list(classes), filled))
    return zeroshot.average(self._batched(self.programs.text, tokens), len(classes))

  def prompt_templates(self, templates: Any = None) -> list[str]:
    """The templates filled for zero-shot: `templates` (set names or strings with '{}'), else
    those the model was evaluated with, else 'clip_best'; canonicalised as it was."""
    from vit_jax.evals import prompts

    chosen = templates if templates is not None else self.templates or ['clip_best']
    return prompts.templates(chosen, self.canonicalize)

  def zero_shot(self, images: Any, class_embeddings: np.ndarray) -> np.ndarray:
    """(N, C) zero-shot probabilities of images against `class_embeddings`."""
    from vit_jax.evals import zeroshot

    zimg = self.embed_images(images)
    return np.asarray(zeroshot.probabilities(zimg, class_embeddings, self.t, self.b))

  def probabilities(self, images: Any, classes: Sequence[str] | None = None, templates=None):
    """(N, C) class probabilities: a classifier's softmax, or an image-text model's zero-shot
    probabilities of `classes`."""
    if not self.image_text:
      if classes is not None:
        raise ValueError(f'{self.name} is a classifier: its classes are its head')
      return softmax(self.logits(images))
    if not classes:
      raise ValueError(f'{self.name} is an image-text model: name the classes to choose from')
    return self.zero_shot(images, self.class_embeddings(classes, templates))

  def classify(
    self, images: Any, classes: Sequence[str] | None = None, top_k: int = TOP_K, templates=None
  ) -> list[list[tuple[str, float]]]:
    """Each image's `top_k` classes, best first, as (name, probability): a classifier's
    (names from `class_names`, else the index), or with `classes` an image-text model's
    zero-shot choice among them."""
    probs = self.probabilities(images, classes, templates)
    names = list(classes) if classes else self.class_names
    indices, top = top_k_of(probs, top_k)
    label = (lambda j: names[j]) if names else str
    return [
      [(label(int(j)), float(p)) for j, p in zip(row, ps, strict=True)]
      for row, ps in zip(indices, top, strict=True)
    ]

  def _batched(self, fn: Callable[[np.ndarray], Any], inputs: np.ndarray) -> Any:
    """`fn` over `inputs`, `batch_size` rows a call (the last call padded to it); each
    output leaf concatenated."""
    size = max(1, min(self.batch_size, len(inputs)))
    parts = [run_padded(fn, inputs[i : i + size], size) for i in range(0, len(inputs), size)]
    if not parts:
      raise ValueError('no images or texts given')
    return jax.tree.map(lambda *xs: np.concatenate(xs), *parts)


def image_batches(
  model: Model, paths: Sequence[Any], batch_size: int, errors: list[str]
) -> Iterator[tuple[list[str], np.ndarray]]:
  """The readable images of `paths` in order as the model's inputs, `batch_size` at a time:
  (their names, (n, *input_shape)); each unreadable one's one-line reason goes to `errors`."""
  from vit_jax.data import images

  names, rows = [], []
  for path in paths:
    try:
      rows.append(model.preprocess(path)[0])
      names.append(str(path))
    except images.ImageError as e:
      errors.append(str(e))
    if len(rows) == batch_size:
      yield names, np.stack(rows)
      names, rows = [], []
  if rows:
    yield names, np.stack(rows)


def run_padded(fn: Callable[[np.ndarray], Any], batch: np.ndarray, size: int) -> Any:
  """`fn(batch)` with the batch padded to `size` rows (one compiled shape for every batch)
  and the padding cut off every output leaf."""
  n = len(batch)
  if n < size:
    batch = np.concatenate([batch, np.zeros((size - n, *batch.shape[1:]), batch.dtype)])
  return jax.tree.map(lambda y: np.asarray(y, np.float32)[:n], fn(batch))


def softmax(logits: np.ndarray) -> np.ndarray:
  """Softmax over the last axis, in float64."""
  z = logits.astype(np.float64)
  z = np.exp(z - z.max(axis=-1, keepdims=True))
  return z / z.sum(axis=-1, keepdims=True)


def top_k_of(probs: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
  """The k most probable classes (N, k), best first (ties: lower index), and their
  probabilities."""
  k = min(k, probs.shape[-1])
  indices = np.argsort(-probs, axis=-1, kind='stable')[:, :k]
  return indices, np.take_along_axis(probs, indices, axis=-1)


def _many(images: Any) -> list[Any]:
  """One image or several, as a list."""
  if isinstance(images, str | bytes | os.PathLike) or _is_pil(images):
    return [images]
  if isinstance(images, np.ndarray | jax.Array):
    return [images] if images.ndim == 3 else list(np.asarray(images))
  return list(images)


def _is_pil(x: Any) -> bool:
  return type(x).__module__.startswith('PIL.')


def _pixels(image: Any) -> np.ndarray:
  """One image as decoded uint8 RGB pixels (H, W, 3)."""
  from vit_jax.data import images

  if isinstance(image, str | os.PathLike):
    return images.read_image(image)
  if isinstance(image, bytes):
    return images.decode_image(image, 'the image bytes given')
  if _is_pil(image):
    return np.asarray(image.convert('RGB'), np.uint8)
  pixels = np.asarray(image)
  if pixels.ndim != 3 or pixels.shape[-1] != 3 or pixels.dtype != np.uint8:
    raise ValueError(f'an image array is uint8 (H, W, 3); got {pixels.dtype} {pixels.shape}')
  return pixels


# --- programs of a flax model -------------------------------------------------------------


def _cast(forward: Callable, params: Any, dtype: str, *examples: Any) -> Any:
  """The parameters on the device; under a 16-bit `dtype` each matmul kernel stored in it
  once (bit-identical outputs, no per-call casts: `precision.cast_matmul_params`; float32
  casts nothing, so the model is not traced for it)."""
  params = jax.device_put(params)  # one transfer of the tree: 0.2 s less than leaf by leaf
  if jnp.dtype(dtype) == jnp.float32:
    return params
  return precision.cast_matmul_params(forward, params, *examples)


def _program(fn: Callable[..., Any], params: Any) -> Callable[[np.ndarray], Any]:
  """`fn(params, x)` compiled, the parameters an argument (not constants folded into the
  program: the same computation as a training run's evaluators), outputs float32."""
  compiled = jax.jit(lambda p, x: jax.tree.map(lambda y: y.astype(jnp.float32), fn(p, x)))
  return functools.partial(compiled, params)


def classifier_programs(
  module: Any, params: dict, spec: Preprocessing, dtype: str
) -> tuple[Programs, Any]:
  """A ViT, DeiT or Mixer: one program of images -> (pre-logits features, logits), the head
  applied to the features in float32 (a distilled model's: the mean of its two heads)."""
  params = dict(params)
  heads = {k: params.pop(k) for k in ('head', 'head_dist') if k in params}
  headless = module.clone(num_classes=None)
  options = families.of_module(module).feature_kwargs(module)

  def features(p, x):
    out = headless.apply({'params': p}, x, train=False, **options)
    return jnp.concatenate(out, axis=-1) if isinstance(out, tuple) else out

  example = jax.ShapeDtypeStruct((1, *spec.input_shape()), jnp.float32)
  params = _cast(features, params, dtype, example)
  head = head_map(heads.get('head'), heads.get('head_dist'))

  def both(p, x):
    f = features(p['body'], x).astype(jnp.float32)
    return f, (None if p['head'] is None else f @ p['head'][0] + p['head'][1])

  return Programs(classifier=_program(both, {'body': params, 'head': head})), {**params, **heads}


def head_map(head: Any, head_dist: Any) -> tuple[jax.Array, jax.Array] | None:
  """(kernel, bias) of the map from the features to the logits, float32: the head, or for a
  distilled model the mean of its two heads on the two tokens side by side."""
  if head is None:
    return None
  f32 = lambda x: jnp.asarray(x, jnp.float32)
  if head_dist is None:
    return f32(head['kernel']), f32(head['bias'])
  kernel = jnp.concatenate([f32(head['kernel']), f32(head_dist['kernel'])]) / 2
  return kernel, (f32(head['bias']) + f32(head_dist['bias'])) / 2


def image_text_programs(
  module: Any, params: dict, spec: Preprocessing, max_len: int, dtype: str
) -> tuple[Programs, Any]:
  """An image-text model: its image and text towers' normalised embeddings, and the image
  tower's pre-logits."""
  both = lambda p, x, t: module.apply({'params': p}, images=x, tokens=t)
  examples = (
    jax.ShapeDtypeStruct((1, *spec.input_shape()), jnp.float32),
    jax.ShapeDtypeStruct((1, max_len), jnp.int32),
  )
  params = _cast(both, params, dtype, *examples)
  pre_logits = families.of_module(module).image_features(module)
  programs = Programs(
    image_features=_program(pre_logits, params),
    image=_program(lambda p, x: module.apply({'params': p}, images=x)[0], params),
    text=_program(lambda p, t: module.apply({'params': p}, tokens=t)[1], params),
  )
  return programs, params


def packed_image_program(model: Model, images_per_row: int) -> Callable[[np.ndarray], Any]:
  """A NaFlex model's `embed_images` on rows packed with up to `images_per_row` patch
  sequences (R, T, P + 3) -> (R, K, D) float32: an image-text model's normalised image
  embeddings, a classifier's pooled features (vit_jax/data/packing.py)."""
  if model.module is None or model.preprocessing.kind != PATCHES:
    raise ValueError(f'{model.name} takes no patch sequences: only a NaFlex model packs them')
  if model.image_text:
    module = model.module
    fn = lambda p, x: module.apply({'params': p}, images=x, images_per_row=images_per_row)[0]
  else:
    features = families.of_module(model.module).image_features(model.module)
    fn = lambda p, x: features(p, x, images_per_row)
  return _program(fn, model.params)
