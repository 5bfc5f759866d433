"""Google's .npz checkpoints: the original ViT release, AugReg, big_vision, and MLP-Mixer.

Reading maps every layout to our tree (the Linen names of `vit_jax.models`):

* original and AugReg files (`gs://vit_models/...`): flat `/`-joined keys with pre-Linen
  names inside each block (`MultiHeadDotProductAttention_1`, `LayerNorm_2`, `MlpBlock_3`),
  renumbered per module class as flax's `convert_pre_linen` does; hybrid GroupNorm
  parameters stored as (1, 1, 1, C) are flattened to (C,).
* big_vision files: a `params/` (or `params/img/`, `opt/target/`) prefix, Linen names, blocks
  possibly scan-stacked as `Transformer/encoderblock/...` with a leading depth axis, and the
  position embedding at the top level (`pos_embedding`), or none (`posemb='sincos2d'`); a MAP
  head as `MAPHead_0/...` (or inline, as during ViT-G's development: moved into `MAPHead_0`).
  Image-text (two-tower) files are read by `two_towers`; of a file whose text tower is
  incomplete, only the image tower `params/img/` is read here, the arrays left out (the text
  tower, the temperature and bias scalars) named in the description.
* NaFlex towers (big_vision's `naflex_vit.Model`, SigLIP 2's `*_naflex.npz` image tower):
  their own tree (a 2-D patch embedding, a top-level (G, G, D) `pos_embedding` grid) as it
  is, but for scan-stacked blocks; the family says which trees are NaFlex's.
* MLP-Mixer files (`gs://mixer_models/...`): `stem`, `MixerBlock_{i}`, `pre_head_layer_norm`,
  `head`, in Linen names (renumbered like the others, which leaves them as they are).

The big_vision position embedding. big_vision adds `pos_embedding` (1, N, D) to the patch
tokens *before* it prepends `cls`; our model (like the original) prepends `cls` first and adds a
(1, N+1, D) embedding whose row 0 belongs to the class token. big_vision's
`fix_old_checkpoints` goes our way -> theirs by folding row 0 into the token
(`cls += pe[:, :1]`). Going theirs -> ours, any split `cls = c + r` with row 0 `r` gives the
same network; we take the one that changes nothing: row 0 is zeros and `cls` is kept as is.
Token 0 is then `cls + 0 == cls` bit for bit, and every patch token `x + pe` is unchanged, so
the logits are identical. A top-level `pos_embedding` whose length is a square + 1 already
carries its class row (the old layout `fix_old_checkpoints` recognises) and is kept as is.
Models without a class token (`pool_type='gap'`) take the embedding unchanged.

Writing (`save_npz`) produces the released layout: pre-Linen names inside each block, GroupNorm
parameters as (1, 1, 1, C), flat `/`-joined keys, float32, so the original vit_jax loader and
timm's npz loader read the file.

What the shapes cannot say goes in FILE.json beside FILE.npz, as the LiT files' conversions have
it (`write_sidecar`, `read_sidecar`): `model`, the model fields the file states (a ViT's exact
GELU and LayerNorm epsilon, an image-text model's BERT heads and `pp`: `stated_fields`, which
`fit` sets on the model); `class_names`, its head's (`class_names.beside` reads them);
`zeroshot`, the settings an image-text model was evaluated with.
"""

import json
import math
import re
import zipfile
from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np
from absl import logging
from etils.epath import Path

from vit_jax import files
from vit_jax.checkpoint.tree import (
  SEP,
  CheckpointError,
  flatten,
  natural_key,
  shape_str,
  unflatten,
)
from vit_jax.families import naflex

# Prefixes of big_vision (and older flax training) checkpoints, most specific first.
PREFIXES = ('params/img/', 'params/', 'opt/target/')
# A key every model has: the patch embedding of a ViT, the stem of a Mixer.
STEMS = ('embedding/kernel', 'stem/kernel')
# big_vision's MAP head, inline at the top level in its early checkpoints.
MAP_HEAD = ('probe', 'MultiHeadDotProductAttention_0', 'LayerNorm_0', 'MlpBlock_0')
# Linen name -> pre-Linen name inside an encoder block (the call order of the old model).
PRE_LINEN_BLOCK = {
  'LayerNorm_0': 'LayerNorm_0',
  'MultiHeadDotProductAttention_0': 'MultiHeadDotProductAttention_1',
  'LayerNorm_1': 'LayerNorm_2',
  'MlpBlock_0': 'MlpBlock_3',
}
_MODULE_NUM_RE = re.compile(r'(.*)_\d+$')
_GROUPNORM_RE = re.compile(r'gn(\d+|_root|_proj)$')
_BLOCK_RE = re.compile(r'encoderblock_\d+$')


def stem(path: Any) -> str:
  """FILE of FILE.npz: the name its sidecar and vocabulary take a suffix to."""
  return str(path).removesuffix('.npz')


def sidecar_path(path: Any) -> str:
  """FILE.json of FILE.npz."""
  return stem(path) + '.json'


def read_sidecar(path: Any) -> dict[str, Any]:
  """FILE.json beside FILE.npz, or {} (another path, no such file)."""
  side = files.path(sidecar_path(path))
  if not str(path).endswith('.npz') or not side.is_file():
    return {}
  try:
    data = json.loads(side.read_text())
  except ValueError as e:
    raise CheckpointError(f'{side}: not JSON ({e})') from None
  return data if isinstance(data, dict) else {}


def stated_fields(path: Any) -> dict[str, Any]:
  """The model fields an .npz's FILE.json states; {} without one."""
  return dict(read_sidecar(path).get('model') or {})


def write_sidecar(
  path: Any,
  model_fields: Mapping[str, Any],
  class_names: list[str] | None = None,
  zeroshot: Mapping[str, Any] | None = None,
) -> list[str]:
  """Writes FILE.json beside the .npz at `path` with what it is given (atomically); the
  path written, or none where there is nothing to keep."""
  side = {'model': dict(model_fields)}
  if class_names is not None:
    side['class_names'] = list(class_names)
  if zeroshot is not None:
    side['zeroshot'] = dict(zeroshot)
  if side == {'model': {}}:
    return []
  written = sidecar_path(path)
  files.atomic_write_text(written, json.dumps(side, indent=1) + '\n')
  return [written]


def detect(path: Path) -> bool:
  """A .npz file: by name, or a zip archive of .npy members (PyTorch files are zips too)."""
  if not path.is_file():
    return False
  if path.suffix == '.npz':
    return True
  with path.open('rb') as f:
    if f.read(4) != b'PK\x03\x04':
      return False
    try:
      with zipfile.ZipFile(f) as z:
        return any(name.endswith('.npy') for name in z.namelist())
    except zipfile.BadZipFile:
      return False


def recover_dtype(array: np.ndarray) -> np.ndarray:
  """A bfloat16 array as `np.savez` writes it (void `|V2`: numpy has no bfloat16) viewed as
  ml_dtypes.bfloat16 again, as big_vision's `utils.recover_dtype` does; others unchanged."""
  if array.dtype.kind == 'V' and array.dtype.itemsize == 2 and array.dtype.names is None:
    return array.view(ml_dtypes.bfloat16)
  return array


def read_flat(path: str | Path) -> dict[str, np.ndarray]:
  """Every array of the archive, read eagerly, never unpickling anything (bfloat16 leaves
  written by np.savez recovered, `recover_dtype`)."""
  try:
    with files.path(path).open('rb') as f, np.load(f, allow_pickle=False) as archive:
      return {key: recover_dtype(archive[key]) for key in archive.files}
  except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError) as e:
    reason = str(e).splitlines()[0] if str(e) else type(e).__name__
    if 'allow_pickle' in reason:
      raise CheckpointError(
        f'{path}: holds pickled Python objects, which are never loaded (allow_pickle=False);'
        ' a weights checkpoint holds plain float arrays only'
      ) from None
    reason = reason if len(reason) <= 100 else reason[:97] + '...'
    raise CheckpointError(
      f'{path}: not a readable .npz checkpoint ({reason}); the file is truncated, corrupt or'
      ' not a checkpoint: download it again'
    ) from None


def convert_pre_linen(tree: Mapping[str, Any]) -> dict[str, Any]:
  """Renumbers `Name_<i>` submodules per class within each dict, as flax's `convert_pre_linen`.

  Idempotent on Linen names; `encoderblock_10` stays in place (natural sort).
  """
  renamed: dict[str, Any] = {}
  counts: dict[str, int] = {}
  for name in sorted(tree, key=natural_key):
    value = tree[name]
    match = _MODULE_NUM_RE.match(name)
    if match:
      module = match.group(1)
      counts[module] = counts.get(module, -1) + 1
      name = f'{module}_{counts[module]}'
    renamed[name] = convert_pre_linen(value) if isinstance(value, Mapping) else value
  return renamed


def _strip_prefix(flat: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], str, str]:
  """(the model's arrays without the prefix, the prefix, a note on the arrays left out)."""
  for prefix in PREFIXES:
    if any(f'{prefix}{stem}' in flat for stem in STEMS):
      kept = {k[len(prefix) :]: v for k, v in flat.items() if k.startswith(prefix)}
      others = sorted({SEP.join(k.split(SEP)[:2]) for k in flat if not k.startswith(prefix)})
      if not others:
        return kept, prefix, ''
      left = len(flat) - len(kept)
      shown = ', '.join(others[:5]) + (', ...' if len(others) > 5 else '')
      return kept, prefix, f'ignored {left} arrays outside {prefix!r} ({shown})'
  return flat, '', ''


def _inline_map_head(tree: dict[str, Any]) -> bool:
  """A top-level `probe` and its modules -> `MAPHead_0` (big_vision `fix_old_checkpoints`)."""
  if 'probe' not in tree:
    return False
  tree['MAPHead_0'] = {name: tree.pop(name) for name in MAP_HEAD if name in tree}
  return True


def unstack_blocks(encoder: dict[str, Any], where: str = 'Transformer') -> bool:
  """`encoderblock/...` (leading depth axis) -> `encoderblock_{i}` in the encoder's dict
  `where` (big_vision's scanned layout, in place); True if done."""
  if 'encoderblock' not in encoder:
    return False
  stacked = flatten(encoder.pop('encoderblock'))
  depths = {k: v.shape[0] if v.ndim else None for k, v in stacked.items()}
  if len(set(depths.values())) != 1 or None in depths.values():
    raise CheckpointError(
      f'scan-stacked {where}/encoderblock has leaves of different depths {depths};'
      ' the file is not a big_vision checkpoint'
    )
  (depth,) = set(depths.values())
  for i in range(depth):
    encoder[f'encoderblock_{i}'] = unflatten({k: v[i] for k, v in stacked.items()})
  return True


def _fold_posemb(tree: dict[str, Any]) -> str | None:
  """Moves a big_vision position embedding to ours (module docstring); returns what was done."""
  transformer = tree.get('Transformer', {})
  if 'pos_embedding' in tree:
    posemb, where = tree.pop('pos_embedding'), 'pos_embedding'
  elif 'pos_embedding' in transformer:
    posemb, where = transformer.pop('pos_embedding'), 'Transformer/pos_embedding'
  else:
    return None
  transformer = tree.setdefault('Transformer', transformer)
  if posemb.ndim != 3 or posemb.shape[0] != 1:
    raise CheckpointError(
      f'{where} has shape {shape_str(posemb.shape)}; expected (1, tokens, hidden)'
    )
  note = f'{where} {shape_str(posemb.shape)}'
  if 'cls' in tree:
    n = posemb.shape[1]
    if math.isqrt(n) ** 2 + 1 != n:  # big_vision's test for an embedded class row
      zero = np.zeros((1, 1, posemb.shape[2]), posemb.dtype)
      posemb = np.concatenate([zero, posemb], axis=1)
      note += ' + zero class row'
    else:
      note += ' (class row present)'
  transformer['posembed_input'] = {'pos_embedding': posemb}
  return note


def _squeeze_groupnorm(flat: dict[str, np.ndarray]) -> int:
  """(1, 1, 1, C) GroupNorm scale/bias -> (C,), in place (vit_jax `_fix_groupnorm`)."""
  count = 0
  for key, value in flat.items():
    parts = key.split('/')
    if (
      len(parts) > 1
      and _GROUPNORM_RE.match(parts[-2])
      and parts[-1] in ('scale', 'bias')
      and value.ndim == 4
      and value.shape[:3] == (1, 1, 1)
    ):
      flat[key] = value.reshape(value.shape[-1])
      count += 1
  return count


def check_arrays(flat: Mapping[str, Any], source: str) -> None:
  """Every leaf is a floating-point array (no strings, objects or integer bookkeeping)."""
  for key, value in flat.items():
    dtype = getattr(value, 'dtype', None)
    if dtype is None or not (np.issubdtype(dtype, np.floating) or dtype.name == 'bfloat16'):
      raise CheckpointError(
        f'{source}: {key!r} has dtype {dtype}; a checkpoint holds floating-point weights only'
      )


def from_flat(flat: dict[str, np.ndarray], source: str = 'checkpoint') -> tuple[dict, str]:
  """A flat .npz dict of any Google layout -> (our tree, a description of the layout)."""
  flat, prefix, ignored = _strip_prefix(dict(flat))
  if not any(stem in flat for stem in STEMS):
    sample = ', '.join(sorted(flat)[:4])
    raise CheckpointError(
      f'{source}: unknown .npz layout: no embedding/kernel or stem/kernel (with or without a'
      f' params/ prefix); first keys: {sample or "none"}. Expected a Google ViT or MLP-Mixer'
      ' .npz (original, AugReg, big_vision)'
    )
  check_arrays(flat, source)
  if naflex.owns_tree(flat):
    return _naflex_tree(flat, prefix, ignored)
  pre_linen = any('/MultiHeadDotProductAttention_1/' in k or '/MlpBlock_3/' in k for k in flat)
  gn4d = _squeeze_groupnorm(flat)
  tree = convert_pre_linen(unflatten(flat))
  scanned = unstack_blocks(tree.get('Transformer', {}))
  posemb = _fold_posemb(tree)
  inline_map = _inline_map_head(tree)

  big_vision = bool(prefix) or scanned or posemb is not None or inline_map
  family = 'Mixer' if 'stem' in tree else 'big_vision' if big_vision else 'vit_jax'
  parts = [family]
  if prefix:
    parts.append(f'prefix {prefix!r}')
  parts.append('pre-Linen names' if pre_linen else 'Linen names')
  if scanned:
    parts.append('scan-stacked blocks')
  if posemb:
    parts.append(posemb)
  if inline_map:
    parts.append('inline MAP head moved to MAPHead_0')
  if gn4d:
    parts.append(f'{gn4d} GroupNorm params (1,1,1,C)')
  if ignored:
    parts.append(ignored)
    logging.info('%s: %s', source, ignored)
  return tree, 'npz (' + ', '.join(parts) + ')'


def _naflex_tree(flat: dict[str, np.ndarray], prefix: str, ignored: str) -> tuple[dict, str]:
  """A NaFlex tower's flat dict (its prefix stripped) -> (our tree, a description): its
  names as they are (Linen; pre-Linen block names renumbered), its blocks unstacked."""
  tree = convert_pre_linen(unflatten(flat))
  parts = ['NaFlex'] + ([f'prefix {prefix!r}'] if prefix else [])
  if unstack_blocks(tree.get('Transformer', {})):
    parts.append('scan-stacked blocks')
  if ignored:
    parts.append(ignored)
  return tree, 'npz (' + ', '.join(parts) + ')'


def read(path: str | Path, **unused: Any) -> tuple[dict, str]:
  """Reads a Google .npz checkpoint into our tree; returns (tree, description)."""
  del unused
  return from_flat(read_flat(path), str(path))


def to_pre_linen(tree: Mapping[str, Any]) -> dict[str, Any]:
  """Our tree with the released pre-Linen names inside every encoder block."""
  out = dict(tree)
  if 'Transformer' in tree:
    transformer = {}
    for name, sub in tree['Transformer'].items():
      if _BLOCK_RE.match(name):
        unknown = set(sub) - set(PRE_LINEN_BLOCK)
        if unknown:
          raise CheckpointError(
            f'Transformer/{name} has modules {sorted(unknown)} that the released layout lacks;'
            f' expected {sorted(PRE_LINEN_BLOCK)}'
          )
        sub = {PRE_LINEN_BLOCK[k]: v for k, v in sub.items()}
      transformer[name] = sub
    out['Transformer'] = transformer
  return out


NPZ_DTYPES = ('float32', 'bfloat16', 'float16')


def cast_for_npz(value: Any, dtype: str | None = None) -> np.ndarray:
  """A leaf as it is written: `dtype` (one of NPZ_DTYPES) if given, else float32 for a
  narrower float (exact). np.savez writes bfloat16 as void `|V2`, as big_vision's files are."""
  array = np.asarray(value)
  if dtype is not None:
    if dtype not in NPZ_DTYPES:
      raise ValueError(f'dtype={dtype!r}: an .npz is written as one of {NPZ_DTYPES}')
    return array.astype(ml_dtypes.bfloat16 if dtype == 'bfloat16' else np.dtype(dtype))
  if array.dtype.name == 'bfloat16' or (
    np.issubdtype(array.dtype, np.floating) and array.dtype.itemsize < 4
  ):
    return array.astype(np.float32)
  return array


def to_flat(
  params: Mapping[str, Any], groupnorm_4d: bool = True, dtype: str | None = None
) -> dict[str, np.ndarray]:
  """Our tree -> the released flat layout (pre-Linen names, (1,1,1,C) GroupNorm, float32
  or `dtype`)."""
  flat = {}
  for key, value in flatten(to_pre_linen(params)).items():
    array = cast_for_npz(value, dtype)
    parts = key.split('/')
    if (
      groupnorm_4d
      and len(parts) > 1
      and _GROUPNORM_RE.match(parts[-2])
      and parts[-1] in ('scale', 'bias')
      and array.ndim == 1
    ):
      array = array.reshape(1, 1, 1, -1)
    flat[key] = array
  check_arrays(flat, 'params')
  return flat


def save_npz(
  params: Mapping[str, Any], path: str | Path, groupnorm_4d: bool = True, dtype: str | None = None
) -> None:
  """Writes `params` in the released .npz layout, atomically (a temp file renamed into place).

  Keys are flat `/`-joined pre-Linen names; hybrids' GroupNorm parameters are written as
  (1, 1, 1, C) like the released files unless `groupnorm_4d=False`. bfloat16/float16 leaves
  are widened to float32 (exactly), unless `dtype` ('float32', 'bfloat16', 'float16') asks
  for every leaf in that dtype (bfloat16 stored as big_vision stores it, void `|V2`).
  """
  flat = to_flat(params, groupnorm_4d, dtype)
  files.atomic_write(path, lambda f: np.savez(f, **flat))
