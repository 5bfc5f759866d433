"""The Table 4 sweep: the protocol per dataset, selection on the dev split only, the local run."""

import json
import os

import numpy as np
import pytest

from configs import digits as digits_config
from vit_jax import data
from vit_jax.data import digits
from vit_jax.reproduce import sweep
from vit_jax.train.spec import with_overrides


def test_table4_protocols():
  c10 = sweep.make_sweep('cifar10')
  assert c10.lrs == (0.001, 0.003, 0.01, 0.03)
  assert (c10.fit_split, c10.dev_split, c10.train_split, c10.test_split) == (
    'train[:98%]',
    'train[98%:]',
    'train',
    'test',
  )
  i1k = sweep.make_sweep('imagenet2012', seeds=[0, 1, 2])
  assert i1k.lrs == (0.003, 0.01, 0.03, 0.06) and i1k.seeds == (0, 1, 2)
  assert (i1k.dev_split, i1k.test_split) == ('train[99%:]', 'validation')
  assert sweep.make_sweep('oxford_iiit_pet').dev_split == 'train[90%:]'
  assert sweep.make_sweep('oxford_flowers102').fit_split == 'train[:90%]'
  assert sweep.make_sweep('dtd', lrs=[0.01], dev_percent=20).dev_split == 'train[80%:]'
  with pytest.raises(ValueError, match="No Table 4 protocol for dataset 'dtd'"):
    sweep.make_sweep('dtd')
  with pytest.raises(ValueError, match='share data'):
    sweep.make_sweep('cifar10', test_split='train[99%:]')
  with pytest.raises(ValueError, match='dev_percent=0'):
    sweep.make_sweep('cifar10', dev_percent=0)


def test_digits_dev_holdout_split():
  source = data.DigitsSource()
  fit, dev = source.records('train[:90%]'), source.records('train[90%:]')
  assert source.num_examples('train[:90%]') == 1293 and source.num_examples('train[90%:]') == 144
  images, labels = digits.load('train')
  fit_labels = np.array([int(r['label']) for r in fit.as_numpy_iterator()])
  dev_labels = np.array([int(r['label']) for r in dev.as_numpy_iterator()])
  np.testing.assert_array_equal(np.concatenate([fit_labels, dev_labels]), labels)  # a partition
  assert source.num_examples('train[:1000]') == 1000 and source.num_examples('test[-60:]') == 60
  with pytest.raises(ValueError, match="Bad digits split 'train\\[90:%\\]'"):
    source.num_examples('train[90:%]')
  del images


def _fake_run(folder, split, accuracy, lr, steps=10, train='train[:90%]'):
  os.makedirs(folder, exist_ok=True)
  config = {
    'model_name': 'ViT-digits',
    'dataset': 'digits',
    'base_lr': lr,
    'pp': {'train': train, 'test': split},
    '_resolved': {'total_steps': steps},
  }
  with open(os.path.join(folder, 'config.json'), 'w') as f:
    json.dump(config, f)
  with open(os.path.join(folder, 'metrics.jsonl'), 'w') as f:
    f.write(json.dumps({'step': steps, 'loss': 0.1}) + '\n')
    f.write(json.dumps({'step': steps, 'accuracy_test': accuracy}) + '\n')


def test_selection_reads_dev_runs_only(tmp_path):
  s = sweep.make_sweep('digits', lrs=[0.001, 0.01], dev_seeds=[0, 1])
  w = str(tmp_path)
  # Dev: 0.001 is better on the dev split (mean 0.90 vs 0.85) ...
  for seed, (a, b) in enumerate([(0.91, 0.80), (0.89, 0.90)]):
    _fake_run(sweep.run_dir(w, 'dev', 0.001, seed), 'train[90%:]', a, 0.001)
    _fake_run(sweep.run_dir(w, 'dev', 0.01, seed), 'train[90%:]', b, 0.01)
  # ... while test runs at both rates exist and 0.01 is better on test: they must not count.
  _fake_run(sweep.run_dir(w, 'final', 0.001, 0), 'test', 0.70, 0.001, train='train')
  _fake_run(sweep.run_dir(w, 'final', 0.01, 0), 'test', 0.99, 0.01, train='train')
  assert sweep.dev_results(s, w) == {0.001: [0.91, 0.89], 0.01: [0.80, 0.90]}
  summary = sweep.summarize(s, w, 'ViT-digits')
  assert summary['selected_lr'] == 0.001
  assert summary['test'] == {'0': 0.70} and summary['test_mean'] == pytest.approx(0.70)
  text = sweep.write_summary(summary, w)
  assert '| 0.001 | 2 | 90.00 | yes |' in text and '| 0.01 | 2 | 85.00 |  |' in text
  assert 'Test top-1 at lr 0.001: 70.00 ± 0.00 % over 1 seed(s) (seed 0: 70.00).' in text
  assert json.loads((tmp_path / 'sweep.json').read_text())['selected_lr'] == 0.001
  # A dev directory that evaluated on test is refused, not used.
  _fake_run(sweep.run_dir(w, 'dev', 0.01, 1), 'test', 0.95, 0.01)
  with pytest.raises(ValueError, match="evaluated on 'test', not the dev split 'train\\[90%:\\]'"):
    sweep.dev_results(s, w)


def test_ties_go_to_the_first_rate_and_unfinished_runs_block_selection():
  assert sweep.select_lr({0.03: [0.5], 0.01: [0.5]}, [0.03, 0.01]) == 0.03
  with pytest.raises(ValueError, match=r'Dev runs not finished for lr 0\.01'):
    sweep.select_lr({0.03: [0.5]}, [0.03, 0.01])


def test_cluster_commands(tmp_path):
  s = sweep.make_sweep('cifar10', lrs=[0.01, 0.03])
  w = str(tmp_path)
  lines = sweep.commands('configs/vit.py:b16,cifar10', {'pretrained_dir': 'ckpt'}, s, w, 'dev')
  assert lines == [
    'python -m vit_jax.main --config=configs/vit.py:b16,cifar10 '
    f'--workdir={w}/dev/lr_{lr}/seed_0 --config.pretrained_dir=ckpt --config.base_lr={lr} '
    "--config.seed=0 '--config.pp.train=train[:98%]' '--config.pp.test=train[98%:]'"
    for lr in (0.01, 0.03)
  ]
  with pytest.raises(ValueError, match=r'Dev runs not finished for lr 0\.01, 0\.03'):
    sweep.commands('configs/vit.py:b16,cifar10', {}, s, w, 'final')
  _fake_run(sweep.run_dir(w, 'dev', 0.01, 0), 'train[98%:]', 0.97, 0.01)
  _fake_run(sweep.run_dir(w, 'dev', 0.03, 0), 'train[98%:]', 0.98, 0.03)
  assert sweep.commands('configs/vit.py:b16,cifar10', {}, s, w, 'dev') == []  # all finished
  (final,) = sweep.commands('configs/vit.py:b16,cifar10', {}, s, w, 'final')
  assert final.endswith(
    '--config.base_lr=0.03 --config.seed=0 --config.pp.train=train --config.pp.test=test'
  )


def test_run_gives_each_trainer_call_its_splits_and_rate(tmp_path):
  s = sweep.make_sweep('digits', lrs=[0.001, 0.01], seeds=[0, 1, 2])
  calls = []

  def trainer(config, workdir):
    calls.append((config.base_lr, config.seed, config.pp.train, config.pp.test))
    dev_accuracy = {0.001: 0.6, 0.01: 0.8}[config.base_lr]
    accuracy = dev_accuracy if config.pp.test != 'test' else 0.75 + 0.01 * config.seed
    _fake_run(workdir, config.pp.test, accuracy, config.base_lr, train=config.pp.train)
    return {'status': 'done'}

  summary = sweep.run(digits_config.get_config(), s, str(tmp_path), train_fn=trainer, log=print)
  assert calls == [
    (0.001, 0, 'train[:90%]', 'train[90%:]'),
    (0.01, 0, 'train[:90%]', 'train[90%:]'),
    (0.01, 0, 'train', 'test'),
    (0.01, 1, 'train', 'test'),
    (0.01, 2, 'train', 'test'),
  ]
  assert summary['selected_lr'] == 0.01
  assert summary['test_mean'] == pytest.approx(0.76) and summary['test_std'] == pytest.approx(0.01)


def test_a_preempted_run_stops_the_sweep(tmp_path):
  s = sweep.make_sweep('digits', lrs=[0.001, 0.01])
  calls = []

  def trainer(config, workdir):
    calls.append(workdir)
    return {'status': 'preempted'}

  summary = sweep.run(digits_config.get_config(), s, str(tmp_path), train_fn=trainer, log=print)
  assert len(calls) == 1 and summary['selected_lr'] is None


@pytest.mark.slow
def test_digits_sweep_selects_on_dev_and_reports_test(tmp_path, monkeypatch):
  read = []
  reader = data.DigitsSource.reader  # every read of a digits split goes through it

  def spy(self, split, *args, **kwargs):
    read.append(split)
    return reader(self, split, *args, **kwargs)

  monkeypatch.setattr(data.DigitsSource, 'reader', spy)
  config = with_overrides(
    digits_config.get_config(),
    {
      'total_steps': 40,
      'warmup_steps': 2,
      'batch': 64,
      'batch_eval': 144,
      'accum_steps': 1,
      'progress_every': 40,
      'checkpoint_every': 0,
      'model.hidden_size': 64,
      'model.transformer.mlp_dim': 128,
      'model.transformer.num_layers': 1,
    },
  )
  # Two rates: 1e-5 barely moves from the initialisation, 1e-2 learns.
  s = sweep.make_sweep('digits', lrs=[1e-5, 1e-2])
  w = str(tmp_path)
  log = []
  sweep.run(config, s, w, stage='dev', log=log.append)
  assert set(read) == {'train[:90%]', 'train[90%:]'}  # the test split was never read
  dev = sweep.dev_results(s, w)
  assert dev[1e-2][0] > dev[1e-5][0] + 0.1

  read.clear()
  summary = sweep.run(config, s, w, stage='final', log=log.append)
  assert set(read) == {'train', 'test'}
  assert summary['selected_lr'] == 1e-2
  final = json.loads((tmp_path / 'final' / 'lr_0.01' / 'seed_0' / 'config.json').read_text())
  assert (final['pp']['train'], final['pp']['test'], final['base_lr']) == ('train', 'test', 0.01)
  lines = (tmp_path / 'final' / 'lr_0.01' / 'seed_0' / 'metrics.jsonl').read_text().splitlines()
  test_accuracy = [json.loads(x) for x in lines if 'accuracy_test' in x][-1]['accuracy_test']
  assert summary['test'] == {'0': test_accuracy} and test_accuracy > 0.2  # chance: 0.1
  text = (tmp_path / 'summary.md').read_text()
  assert f'| 0.01 | 1 | {100 * dev[1e-2][0]:.2f} | yes |' in text
  assert f'Test top-1 at lr 0.01: {100 * test_accuracy:.2f} ± 0.00 %' in text
  # Running again keeps finished runs.
  sweep.run(config, s, w, stage='all', log=log.append)
  assert sum('finished earlier, kept' in line for line in log) == 3
