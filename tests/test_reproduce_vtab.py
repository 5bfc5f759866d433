"""VTAB-1k: the task table, label preprocessing, the report, every task config run on mock data."""

import functools
import json

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from tensorflow_datasets.testing import mocking

from configs import vtab as vtab_config
from vit_jax import data, rundir
from vit_jax.reproduce import vtab
from vit_jax.train.spec import with_overrides

pytestmark = pytest.mark.slow  # VTAB configs end to end


def test_nineteen_tasks_in_three_groups():
  assert len(vtab.TASKS) == 19
  groups = [t.group for t in vtab.TASKS.values()]
  assert (groups.count('natural'), groups.count('specialized'), groups.count('structured')) == (
    7,
    4,
    8,
  )
  assert vtab.tasks_in('specialized') == [
    'patch_camelyon',
    'eurosat',
    'resisc45',
    'diabetic_retinopathy',
  ]
  assert vtab.tasks_in('dtd,svhn,dtd') == ['dtd', 'svhn']
  with pytest.raises(ValueError, match="Unknown VTAB task 'clevr'"):
    vtab.tasks_in('clevr')


def test_standard_splits_and_classes():
  t = vtab.TASKS
  # 800 training examples first, 200 dev examples where the reference code cuts them.
  assert t['caltech101'].splits == {
    'train800': 'train[:800]',
    'val200': 'train[2754:2954]',  # 90% of the 3,060 tfds train examples
    'train800val200': 'train[:800]+train[2754:2954]',
    'test': 'test',
  }
  assert t['cifar100'].val200 == 'train[45000:45200]'
  assert t['oxford_iiit_pet'].val200 == 'train[2944:3144]'
  assert t['svhn'].val200 == 'train[65931:66131]'
  assert (t['eurosat'].val200, t['eurosat'].test) == ('train[16200:16400]', 'train[21600:]')
  assert (t['resisc45'].val200, t['resisc45'].test) == ('train[18900:19100]', 'train[25200:]')
  assert (t['clevr_count'].val200, t['clevr_count'].test) == ('train[63000:63200]', 'validation')
  assert (t['dsprites_location'].val200, t['dsprites_location'].test) == (
    'train[589824:590024]',
    'train[663552:]',
  )
  assert (t['smallnorb_azimuth'].val200, t['smallnorb_azimuth'].test) == (
    'test[:200]',
    'test[50%:]',
  )
  assert t['dmlab'].splits['train800val200'] == 'train[:800]+validation[:200]'
  classes = {name: task.num_classes for name, task in t.items()}
  assert classes == {
    'caltech101': 102,
    'cifar100': 100,
    'dtd': 47,
    'oxford_flowers102': 102,
    'oxford_iiit_pet': 37,
    'sun397': 397,
    'svhn': 10,
    'patch_camelyon': 2,
    'eurosat': 10,
    'resisc45': 45,
    'diabetic_retinopathy': 5,
    'clevr_count': 8,
    'clevr_distance': 6,
    'dmlab': 6,
    'kitti_distance': 4,
    'dsprites_location': 16,
    'dsprites_orientation': 16,
    'smallnorb_azimuth': 18,
    'smallnorb_elevation': 9,
  }
  # The tfds datasets' own label counts agree where the label is used as is.
  for name in ('caltech101', 'dtd', 'sun397', 'diabetic_retinopathy', 'dmlab', 'patch_camelyon'):
    features = tfds.builder(t[name].tfds_name).info.features
    assert features['label'].num_classes == t[name].num_classes, name


def _tensors(value):
  return (
    {k: _tensors(v) for k, v in value.items()} if isinstance(value, dict) else tf.constant(value)
  )


def _label(task, **record):
  return int(vtab.TASKS[task].label_fn(_tensors(record)))


def test_derived_labels():
  # CLEVR: 3..10 objects -> 0..7; closest object depth in bins (8, 8.5, 9, 9.5, 10).
  assert _label('clevr_count', objects={'size': [0, 1, 1, 0, 1]}) == 2
  coords = lambda depths: {'pixel_coords': [[0.0, 0.0, d] for d in depths]}
  assert _label('clevr_distance', objects=coords([12.0, 7.5])) == 0
  assert _label('clevr_distance', objects=coords([9.2, 11.0])) == 3
  assert _label('clevr_distance', objects=coords([10.5])) == 5
  # KITTI: closest car/van/truck (types 0-2) < 8 m, < 20 m, farther; no vehicle: 3.
  kitti = lambda types, z: {'type': types, 'location': [[0.0, 0.0, d] for d in z]}
  assert _label('kitti_distance', objects=kitti([3, 0, 1], [5.0, 15.0, 30.0])) == 1
  assert _label('kitti_distance', objects=kitti([2], [6.0])) == 0
  assert _label('kitti_distance', objects=kitti([1, 2], [45.0, 25.0])) == 2
  assert _label('kitti_distance', objects=kitti([3, 4, 7], [3.0, 4.0, 5.0])) == 3
  # dSprites: 32 x positions / 40 orientations into 16 bins.
  assert [_label('dsprites_location', label_x_position=x) for x in (0, 1, 2, 31)] == [0, 0, 1, 15]
  assert [_label('dsprites_orientation', label_orientation=o) for o in (0, 2, 3, 39)] == [
    0,
    0,
    1,
    15,
  ]
  assert _label('smallnorb_azimuth', label_azimuth=17) == 17
  assert _label('smallnorb_elevation', label_elevation=8) == 8
  assert _label('dtd', label=46) == 46


def test_dsprites_pixels_are_scaled_to_255():
  png = tf.io.encode_png(tf.constant(np.array([[[0], [1]]], np.uint8)))
  image = data.get_source('vtab/dsprites_location').decode(png).numpy()
  assert image.shape == (1, 2, 3)
  np.testing.assert_array_equal(image[0, :, 0], [0, 255])


def test_config_and_source_resolution():
  config = vtab_config.get_config('b16,clevr_distance')
  assert (config.dataset, config.pp.train, config.pp.test) == (
    'vtab/clevr_distance',
    'train800val200',
    'test',
  )
  assert (config.total_steps, config.base_lr, config.batch, config.pp.crop) == (
    2500,
    0.01,
    512,
    384,
  )
  assert config.model_name == 'ViT-B_16'
  source = data.get_source('vtab/clevr_distance')
  assert source.num_classes == 6
  assert source.tfds_split('train800val200') == 'train[:800]+train[63000:63200]'
  assert source.tfds_split('train') == 'train'  # anything else goes to tfds as is
  with pytest.raises(ValueError, match="Unknown VTAB task 'clever'"):
    vtab_config.get_config('b16,clever')
  with pytest.raises(ValueError, match="Unknown VTAB task 'nope'"):
    data.get_source('vtab/nope')


def _fake_as_dataset(self, split, decoders=None, read_config=None, **kwargs):
  """tfds mock data with every variable-length feature 10 long (the default random lengths
  differ between the fields of one sequence, which CLEVR's and KITTI's objects reject)."""
  del split, read_config, kwargs
  features = self.info.features
  if isinstance(decoders, tfds.decode.PartialDecoding):  # only the features asked for
    features, decoders = decoders.extract_features(features), decoders.decoders
  specs = features.get_serialized_info()
  generator = functools.partial(
    mocking.EncodedRandomFakeGenerator, features, 8, constant_dynamic_shape=True
  )
  ds = tf.data.Dataset.from_generator(
    generator,
    output_types=tf.nest.map_structure(lambda t: t.dtype, specs),
    output_shapes=tf.nest.map_structure(lambda t: t.shape, specs),
  )
  return ds.map(functools.partial(features.decode_example, decoders=decoders))


def _small(config, workdir_seed=0):
  """The task config on a 1-layer, 10-wide ViT at 16 px: a few fast steps."""
  config = with_overrides(
    config,
    {
      'total_steps': 2,
      'warmup_steps': 1,
      'batch': 8,
      'batch_eval': 8,
      'accum_steps': 1,
      'pp.crop': 16,
      'eval_every': 2,
      'progress_every': 1,
      'checkpoint_every': 0,
      'shuffle_buffer': 8,
      'pretrained_dir': '',
      'seed': workdir_seed,
    },
  )
  config.model.transformer.dropout_rate = 0.0
  return config


def test_every_task_config_trains_on_mock_data(tmp_path, capsys, monkeypatch):
  # Each finished run's curves.png is recorded, not drawn: 19 matplotlib renders were a fifth
  # of this test's time, and the drawing is tested in test_rundir.py and test_train.py.
  plotted = []
  monkeypatch.setattr(rundir, 'plot_curves', plotted.append)
  with tfds.testing.mock_data(as_dataset_fn=_fake_as_dataset):
    # The data of every task: labels inside the task's classes, images decoded to RGB.
    for name, task in vtab.TASKS.items():
      source = data.get_source(f'vtab/{name}')
      assert source.num_classes == task.num_classes
      assert source.num_examples('train800val200') == 8  # counted: mock data has no metadata
      pp = data.Data(pp=data.Pp(crop=16))
      batch = next(data.eval_dataset(source, 'test', local_batch=8, data=pp).as_numpy_iterator())
      assert batch['image'].shape == (8, 16, 16, 3), name
      assert batch['label'].min() >= 0 and batch['label'].max() < task.num_classes, name
    # Every task's config, two steps each, through the VTAB runner. One head width for all
    # (the largest task's, 397) so that the 19 runs share one compiled step.
    base = _small(vtab_config.get_config('testing,caltech101').unlock())
    base.num_classes = 397
    runs = tmp_path / 'vtab'
    summary = vtab.run_tasks(base, str(runs), list(vtab.TASKS), seeds=[0], log=lambda _: None)
  assert summary['complete'] and set(summary['tasks']) == set(vtab.TASKS)
  assert plotted == [str(runs / name / 'seed_0') for name in vtab.TASKS]  # every run finished
  for name in vtab.TASKS:
    folder = runs / name / 'seed_0'
    config = json.loads((folder / 'config.json').read_text())
    assert config['dataset'] == f'vtab/{name}'
    assert (config['pp']['train'], config['pp']['test']) == ('train800val200', 'test')
    assert (config['total_steps'], config['base_lr']) == (2, 0.01)
    lines = [json.loads(line) for line in (folder / 'metrics.jsonl').read_text().splitlines()]
    evaluation = [m for m in lines if 'accuracy_test' in m][-1]
    assert evaluation['step'] == 2 and evaluation['num_test'] == 8
    assert summary['tasks'][name]['mean'] == pytest.approx(100 * evaluation['accuracy_test'])
  report = (runs / 'vtab.md').read_text()
  assert '| natural | **mean** |' in report and '**mean of 19**' in report
  capsys.readouterr()


def test_summary_groups_and_seed_std():
  rng = np.random.default_rng(0)
  accuracies = {name: list(rng.uniform(0.5, 0.9, size=2)) for name in vtab.TASKS}
  s = vtab.summarize(accuracies)
  natural = [n for n, t in vtab.TASKS.items() if t.group == 'natural']
  assert s['groups']['natural'] == pytest.approx(
    100 * np.mean([np.mean(accuracies[n]) for n in natural])
  )
  assert s['mean'] == pytest.approx(100 * np.mean([np.mean(v) for v in accuracies.values()]))
  per_seed = [100 * np.mean([accuracies[n][i] for n in vtab.TASKS]) for i in range(2)]
  assert s['std'] == pytest.approx(np.std(per_seed, ddof=1))
  text = vtab.format_summary(s, vtab.paper_rows('ViT-L_16', 'imagenet21k'))
  assert (
    f'| paper | Table 2 ViT-L_16 imagenet21k | 3 | 72.72 ± 0.21 (ours {s["mean"] - 72.72:+.2f}) |'
    in text
  )
  del accuracies['dmlab']
  partial = vtab.summarize(accuracies)
  assert (
    not partial['complete'] and partial['mean'] is None and 'structured' not in partial['groups']
  )
  assert 'incomplete: 1 tasks missing' in vtab.format_summary(partial)


def test_commands_for_a_cluster(tmp_path):
  lines = vtab.commands(
    'configs/vtab.py:b16', {'pretrained_dir': 'ckpt'}, str(tmp_path), ['dtd', 'svhn'], [0, 1]
  )
  assert len(lines) == 4
  assert lines[0] == (
    f'python -m vit_jax.main --config=configs/vtab.py:b16 --workdir={tmp_path}/dtd/seed_0 '
    '--config.pretrained_dir=ckpt --config.dataset=vtab/dtd --config.seed=0'
  )
  assert '--config.dataset=vtab/svhn --config.seed=1' in lines[3]
  dev = vtab.commands('configs/vtab.py:b16', {}, str(tmp_path), ['dtd'], [0], dev=True)
  assert '--config.pp.train=train800 --config.pp.test=val200' in dev[0]
