r"""Exports a checkpoint as a model that runs outside JAX and this project.

  python -m vit_jax.export SRC OUT [--formats=stablehlo,saved_model,onnx,onnx_int8] \
      [--dtype=bfloat16] [--model=NAME] [--resolution=R] [--vocab=FILE]

SRC is any checkpoint `vit_jax.checkpoint.fit` reads (a run directory, an .npz, a Hugging Face
or timm model, a LiT or SigLIP file, a SigLIP 2 of patch sequences). OUT, a new directory, gets:

  model.stablehlo     `jax.export`, parameters as constants, batch 'b' symbolic, lowered
                      for cpu, cuda and tpu: `jax.export.deserialize(blob).call(images)`
  saved_model/        a TensorFlow SavedModel (`jax2tf`), signature `serving_default`
  model.onnx          ONNX (`jax2onnx`), batch 'b' symbolic, for onnxruntime: only where
                      jax2onnx is installed, an environment of its own (`make onnx-env`)
  model.int8.onnx     `onnx_int8`, only where asked for: model.onnx with int8 weights
                      (onnxruntime's quantize_dynamic), which it writes too
  export.json         the inputs, outputs, preprocessing, dtype, and the command line

Unless --formats says otherwise, it writes what this environment can: StableHLO and the
SavedModel in the main one, StableHLO and ONNX in ONNX's (no TensorFlow there: the SavedModel
is one line). With jax 0.12 or newer (Python 3.13) the SavedModel is one line too: TensorFlow
cannot run the StableHLO it writes.

A classifier takes NHWC float32 images in [-1, 1] at its resolution and gives logits (its
pre-logits features where it has no head). An image-text model (LiT, SigLIP) is two
functions: `image` (images; a patch-sequence tower: packed patch sequences
(b, n, p * p * 3 + 3)) and `text` (int32 tokens (b, max_len)), each to normalised
embeddings: image.stablehlo, text.stablehlo (image.onnx, text.onnx), and the SavedModel
signatures `image` (also `serving_default`) and `text`; export.json adds the tokenizer's
settings, t and b, and its vocabulary (`--vocab`, else the one found beside the checkpoint, as
vit-zeroshot finds it) is copied beside; without one, a warning line names every place looked
and export.json names no vocabulary. `--dtype=bfloat16`
computes in bfloat16 (outputs stay float32; ONNX has no bfloat16 Einsum, so no ONNX then). A
format that cannot be written here is one warning line; with none left to write, as on any
failure, it exits with status 1 and one line, leaving OUT untouched; bad usage exits with status
2 (docs/export.md).
"""

import os
import shlex
import sys
from collections.abc import Sequence

from absl import flags
from etils import epy

from vit_jax import cli
from vit_jax import export as export_lib  # its constants; the rest loads jax on first use

with epy.lazy_imports():
  from vit_jax import checkpoint, data


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """The command line's flags, on `flag_values`."""
  fv = flag_values
  flags.DEFINE_list(
    'formats',
    None,
    f'What to write, of {", ".join(export_lib.FORMATS)}; default: what this environment'
    ' writes (stablehlo; saved_model where TensorFlow runs this jax; onnx where jax2onnx is'
    ' installed; onnx_int8, its int8 weights, only where asked for: docs/export.md).',
    flag_values=fv,
  )
  flags.DEFINE_enum(
    'dtype', 'float32', list(export_lib.DTYPES), 'The compute dtype.', flag_values=fv
  )
  flags.DEFINE_string(
    'model', None, 'Registered model name; inferred from the shapes if unset.', flag_values=fv
  )
  flags.DEFINE_integer(
    'resolution', None, "Input size in pixels (default: the checkpoint's).", flag_values=fv
  )
  flags.DEFINE_string(
    'vocab', None, 'An image-text model: its vocabulary; default: beside it.', flag_values=fv
  )


def _summary(meta: dict, out: str) -> str:
  names = ', '.join(
    f'{name} {fn["input"]["shape"]} -> {fn["output"]["name"]} {fn["output"]["shape"]}'
    for name, fn in meta['functions'].items()
  )
  return f'{meta["model"]} ({meta["dtype"]}): {names}; wrote {", ".join(meta["formats"])} to {out}'


def run(args: Sequence[str], f: flags.FlagValues = flags.FLAGS, command: str | None = None) -> int:
  """The command line's work on parsed flags `f` and positional `args`; returns the exit
  status (0 ok, 1 failed, 2 bad usage)."""
  if len(args) != 2:
    print(f'error: SRC and OUT are required, got {list(args)}', file=sys.stderr)
    return 2
  unknown = [name for name in f.formats or () if name not in export_lib.FORMATS]
  if unknown or f.formats == []:
    print(f'error: --formats: choose from {", ".join(export_lib.FORMATS)}', file=sys.stderr)
    return 2
  src, out = args
  early = cli.missing_path(src) or cli.existing_out(out)
  if early:  # said before jax loads
    print(f'error: {early}', file=sys.stderr)
    return 1
  if export_lib.saved_model.available():  # ONNX's environment has no TensorFlow
    data.hide_accelerators_from_tensorflow()
  try:
    meta = export_lib.export_model(
      src, out, f.formats, f.dtype, f.model, f.resolution, command, vocab=f.vocab
    )
  except (checkpoint.CheckpointError, export_lib.ExportError, OSError) as e:
    message = str(e) if str(src) in str(e) or str(out) in str(e) else f'{src}: {e}'
    print(f'error: {message}'.replace('\n', ' '), file=sys.stderr)
    return 1
  except Exception as e:  # any other failure: still one line, still non-zero
    print(f'error: {cli.failure_line(e)}', file=sys.stderr)
    return 1
  for line in meta['skipped']:
    print(f'warning: {line}', file=sys.stderr)
  print(_summary(meta, out))
  return 0


def main(argv: Sequence[str]) -> None:
  cli.quiet_logs()  # orbax and JAX log at INFO on every restore
  command = shlex.join([os.path.basename(sys.argv[0]), *sys.argv[1:]])
  sys.exit(run(argv[1:], command=command))


def run_cli() -> None:
  """The `vit-export` console script (and `python -m vit_jax.export`)."""
  cli.start(define_flags, main)
