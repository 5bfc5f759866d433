r"""Reproduces the paper's tables: `python -m vit_jax.reproduce COMMAND [flags]`.

  compute   Table 6's pretraining exaFLOPs from the code, beside the paper's.
            python -m vit_jax.reproduce compute [--csv]
  sweep     Table 4's protocol for one model and dataset: LR grid on a dev split, selection,
            final runs on the full training split, test top-1 mean ± std over seeds.
            python -m vit_jax.reproduce sweep --config=configs/vit.py:b16,cifar10 \
                --workdir=runs/sweep_b16_c10 --config.pretrained_dir=checkpoints --seeds=0,1,2
            (--stage=dev|final --print_commands prints the runs for a cluster instead)
  vtab      The 19 VTAB-1k tasks, 2500 steps at lr 0.01, and their grouped report.
            python -m vit_jax.reproduce vtab --config=configs/vtab.py:b16 --workdir=runs/vtab_b16 \
                --config.pretrained_dir=checkpoints [--tasks=natural] [--print_commands]
  report    Accuracies of any run directories beside Tables 2 and 5 and the original README.
            python -m vit_jax.reproduce report runs/ [--out=reports/ours] [--csv]
  lit_digits  The digits LiT (configs/lit_digits.py) over seeds: zero-shot and retrieval on the
            test digits, beside the locked ViT's classifier (docs/image-text.md).
            python -m vit_jax.reproduce lit_digits --image_run=runs/digits \
                --workdir=runs/lit_digits_seeds --seeds=0,1,2

Errors (an unknown dataset or task, unfinished dev runs, no runs found) end with one line
on stderr and exit status 1; usage errors (no command, a missing --config or --workdir) with
exit status 2.
"""

import sys

from absl import app, flags
from ml_collections import config_flags

import configs
from vit_jax import cli, hugepages

COMMANDS = ('compute', 'sweep', 'vtab', 'report', 'lit_digits')
FLAGS = flags.FLAGS


def define_flags(flag_values: flags.FlagValues = FLAGS) -> None:
  """The command line's flags, on `flag_values` (defined at program start, not at import)."""
  fv = flag_values
  configs.define_config_flag(
    'config',
    'Experiment config (sweep, vtab), e.g. configs/vit.py:b16,cifar10.',
    lock_config=False,
    flag_values=fv,
  )
  flags.DEFINE_string(
    'workdir', None, 'Sweep or VTAB folder (holds one run dir per run).', flag_values=fv
  )
  flags.DEFINE_list(
    'lrs', None, 'sweep: learning-rate grid (default: the paper Table 4 grid).', flag_values=fv
  )
  flags.DEFINE_list(
    'seeds', ['0'], 'sweep: seeds of the final runs; vtab: seeds per task.', flag_values=fv
  )
  flags.DEFINE_list('dev_seeds', ['0'], 'sweep: seeds of the dev runs, per lr.', flag_values=fv)
  flags.DEFINE_integer(
    'dev_percent', None, 'sweep: % of train held out as dev split.', flag_values=fv
  )
  flags.DEFINE_enum(
    'stage',
    'all',
    ['dev', 'final', 'all', 'summary'],
    'sweep: what to run; vtab: summary = report only.',
    flag_values=fv,
  )
  flags.DEFINE_bool(
    'print_commands', False, 'sweep, vtab: print `vit_jax.main` commands.', flag_values=fv
  )
  flags.DEFINE_string(
    'tasks', 'all', 'vtab: all, a group, or a comma-separated task list.', flag_values=fv
  )
  flags.DEFINE_bool(
    'vtab_dev', False, 'vtab: train on train800, evaluate on val200.', flag_values=fv
  )
  flags.DEFINE_string(
    'pretrain',
    None,
    'report, vtab: upstream data of the checkpoint (imagenet21k, jft300m, ...).',
    flag_values=fv,
  )
  flags.DEFINE_string(
    'out', '', 'report, compute: also write OUT.md, OUT.csv (report: OUT.png).', flag_values=fv
  )
  flags.DEFINE_bool('csv', False, 'report, compute: print CSV instead of markdown.', flag_values=fv)
  flags.DEFINE_string(
    'image_run', 'runs/digits', 'lit_digits: the digits ViT run it locks.', flag_values=fv
  )


def _config():
  if FLAGS.config is None:
    raise app.UsageError('--config is required, e.g. --config=configs/vit.py:b16,cifar10.')
  if not FLAGS.workdir:
    raise app.UsageError('--workdir is required: the folder that holds the runs.')
  return FLAGS.config


def _user_overrides() -> dict:
  return dict(config_flags.get_override_values(FLAGS['config']))


def _config_arg() -> str:
  return config_flags.get_config_filename(FLAGS['config'])


def _compute() -> None:
  from vit_jax.reproduce import compute

  rows = compute.table6()
  text = compute.format_markdown(rows)
  csv_text = compute.format_csv(rows)
  print(csv_text if FLAGS.csv else text)
  if not FLAGS.csv:
    print(
      f'\nexaFLOPs = 3 x forward FLOPs per image (forward + backward) x epochs x '
      f'{compute.JFT_IMAGES / 1e6:.0f}M JFT-300M images, at {compute.PRETRAIN_RESOLUTION} px with '
      f'the pretraining head ({compute.JFT_CLASSES:,} classes).'
    )
  if FLAGS.out:
    from vit_jax import files

    files.atomic_write_text(FLAGS.out + '.md', text + '\n')
    files.atomic_write_text(FLAGS.out + '.csv', csv_text)


def _sweep() -> None:
  from vit_jax.reproduce import sweep

  config = _config()
  spec = sweep.make_sweep(
    config.dataset,
    lrs=[float(x) for x in FLAGS.lrs] if FLAGS.lrs else None,
    seeds=[int(s) for s in FLAGS.seeds],
    dev_seeds=[int(s) for s in FLAGS.dev_seeds],
    dev_percent=FLAGS.dev_percent,
  )
  if FLAGS.print_commands:
    ignored = sorted(set(_user_overrides()) & {'base_lr', 'seed', 'pp.train', 'pp.test'})
    if ignored:
      print(
        f'# the sweep sets {", ".join(ignored)} itself; your values are ignored', file=sys.stderr
      )
    overrides = {k: v for k, v in _user_overrides().items() if k not in ignored}
    lines = sweep.commands(_config_arg(), overrides, spec, FLAGS.workdir, FLAGS.stage)
    print('\n'.join(lines) if lines else f'# every {FLAGS.stage} run has finished')
    if FLAGS.stage == 'dev':
      print('# when these are done: the same command with --stage=final --print_commands')
    return
  sweep.run(config, spec, FLAGS.workdir, FLAGS.stage)


def _vtab() -> None:
  from vit_jax.reproduce import vtab

  config = _config()
  tasks = vtab.tasks_in(FLAGS.tasks)
  seeds = [int(s) for s in FLAGS.seeds]
  if FLAGS.pretrain:
    pretrain = FLAGS.pretrain
  else:
    from vit_jax.reproduce.report import infer_pretrain

    pretrain = infer_pretrain(config.to_dict())
  if FLAGS.print_commands:
    overrides = {k: v for k, v in _user_overrides().items() if k not in ('dataset', 'seed')}
    lines = vtab.commands(_config_arg(), overrides, FLAGS.workdir, tasks, seeds, FLAGS.vtab_dev)
    print('\n'.join(lines) if lines else '# every run has finished')
    print(
      f'# report: python -m vit_jax.reproduce vtab ... --workdir={FLAGS.workdir} --stage=summary'
    )
    return
  if FLAGS.stage == 'summary':
    vtab.write_report(FLAGS.workdir, seeds, config.get('model_name', ''), pretrain)
    return
  vtab.run_tasks(config, FLAGS.workdir, tasks, seeds, FLAGS.vtab_dev, pretrain)


def _report(paths: list[str]) -> None:
  from vit_jax.reproduce import report

  if not paths:
    raise app.UsageError('report: give one or more run directories (or folders holding them).')
  rows, _, text = report.report(paths, FLAGS.out, FLAGS.pretrain)
  print(report.format_csv(rows) if FLAGS.csv else text)
  if FLAGS.out:
    print(f'\nWrote {FLAGS.out}.md, {FLAGS.out}.csv and {FLAGS.out}.png', file=sys.stderr)


def _lit_digits() -> None:
  from vit_jax.reproduce import lit_digits

  workdir = FLAGS.workdir or 'runs/lit_digits_seeds'  # runs/lit_digits: the docs' one run
  print(lit_digits.report(FLAGS.image_run, workdir, [int(s) for s in FLAGS.seeds]))


def main(argv: list[str]) -> int:
  if len(argv) < 2 or argv[1] not in COMMANDS:
    given = f', not {argv[1]!r}' if len(argv) > 1 else ''
    raise app.UsageError(f'give a command: one of {", ".join(COMMANDS)}{given}')
  cli.quiet_logs()  # keep the library's INFO lines (orbax) out of the tables
  command, rest = argv[1], argv[2:]
  if rest and command != 'report':
    raise app.UsageError(f'unexpected arguments {" ".join(rest)}')
  try:
    if command == 'compute':
      _compute()
    elif command == 'sweep':
      _sweep()
    elif command == 'vtab':
      _vtab()
    elif command == 'lit_digits':
      _lit_digits()
    else:
      _report(rest)
  except (ValueError, FloatingPointError, FileNotFoundError) as e:
    print(f'Error: {str(e).strip().splitlines()[0]}', file=sys.stderr)
    return 1
  return 0


def _parse_flags(argv: list[str], flag_values: flags.FlagValues = FLAGS) -> list[str]:
  """Flag errors (a bad override, a config file that fails) as one usage line."""
  try:
    return flag_values(argv)
  except (flags.Error, ValueError, KeyError, AttributeError) as e:
    raise app.UsageError(str(e).strip().splitlines()[0]) from e


def run_cli() -> None:
  """The `vit-reproduce` console script (and `python -m vit_jax.reproduce`)."""
  hugepages.reexec_with_huge_pages()
  cli.start(define_flags, main, _parse_flags)
