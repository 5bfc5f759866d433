"""The folder `vit-embed` writes (`vit_jax.cli.embed`): shards of embeddings with their ids,
finished or not, and the manifest; written so that a stop at any point loses at most the shards in
flight, and read back whole (`read`).

  embeddings-00000-of-00004.npy   float32 (n, D)
  ids-00000-of-00004.json         {"count": n, "dimension": D, "ids": [...], "bad": [...]}
  embed.json                      the settings of the command that writes the folder
  manifest.json                   written last, by process 0: the settings, dimension, count,
                                  shards and every unreadable input (`bad`)

Each file is written atomically (`files.atomic_write`), a shard's ids after its embeddings: a
shard whose two files exist is finished.
"""

import json
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from vit_jax import files

MANIFEST = 'manifest.json'
SETTINGS = 'embed.json'


def shard_names(i: int, num_shards: int) -> tuple[str, str]:
  """The file names of shard i: (embeddings .npy, ids .json)."""
  tail = f'{i:05d}-of-{num_shards:05d}'
  return f'embeddings-{tail}.npy', f'ids-{tail}.json'


def write_shard(out: str, i: int, num_shards: int, array, ids, bad) -> None:
  """The embeddings, then the ids: a shard whose ids file exists is whole."""
  npy, ids_name = shard_names(i, num_shards)
  files.atomic_write(files.join(out, npy), lambda f: np.save(f, array, allow_pickle=False))
  record = {'count': len(ids), 'dimension': int(array.shape[1]), 'ids': ids, 'bad': bad}
  files.atomic_write_text(files.join(out, ids_name), json.dumps(record) + '\n')


def finished(out: str, i: int, num_shards: int) -> bool:
  return all(files.path(files.join(out, name)).exists() for name in shard_names(i, num_shards))


def remove_partial(out: str, shards: Sequence[int], num_shards: int) -> None:
  """Removes what a stop left of these shards: temporary files, embeddings without ids (a
  bucket object is written whole on close and leaves no temporary file)."""
  if not files.is_local(out):
    return
  names = {name for i in shards for name in shard_names(i, num_shards)}
  for entry in os.listdir(out):
    if entry.endswith('.tmp') and entry.startswith('.') and entry[1:].rsplit('.', 2)[0] in names:
      os.unlink(os.path.join(out, entry))
  for i in shards:
    npy, ids_name = shard_names(i, num_shards)
    if os.path.exists(os.path.join(out, npy)) and not os.path.exists(os.path.join(out, ids_name)):
      os.unlink(os.path.join(out, npy))


def check_settings(out: str, settings: dict[str, Any]) -> None:
  """Writes OUT/embed.json (every process the same), or checks that it holds these settings:
  a folder never mixes the shards of two commands."""
  path = files.join(out, SETTINGS)
  text = json.dumps(settings, indent=1, sort_keys=True) + '\n'
  if files.path(path).exists():
    if files.path(path).read_text() != text:
      raise ValueError(
        f'{out} holds the embeddings of another command (model, input, shard or batch size): '
        'give a new --out, or the same flags to continue it'
      )
    return
  files.atomic_write_text(path, text)


def wait_for_shards(out: str, num_shards: int, wait_s: float) -> None:
  """Until every shard is finished (the other processes'), at most `wait_s` seconds."""
  deadline = time.monotonic() + wait_s
  missing = list(range(num_shards))
  while missing := [i for i in missing if not finished(out, i, num_shards)]:
    if time.monotonic() > deadline:
      raise TimeoutError(
        f'{len(missing)} shards of {out} still missing after {wait_s:.0f} s (first: '
        f'{shard_names(missing[0], num_shards)[1]}): did a process stop? Rerun to finish them'
      )
    time.sleep(1.0)


def write_manifest(out: str, num_shards: int, settings: dict[str, Any]) -> dict[str, Any]:
  """Writes the manifest, from the settings and the shards' ids files; returns it."""
  shards, bad, count, dimension = [], [], 0, 0
  for i in range(num_shards):
    npy, ids_name = shard_names(i, num_shards)
    record = json.loads(files.path(files.join(out, ids_name)).read_text())
    shards.append({'embeddings': npy, 'ids': ids_name, 'count': record['count']})
    bad += record['bad']
    count += record['count']
    dimension = record['dimension']
  manifest = {**settings, 'dimension': dimension, 'count': count, 'shards': shards, 'bad': bad}
  files.atomic_write_text(files.join(out, MANIFEST), json.dumps(manifest, indent=1) + '\n')
  return manifest


def read(out: str) -> tuple[dict[str, Any], np.ndarray, list[Any]]:
  """What `embed` wrote: (manifest, embeddings (count, D) float32, their ids)."""
  path = files.path(files.join(out, MANIFEST))
  if not path.exists():
    raise ValueError(f'{out}: no {MANIFEST} (not written by vit-embed, or not finished)')
  manifest = json.loads(path.read_text())
  arrays, ids = [np.zeros((0, manifest['dimension']), np.float32)], []
  for shard in manifest['shards']:
    with files.path(files.join(out, shard['embeddings'])).open('rb') as f:
      arrays.append(np.load(f, allow_pickle=False))
    ids += json.loads(files.path(files.join(out, shard['ids'])).read_text())['ids']
  return manifest, np.concatenate(arrays), ids
