"""PyTorch state dicts: the skeleton the Hugging Face and timm formats share.

A format module keeps what is its own: its key maps (their name -> (our key, or a `BLOCK`
template inside a block; the kind of transform)), what it cannot hold, and its `config.json`
writer. The rest is done here, one way for both:

- reading: the tensors of a .safetensors file, a PyTorch .bin/.pth (through
  `torch.load(weights_only=True)`: no pickle runs code) or a sharded checkpoint, and the
  `config.json` beside them;
- converting: PyTorch's layouts to ours and back (`torch_to_ours`, `ours_to_torch`), a state
  dict walked key by key into our tree and checked complete (`walk`, `checked_tree`), our tree
  walked back through the inverted maps (`unwalk`);
- writing: what every exported `config.json` needs of our tree (`Export`), and the model
  directory (`model.safetensors` + `config.json`) written whole (`write_model_dir`).
"""

import dataclasses
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import ml_collections
import numpy as np
from etils.epath import Path

from vit_jax import files
from vit_jax.checkpoint.npz import check_arrays
from vit_jax.checkpoint.tree import (
  POSEMB,
  CheckpointError,
  block_numbers,
  block_options,
  check_complete,
  config_field,
  flatten,
  infer_config,
  natural_key,
  num_prefix_tokens,
  shape_str,
  square_side,
  unflatten,
)
from vit_jax.models.precision import LAYER_NORM_EPSILON

TORCH_SUFFIXES = ('.bin', '.pth', '.pt')
BLOCK = 'Transformer/encoderblock_{i}'
ATTN = BLOCK + '/MultiHeadDotProductAttention_0'
QKV = ('query', 'key', 'value')
# The weights outside the blocks that every ViT has (the class token is optional in timm).
BACKBONE = (
  'embedding/kernel',
  'embedding/bias',
  POSEMB,
  'Transformer/encoder_norm/scale',
  'Transformer/encoder_norm/bias',
)
# Our keys of one encoder block, in the order the block computes them.
BLOCK_KEYS = (
  BLOCK + '/LayerNorm_0/scale',
  BLOCK + '/LayerNorm_0/bias',
  *(f'{ATTN}/{name}/{leaf}' for name in QKV for leaf in ('kernel', 'bias')),
  ATTN + '/out/kernel',
  ATTN + '/out/bias',
  BLOCK + '/LayerNorm_1/scale',
  BLOCK + '/LayerNorm_1/bias',
  *(f'{BLOCK}/MlpBlock_0/Dense_{j}/{leaf}' for j in (0, 1) for leaf in ('kernel', 'bias')),
)
# Their name -> (our key, or a BLOCK template; the kind of transform: see `torch_to_ours`).
KeyMap = Mapping[str, tuple[str, str]]
ImageSize = int | tuple[int, int]


# ---------------------------------------------------------------------------------------------
# Reading files.


def _read_safetensors(path: Path) -> dict[str, np.ndarray]:
  from safetensors import SafetensorError
  from safetensors.numpy import load, load_file

  try:  # a local file is memory-mapped; a bucket object is read whole
    return load_file(os.fspath(path)) if files.is_local(path) else load(path.read_bytes())
  except (SafetensorError, OSError, ValueError, TypeError) as e:
    reason = str(e).splitlines()[0] if str(e) else type(e).__name__
    raise CheckpointError(
      f'{path}: not a readable .safetensors file ({reason}); it is truncated or corrupt:'
      ' download it again'
    ) from None


def _torch_to_numpy(value: Any, key: str, path: Path) -> np.ndarray:
  import torch

  if not isinstance(value, torch.Tensor):
    raise CheckpointError(f'{path}: {key!r} is a {type(value).__name__}, not a tensor')
  value = value.detach().cpu().contiguous()
  if value.dtype == torch.bfloat16:
    import ml_dtypes

    return value.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
  return value.numpy()


def _read_torch(path: Path) -> dict[str, np.ndarray]:
  """A PyTorch state dict, through `torch.load(weights_only=True)` only: no pickle runs code."""
  try:
    import torch
  except ImportError:
    raise CheckpointError(
      f'{path}: PyTorch weights need torch to read (pip install torch); or use the'
      ' model.safetensors file of the same checkpoint'
    ) from None
  try:
    with path.open('rb') as f:
      state = torch.load(f, map_location='cpu', weights_only=True)
  except Exception as e:  # torch raises UnpicklingError, RuntimeError, EOFError, ...
    reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise CheckpointError(
      f'{path}: refused or unreadable PyTorch file ({reason}); only plain tensor state dicts'
      ' load (weights_only=True): use the .safetensors file instead'
    ) from None
  if isinstance(state, Mapping) and len(state) == 1:
    (only,) = state.values()
    state = only if isinstance(only, Mapping) else state  # {'state_dict': {...}} / {'model': ...}
  if not isinstance(state, Mapping):
    raise CheckpointError(f'{path}: holds a {type(state).__name__}, not a state dict')
  return {k: _torch_to_numpy(v, k, path) for k, v in state.items()}


def read_state_dict(path: Path) -> dict[str, np.ndarray]:
  """The tensors of one file or of a sharded checkpoint (its *.index.json)."""
  if path.name.endswith('.index.json'):
    try:
      shards = sorted(set(json.loads(path.read_text())['weight_map'].values()))
    except (OSError, ValueError, KeyError, AttributeError) as e:
      raise CheckpointError(f'{path}: not a valid shard index ({e})') from None
    state: dict[str, np.ndarray] = {}
    for shard in shards:
      state.update(read_state_dict(path.parent / shard))
    return state
  if not path.is_file():
    raise CheckpointError(f'{path}: missing weights file')
  return _read_safetensors(path) if path.suffix == '.safetensors' else _read_torch(path)


def state_shapes(path: Path) -> dict[str, tuple[int, ...]]:
  """The tensor names and shapes of a weights file, without reading the tensors; {} if
  unreadable (the format that claims the file reports the problem: detection only asks)."""
  try:
    if not files.is_local(path):  # a bucket object: read whole
      return {k: tuple(v.shape) for k, v in read_state_dict(path).items()}
    if path.suffix == '.safetensors':
      from safetensors import safe_open

      with safe_open(str(path), framework='numpy') as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    import torch

    state = torch.load(path, map_location='cpu', weights_only=True, mmap=True)
  except Exception:  # not ours to judge: the format that claims the file reports the problem
    return {}
  if (
    isinstance(state, Mapping)
    and len(state) == 1
    and isinstance(next(iter(state.values())), Mapping)
  ):
    state = next(iter(state.values()))
  if not isinstance(state, Mapping):
    return {}
  return {str(k): tuple(getattr(v, 'shape', ())) for k, v in state.items()}


def state_keys(path: Path) -> list[str]:
  """The tensor names of a weights file (`state_shapes`'s); [] if unreadable."""
  return list(state_shapes(path))


def read_config(path: Path, name: str = 'config.json') -> dict[str, Any] | None:
  """The `config.json` (or another JSON file `name`, e.g. `preprocessor_config.json`) of a
  model directory, or beside a weights file; None if there is none."""
  path = (path if path.is_dir() else path.parent) / name
  if not path.is_file():
    return None
  try:
    config = json.loads(path.read_text())
  except (OSError, ValueError) as e:
    raise CheckpointError(f'{path}: not valid JSON ({e}); fix or delete it') from None
  if not isinstance(config, dict):
    raise CheckpointError(f'{path}: expected a JSON object')
  return config


# PIL's resample codes (transformers' image processors) by name.
PIL_RESAMPLE = {0: 'nearest', 1: 'lanczos', 2: 'bilinear', 3: 'bicubic', 4: 'box', 5: 'hamming'}


def _numbers(values: Any) -> str:
  return '[' + ', '.join(f'{v:g}' for v in np.ravel(values)) + ']'


def preprocessing_unlike(
  where: str,
  method: str,
  mean: Any = 0.5,
  std: Any = 0.5,
  crop: float = 1.0,
) -> list[str]:
  """A line for each way a file's stated preprocessing (`where` says it: resize `method`,
  values (x / 255 - mean) / std, the central `crop` of each side) is not the project's, which
  resizes the whole image bilinearly to values (x - 127.5) / 127.5 in [-1, 1]."""
  differ = "so the model's inputs differ from the file's preprocessing"
  lines = []
  if method != 'bilinear':
    lines.append(f'{where} resizes {method}; the project resizes bilinear, {differ}')
  if not (np.allclose(mean, 0.5) and np.allclose(std, 0.5)):
    lines.append(
      f'{where} normalises pixels x as (x / 255 - {_numbers(mean)}) / {_numbers(std)}; the'
      f' project as (x - 127.5) / 127.5, to [-1, 1], {differ}'
    )
  if crop < 1:
    lines.append(
      f'{where} keeps the central {crop:g} of each side before resizing; the project resizes'
      f' the whole image, {differ}'
    )
  return lines


def weights_in(directory: Path, names: Iterable[str]) -> Path | None:
  """The first of the weight files `names` that `directory` holds, or None."""
  return next((directory / name for name in names if (directory / name).is_file()), None)


def weights_of(path: Path, names: tuple[str, ...]) -> Path:
  """The weights file of `path`: itself, or the first of `names` in a directory."""
  if not path.is_dir():
    return path
  weights = weights_in(path, names)
  if weights is None:
    raise CheckpointError(f'{path}: no {" / ".join(names)} in this directory')
  return weights


def description(name: str, weights: Path, state: Mapping[str, Any], notes: Iterable[str]) -> str:
  """What a format's `read` says it read: `name (file, N tensors, notes...)`."""
  return f'{name} (' + ', '.join([weights.name, f'{len(state)} tensors', *notes]) + ')'


def gelu_approximate(act: str, acts: Mapping[str, bool], field: str, source: Path | str) -> bool:
  """Our `gelu_approximate` for the activation `act` that config.json's `field` names (`acts`:
  the names of the GELUs); another activation is an error."""
  if act not in acts:
    raise CheckpointError(
      f'{source}: config.json says {field}={act!r}; our models compute the GELU only'
      f' ({", ".join(acts)})'
    )
  return acts[act]


# ---------------------------------------------------------------------------------------------
# Layouts: PyTorch's and ours.


def _num_heads(weight: np.ndarray, width: int, num_heads: int | None, key: str, source: str) -> int:
  if num_heads is None:
    raise CheckpointError(
      f'{source}: the number of attention heads is unknown (no config.json with'
      ' num_attention_heads): pass --model NAME (or num_heads=...)'
    )
  if width % num_heads:
    raise CheckpointError(
      f'{source}: {key} has shape {shape_str(weight.shape)}, not divisible into'
      f' num_heads={num_heads} heads: wrong --model or config.json'
    )
  return num_heads


def torch_to_ours(kind: str, w: np.ndarray, heads: int | None, key: str, source: str) -> np.ndarray:
  """A PyTorch weight in our layout: `kind` is 'copy', 'linear' ((out, in) -> (in, out)),
  'conv' (OIHW -> HWIO), 'posemb' (an embedding's (N, D) rows -> (1, N, D)), 'grid' (an
  embedding's (G * G, D) rows -> a (G, G, D) grid, NaFlex's), or an attention kernel split
  into `heads`: 'qkv_kernel', 'qkv_bias', 'out_kernel'."""
  if kind == 'copy':
    return w
  if kind == 'grid':
    side = square_side(w.shape[0]) if w.ndim == 2 else None
    if side is None:
      raise CheckpointError(
        f'{source}: {key} {shape_str(w.shape)} is not a square grid of position embeddings'
      )
    return w.reshape(side, side, w.shape[1])
  if kind == 'linear':
    return np.ascontiguousarray(w.T)
  if kind == 'conv':
    return np.ascontiguousarray(np.transpose(w, (2, 3, 1, 0)))  # OIHW -> HWIO
  if kind == 'posemb':
    return w[None]  # an nn.Embedding's (N, D) rows as our (1, N, D)
  d = w.shape[1] if kind == 'out_kernel' else w.shape[0]  # the width split into heads
  h = _num_heads(w, d, heads, key, source)
  if kind == 'qkv_kernel':
    return np.ascontiguousarray(w.T.reshape(w.shape[1], h, d // h))
  if kind == 'qkv_bias':
    return w.reshape(h, d // h)
  if kind == 'out_kernel':
    return np.ascontiguousarray(w.T.reshape(h, d // h, w.shape[0]))
  raise AssertionError(kind)


def ours_to_torch(kind: str, value: np.ndarray) -> np.ndarray:
  """The inverse of `torch_to_ours`: our weight in PyTorch's layout (contiguous)."""
  if kind == 'linear':
    value = value.T
  elif kind == 'conv':
    value = np.transpose(value, (3, 2, 0, 1))  # HWIO -> OIHW
  elif kind == 'posemb':
    value = value[0]
  elif kind == 'grid':
    value = value.reshape(-1, value.shape[-1])
  elif kind == 'qkv_kernel':
    value = value.reshape(value.shape[0], -1).T
  elif kind == 'qkv_bias':
    value = value.reshape(-1)
  elif kind == 'out_kernel':
    value = value.reshape(-1, value.shape[-1]).T
  return np.ascontiguousarray(value)


def split_qkv(
  kind: str, value: np.ndarray, heads: int | None, key: str, source: str
) -> dict[str, np.ndarray]:
  """A fused (3D, D) in-projection weight or (3D,) bias (timm's `qkv`, PyTorch's
  `nn.MultiheadAttention.in_proj_*`) as our {'query', 'key', 'value'} kernels or biases;
  `kind` is 'qkv_kernel' or 'qkv_bias'."""
  if value.shape[0] % 3:
    raise CheckpointError(f'{source}: {key} {shape_str(value.shape)} does not split into q, k, v')
  parts = np.split(value, 3, axis=0)
  return {n: torch_to_ours(kind, p, heads, key, source) for n, p in zip(QKV, parts, strict=True)}


# ---------------------------------------------------------------------------------------------
# Walking a state dict into our tree, and back.


def lookup(name: str, top: KeyMap, block_re: re.Pattern, block: KeyMap) -> tuple[str, str] | None:
  """(our key, kind) of their `name`: from `top`, or from `block` inside the block that
  `block_re` (groups: number, name inside) matches; None if neither maps it."""
  if name in top:
    return top[name]
  if (m := block_re.match(name)) and m.group(2) in block:
    template, kind = block[m.group(2)]
    return template.format(i=int(m.group(1))), kind
  return None


def walk(
  state: Mapping[str, Any],
  map_key: Callable[[str, np.ndarray], Mapping[str, np.ndarray]],
  source: str,
) -> dict[str, np.ndarray]:
  """Our flat dict of `state`: each key, in natural order, mapped by `map_key(key, value) ->
  {our key: array}`; two keys for one of ours are an error."""
  flat: dict[str, np.ndarray] = {}
  for key in sorted(state, key=natural_key):
    for ours, array in map_key(key, np.asarray(state[key])).items():
      if ours in flat:
        raise CheckpointError(f'{source}: {key!r} maps to {ours!r}, which another key already set')
      flat[ours] = array
  return flat


def checked_tree(
  flat: dict[str, np.ndarray],
  required: Iterable[str],
  pairs: Iterable[tuple[str, str]],
  source: str,
  what: str,
) -> dict[str, Any]:
  """Our tree of `flat`, checked: plain numeric arrays, the `required` keys and every block's
  present, each optional (kernel, bias) of `pairs` whole; else an error naming `what` it is not."""
  check_arrays(flat, source)
  required = list(required)
  for i in block_numbers(flat):
    required += [template.format(i=i) for template in BLOCK_KEYS]
  check_complete(flat, required, pairs, source, what)
  return unflatten(flat)


def unwalk(
  flat: Mapping[str, np.ndarray],
  top: KeyMap,
  block: tuple[str, KeyMap],
  what: str,
  skip: re.Pattern | None = None,
) -> dict[str, np.ndarray]:
  """Their state dict of our `flat`, through the maps inverted: `top`, and `block` = (their
  prefix of block `{i}`, the map inside it). A key that neither maps nor matches `skip` (keys
  the caller writes itself) has no `what` equivalent: an error."""
  prefix, inside = block
  inverse = {ours: (name, kind) for name, (ours, kind) in top.items()}
  for i in block_numbers(flat):
    for name, (template, kind) in inside.items():
      inverse[template.format(i=i)] = (prefix.format(i=i) + name, kind)
  state = {}
  for key, value in flat.items():
    if key in inverse:
      name, kind = inverse[key]
      state[name] = ours_to_torch(kind, value)
    elif skip is None or not skip.search(key):
      raise CheckpointError(f'{key!r} {shape_str(value.shape)} has no {what} equivalent')
  return state


def check_exportable(flat: Mapping[str, Any], model_config: Any, what: str) -> None:
  """Our tree is a plain ViT, which is all `what` (a PyTorch ViT) computes."""
  if 'stem/kernel' in flat:
    raise CheckpointError(f'MLP-Mixer models have no {what} equivalent; export them with --to=npz')
  if 'embedding/kernel' in flat and POSEMB not in flat:
    raise CheckpointError(
      f"a model without learned position embeddings (posemb='sincos2d') has no {what}"
      ' equivalent; export it with --to=npz'
    )
  if 'conv_root/kernel' in flat or config_field(model_config, 'resnet') is not None:
    raise CheckpointError(
      f'hybrid (ResNet+ViT) models have no {what} equivalent; export them with --to=npz'
    )
  if options := block_options(flat):
    raise CheckpointError(
      f'ViT-22B block options {sorted(options)} have no {what} equivalent; export the model'
      ' with --to=npz'
    )


# ---------------------------------------------------------------------------------------------
# Writing.


@dataclasses.dataclass(frozen=True)
class Export:
  """What a format's `config.json` writer needs: our flat tree, its architecture read off the
  shapes, the model config (for what shapes cannot tell), and the export's checked options."""

  flat: Mapping[str, np.ndarray]
  arch: ml_collections.ConfigDict
  model_config: Any
  image_size: ImageSize  # as given, else the square the position embeddings are laid out for
  labels: list[str] | None  # one name per class of the head, or None

  @classmethod
  def of(
    cls,
    params: Mapping[str, Any],
    model_config: Any = None,
    image_size: ImageSize | None = None,
    labels: list[str] | None = None,
  ) -> 'Export':
    """The export of `params`; `labels` must name every class of the head, or be None."""
    flat = {k: np.asarray(v) for k, v in flatten(params).items()}
    arch = infer_config(flat)
    if labels is not None and len(labels) != (arch.num_classes or 0):
      raise CheckpointError(f'{len(labels)} labels for a head of {arch.num_classes or 0} classes')
    size = _grid_image_size(flat) if image_size is None else image_size
    return cls(flat, arch, model_config, size, None if labels is None else list(labels))

  @property
  def gelu_approximate(self) -> bool:
    """The model's GELU: the tanh approximation (our default), or the exact one."""
    return bool(config_field(self.model_config, 'gelu_approximate', True))

  @property
  def layer_norm_epsilon(self) -> float:
    """The model's LayerNorm epsilon (our default 1e-6, or the one a file stated)."""
    return float(config_field(self.model_config, 'layer_norm_epsilon', LAYER_NORM_EPSILON))


def _grid_image_size(flat: Mapping[str, np.ndarray]) -> ImageSize:
  """The image size of a square grid of patches, one position embedding each (an int when the
  image is square)."""
  posemb = flat[POSEMB]
  side = square_side(posemb.shape[1] - num_prefix_tokens(flat))
  if side is None:
    raise CheckpointError(
      f'{POSEMB} {shape_str(posemb.shape)} is not a square grid: pass image_size=(height, width)'
    )
  ph, pw = flat['embedding/kernel'].shape[:2]
  return side * ph if ph == pw else (side * ph, side * pw)


def write_model_dir(
  out_dir: str | os.PathLike,
  state: Mapping[str, np.ndarray],
  config: Mapping[str, Any],
  extra: Mapping[str, bytes] | None = None,
) -> Path:
  """Writes `model.safetensors` (PyTorch metadata), `config.json` and the `extra` files
  ({name: contents}: a processor's, a tokenizer's) into `out_dir`.

  Nothing partial is left: the files are written to a temporary folder first, then moved
  into `out_dir` (a new folder, or one holding at most these files); in a bucket each file
  is an object written whole, the weights first.
  """
  from safetensors.numpy import save, save_file

  out_dir = files.path(out_dir)
  config_text = json.dumps(config, indent=2, sort_keys=True) + '\n'
  others = {'config.json': config_text.encode(), **(extra or {})}
  _check_out_dir(out_dir, ('model.safetensors', *others))
  if not files.is_local(out_dir):  # each object is written whole; weights first
    weights = save(dict(state), metadata={'format': 'pt'})
    files.atomic_write(out_dir / 'model.safetensors', lambda f: f.write(weights))
    for name, data in others.items():
      files.atomic_write(out_dir / name, lambda f, data=data: f.write(data))
    return out_dir
  out_dir.parent.mkdir(parents=True, exist_ok=True)
  tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f'.{out_dir.name}.', suffix='.tmp'))
  try:
    save_file(dict(state), str(tmp / 'model.safetensors'), metadata={'format': 'pt'})
    for name, data in others.items():
      (tmp / name).write_bytes(data)
    if out_dir.exists():
      for name in ('model.safetensors', *others):
        os.replace(tmp / name, out_dir / name)
      tmp.rmdir()
    else:
      os.rename(tmp, out_dir)
      os.chmod(out_dir, 0o777 & ~_umask())
  finally:
    if tmp.exists():
      shutil.rmtree(tmp)
  return out_dir


def _check_out_dir(out_dir: Path, names: Iterable[str]) -> None:
  """A new directory, or one that holds at most the files written (`names`)."""
  if out_dir.exists():
    if not out_dir.is_dir():
      raise CheckpointError(f'{out_dir} exists and is not a directory; choose a directory name')
    others = sorted(p.name for p in out_dir.iterdir() if p.name not in set(names))
    if others:
      raise CheckpointError(
        f'{out_dir} already holds {others[:3]}: choose a new or empty directory'
      )


def _umask() -> int:
  mask = os.umask(0)
  os.umask(mask)
  return mask
