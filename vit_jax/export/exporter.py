"""What `vit_jax.export` does (the package names it; its docstring says how): a fitted model's
functions, their StableHLO, SavedModel and ONNX files, and export.json."""

import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import checkpoint as ckpt
from vit_jax import families
from vit_jax.export import (
  DTYPES,
  FORMATS,
  OPT_IN,
  PLATFORMS,
  SAVED_MODEL,
  onnx,
  onnx_int8,
  saved_model,
)
from vit_jax.export.artifact import METADATA
from vit_jax.families.preprocessing import Preprocessing
from vit_jax.models import precision


class ExportError(ValueError):
  """A model or a request this command cannot export; one line."""


@dataclasses.dataclass(frozen=True)
class Function:
  """One exported function: a batch of `input_name` in, a batch of `output_name` out.

  Attributes:
    name: 'model' (a classifier), 'image' or 'text' (an image-text model's towers); the
      StableHLO file is NAME.stablehlo, the SavedModel signature NAME.
    fn: the model's apply on one input array, its parameters closed over (constants).
    shape: the input's dimensions, 'b' the symbolic batch ('n': a patch sequence's length).
    dtype: the input's dtype ('float32' images, 'int32' tokens).
    input_name, output_name: what the input and output are called in the SavedModel and
      export.json.
  """

  name: str
  fn: Callable[[jax.Array], jax.Array]
  shape: tuple[str | int, ...]
  dtype: str
  input_name: str
  output_name: str

  @property
  def polymorphic_shape(self) -> str:
    """The shape as jax.export and jax2tf spell it: '(b, 224, 224, 3)'."""
    return '(' + ', '.join(str(d) for d in self.shape) + ')'

  def spec(self) -> jax.ShapeDtypeStruct:
    """The input with its symbolic dimensions, for `jax.export`."""
    shape = jax.export.symbolic_shape(self.polymorphic_shape)
    return jax.ShapeDtypeStruct(shape, jnp.dtype(self.dtype))

  def output_shape(self) -> list[str | int]:
    """The output's dimensions ('b' symbolic), traced without compiling."""
    out = jax.eval_shape(self.fn, self.spec())
    return [d if isinstance(d, int) else str(d) for d in out.shape]


def _as_float32(fn: Callable[[jax.Array], jax.Array]) -> Callable[[jax.Array], jax.Array]:
  """Outputs in float32 whatever the compute dtype, so consumers see one dtype."""
  return lambda x: fn(x).astype(jnp.float32)


def _arrays(fitted: ckpt.Fitted) -> Any:
  return jax.tree.map(jnp.asarray, fitted.params)


def image_preprocessing(fitted: ckpt.Fitted) -> Preprocessing:
  """How the fitted model's images are prepared: its family's spec at its resolution."""
  return families.of_config(fitted.config).preprocessing(fitted.config, fitted.resolution, 0)


def _image_shape(fitted: ckpt.Fitted) -> tuple[str | int, ...]:
  """The image input with its symbolic batch 'b' (and a patch sequence's length 'n')."""
  return ('b', *image_preprocessing(fitted).symbolic_shape())


def _example(shape: tuple[str | int, ...], dtype: Any) -> jax.ShapeDtypeStruct:
  """A concrete example of `shape`: batch 1, a sequence of 2."""
  return jax.ShapeDtypeStruct(tuple({'b': 1, 'n': 2}.get(d, d) for d in shape), dtype)


def _classifier(fitted: ckpt.Fitted, dtype: str) -> list[Function]:
  """A ViT, DeiT or Mixer: NHWC images in [-1, 1] -> logits (a DeiT's: the mean of its two
  heads), or the pre-logits features where it has no head."""
  model = fitted.model(dtype=jnp.dtype(dtype))
  forward = lambda p, x: model.apply({'params': p}, x, train=False)
  shape = _image_shape(fitted)
  params = precision.cast_matmul_params(forward, _arrays(fitted), _example(shape, jnp.float32))
  apply = lambda x: forward(params, x)
  output = 'logits' if fitted.config.get('num_classes') else 'features'
  return [Function('model', _as_float32(apply), shape, 'float32', 'images', output)]


def _image_text(fitted: ckpt.Fitted, dtype: str) -> list[Function]:
  """An image-text model's towers: images (patch sequences: each slot the patch's p * p * 3
  values, its ptype, yidx, xidx) and int32 tokens -> L2-normalised embeddings."""
  tower = {'dtype': jnp.dtype(dtype)}
  model = fitted.model(image=tower, text=tower)
  image_shape = _image_shape(fitted)
  image_input = 'patches' if 'n' in image_shape else 'images'
  tokens = ('b', int(fitted.config.pp.max_len))
  examples = (_example(image_shape, jnp.float32), _example(tokens, jnp.int32))
  both = lambda p, x, t: model.apply({'params': p}, images=x, tokens=t)
  params = precision.cast_matmul_params(both, _arrays(fitted), *examples)
  image = lambda x: model.apply({'params': params}, images=x)[0]
  text = lambda x: model.apply({'params': params}, tokens=x)[1]
  return [
    Function('image', _as_float32(image), image_shape, 'float32', image_input, 'embeddings'),
    Function('text', _as_float32(text), tokens, 'int32', 'tokens', 'embeddings'),
  ]


def functions(fitted: ckpt.Fitted, dtype: str = 'float32') -> list[Function]:
  """The functions a fitted model is exported as, computing in `dtype`."""
  if dtype not in DTYPES:
    raise ExportError(f'--dtype={dtype}: choose one of {", ".join(DTYPES)}')
  try:
    if families.of_config(fitted.config).image_text:
      return _image_text(fitted, dtype)
    return _classifier(fitted, dtype)
  except TypeError as e:  # a model without a compute dtype field
    raise ExportError(f'this model cannot compute in {dtype}: {e}') from None


def write_stablehlo(function: Function, path: str | os.PathLike) -> jax.export.Exported:
  """`function` exported (symbolic batch, every platform) and serialised to `path`."""
  exported = jax.export.export(jax.jit(function.fn), platforms=PLATFORMS)(function.spec())
  with open(path, 'wb') as f:
    f.write(exported.serialize())
  return exported


def _vocab(fitted: ckpt.Fitted, source: str, vocab: str | None) -> tuple[str | None, list[str]]:
  """An image-text model's vocabulary (`vocab`, else the one found for `source`), checked
  against its text tower: (its path, []); or (None, [the line that says where it was looked
  for])."""
  name = families.of_config(fitted.config).tokenizer_settings(fitted.config.get('pp'))[0]
  vocab = ckpt.two_towers.uses(source, name, vocab).vocab
  if vocab is None:
    return None, ['exported without a tokenizer: ' + ckpt.two_towers.missing_vocab(source, name)]
  ckpt.two_towers.vocab_tokenizer(fitted.config, vocab)
  return vocab, []


def _text(fitted: ckpt.Fitted, vocab: str | None, out: str) -> dict[str, Any]:
  """The text tower's tokenizer (`tokenizer_settings`), its vocabulary copied into `out`
  where there is one, t and b."""
  family = families.of_config(fitted.config)
  pp = dict(fitted.config.get('pp') or {})
  name, max_len, options = family.tokenizer_settings(pp)
  copied = None
  if vocab is not None:
    copied = 'vocab' + ckpt.two_towers.VOCAB_SUFFIX[name]
    shutil.copyfile(vocab, os.path.join(out, copied))
  params = fitted.params
  scalar = lambda key: float(np.asarray(params[key]).reshape(())) if key in params else None
  return {
    # `pp`: the model's tokenizer settings, which the one tokenizer resolver reads back.
    'tokenizer': {
      'name': name,
      'max_len': max_len,
      'options': options,
      'vocab': copied,
      'pp': pp,
    },
    't': float(np.exp(scalar('t'))),  # exp of the stored log temperature
    'b': scalar('b'),
    'logits': 'sigmoid(t * zimg @ ztxt.T + b)' if 'b' in params else 'softmax(t * zimg @ ztxt.T)',
  }


def metadata(
  fitted: ckpt.Fitted, fns: Sequence[Function], source: str, dtype: str, written: Sequence[str]
) -> dict[str, Any]:
  """export.json: what the artifacts are and how to feed them."""
  family = families.of_config(fitted.config)
  entries = {}
  for f in fns:
    entries[f.name] = {
      'input': {'name': f.input_name, 'shape': list(f.shape), 'dtype': f.dtype},
      'output': {'name': f.output_name, 'shape': f.output_shape(), 'dtype': 'float32'},
      'stablehlo': f'{f.name}.stablehlo' if 'stablehlo' in written else None,
      'saved_model_signature': f.name if 'saved_model' in written else None,
      'onnx': f'{f.name}.onnx' if 'onnx' in written else None,
      'onnx_int8': f'{f.name}.int8.onnx' if 'onnx_int8' in written else None,
    }
  return {
    'family': family.name,
    'kind': family.kind(fitted.config),
    # Which jax wrote the StableHLO: an older jax may not read it (artifact.function says so).
    'jax': jax.__version__,
    'model': fitted.name or family.label(fitted.config),
    'source': source,
    'dtype': dtype,
    'formats': list(written),
    'platforms': list(PLATFORMS),
    'functions': entries,
    'onnx_int8': onnx_int8.settings() if 'onnx_int8' in written else None,
    'preprocessing': image_preprocessing(fitted).to_json(),
  }


def default_formats() -> list[str]:
  """What is written unless told: StableHLO and the SavedModel, and ONNX where jax2onnx is
  installed (its own environment, without TensorFlow: there the SavedModel is one line, as it
  is where TensorFlow cannot run this jax's StableHLO: jax 0.12 or newer); never int8."""
  return [f for f in FORMATS if f not in OPT_IN and (f != 'onnx' or onnx.available())]


def _unavailable(fmt: str, dtype: str) -> str | None:
  """Why `fmt` in `dtype` cannot be written here, in one line; None where it can."""
  if fmt == 'saved_model':
    return saved_model.unavailable()
  if fmt == 'onnx' and not onnx.available():
    return onnx.UNAVAILABLE
  if fmt == 'onnx' and dtype == 'bfloat16':
    return onnx.NO_BFLOAT16
  if fmt == 'onnx_int8' and not (onnx.available() and onnx_int8.available()):
    return onnx_int8.UNAVAILABLE
  if fmt == 'onnx_int8' and dtype == 'bfloat16':
    return onnx_int8.NO_BFLOAT16
  return None


def _check_formats(formats: Sequence[str] | None, dtype: str) -> tuple[list[str], list[str]]:
  """(the formats to write, one line for each asked for that cannot be written here); none
  to write is an ExportError of those lines."""
  asked = default_formats() if formats is None else list(formats)
  unknown = [f for f in asked if f not in FORMATS]
  if unknown or not asked:
    raise ExportError(f'--formats={",".join(asked)}: choose from {", ".join(FORMATS)}')
  if 'onnx_int8' in asked and 'onnx' not in asked:
    asked.append('onnx')  # the float32 file it quantizes
  why = {f: _unavailable(f, dtype) for f in FORMATS if f in asked}
  todo = [f for f, line in why.items() if not line]
  skipped = [line for line in why.values() if line]
  if not todo:
    raise ExportError('nothing to write: ' + '; '.join(skipped))
  return todo, skipped


def _write(fitted: ckpt.Fitted, fns: list[Function], formats: list[str], out: str) -> None:
  """The artifacts of `formats` into the directory `out`."""
  if 'stablehlo' in formats:
    for f in fns:
      write_stablehlo(f, os.path.join(out, f'{f.name}.stablehlo'))
  if 'saved_model' in formats:
    saved_model.write(fns, os.path.join(out, SAVED_MODEL), PLATFORMS)
  if 'onnx' in formats:
    for f in fns:
      onnx.write(f, os.path.join(out, f'{f.name}.onnx'))
  if 'onnx_int8' in formats:
    for f in fns:
      onnx_int8.write(os.path.join(out, f'{f.name}.onnx'), os.path.join(out, f'{f.name}.int8.onnx'))


def export_model(
  source: str,
  out: str | os.PathLike,
  formats: Sequence[str] | None = None,
  dtype: str = 'float32',
  model: str | None = None,
  resolution: int | None = None,
  command: str | None = None,
  vocab: str | None = None,
) -> dict[str, Any]:
  """Exports the checkpoint `source` (anything `checkpoint.fit` reads) into the new directory
  `out` in `formats` (None: `default_formats()`); an image-text model with the tokenizer of
  `vocab` (None: the vocabulary found for `source`, as `vit_jax.load` finds it); returns
  export.json's contents. One-line ExportError, CheckpointError or ValueError (a vocabulary
  not the model's); `out` is written as a whole or not at all."""
  out = os.fspath(out)
  if os.path.exists(out):
    raise ExportError(f'{out} exists: remove it or choose another directory')
  if dtype not in DTYPES:
    raise ExportError(f'--dtype={dtype}: choose one of {", ".join(DTYPES)}')
  todo, skipped = _check_formats(formats, dtype)
  fitted = ckpt.fit(source, model, resolution=resolution)
  image_text = families.of_config(fitted.config).image_text
  if image_text:
    vocab, missing = _vocab(fitted, str(source), vocab)
    skipped += missing
  fns = functions(fitted, dtype)
  parent = os.path.dirname(os.path.abspath(out))
  os.makedirs(parent, exist_ok=True)
  temp = tempfile.mkdtemp(prefix=f'.{os.path.basename(out)}.', dir=parent)
  try:
    _write(fitted, fns, todo, temp)
    meta = metadata(fitted, fns, str(source), dtype, todo)
    if image_text:
      meta['text'] = _text(fitted, vocab, temp)
    meta['skipped'] = skipped
    meta['command'] = command
    with open(os.path.join(temp, METADATA), 'w') as f:
      f.write(json.dumps(meta, indent=1) + '\n')
    os.rename(temp, out)
  except BaseException:
    shutil.rmtree(temp, ignore_errors=True)
    raise
  return meta
