"""Flat `{'a/b/c': array}` dicts and the nested parameter trees they stand for.

Every checkpoint format maps a file to a flat dict in our names and back, and every model
family reads its architecture off one; these helpers are shared by both, below them.
"""

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

SEP = '/'


class CheckpointError(ValueError):
  """A checkpoint that cannot be read, converted or fitted; the message is one line with the fix."""


def flatten(tree: Mapping[str, Any], prefix: str = '') -> dict[str, Any]:
  """`{'a': {'b': x}}` -> `{'a/b': x}`; empty sub-dicts (layers without weights) vanish."""
  flat = {}
  for key, value in tree.items():
    path = f'{prefix}{SEP}{key}' if prefix else str(key)
    if isinstance(value, Mapping):
      flat.update(flatten(value, path))
    else:
      flat[path] = value
  return flat


def as_flat(params: Mapping[str, Any]) -> dict[str, Any] | Mapping[str, Any]:
  """`params` flattened if it is a nested tree (a flat dict as it is)."""
  return flatten(params) if any(isinstance(v, Mapping) for v in params.values()) else params


def unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
  """`{'a/b': x}` -> `{'a': {'b': x}}`; a key that is both a leaf and a prefix is an error."""
  tree: dict[str, Any] = {}
  for key, value in flat.items():
    *parents, leaf = key.split(SEP)
    node = tree
    for i, part in enumerate(parents):
      node = node.setdefault(part, {})
      if not isinstance(node, dict):
        raise CheckpointError(f'key {key!r} nests under {SEP.join(parents[: i + 1])!r}, a leaf')
    if leaf in node:
      raise CheckpointError(f'key {key!r} is both a leaf and a group of parameters')
    node[leaf] = value
  return tree


def natural_key(name: str) -> list[Any]:
  """Sort key that orders `encoderblock_2` before `encoderblock_10`."""
  return [int(t) if t.isdigit() else t for t in re.split(r'(\d+)', name)]


def count_params(flat: Mapping[str, Any]) -> int:
  """Total number of scalars of a flat dict (or tree) of arrays or ShapeDtypeStructs."""
  return sum(math.prod(v.shape) for v in as_flat(flat).values())


def shape_str(shape: Iterable[int]) -> str:
  """`(1, 197, 768)` as written in messages."""
  return '(' + ', '.join(str(int(d)) for d in shape) + (',)' if len(tuple(shape)) == 1 else ')')


def square_side(n: int) -> int | None:
  """`s` when `n == s * s`, else None."""
  s = math.isqrt(n)
  return s if s * s == n else None


def get(flat: Mapping[str, Any], key: str) -> Any:
  """`flat[key]`; a missing key is a one-line CheckpointError."""
  if key not in flat:
    raise CheckpointError(f'the parameters lack {key!r}; this is not a ViT parameter tree')
  return flat[key]


def numbered(flat: Mapping[str, Any], pattern: re.Pattern, where: str) -> list[int]:
  """The indices `i` of the `name_{i}` groups matching `pattern` in `where`, checked 0..N-1."""
  prefix = where + SEP if where else ''
  depth = prefix.count(SEP)
  names = {k.split(SEP)[depth] for k in flat if k.startswith(prefix) and k.count(SEP) > depth}
  found = sorted(int(m.group(1)) for name in names if (m := pattern.match(name)))
  if found != list(range(len(found))):
    raise CheckpointError(f'{where or "Mixer"} blocks {found} are not numbered 0..{len(found) - 1}')
  return found


def patch_embedding(flat: Mapping[str, Any], key: str) -> tuple[tuple[int, int], int]:
  """(patch size, width) of the conv kernel `key` that cuts the image into patches."""
  kernel = get(flat, key)
  if len(kernel.shape) != 4:
    raise CheckpointError(
      f'{key} has shape {shape_str(kernel.shape)}; expected a 4-D HWIO conv kernel'
    )
  return (int(kernel.shape[0]), int(kernel.shape[1])), int(kernel.shape[-1])
