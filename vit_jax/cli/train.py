r"""Trains and evaluates a ViT: `python -m vit_jax.main --config=FILE[:ARG] --workdir=DIR`.

  python -m vit_jax.main --config=configs/digits.py --workdir=runs/digits
  python -m vit_jax.main --config=configs/vit.py:b16,cifar10 --workdir=runs/b16 \
      --config.pretrained_dir=checkpoints --config.base_lr=0.01

Running the same command again with the same workdir resumes from its last checkpoint.

Several processes (hosts) run the same command; jax.distributed joins them before anything
else. On a TPU VM pod and under SLURM (srun) it finds its settings by itself; elsewhere give
them, e.g. two processes on one machine (launch/local.sh does this):

  python -m vit_jax.main ... --coordinator_address=127.0.0.1:8476 --num_processes=2 --process_id=0
  python -m vit_jax.main ... --coordinator_address=127.0.0.1:8476 --num_processes=2 --process_id=1

Bad input (an unknown model, dataset or config key, a missing pretrained file, a batch
that does not divide over the devices) ends with a one-line error before any compute.
Every path may be a bucket (gs://...); one that cannot be reached is a one-line error too.
"""

import sys

from absl import app, flags, logging

import configs
from vit_jax import cli, distributed, hugepages

FLAGS = flags.FLAGS


def define_flags(flag_values: flags.FlagValues = FLAGS) -> None:
  """The command line's flags, on `flag_values` (defined at program start, not at import)."""
  fv = flag_values
  configs.define_config_flag(
    'config', 'Experiment config file, e.g. configs/vit.py:b16,cifar10.', flag_values=fv
  )
  flags.DEFINE_string(
    'workdir', None, 'Run directory (checkpoints, metrics, events).', flag_values=fv
  )
  flags.DEFINE_string(
    'coordinator_address',
    None,
    'HOST:PORT of process 0 (env JAX_COORDINATOR_ADDRESS).',
    flag_values=fv,
  )
  flags.DEFINE_integer(
    'num_processes', None, 'Processes in the run (env JAX_NUM_PROCESSES).', flag_values=fv
  )
  flags.DEFINE_integer(
    'process_id', None, 'This process, 0..num_processes-1 (env JAX_PROCESS_ID).', flag_values=fv
  )
  flags.DEFINE_enum(
    'distributed',
    'auto',
    list(distributed.MODES),
    'jax.distributed: auto (given settings, SLURM srun, TPU VM), on (always), off (never).',
    flag_values=fv,
  )
  flags.DEFINE_float(
    'distributed_timeout',
    distributed.DEFAULT_TIMEOUT_S,
    'Seconds to wait for the coordinator and every process before failing.',
    flag_values=fv,
  )
  flags.mark_flags_as_required(['config', 'workdir'], flag_values=fv)


def main(argv: list[str]) -> int:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  cli.quiet_logs()  # orbax and tfds log every step at INFO
  try:  # before anything asks JAX for its devices
    distributed.initialize(
      FLAGS.coordinator_address,
      FLAGS.num_processes,
      FLAGS.process_id,
      mode=FLAGS.distributed,
      timeout_s=FLAGS.distributed_timeout,
    )
  except distributed.DistributedError as e:
    _exit_with(e)
  import jax

  if jax.process_index() != 0:
    cli.quiet_logs(logging.ERROR)  # process 0 speaks for the run
  from vit_jax import data, train
  from vit_jax.train import spec

  data.hide_accelerators_from_tensorflow()

  try:
    config = FLAGS.config
    config.keys()  # a config file that failed to load raises only when first used
  except (OSError, ValueError, KeyError) as e:  # config_flags defers a file's load error
    _exit_with(e)
  try:
    run_spec = spec.from_config(config)  # the config, resolved once
    result = train.train_and_evaluate(run_spec, FLAGS.workdir)
  except (ValueError, FloatingPointError) as e:
    _exit_with(e)
  except OSError as e:  # a file or bucket that cannot be read or written: its own message
    print(f'Error: {" ".join(str(e).split()) or type(e).__name__}', file=sys.stderr)
    sys.exit(1)
  except jax.errors.JaxRuntimeError as e:
    distributed.collective_failed(e)  # several processes: one line, exit 1 (a peer died?)
    raise
  distributed.mark_finished()
  if result['status'] == 'done' and 'accuracy_test' in result and jax.process_index() == 0:
    print(
      f'Final test accuracy: {result["accuracy_test"]:.4f} '
      f'(top-5 {result["accuracy_test_top5"]:.4f})'
    )
  return 0


def _one_line(e: BaseException) -> str:
  """An exception's message on one line (a config file's own error, not its traceback)."""
  cause = e
  while cause is not None and not isinstance(cause, KeyError):
    cause = cause.__cause__ or cause.__context__
  if cause is not None and cause.args:  # an unknown config key, however absl wrapped it
    e = cause
  text = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
  lines = [line.strip() for line in text.splitlines() if line.strip()] or [type(e).__name__]
  if any(line.startswith('Traceback') for line in lines):
    return lines[-1].split(': ', 1)[-1]
  if isinstance(e, KeyError):  # ml_collections: "'bathc'" + 'Did you mean "batch" ...?'
    return f'Unknown config key {" ".join(lines)}'
  if isinstance(e, OSError):  # a config file that could not be loaded
    return f'Cannot load the config: {lines[-1]}'
  return ' '.join(lines)


def _exit_with(e: BaseException) -> None:
  print(f'Error: {_one_line(e)}', file=sys.stderr)
  sys.exit(1)


def _parse_flags(argv: list[str], flag_values: flags.FlagValues = FLAGS) -> list[str]:
  """Flag errors (unknown config key, bad override, bad config file) as one usage line."""
  try:
    return flag_values(argv)
  except (flags.Error, ValueError, KeyError, AttributeError, OSError) as e:
    raise app.UsageError(_one_line(e)) from e


def run_cli() -> None:
  """The `vit-train` console script (and `python -m vit_jax.main`)."""
  hugepages.reexec_with_huge_pages()
  cli.start(define_flags, main, _parse_flags)
