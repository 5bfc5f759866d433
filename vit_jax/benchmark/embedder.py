"""`--embedder`: what `vit-embed` delivers end to end beside its model alone.

A folder of synthetic JPEGs (`synthetic.write_folder`) is embedded as `vit-embed --folder`
embeds it (`vit_jax.inference.embed.run`: files read, decoded and resized by worker threads,
batches through the model, shards written), and the same images, preprocessed beforehand, go
through the model alone (the embedder's own `apply`, padded batches of the same size). Both at
each dtype, in interleaved rounds so that a change in machine load hits all alike; the table
shows the median round. No TensorFlow is imported: JPEGs decode without it
(`vit_jax.data.images`).
"""

import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from vit_jax.benchmark import synthetic


def _model_alone(embedder, x: np.ndarray, batch: int) -> float:
  """Seconds for the model to embed the preprocessed images `x`, `batch` at a time."""
  start = time.perf_counter()
  for i in range(0, len(x), batch):
    embedder.apply(x[i : i + batch])
  return time.perf_counter() - start


def _end_to_end(embedder, inputs, checkpoint: str, batch: int) -> float:
  """Seconds for `vit-embed`'s work on the folder, into a fresh output folder."""
  from vit_jax.inference import embed

  with tempfile.TemporaryDirectory() as out:
    start = time.perf_counter()
    embed.run(embedder, inputs, out, checkpoint, shard_size=inputs.size, batch_size=batch)
    return time.perf_counter() - start


def run_embedder_benchmark(
  checkpoint: str,
  work_dir: str,
  images: int,
  image_size: tuple[int, int],
  dtypes: Sequence[str],
  batch: int,
  rounds: int,
  log: Callable[[str], None],
) -> dict[str, Any]:
  """{'rows': [{dtype, model_img_s, end_to_end_img_s, ratio}], 'settings': ...}."""
  import vit_jax
  from vit_jax.data import images as host
  from vit_jax.inference import embed

  w, h = image_size
  root = synthetic.write_folder(os.path.join(work_dir, f'jpeg_{w}x{h}_{images}'), images, (w, h))
  inputs = embed.folder_inputs(root)
  embedders = {}
  for dtype in dtypes:
    log(f'loading {checkpoint} ({dtype}) and compiling its batch of {batch} ...')
    embedders[dtype] = embed.embedder(vit_jax.load(checkpoint, dtype=dtype, batch_size=batch))
  # One checkpoint: every dtype's model prepares its images alike.
  prepare = embedders[dtypes[0]].prepare
  prepared = np.stack([prepare(host.read_image(path)) for _, path in inputs.read(0, inputs.size)])
  for embedder in embedders.values():
    embedder.apply(prepared[:batch])  # compiled before any clock runs
  seconds = {(dtype, kind): [] for dtype in dtypes for kind in ('model', 'end_to_end')}
  for r in range(rounds):
    for dtype, embedder in embedders.items():
      seconds[dtype, 'model'].append(_model_alone(embedder, prepared, batch))
      seconds[dtype, 'end_to_end'].append(_end_to_end(embedder, inputs, checkpoint, batch))
      model, whole = (images / seconds[dtype, k][-1] for k in ('model', 'end_to_end'))
      log(f'round {r + 1}/{rounds} {dtype}: model {model:.2f} img/s, end to end {whole:.2f}')
  rows = []
  for dtype in dtypes:
    model, whole = (images / statistics.median(seconds[dtype, k]) for k in ('model', 'end_to_end'))
    rows.append(
      {'dtype': dtype, 'model_img_s': model, 'end_to_end_img_s': whole, 'ratio': whole / model}
    )
  settings = {'checkpoint': checkpoint, 'images': images, 'image_size': [w, h], 'batch': batch}
  settings |= {'rounds': rounds, 'workers': embed.WORKERS}
  runs = {f'{dtype} {kind}': s for (dtype, kind), s in seconds.items()}
  return {'rows': rows, 'settings': settings, 'seconds': runs}


def format_table(result: dict[str, Any]) -> str:
  """Markdown: each dtype's model-alone and end-to-end img/s, and their ratio."""
  lines = ['| dtype | model alone img/s | vit-embed img/s | ratio |', '|---|---|---|---|']
  for r in result['rows']:
    lines.append(
      f'| {r["dtype"]} | {r["model_img_s"]:.2f} | {r["end_to_end_img_s"]:.2f} | {r["ratio"]:.3f} |'
    )
  return '\n'.join(lines)
