"""`--pipeline`: the input pipeline's speed beside the model's. The trainer's own training and
evaluation streams timed on the bundled digits and on synthetic JPEGs, the host cores an
accelerator's training needs, and the cost of resuming a stream by index or in order.
TensorFlow is imported here, and nowhere else in `vit_jax.benchmark`."""

import dataclasses
import datetime
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from vit_jax.benchmark.synthetic import write_folder
from vit_jax.data import default_threads, pipeline, sources, spec

# (what, resolution, training img/s of one accelerator): the figures the table starts from.
ANCHORS = (
  ('ViT-B/16 bf16 training, one H100 (NVIDIA JAX ViT recipe)', 224, 1460.0),
  ('ViT-B/16 fine-tuning at 384 px, one A100', 384, 230.0),
)
SOURCES = ('digits', 'folder')
MODES = ('train', 'eval')


@dataclasses.dataclass(frozen=True)
class Variant:
  source: str
  mode: str
  crop: int
  threads: int
  window: bool = True  # JPEG training: decode only the crop window

  @property
  def name(self) -> str:
    decode = (
      ''
      if self.mode == 'eval' or self.source == 'digits'
      else (' window' if self.window else ' whole')
    )
    return f'{self.source} {self.mode}{decode} {self.crop}px {self.threads}t'


def variants(source_names, modes, crops, threads, decodes=('window', 'whole')) -> list[Variant]:
  """Every combination; the whole-image decode only where it differs (JPEG training)."""
  out = []
  for source in source_names:
    for mode in modes:
      for crop in crops:
        for t in threads:
          windows = (
            [d == 'window' for d in decodes] if (source, mode) == ('folder', 'train') else [True]
          )
          out += [Variant(source, mode, crop, t, w) for w in windows]
  return out


def _dataset(variant: Variant, source: sources.Source, batch: int) -> tf.data.Dataset:
  pp = spec.Pp(crop=variant.crop, decode_window=variant.window)
  data = spec.Data(pp=pp, input_threads=variant.threads)
  if variant.mode == 'train':
    return pipeline.train_dataset(source, 'train', data, local_batch=batch, seed=0)
  return pipeline.eval_dataset(source, 'train', data, local_batch=batch).repeat()


def _time(ds: tf.data.Dataset, images: int, threads: int) -> tuple[float, float, int]:
  """(wall s, process CPU s, images) for `images` images in the steady state: after the
  batches made while the first one was awaited (up to 2 groups a thread, and the prefetch)."""
  it = iter(ds)
  for _ in range(2 * threads + 4):
    next(it)
  wall, cpu, done = time.perf_counter(), time.process_time(), 0
  while done < images:
    done += int(next(it)['label'].shape[0])
  return time.perf_counter() - wall, time.process_time() - cpu, done


def measure(
  chosen: Sequence[Variant], by_name: dict[str, sources.Source], batch: int, images: int,
  rounds: int, log: Callable[[str], None],
) -> list[dict[str, Any]]:  # fmt: skip
  """Each variant's rounds (interleaved) and their medians."""
  times: dict[Variant, list[tuple[float, float, int]]] = {v: [] for v in chosen}
  for r in range(rounds):
    for v in chosen:
      times[v].append(_time(_dataset(v, by_name[v.source], batch), images, v.threads))
      wall, cpu, n = times[v][-1]
      log(f'round {r + 1}/{rounds} {v.name}: {n / wall:.0f} img/s, {n / cpu:.0f} img/s/core')
  rows = []
  for v in chosen:
    rates = [n / wall for wall, _, n in times[v]]
    per_core = [n / cpu for _, cpu, n in times[v]]
    busy = [cpu / wall for wall, cpu, _ in times[v]]
    rows.append(
      {
        **dataclasses.asdict(v),
        'name': v.name,
        'img_per_s': statistics.median(rates),
        'img_per_s_per_core': statistics.median(per_core),
        'cpu_per_wall': statistics.median(busy),
        'rounds_img_per_s': rates,
        'rounds_img_per_s_per_core': per_core,
      }
    )
  return rows


class InOrderFolder(sources.FolderSource):
  """An image folder read as a TFRecord dataset is: in order only, each record its bytes."""

  def reader(self, split: str, process_index: int = 0, process_count: int = 1) -> None:
    return None

  def records(self, split: str, process_index: int = 0, process_count: int = 1) -> tf.data.Dataset:
    by_index = super().reader(split, process_index, process_count)
    paths = tf.data.Dataset.range(by_index.size).batch(256).map(by_index.fetch).unbatch()
    return paths.map(lambda r: {**r, 'image': tf.io.read_file(r['image'])})

  def encoded(self, image: tf.Tensor) -> tf.Tensor:
    return image

  def in_order_cost(self, split: str) -> str:
    return f'{self.root} read in order (the resume-cost comparison)'


def _first_batch_s(source, position: int, batch: int, crop: int, threads: int) -> float:
  start = time.perf_counter()
  data = spec.Data(pp=spec.Pp(crop=crop), shuffle_buffer=1024, input_threads=threads)
  ds = pipeline.train_dataset(source, 'train', data, local_batch=batch, seed=0, position=position)
  next(iter(ds))
  return time.perf_counter() - start


def _resumed_equal(source, position: int, batch: int, crop: int, threads: int) -> bool:
  """The two batches at `position` of a stream resumed there equal the uninterrupted ones."""
  data = spec.Data(pp=spec.Pp(crop=crop), input_threads=threads)
  kwargs = {'local_batch': batch, 'seed': 0}
  resumed = pipeline.train_dataset(source, 'train', data, position=position, **kwargs).take(2)
  skipped = position // batch
  whole = pipeline.train_dataset(source, 'train', data, **kwargs).skip(skipped).take(2)
  pairs = zip(resumed.as_numpy_iterator(), whole.as_numpy_iterator(), strict=True)
  return all(np.array_equal(a[k], b[k]) for a, b in pairs for k in ('image', 'label'))


def resume_cost(
  root: str, batch: int, crop: int, rounds: int, threads: int, check: bool, log: Callable
) -> dict[str, Any]:
  """Time to the first batch at 0 and at 95% of an epoch, by index and in order."""
  kinds = {'by index': sources.FolderSource(root), 'in order': InOrderFolder(root)}
  n = kinds['by index'].num_examples('train')  # lists the folder (once, untimed)
  kinds['in order']._listing = kinds['by index']._listing
  position = int(0.95 * n) // batch * batch
  times = {(k, p): [] for k in kinds for p in (0, position)}
  for r in range(rounds):
    for (kind, p), t in times.items():
      t.append(_first_batch_s(kinds[kind], p, batch, crop, threads))
      log(f'resume round {r + 1}/{rounds}: {kind} at {p}: first batch after {t[-1]:.2f} s')
  rows = [
    {'read': kind, 'position': p, 'first_batch_s': statistics.median(t), 'rounds_s': t}
    for (kind, p), t in times.items()
  ]
  out = {'images': n, 'batch': batch, 'crop': crop, 'position': position, 'rows': rows}
  if check:
    out['resumed_equals_uninterrupted'] = _resumed_equal(
      kinds['by index'], position, batch, crop, threads
    )
  return out


def _per_core(rows: list[dict], crop: int) -> float | None:
  """JPEG training's img/s per core at `crop` (window decode, fewest threads measured)."""
  chosen = [r for r in rows if (r['source'], r['mode'], r['window']) == ('folder', 'train', True)]
  chosen = sorted((r for r in chosen if r['crop'] == crop), key=lambda r: r['threads'])
  return chosen[0]['img_per_s_per_core'] if chosen else None


def model_rows(paths: Sequence[str]) -> list[tuple[str, int, float]]:
  """(what, resolution, img/s) of the training rows of `vit_jax.benchmark --json` files."""
  out = []
  for path in paths:
    with open(path) as f:
      result = json.load(f)
    for row in result['rows']:
      if row['mode'] == 'train' and row.get('framework', 'jax') == 'jax':
        what = (
          f'{result["model"]} {row["program"]} batch {result["batch"]}, '
          f'{result.get("device", "?")} (measured)'
        )
        out.append((what, int(result['resolution']), float(row['img_per_s'])))
  return out


def cores_needed(rows: list[dict], accelerators) -> list[dict[str, Any]]:
  out = []
  for what, resolution, rate in accelerators:
    per_core = _per_core(rows, resolution)
    cores = rate / per_core if per_core else None
    out.append(
      {
        'accelerator': what,
        'resolution': resolution,
        'img_per_s': rate,
        'pipeline_img_per_s_per_core': per_core,
        'cores': cores,
      }
    )
  return out


def run_pipeline_benchmark(
  *,
  work_dir: str,
  source_names: Sequence[str] = SOURCES,
  modes: Sequence[str] = MODES,
  crops: Sequence[int] = (224, 384),
  threads: Sequence[int] = (1, 2),
  decodes: Sequence[str] = ('window', 'whole'),
  images: int = 2048,
  image_size: tuple[int, int] = (500, 375),
  batch: int = 64,
  measure_images: int = 1024,
  rounds: int = 2,
  resume: bool = True,
  resume_images: int = 20_000,
  resume_size: tuple[int, int] = (64, 48),
  resume_check: bool = True,
  model_json: Sequence[str] = (),
  log: Callable[[str], None] = lambda s: None,
) -> dict[str, Any]:
  """Measures throughput (and the resume cost); returns a JSON-ready dict."""
  load_start = os.getloadavg()
  by_name: dict[str, sources.Source] = {'digits': sources.DigitsSource()}
  if 'folder' in source_names:
    w, h = image_size
    log(f'writing (or reusing) {images} JPEGs of {w}x{h} in {work_dir}')
    folder = write_folder(os.path.join(work_dir, f'jpeg_{w}x{h}_{images}'), images, image_size)
    by_name['folder'] = sources.FolderSource(folder)
  chosen = variants(source_names, modes, crops, threads, decodes)
  rows = measure(chosen, by_name, batch, measure_images, rounds, log)
  result: dict[str, Any] = {
    'date': datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds'),
    'tensorflow': tf.__version__,
    'cpu_count': os.cpu_count(),
    'cores_available': default_threads(),
    'batch': batch,
    'images_per_round': measure_images,
    'rounds': rounds,
    'folder_images': images,
    'image_size': list(image_size),
    'rows': rows,
    'cores_per_accelerator': cores_needed(rows, [*ANCHORS, *model_rows(model_json)]),
  }
  if resume:
    w, h = resume_size
    log(f'writing (or reusing) {resume_images} JPEGs of {w}x{h} for the resume cost')
    root = write_folder(
      os.path.join(work_dir, f'jpeg_{w}x{h}_{resume_images}'), resume_images, resume_size
    )
    result['resume'] = resume_cost(root, batch, 32, max(rounds, 3), max(threads), resume_check, log)
  result['load_average'] = [list(load_start), list(os.getloadavg())]
  return result
