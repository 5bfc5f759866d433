"""The input pipeline's speed, beside the model's: `python -m vit_jax.benchmark --pipeline`.

  python -m vit_jax.benchmark --pipeline --crops 224,384 --threads 1,2 \\
      --model_json docs/benchmarks/h200/train_max_batch.json --json pipeline.json

Throughput: the trainer's own pipelines (`train_dataset`: decode, inception crop, flip,
resize; `eval_dataset`: decode, resize), on the bundled digits (8x8 pixels: no decoding) and
on a folder of synthetic JPEGs of `--image_size` written once into `--pipeline_dir` (smooth
colour fields with noise, quality 90: about 70 KB at 500x375, near ImageNet's average). Each
variant (source, mode, crop, threads, and for JPEG training whether only the crop window is
decoded) is timed over `--measure_images` images in the steady state (after the batches made
ahead while the first one was awaited), in interleaved rounds so that a change in machine
load hits all alike; the table shows the median round.

  img/s      images per second of wall time
  cpu/wall   process CPU seconds per wall second: the cores the pipeline kept busy (below
             `threads` where other processes had the machine)
  img/s/core images per CPU second: what one core delivers, whatever the load

Cores per accelerator: an accelerator's training img/s (the anchors below, and the training
rows of `vit_jax.benchmark --json` files given with `--model_json`) over the per-core rate of
JPEG training at its resolution: the host cores that keep it fed.

Resume cost (`--resume`): a folder of `--resume_images` JPEGs; the time to the first batch of a
training stream started at position 0 and at 95% of an epoch, read by index (the folder as
it is) and read in order (the same files as a dataset that can only be read in order, as a
TFRecord build of tfds is, with a shuffle buffer of 1,024); and whether the batches resumed at
95% equal the uninterrupted stream's there.
"""

import dataclasses
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from absl import flags
from PIL import Image

from vit_jax import files
from vit_jax.data import pipeline, sources, spec

# (what, resolution, training img/s of one accelerator): the figures the table starts from.
ANCHORS = (
  ('ViT-B/16 bf16 training, one H100 (NVIDIA JAX ViT recipe)', 224, 1460.0),
  ('ViT-B/16 fine-tuning at 384 px, one A100', 384, 230.0),
)
SOURCES = ('digits', 'folder')
MODES = ('train', 'eval')
_MARKER = 'synthetic.json'


def synthetic_image(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
  """A smooth random colour field with pixel noise: JPEGs of a photo's size and decode cost."""
  grid = rng.uniform(0, 255, (6, 8, 3)).astype(np.uint8)
  base = np.asarray(Image.fromarray(grid).resize((width, height), Image.BICUBIC), np.float32)
  noise = rng.normal(0, 12, (height, width, 3))
  return np.clip(base + noise, 0, 255).astype(np.uint8)


def write_folder(root: str, count: int, size: tuple[int, int], classes: int = 10) -> str:
  """`root/train/cNN/NNNNNN.jpg`: `count` synthetic JPEGs of `size` (W, H); kept for reuse."""
  spec = {'count': count, 'size': list(size), 'classes': classes, 'quality': 90}
  marker = os.path.join(root, _MARKER)
  if os.path.exists(marker):
    with open(marker) as f:
      if json.load(f) == spec:
        return root
  rng = np.random.default_rng(0)
  for i in range(count):
    folder = os.path.join(root, 'train', f'c{i % classes:02d}')
    os.makedirs(folder, exist_ok=True)
    image = Image.fromarray(synthetic_image(rng, size[1], size[0]))
    image.save(os.path.join(folder, f'{i:06d}.jpg'), quality=90)
  files.atomic_write_text(marker, json.dumps(spec))
  return root


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

  def num_examples(self, split: str, process_index: int = 0, process_count: int = 1) -> int:
    return super().num_examples(split, process_index, process_count)

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
    'cores_available': pipeline.default_threads(),
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


def _fmt(value: float | None, spec: str = ',.0f') -> str:
  return '' if value is None else format(value, spec)


def format_tables(result: dict[str, Any]) -> str:
  """Markdown: throughput, cores per accelerator, and the resume cost."""
  lines = [
    '| source | mode | decode | crop | threads | img/s | cpu/wall | img/s/core |',
    '|---|---|---|---|---|---|---|---|',
  ]
  for r in result['rows']:
    decode = (
      ''
      if r['mode'] == 'eval' or r['source'] == 'digits'
      else ('crop window' if r['window'] else 'whole image')
    )
    lines.append(
      f'| {r["source"]} | {r["mode"]} | {decode} | {r["crop"]} | {r["threads"]} | '
      f'{_fmt(r["img_per_s"])} | {r["cpu_per_wall"]:.2f} | {_fmt(r["img_per_s_per_core"])} |'
    )
  lines += [
    '',
    '| accelerator | px | img/s | pipeline img/s/core | cores |',
    '|---|---|---|---|---|',
  ]
  for c in result['cores_per_accelerator']:
    lines.append(
      f'| {c["accelerator"]} | {c["resolution"]} | {_fmt(c["img_per_s"])} | '
      f'{_fmt(c["pipeline_img_per_s_per_core"])} | {_fmt(c["cores"], ".1f")} |'
    )
  if 'resume' in result:
    res = result['resume']
    lines += [
      '',
      f'Resume cost: {res["images"]:,} JPEGs, batch {res["batch"]}, crop {res["crop"]}; '
      f'time to the first batch (median of rounds):',
      '',
      '| read | position | first batch s | vs position 0 |',
      '|---|---|---|---|',
    ]
    start = {r['read']: r['first_batch_s'] for r in res['rows'] if r['position'] == 0}
    for r in res['rows']:
      ratio = r['first_batch_s'] / start[r['read']]
      lines.append(f'| {r["read"]} | {r["position"]:,} | {r["first_batch_s"]:.2f} | {ratio:.2f}x |')
    if 'resumed_equals_uninterrupted' in res:
      lines.append(
        f"\nBatches resumed at {res['position']:,} equal the uninterrupted stream's: "
        f'{res["resumed_equals_uninterrupted"]}'
      )
  return '\n'.join(lines)


def _size(text: str) -> tuple[int, int]:
  w, h = text.lower().split('x')
  return int(w), int(h)


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """The `--pipeline` mode's flags, on `flag_values` (defined at program start)."""
  fv = flag_values
  flags.DEFINE_bool('pipeline', True, 'the input pipeline benchmark (this mode)', flag_values=fv)
  default_dir = os.path.join(tempfile.gettempdir(), 'vit_jax_pipeline_benchmark')
  flags.DEFINE_string(
    'pipeline_dir', default_dir, 'where the synthetic JPEG folders are kept', flag_values=fv
  )
  flags.DEFINE_list('sources', list(SOURCES), f'of {list(SOURCES)}', flag_values=fv)
  flags.DEFINE_list('modes', list(MODES), f'of {list(MODES)}', flag_values=fv)
  flags.DEFINE_list('crops', ['224', '384'], 'output sizes in pixels', flag_values=fv)
  flags.DEFINE_list(
    'threads', ['1', '2'], 'thread counts (0: the cores this process may use)', flag_values=fv
  )
  flags.DEFINE_list(
    'decode', ['window', 'whole'], 'JPEG training: crop window or whole image', flag_values=fv
  )
  flags.DEFINE_integer('images', 2048, 'JPEGs in the throughput folder', flag_values=fv)
  flags.DEFINE_string('image_size', '500x375', 'their size, WxH', flag_values=fv)
  flags.DEFINE_integer('batch', 64, 'images per batch', flag_values=fv)
  flags.DEFINE_integer('measure_images', 1024, 'images timed per variant and round', flag_values=fv)
  flags.DEFINE_integer('rounds', 2, 'interleaved rounds', flag_values=fv)
  flags.DEFINE_bool('resume', True, 'measure the resume cost', flag_values=fv)
  flags.DEFINE_integer('resume_images', 20_000, 'JPEGs in the resume-cost folder', flag_values=fv)
  flags.DEFINE_string('resume_size', '64x48', 'their size, WxH', flag_values=fv)
  flags.DEFINE_bool(
    'resume_check', True, 'check resumed batches against an uninterrupted run', flag_values=fv
  )
  flags.DEFINE_multi_string(
    'model_json', [], 'vit_jax.benchmark --json files (training rows)', flag_values=fv
  )
  flags.DEFINE_string('json', None, 'write the results here (JSON)', flag_values=fv)


def main(argv: Sequence[str]) -> None:
  del argv
  f = flags.FLAGS
  threads = [int(t) or pipeline.default_threads() for t in f.threads]
  result = run_pipeline_benchmark(
    work_dir=f.pipeline_dir,
    source_names=f.sources,
    modes=f.modes,
    crops=[int(c) for c in f.crops],
    threads=threads,
    decodes=f.decode,
    images=f.images,
    image_size=_size(f.image_size),
    batch=f.batch,
    measure_images=f.measure_images,
    rounds=f.rounds,
    resume=f.resume,
    resume_images=f.resume_images,
    resume_size=_size(f.resume_size),
    resume_check=f.resume_check,
    model_json=f.model_json,
    log=lambda s: print(s, file=sys.stderr, flush=True),
  )
  print(format_tables(result))
  if f.json:
    files.atomic_write_text(f.json, json.dumps(result, indent=2) + '\n')
    print(f'wrote {f.json}')
