"""Throughput, memory, compile time and MFU of the model zoo, side by side in one process.

  python -m vit_jax.benchmark --model ViT-B_16 --batch 8 --resolution 224 \\
      --dtype float32,bfloat16 --train --compare --json bench.json

Every combination of `--dtype`, `--attention`, `--remat` and `--layers` (unrolled or one
`nn.scan`) is one variant. All variants share one set of weights and one batch of random
images, and are timed in interleaved rounds (variant A, B, ..., then A, B, ... again), so that
a change in machine load hits them alike; the table shows the best step and the median. Each
round times `--steps` consecutive steps per program: the later ones show the steady state of a
training loop, which reuses the memory of the step before.
Per variant and mode:

  img/s         images per second (inference: `apply(train=False)`; training: the trainer's
                own compiled step, `vit_jax.train.steps.make_train_step` with the default
                recipe of the run spec: softmax cross-entropy, clipping at global norm 1,
                SGD with momentum 0.9, `--accum_steps` micro-batches, per-example dropout
                where the model drops out; the train state is donated)
  compile       seconds to lower and compile the program
  GFLOP/img     XLA's cost analysis of the program, per image (a training step with
                rematerialisation counts its recomputation; XLA counts a scanned body once,
                so scanned programs show none)
  TFLOP/s, MFU  model FLOPs (the unrolled program without rematerialisation, with explicit
                attention: XLA counts a cuDNN kernel as 0 FLOPs; where XLA analyses no
                lowered program, as on GPUs, the analytic count of `models.stats`, a
                training step 3 forward passes) x img/s, and that as a
                fraction of the peak: `--peak_tflops`, or else the best square matmul this
                process measures in the same dtype (bfloat16 operands with float32
                accumulation for the 16-bit dtypes), once per round; on an accelerator the
                probe is measured in any case (JSON `of_matmul_probe`)
  XLA mem       arguments + outputs - donated + temporaries of the compiled program
                (`compiled.memory_analysis()`): the memory the program needs
  MB acc/img    XLA's `bytes accessed` of the compiled program (after fusion; its cost
                analysis), per image (JSON `bytes_accessed_per_image`): the memory traffic
                that halving activation bytes halves, visible on a CPU too
  temp MB/img   the compiled program's temporaries (`temp_size_in_bytes`: activations kept
                for the backward pass, workspace), per image (JSON `temp_bytes_per_image`)
  peak mem      measured: the accelerator's `peak_bytes_in_use` (the process's peak so far),
                or on CPU the process's peak resident set during the timed steps (VmHWM,
                reset before them; it includes everything the process holds)
  cpu/wall      process CPU seconds per wall second while timing (CPU only): well below the
                number of cores means that other processes had the machine
  cuDNN attn    (JSON `cudnn_attention`) whether the compiled program calls cuDNN's fused
                attention: `--attention=fused` falls back to XLA where cuDNN does not apply
  faults/step   minor page faults of the process per step (median): on CPU, XLA's fresh
                temporaries at every step; the entry point turns on transparent huge pages
                for them where it can (`vit_jax.hugepages`), and the report says whether

`--pipeline` measures the input pipeline instead (`vit_jax.benchmark.input_pipeline`, TensorFlow):
images/s and images/s per core of training and evaluation input, beside accelerators'
training images/s.

`--precision=matmul,activations` compares the precision policies of the 16-bit dtypes
(`vit_jax.models.precision`); a variant's name ends in `/activations` under the second.
`--profile_steps N` traces N more steps of the first training program (else the first
program) with `jax.profiler` into `--profile_dir` and prints the top ops by time, with the
matmul / attention / other shares (`vit_jax.profiling`).

`--mesh data:-1,model:2 --sharding tp` runs the training programs on a mesh of this machine's
devices (the form of config.mesh; default one device), the train state placed by the rule and
the step compiled as the trainer places and compiles them; training only (`--noinference`).
img/s, TFLOP/s and the per-image figures are then the whole mesh's, MFU is against the
devices x the peak, XLA mem is one device's (JSON `mesh`, `mesh_devices`, `sharding`,
`img_per_s_per_device`).

`--compare` runs Hugging Face `ViTForImageClassification` (PyTorch eager) on the same weights
(through `vit_jax.checkpoint.export_hf`) in the same rounds, and reports our speed over theirs
and the largest logit difference; 16-bit variants compare against `torch.autocast`.
`--onnx=OUT` adds ONNX Runtime's rows, the float32 and int8 files that vit-export wrote in OUT,
of the weights `--save_params=FILE.npz` writes (`vit_jax.benchmark.onnx_runtime`).
`--max_batch` picks the largest batch whose training step fits in memory.

`--memory_batches 8,16,32` instead compiles each variant's training step at these batches
(nothing allocated or timed) and prints its memory as a line in the batch (`memory_table`):
the fixed part of XLA's memory and its bytes per image, the fixed part's state (arguments +
outputs - donated), the temporaries per image, how far the batches between the first and
last lie from the line through them, and the largest batch that fits in each of
`--memory_gib` GiB: (G GiB - fixed) / per image, rounded down. `--model` may then be a
comma list.
"""

import importlib
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

import jax
from absl import flags

from vit_jax import benchmark, cli, files, hugepages, parallel, profiling
from vit_jax.benchmark import onnx_runtime
from vit_jax.benchmark.memory import GIB
from vit_jax.benchmark.variants import ATTENTION, DTYPES, LAYERS, REMAT
from vit_jax.models import MODEL_CONFIGS, precision, unknown_model


def _fmt(value: Any, spec: str, scale: float = 1.0) -> str:
  if value is None or (isinstance(value, float) and value != value):
    return '-'
  return format(value / scale, spec)


def _markdown_rows(result: dict[str, Any]) -> str:
  """The rows as a Markdown table, one column per measured figure."""
  head = (
    '| program | mode | img/s | median | compile s | GFLOP/img | TFLOP/s | MFU | XLA mem GB'
    ' | MB acc/img | temp MB/img | peak mem GB | cpu/wall | faults/step | vs HF |'
  )
  lines = [head, '|' + '---|' * 15]
  for r in result['rows']:
    cells = [
      r['program'],
      r['mode'],
      _fmt(r['img_per_s'], '.2f'),
      _fmt(r['img_per_s_median'], '.2f'),
      _fmt(r['compile_s'], '.1f'),
      _fmt(r['flops_per_image'], '.2f', 1e9),
      _fmt(r['achieved_tflops'], '.3f'),
      _fmt(r['mfu'], '.0%'),
      _fmt(r['xla_memory_bytes'], '.2f', 1e9),
      _fmt(r.get('bytes_accessed_per_image'), '.1f', 1e6),
      _fmt(r.get('temp_bytes_per_image'), '.1f', 1e6),
      _fmt(r['peak_memory_bytes'], '.2f', 1e9),
      _fmt(r['cpu_per_wall'], '.2f'),
      _fmt(r.get('page_faults_per_step'), '.0f'),
      _fmt(r.get('vs_hf'), '.2f'),
    ]
    lines.append('| ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def format_table(result: dict[str, Any]) -> str:
  """A Markdown table of the rows, then the probe, agreement and load lines."""
  out = [_markdown_rows(result), '']
  if result['matmul_probe_tflops']:
    probes = ', '.join(
      f'{d} {max(v) * 1e3:.0f} GFLOP/s' for d, v in result['matmul_probe_tflops'].items()
    )
    out.append(f'matmul probe (best square {result["matmul_probe_sizes"]}): {probes}')
  if result['peak_tflops_given']:
    out.append(f'peak: {result["peak_tflops_given"]} TFLOP/s (given)')
  for name, a in result['agreement'].items():
    out.append(
      f'{name} vs {a["reference"]}: top-1 agreement {a["top1_agreement"]:.1%} on {a["images"]}'
      f' random images ({a["distinct_reference_top1"]} distinct classes), max |logit error|'
      f' {a["max_abs_logit_error"]:.2e} (max |logit| {a["max_abs_logit"]:.2f})'
    )
  if result['hf_max_abs_logit_error'] is not None:
    out.append(
      f'Hugging Face vs ours (float32): max |logit error| {result["hf_max_abs_logit_error"]:.2e}'
    )
  out += onnx_runtime.agreement_lines(result.get('onnx_agreement') or {})
  for r in result['rows']:
    if r['attention'] == 'fused' and r['cudnn_attention'] is not None:
      kernel = 'cuDNN fused attention' if r['cudnn_attention'] else 'no cuDNN kernel (XLA)'
      out.append(f'{r["program"]} {r["mode"]}: {kernel}')
  for r in result['rows']:
    if r.get('train_over_inference_time'):
      out.append(
        f'{r["program"]}: training step per image = {r["train_over_inference_time"]:.2f} x'
        ' inference per image'
      )
  if result.get('profile'):
    profile = result['profile']
    out.append(f'{profile["program"]} {profile["mode"]}, {profile["steps"]} steps profiled:')
    out.append(profiling.format_summary(profile))
  if result['mesh_devices'] > 1:
    out.append(
      f'mesh {result["mesh"]} ({result["mesh_devices"]} devices), sharding {result["sharding"]}:'
      " img/s, TFLOP/s, MB acc/img and temp MB/img are the whole mesh's, MFU is of"
      f" {result['mesh_devices']} x the peak; XLA mem is one device's"
    )
  if result.get('huge_pages'):
    out.append(result['huge_pages'])
  out.append(
    f'load average {result["load_average_start"][0]:.2f} at start, '
    f'{result["load_average_end"][0]:.2f} at end ({result["cpu_count"]} CPUs); {result["date"]}'
  )
  return '\n'.join(out)


def format_memory_table(result: dict[str, Any]) -> str:
  """A Markdown table of `memory_table`'s rows: GiB, and MiB per image."""
  devices = result['devices_gib']
  head = '| model | program | fixed GiB | of it state | MiB/img | of it temp | off line MiB | '
  lines = [head + ' | '.join(f'{g:g} GiB' for g in devices) + ' |']
  lines.append('|' + '---|' * (7 + len(devices)))
  for r in result['rows']:
    cells = [
      r['model'],
      r['program'],
      _fmt(r['fixed_bytes'], '.2f', GIB),
      _fmt(r['state_bytes'], '.2f', GIB),
      _fmt(r['per_image_bytes'], '.1f', 2**20),
      _fmt(r['temp_per_image_bytes'], '.1f', 2**20),
      _fmt(r['off_line_bytes'], '.2f', 2**20),
      *(str(r['largest_batch'][f'{g:g}']) for g in devices),
    ]
    lines.append('| ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def write_json(result: dict[str, Any], path: str) -> None:
  """Writes atomically (`vit_jax.files`): a failed write leaves an earlier file as it was."""
  files.atomic_write_text(path, json.dumps(result, indent=2) + '\n')


def main(argv: Sequence[str]) -> None:
  try:
    _main(argv)
  except ValueError as e:  # bad flags or a batch that cannot fit: one line, no traceback
    sys.exit(f'error: {e}')


def _main(argv: Sequence[str]) -> None:
  del argv
  f = flags.FLAGS
  log = lambda s: print(s, file=sys.stderr, flush=True)
  if f.mesh and (f.memory_batches or f.max_batch):
    raise ValueError('--memory_batches and --max_batch measure one device: leave out --mesh')
  if f.memory_batches:
    _memory_main(f, log)
    return
  if f.save_params:
    config = benchmark.model_config(f.model)
    benchmark.save_params(f.save_params, config, f.num_classes, f.resolution, f.seed)
    print(f'wrote {f.save_params}')
    return
  result = benchmark.run_benchmark(
    f.model,
    _batch(f, log),
    f.resolution,
    f.dtype,
    f.attention,
    f.remat,
    f.layers,
    precisions=f.precision,
    inference=f.inference,
    train=f.train,
    compare=f.compare,
    onnx=f.onnx,
    num_classes=f.num_classes,
    peak_tflops=f.peak_tflops,
    rounds=f.rounds,
    steps=f.steps,
    check_batches=f.check_batches,
    probe_sizes=[int(s) for s in f.probe_sizes] or None,
    seed=f.seed,
    compile_only=f.compile_only,
    accum_steps=f.accum_steps,
    profile_steps=f.profile_steps,
    profile_dir=f.profile_dir,
    mesh=f.mesh,
    sharding=f.sharding,
    log=log,
  )
  print(format_table(result))
  if f.json:
    write_json(result, f.json)
    print(f'wrote {f.json}')


def _batch(f: flags.FlagValues, log: Callable[[str], None]) -> int:
  """`--batch`, or with `--max_batch` the largest multiple of 32 whose training step fits."""
  if not f.max_batch:
    return f.batch
  variants = benchmark.variants_from(f.dtype, f.attention, f.remat, f.layers, f.precision)
  config = benchmark.model_config(f.model)
  limit = int(f.memory_fraction * benchmark.memory_limit_bytes())
  batch, need = benchmark.largest_batch(config, f.num_classes, variants[0], f.resolution, limit)
  log(f'largest batch for {variants[0].name}: {batch} ({need / 1e9:.1f} of {limit / 1e9:.1f} GB)')
  return batch


def _memory_main(f: flags.FlagValues, log: Callable[[str], None]) -> None:
  """`--memory_batches`: the memory table of the training steps of every `--model` (a comma
  list here) and variant."""
  variants = benchmark.variants_from(f.dtype, f.attention, f.remat, f.layers, f.precision)
  models = f.model.split(',')
  log(f'{", ".join(models)} {f.resolution}px on {jax.devices()[0].device_kind}: memory only')
  batches = [int(b) for b in f.memory_batches]
  devices = [float(g) for g in f.memory_gib]
  result = benchmark.memory_table(
    models, variants, f.resolution, batches, devices, f.num_classes, log
  )
  print(format_memory_table(result))
  if f.json:
    write_json(result, f.json)
    print(f'wrote {f.json}')


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """The command line's flags, on `flag_values` (defined at program start, not at import)."""
  _define_program_flags(flag_values)
  _define_run_flags(flag_values)


def _define_program_flags(fv: flags.FlagValues) -> None:
  """What is compiled: the model, its batch and the variants measured side by side."""
  flags.DEFINE_string(
    'model', 'ViT-B_16', 'registered model name (vit_jax.models.MODEL_CONFIGS)', flag_values=fv
  )
  flags.DEFINE_integer('batch', 8, 'images per step', flag_values=fv)
  flags.DEFINE_bool(
    'max_batch',
    False,
    'instead of --batch: the largest multiple of 32 whose training step fits',
    flag_values=fv,
  )
  flags.DEFINE_float(
    'memory_fraction', 0.9, 'of the device memory, for --max_batch', flag_values=fv
  )
  flags.DEFINE_list(
    'memory_batches',
    [],
    "instead of timing: compile each variant's training step at these batches (nothing"
    ' allocated) and print its memory as a line in the batch; --model may be a comma list',
    flag_values=fv,
  )
  flags.DEFINE_list(
    'memory_gib',
    ['16', '40', '80'],
    'with --memory_batches: the largest batch for these GiB',
    flag_values=fv,
  )
  flags.register_validator('model', _registered, flag_values=fv)
  flags.register_multi_flags_validator(
    ['model', 'memory_batches'],
    lambda values: ',' not in values['model'] or bool(values['memory_batches']),
    '--model is one name; a comma list of them only with --memory_batches',
    flag_values=fv,
  )
  flags.DEFINE_integer('resolution', 224, 'image side in pixels', flag_values=fv)
  flags.DEFINE_integer('num_classes', 1000, 'head width', flag_values=fv)
  flags.DEFINE_list(
    'dtype', ['float32'], f'compute dtypes, comma list of {list(DTYPES)}', flag_values=fv
  )
  flags.DEFINE_list(
    'attention', ['xla'], f'attention implementations, of {list(ATTENTION)}', flag_values=fv
  )
  flags.DEFINE_list(
    'remat', ['none'], f'rematerialisation policies, of {list(REMAT)}', flag_values=fv
  )
  flags.DEFINE_list(
    'layers', ['unrolled'], f'encoder blocks unrolled or as one nn.scan: {LAYERS}', flag_values=fv
  )
  flags.DEFINE_list(
    'precision',
    ['matmul'],
    f'precision policies of the 16-bit dtypes, of {list(precision.POLICIES)}',
    flag_values=fv,
  )
  flags.DEFINE_string(
    'mesh',
    None,
    "the training step's device mesh over this machine's devices, as config.mesh (e.g."
    ' data:-1,model:2); default: one device. Training only (--noinference); img/s and TFLOP/s'
    " are then the whole mesh's, MFU is against devices x peak",
    flag_values=fv,
  )
  flags.DEFINE_string(
    'sharding',
    'replicate',
    f'how --mesh holds the train state, as config.sharding: one of {list(parallel.RULES)}',
    flag_values=fv,
  )
  flags.register_validator('mesh', _mesh_spec, flag_values=fv)
  flags.register_validator('sharding', _sharding_rule, flag_values=fv)
  flags.DEFINE_integer(
    'profile_steps', 0, 'trace this many more steps with jax.profiler (0: none)', flag_values=fv
  )
  flags.DEFINE_string(
    'profile_dir', '/tmp/vit_benchmark_profile', 'where --profile_steps writes', flag_values=fv
  )


def _registered(models: str) -> bool:
  """--model names registered models: an unknown one is a usage error of one line, not a
  traceback."""
  for name in models.split(','):
    if name not in MODEL_CONFIGS:
      raise flags.ValidationError(f'{unknown_model(name)} `vit-models` lists the registered ones.')
  return True


def _mesh_spec(spec: str | None) -> bool:
  """--mesh parses as config.mesh does: a bad one is a usage error of one line."""
  try:
    return spec is None or bool(parallel.parse_mesh(spec))
  except ValueError as e:
    raise flags.ValidationError(str(e).replace('config.mesh', '--mesh')) from e


def _sharding_rule(rule: str) -> bool:
  if rule not in parallel.RULES:
    raise flags.ValidationError(f'--sharding={rule!r}: expected one of {list(parallel.RULES)}')
  return True


def _define_run_flags(fv: flags.FlagValues) -> None:
  """What is measured and how: the modes, the comparison, the peak, timing and output."""
  flags.DEFINE_bool(
    'inference', True, 'time inference (--noinference: training only)', flag_values=fv
  )
  flags.DEFINE_bool(
    'train', False, "time the trainer's training step (vit_jax.train.steps)", flag_values=fv
  )
  flags.DEFINE_integer(
    'accum_steps', 1, 'micro-batches per training step (config.accum_steps)', flag_values=fv
  )
  flags.DEFINE_bool(
    'compare', False, 'also run Hugging Face PyTorch ViT on the same weights', flag_values=fv
  )
  flags.DEFINE_string(
    'onnx',
    None,
    'also time the ONNX files of this vit-export directory under onnxruntime (model.onnx,'
    ' model.int8.onnx): an export of the --save_params weights',
    flag_values=fv,
  )
  flags.DEFINE_string(
    'save_params',
    None,
    'instead of timing: write the weights every program runs as this .npz, for vit-export',
    flag_values=fv,
  )
  flags.DEFINE_float(
    'peak_tflops', None, 'device peak for MFU; default: a matmul probe', flag_values=fv
  )
  flags.DEFINE_list(
    'probe_sizes', [], 'square matmul sizes of the probe (default by platform)', flag_values=fv
  )
  flags.DEFINE_integer('rounds', 2, 'interleaved rounds over all programs', flag_values=fv)
  flags.DEFINE_integer('steps', 3, 'timed steps per program per round', flag_values=fv)
  flags.DEFINE_integer(
    'check_batches', 2, 'batches of random images for top-1 agreement', flag_values=fv
  )
  flags.DEFINE_integer('seed', 0, 'weights and images', flag_values=fv)
  flags.DEFINE_bool(
    'compile_only', False, 'compile on abstract arrays: no allocation, no timing', flag_values=fv
  )
  flags.DEFINE_string('json', None, 'write the results here (JSON)', flag_values=fv)


def run_cli() -> None:
  """The `vit-benchmark` console script (and `python -m vit_jax.benchmark`); with `--pipeline`
  the input pipeline's benchmark (`benchmark_pipeline`, which imports TensorFlow)."""
  hugepages.reexec_with_huge_pages()
  mode = importlib.import_module(cli.entry_point('vit-benchmark', sys.argv[1:]).cli)
  # Its compile seconds are XLA's, not a cache read's: no persistent compilation cache.
  cli.start(mode.define_flags, mode.main, keep_compilations=False)
