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

import os
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from absl import flags

from vit_jax import cli, data
from vit_jax.benchmark import input_pipeline
from vit_jax.benchmark.input_pipeline import MODES, SOURCES


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
  threads = [int(t) or data.default_threads() for t in f.threads]
  result = input_pipeline.run_pipeline_benchmark(
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
  cli.report(format_tables(result), result, f.json)
