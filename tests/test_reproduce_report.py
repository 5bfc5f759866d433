"""The report: synthetic run directories in, the expected rows beside the paper's numbers out."""

import csv
import io
import json
import os

import numpy as np
import pytest
from matplotlib import image as mpimg

from vit_jax.reproduce import paper, report, vtab


def _run(root, name, accuracy, model='ViT-B_16', dataset='cifar10', ckpt='ViT-B_16.npz',
         dropout=0.0, test='test', train='train', steps=100, step=None, seed=0, crop=384,
         polyak=0.0, extra=None, fewshot=None):  # fmt: skip
  """A run folder; `extra`: more keys of the last evaluation line; `fewshot`: a last line."""
  folder = os.path.join(root, name)
  os.makedirs(folder)
  config = {
    'model_name': model,
    'model': {'transformer': {'dropout_rate': dropout}},
    'dataset': dataset,
    'pretrained_dir': '',
    'pretrained_path': '',
    'seed': seed,
    'base_lr': 0.01,
    'pp': {'train': train, 'test': test, 'crop': crop},
    'polyak_decay': polyak,
    'total_steps': steps,
    '_resolved': {'total_steps': steps, 'pretrained_path': ckpt},
  }
  with open(os.path.join(folder, 'config.json'), 'w') as f:
    json.dump(config, f)
  step = steps if step is None else step
  with open(os.path.join(folder, 'metrics.jsonl'), 'w') as f:
    f.write(json.dumps({'step': step // 2, 'accuracy_test': accuracy - 0.05}) + '\n')
    f.write(json.dumps({'step': step, 'loss': 0.01}) + '\n')
    f.write(json.dumps({'step': step, 'accuracy_test': accuracy, **(extra or {})}) + '\n')
    if fewshot:
      f.write(json.dumps({'step': step, **fewshot}) + '\n')
  return folder


@pytest.fixture
def runs(tmp_path):
  root = str(tmp_path / 'runs')
  # B/16 from the imagenet21k release on CIFAR-10, two seeds: Table 5 and the README.
  _run(root, 'b16_c10_s0', 0.9900, seed=0, ckpt='checkpoints/ViT-B_16.npz')
  _run(root, 'b16_c10_s1', 0.9890, seed=1, ckpt='checkpoints/ViT-B_16.npz')
  # L/16 from JFT on Pets, three seeds: Table 2 and Table 5.
  for seed, acc in enumerate((0.9720, 0.9735, 0.9741)):
    _run(root, f'l16_pets_{seed}', acc, model='ViT-L_16', dataset='oxford_iiit_pet',
         ckpt='jft/ViT-L_16.npz', seed=seed)  # fmt: skip
  # R50+B/16 (imagenet21k) on CIFAR-100 with dropout 0.1: the README's dropout=0.1 column only.
  _run(root, 'r50_c100', 0.9200, model='R50+ViT-B_16', dataset='cifar100',
       ckpt='gs-copy/imagenet21k/R50+ViT-B_16.npz', dropout=0.1)  # fmt: skip
  # A sweep's dev run (evaluated on part of train): never a test result.
  _run(root, 'sweep/dev/lr_0.01/seed_0', 0.9990, train='train[:98%]', test='train[98%:]')
  # The bundled digits from scratch: no published number.
  _run(root, 'digits', 0.9700, model='ViT-digits', dataset='digits', ckpt=None)
  # An unfinished run, and a folder that has not evaluated yet.
  _run(root, 'b32_c10_partial', 0.9800, model='ViT-B_32', step=50, ckpt='ViT-B_32.npz')
  os.makedirs(os.path.join(root, 'empty'))
  with open(os.path.join(root, 'empty', 'config.json'), 'w') as f:
    json.dump({'model_name': 'ViT-B_16'}, f)
  open(os.path.join(root, 'empty', 'metrics.jsonl'), 'w').close()
  return root


def test_rows_beside_the_paper(runs, tmp_path):
  rows, notes, text = report.report([runs], out=str(tmp_path / 'out' / 'ours'))
  got = [(r.model, r.pretrain, r.dataset, r.dropout, r.runs, r.source) for r in rows]
  assert got == [
    ('R50+ViT-B_16', 'imagenet21k', 'cifar100', 0.1, 1, 'README dropout=0.1'),
    ('ViT-B_16', 'imagenet21k', 'cifar10', 0.0, 2, 'Table 5'),
    ('ViT-B_16', 'imagenet21k', 'cifar10', 0.0, 2, 'README dropout=0.0'),
    ('ViT-B_32', 'imagenet21k', 'cifar10', 0.0, 1, 'Table 5'),
    ('ViT-B_32', 'imagenet21k', 'cifar10', 0.0, 1, 'README dropout=0.0'),
    ('ViT-L_16', 'jft300m', 'oxford_iiit_pet', 0.0, 3, 'Table 2'),
    ('ViT-L_16', 'jft300m', 'oxford_iiit_pet', 0.0, 3, 'Table 5'),
    ('ViT-digits', 'scratch', 'digits', 0.0, 1, ''),
  ]
  by = {(r.model, r.source): r for r in rows}
  b16 = by['ViT-B_16', 'Table 5']
  assert (b16.ours, b16.paper) == (pytest.approx(98.95), 98.95) and b16.diff == pytest.approx(0.0)
  assert by['ViT-B_16', 'README dropout=0.0'].diff == pytest.approx(98.95 - 99.02)
  assert b16.ours_std == pytest.approx(np.std([99.0, 98.9], ddof=1))
  l16 = by['ViT-L_16', 'Table 2']
  assert l16.ours == pytest.approx(np.mean([97.20, 97.35, 97.41]))
  assert (l16.paper, l16.paper_std) == (97.32, 0.11)
  assert by['R50+ViT-B_16', 'README dropout=0.1'].paper == 92.30
  assert by['ViT-digits', ''].paper is None and by['ViT-digits', ''].ours_std is None

  assert (
    '| ViT-B_16 | imagenet21k | CIFAR-10 | 0 | 2 | 98.95 ± 0.07 | Table 5 | 98.95 | +0.00 |' in text
  )
  l16_row = (
    '| ViT-L_16 | jft300m | Oxford-IIIT Pets | 0 | 3 | 97.32 ± 0.11 | Table 2 | 97.32 ± 0.11 |'
  )
  assert l16_row + ' +0.00 |' in text
  assert '| ViT-digits | scratch | digits | 0 | 1 | 97.00 | - | - | - |' in text
  assert 'sweep/dev/lr_0.01/seed_0' in notes[0] and 'development split' in notes[0]
  assert 'b32_c10_partial (step 50/100)' in notes[1]
  assert '99.90' not in text  # the dev accuracy is nowhere reported as a result

  out = tmp_path / 'out'
  parsed = list(csv.DictReader(io.StringIO((out / 'ours.csv').read_text())))
  assert len(parsed) == len(rows) and parsed[0]['source'] == 'README dropout=0.1'
  assert float(parsed[5]['paper']) == 97.32 and float(parsed[5]['diff']) == pytest.approx(0.0)
  assert parsed[-1]['paper'] == '' and parsed[-1]['diff'] == ''
  assert (out / 'ours.md').read_text().startswith('| model | pretrain | dataset |')
  png = mpimg.imread(str(out / 'ours.png'))
  assert png.ndim == 3 and png.shape[1] > png.shape[0] > 300  # 7 compared rows, wide


def test_vtab_runs_make_one_mean_row(tmp_path):
  root = str(tmp_path)
  rng = np.random.default_rng(1)
  accuracies = {}
  for name, task in vtab.TASKS.items():
    for seed in (0, 1):
      acc = float(rng.uniform(0.4, 0.95))
      accuracies.setdefault(name, []).append(acc)
      _run(root, f'vtab/{name}/seed_{seed}', acc, model='ViT-L_16', dataset=f'vtab/{name}',
           ckpt='imagenet21k/ViT-L_16.npz', test=task.test if seed else 'test',
           train='train800val200', seed=seed)  # fmt: skip
  _run(root, 'vtab/dtd/dev', 0.99, model='ViT-L_16', dataset='vtab/dtd', test='val200',
       train='train800', ckpt='imagenet21k/ViT-L_16.npz')  # fmt: skip
  rows, notes, _ = report.report([root])
  (row,) = rows
  expected = vtab.summarize(accuracies)
  assert (row.dataset, row.runs, row.source, row.paper) == ('vtab', 2, 'Table 2', 72.72)
  assert row.ours == pytest.approx(expected['mean']) and row.ours_std == pytest.approx(
    expected['std']
  )
  assert 'vtab/dtd/dev' in notes[0]


def test_infer_pretrain():
  infer = report.infer_pretrain
  assert infer(
    {'_resolved': {'pretrained_path': 'ckpt/ViT-B_16.npz'}, 'model_name': 'ViT-B_16'}
  ) == ('imagenet21k')
  assert infer({'pretrained_path': 'imagenet21k+imagenet2012/ViT-B_16.npz'}) == (
    'imagenet21k+imagenet2012'
  )
  assert infer({'pretrained_path': 'jft/L_16.npz'}) == 'jft300m'
  assert infer({'pretrained_path': 'i1k/ViT-B_16.npz'}) == 'imagenet2012'
  assert infer({'model_or_filename': 'B_16', 'pretrained_dir': 'augreg'}) == 'augreg'
  assert infer({'pretrained_dir': 'ckpt', 'model_name': 'ViT-B_32'}) == 'imagenet21k'
  assert infer({'pretrained_dir': '', 'pretrained_path': ''}) == 'scratch'
  assert infer({'pretrained_path': 'mine/finetuned.npz', 'model_name': 'ViT-B_16'}) == 'unknown'


def test_published_numbers():
  refs = paper.references('ViT-H_14', 'jft300m', 'imagenet2012')
  assert [(r.source, r.accuracy, r.std) for r in refs] == [
    ('Table 2', 88.55, 0.04),
    ('Table 5', 88.04, None),
  ]
  assert [r.accuracy for r in paper.references('ViT-L_32', 'imagenet21k', 'imagenet2012_real')] == [
    85.65
  ]
  readme = paper.references('ViT-L_16', 'imagenet21k', 'imagenet2012', dropout=0.1)
  assert [(r.source, r.accuracy) for r in readme] == [
    ('Table 2', 85.30),
    ('Table 5', 85.15),
    ('README dropout=0.1', 85.05),
  ]
  assert len([r for r in paper.REFERENCES if r.source == 'Table 5']) == 6 * (4 + 5 + 5)
  assert len([r for r in paper.REFERENCES if r.source.startswith('README')]) == 30


def test_bad_input_is_one_clear_error(tmp_path):
  with pytest.raises(ValueError, match='is not a directory'):
    report.report([str(tmp_path / 'missing')])
  with pytest.raises(ValueError, match='No evaluated runs under'):
    report.report([str(tmp_path)])
  folder = _run(str(tmp_path), 'bad', 0.5)
  with open(os.path.join(folder, 'metrics.jsonl'), 'a') as f:
    f.write('{"step": 3, "accuracy_test": \n')
  with pytest.raises(ValueError, match=r'bad/metrics.jsonl:4 is not JSON'):
    report.report([str(tmp_path)])


def test_polyak_real_and_fewshot_cells_beside_the_paper(tmp_path):
  """Table 2's ImageNet and ReaL cells (512 px, Polyak 0.9999) against a run in that setting,
  which reports its Polyak average; a plain 384 px run is marked as not like for like; the
  few-shot metric of a run from scratch on JFT beside Table 8."""
  root = str(tmp_path)
  polyak_line = {
    'accuracy_real': 0.9000, 'polyak/accuracy_test': 0.8780, 'polyak/accuracy_real': 0.9050,
  }  # fmt: skip
  _run(root, 'l16_i1k_512', 0.8700, model='ViT-L_16', dataset='imagenet2012', crop=512,
       polyak=0.9999, ckpt='jft/ViT-L_16.npz', extra=polyak_line)  # fmt: skip
  _run(root, 'l16_i1k_384', 0.8710, model='ViT-L_16', dataset='imagenet2012',
       ckpt='jft/ViT-L_16.npz', dropout=0.1)  # fmt: skip
  fewshot = {'fewshot/imagenet2012/5shot': 0.6300, 'fewshot/imagenet2012/5shot/l2_1024': 0.63}
  _run(root, 'b16_jft', 0.5, model='ViT-B_16', dataset='jft300m', ckpt=None, fewshot=fewshot)
  rows, _, text = report.report([root])
  by = {(r.dataset, r.source, r.dropout): r for r in rows}

  imagenet = by['imagenet2012', 'Table 2', 0.0]
  assert imagenet.ours == pytest.approx(87.80) and imagenet.paper == 87.76  # the average's
  assert 'not like' not in imagenet.note and 'Polyak 0.9999' in imagenet.note
  real = by['imagenet2012_real', 'Table 2', 0.0]
  assert (real.ours, real.paper) == (pytest.approx(90.50), 90.54)
  assert 'not like' not in real.note
  assert by['imagenet2012_real', 'Table 5', 0.0].note.startswith('not like for like')
  plain = by['imagenet2012', 'Table 2', 0.1]
  assert plain.ours == pytest.approx(87.10) and plain.note.startswith('not like for like')
  assert ('imagenet2012_real', 'Table 2', 0.1) not in by  # that run measured no ReaL

  few = by['fewshot/imagenet2012/5shot', 'Table 8', 0.0]
  assert (few.model, few.pretrain, few.ours, few.paper) == ('ViT-B_16', 'jft300m', 63.0, 64.206)
  assert '| ViT-B_16 | jft300m | ImageNet 5-shot linear | 0 | 1 | 63.00 | Table 8 |' in text
  assert not any('/l2_' in r.dataset for r in rows)
