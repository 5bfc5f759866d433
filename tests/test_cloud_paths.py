"""gs:// paths end to end, against a real Cloud Storage API: the `gcp-storage-emulator` server
(with the download headers it leaves out added: tests/gcs_emulator.py).

The module starts the emulator on 127.0.0.1 and points the clients at it the way a user
would (environment variables, inherited by subprocesses): gcsfs (the path layer, through
etils.epath) with STORAGE_EMULATOR_HOST, tensorstore (orbax's arrays) with
TENSORSTORE_GCS_HTTP_URL. Every path below is an unchanged gs:// URL.
"""

import io
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from conftest import TINY, tiny_config
from PIL import Image

import vit_jax
from configs import augreg
from vit_jax import checkpoint, files, rundir, train
from vit_jax.cli import predict
from vit_jax.data import digits as digits_data
from vit_jax.inference import predict as inference_predict
from vit_jax.train import setup, spec

pytestmark = pytest.mark.slow  # a Cloud Storage emulator server

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUCKET = 'vit-test'
RUN = f'gs://{BUCKET}/run'
FAILURE_BOUND_S = 60  # a failing command's whole life, start-up included


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _wait_for_port(port: int, process: subprocess.Popen) -> None:
  deadline = time.monotonic() + 60
  while time.monotonic() < deadline:
    assert process.poll() is None, 'the storage emulator exited'
    try:
      socket.create_connection(('127.0.0.1', port), timeout=1).close()
      return
    except OSError:
      time.sleep(0.1)
  raise TimeoutError('the storage emulator did not start')


@pytest.fixture(scope='module')
def gcs():
  """The emulator with the bucket BUCKET; yields the gcsfs file system the tests inspect with."""
  port = _free_port()
  emulator = os.path.join(REPO, 'tests', 'gcs_emulator.py')
  process = subprocess.Popen(
    [sys.executable, emulator, 'start', '--host=127.0.0.1', f'--port={port}', '--in-memory'],
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
  )
  url = f'http://127.0.0.1:{port}'
  env = {
    'STORAGE_EMULATOR_HOST': url,
    'GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT': 'false',  # else a 60 s gRPC probe per bucket
    'EPATH_USE_TF': 'false',
    'TENSORSTORE_GCS_HTTP_URL': url,
  }
  with pytest.MonkeyPatch.context() as patch:
    for key, value in env.items():
      patch.setenv(key, value)
    try:
      _wait_for_port(port, process)
      import gcsfs

      fs = gcsfs.GCSFileSystem(token='anon')
      fs.mkdir(BUCKET)
      yield fs
    finally:
      process.kill()
      process.wait()


def _flat(params):
  return {
    '/'.join(str(k.key) for k in path): np.asarray(x)
    for path, x in jax.tree_util.tree_flatten_with_path(jax.device_get(params))[0]
  }


def _assert_trees_equal(a, b):
  fa, fb = _flat(a), _flat(b)
  assert fa.keys() == fb.keys()
  for k in fa:
    np.testing.assert_array_equal(fa[k], fb[k], err_msg=k)


def _deterministic(metrics):
  keys = ('step', 'loss', 'accuracy_test', 'loss_test', 'num_test')
  return [{k: m[k] for k in keys if k in m} for m in metrics]


@pytest.fixture(scope='module')
def bucket_run(gcs, reference_run):
  """The same run with its workdir in the bucket: stopped after step 3, then resumed."""
  config = tiny_config(profile_steps=1)  # a trace, traced locally and copied up; no number changes
  first = train.train_and_evaluate(config, RUN, stop_after=3)
  assert first['status'] == 'preempted' and first['step'] == 3
  assert rundir.latest_step(RUN) == 3
  second = train.train_and_evaluate(config, RUN)
  assert second['status'] == 'done' and second['step'] == 6
  return second


def _run(args, timeout=300, **env):
  return subprocess.run(
    [sys.executable, *args],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=timeout,
    env={**os.environ, **env},
  )


def test_a_run_in_a_bucket_resumes_exactly(gcs, reference_run, bucket_run):
  ref_dir, ref = reference_run
  _assert_trees_equal(bucket_run['params'], ref['params'])
  assert _deterministic(rundir.read_metrics(RUN)) == _deterministic(rundir.read_metrics(ref_dir))
  listing = {os.path.relpath(p, f'{BUCKET}/run') for p in gcs.find(f'{BUCKET}/run')}
  assert {'config.json', 'metrics.jsonl', 'curves.png'} <= listing
  assert {p.split('/')[1] for p in listing if p.startswith('checkpoints/')} == {'3', '6'}
  traces = [p for p in listing if p.startswith('plugins/profile/') and p.endswith('.xplane.pb')]
  assert len(traces) == 2  # one per part of the run
  assert all(gcs.size(f'{BUCKET}/run/{p}') > 1000 for p in traces)
  config = json.loads(gcs.cat(f'{BUCKET}/run/config.json'))
  assert config['_resolved']['class_names'] == [str(i) for i in range(10)]
  # The parameters as a reader of the bucket sees them (orbax through tensorstore's gcs store).
  _assert_trees_equal(checkpoint.load(RUN), ref['params'])


def test_tensorboard_events_in_the_bucket_hold_the_training_losses(gcs, bucket_run, tmp_path):
  """Read back by TensorFlow's own event reader from a local copy of the objects."""
  import tensorflow as tf

  names = [p for p in gcs.ls(f'{BUCKET}/run') if 'events.out.tfevents' in p]
  assert len(names) == 2  # one per process that trained: the first part and the resumed one
  losses = {}
  for name in names:
    local = tmp_path / os.path.basename(name)
    local.write_bytes(gcs.cat(name))
    for event in tf.compat.v1.train.summary_iterator(str(local)):
      for value in event.summary.value:
        if value.tag == 'loss':
          losses[event.step] = value.simple_value
  expected = {m['step']: m['loss'] for m in rundir.read_metrics(RUN) if 'loss' in m}
  assert sorted(losses) == [1, 2, 3, 4, 5, 6]
  np.testing.assert_allclose([losses[s] for s in expected], list(expected.values()), rtol=1e-6)


def _upload_digit_images(gcs, count: int) -> list[str]:
  images, _ = digits_data.load('test')
  urls = []
  for i in range(count):
    buffer = io.BytesIO()
    Image.fromarray(images[i]).save(buffer, format='PNG')
    url = f'gs://{BUCKET}/images/digit_{i}.png'
    gcs.pipe(url, buffer.getvalue())
    urls.append(url)
  return urls


def test_convert_and_predict_read_the_run_from_the_bucket(
  gcs, reference_run, bucket_run, tmp_path, capsys
):
  """The commands' own functions, in this process (the emulator's environment is set here)."""
  from vit_jax.cli import convert

  ref_dir, ref = reference_run
  npz = f'gs://{BUCKET}/out/digits.npz'
  convert.convert(RUN, npz, 'npz', out=lambda line: None)
  # The converted file read from the bucket: the run's final parameters.
  _assert_trees_equal(checkpoint.load(npz), ref['params'])

  urls = _upload_digit_images(gcs, 3)
  features = f'gs://{BUCKET}/out/features.npy'
  capsys.readouterr()
  status = predict.run(RUN, urls, resolution=TINY['pp.crop'], as_json=True, features=features)
  assert status == 0, capsys.readouterr().err
  stdout = capsys.readouterr().out
  # The same images from local files, through the local reference run: the same answers.
  local = []
  for url in urls:
    path = tmp_path / os.path.basename(url)
    path.write_bytes(gcs.cat(url))
    local.append(str(path))
  expected, errors = inference_predict.predict_files(
    vit_jax.load(ref_dir, resolution=8), local, 5, 32
  )
  assert not errors
  results = json.loads(stdout)['results']
  assert [r['image'] for r in results] == urls
  for result, want in zip(results, expected, strict=True):
    assert [p['class'] for p in result['predictions']] == want.indices.tolist()
    got = [p['probability'] for p in result['predictions']]
    np.testing.assert_allclose(got, want.probabilities, rtol=1e-6)
  want_features = np.stack([p.features for p in expected])
  with files.path(features).open('rb') as f:
    np.testing.assert_allclose(np.load(f), want_features, rtol=1e-6)


def test_a_pretrained_file_is_fitted_from_the_bucket(gcs, reference_run):
  """`load_pretrained` and `checkpoint.fit` read an .npz object (a new head, as fine-tuning)."""
  _, ref = reference_run
  url = f'gs://{BUCKET}/pretrained/tiny.npz'
  checkpoint.save_npz(jax.device_get(ref['params']), url)
  assert gcs.exists(url)
  fitted = checkpoint.fit(url)
  _assert_trees_equal(fitted.params, ref['params'])
  init = jax.tree.map(np.zeros_like, jax.device_get(ref['params']))
  model_config = spec.from_config(tiny_config()).model.fields
  loaded = checkpoint.load_pretrained(url, init, model_config, keep_head=False)
  flat, ref_flat = _flat(loaded), _flat(ref['params'])
  for key in flat:
    expected = np.zeros_like(flat[key]) if key.startswith('head/') else ref_flat[key]
    np.testing.assert_array_equal(flat[key], expected, err_msg=key)


def test_augreg_default_bucket_selects_its_file_by_index_csv(gcs):
  """configs/augreg.py unchanged: its default gs://vit_models/augreg, served by the emulator."""
  config = augreg.get_config('S_32')
  assert config.pretrained_dir == 'gs://vit_models/augreg'
  rows = [
    ('S_32-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0', 'i21k', '0.41'),
    ('S_32-i21k-300ep-lr_0.001-aug_none-wd_0.1-do_0.0-sd_0.0', 'i21k', '0.44'),
    ('S_32-i1k-300ep-lr_0.001-aug_none-wd_0.1-do_0.0-sd_0.0', 'i1k', '0.90'),
  ]
  gcs.mkdir('vit_models')
  text = '\n'.join(['filename,ds,final_val', *(','.join(r) for r in rows)]) + '\n'
  gcs.pipe('vit_models/augreg/index.csv', text.encode())
  best = f'gs://vit_models/augreg/{rows[1][0]}.npz'
  with pytest.raises(ValueError, match=f'Pretrained checkpoint {best} not found'):
    setup.resolve_pretrained_path(spec.from_config(config))
  gcs.pipe(best, b'')
  assert setup.resolve_pretrained_path(spec.from_config(config)) == best


def _one_line_error(result: subprocess.CompletedProcess, seconds: float, *names: str) -> str:
  assert result.returncode != 0
  assert seconds < FAILURE_BOUND_S, seconds
  lines = [line for line in result.stderr.splitlines() if line.strip()]
  errors = [line for line in lines if line.lower().startswith('error')]
  assert len(errors) == 1, result.stderr
  assert 'Traceback' not in result.stderr, result.stderr
  for name in names:
    assert name in errors[0], errors[0]
  return errors[0]


def _timed(args, **env):
  start = time.monotonic()
  result = _run(args, timeout=FAILURE_BOUND_S * 2, **env)
  return result, time.monotonic() - start


# An image that is there: vit-predict says a missing one before it reads the checkpoint.
IMAGE = 'docs/figures/digit_test0.png'
MAIN = [
  '-m',
  'vit_jax.main',
  '--config=configs/digits.py',
  *(f'--config.{k}={v}' for k, v in TINY.items()),
]


@pytest.mark.serial
@pytest.mark.parametrize(
  'args',
  [
    [*MAIN, f'--workdir={RUN}'],
    ['-m', 'vit_jax.predict', f'--checkpoint={RUN}', IMAGE],
    ['-m', 'vit_jax.convert', RUN, '/tmp/never.npz', '--to=npz'],
  ],
  ids=['main', 'predict', 'convert'],
)
def test_an_unreachable_bucket_is_one_line_naming_the_path(gcs, args):
  dead = f'http://127.0.0.1:{_free_port()}'  # nothing listens there
  result, seconds = _timed(args, STORAGE_EMULATOR_HOST=dead, TENSORSTORE_GCS_HTTP_URL=dead)
  line = _one_line_error(result, seconds, RUN)
  assert 'cannot be reached' in line


@pytest.mark.serial
def test_a_missing_object_is_one_line_naming_it(gcs, tmp_path):
  missing = f'gs://{BUCKET}/nothing/here.npz'
  result, seconds = _timed(
    [*MAIN, f'--workdir={tmp_path}/run', f'--config.pretrained_path={missing}']
  )
  _one_line_error(result, seconds, missing)
  result, seconds = _timed(['-m', 'vit_jax.predict', f'--checkpoint={missing}', IMAGE])
  _one_line_error(result, seconds, missing)
  result, seconds = _timed(['-m', 'vit_jax.convert', missing, str(tmp_path / 'x.npz'), '--to=npz'])
  _one_line_error(result, seconds, missing)
  assert not os.path.exists(tmp_path / 'x.npz')
  shutil.rmtree(tmp_path, ignore_errors=True)


def test_an_image_folder_in_the_bucket_reads_as_its_local_copy(gcs, tmp_path):
  from vit_jax import data as data_lib

  images, labels = digits_data.load('test')
  for split, rows in (('train', range(0, 6)), ('test', range(6, 9))):
    for i in rows:
      buffer = io.BytesIO()
      Image.fromarray(images[i]).save(buffer, format='PNG')
      relative = f'{split}/class_{labels[i] % 2}/{i}.png'
      gcs.pipe(f'{BUCKET}/folder/{relative}', buffer.getvalue())
      (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
      (tmp_path / relative).write_bytes(buffer.getvalue())
  bucket = data_lib.get_source(f'gs://{BUCKET}/folder')
  local = data_lib.get_source(str(tmp_path))
  assert bucket.class_names() == local.class_names() == ['class_0', 'class_1']
  for split in ('train', 'test'):
    assert bucket.num_examples(split) == local.num_examples(split)
    read = [
      [(source.decode(r['image']).numpy(), int(r['label'])) for r in source.records(split)]
      for source in (bucket, local)
    ]
    for (a, label_a), (b, label_b) in zip(*read, strict=True):
      np.testing.assert_array_equal(a, b)
      assert label_a == label_b


def test_tokenizer_vocabularies_in_the_bucket_read_as_their_local_copies(gcs, tmp_path):
  import text_vocabs

  from vit_jax import text

  local = {
    'bert': text_vocabs.write_bert_vocab(tmp_path / 'LiT-B16B.txt'),
    'sentencepiece': str(tmp_path / 'LiT-L16S.model'),
  }
  shutil.copy(
    os.path.join(os.path.dirname(__file__), 'data', 'sp_unigram.model'), local['sentencepiece']
  )
  texts = ['The cat sat on the mat!', 'Über café 中文 😀', '']
  for name, path in local.items():
    bucket_path = f'gs://{BUCKET}/lit/{os.path.basename(path)}'
    with open(path, 'rb') as f:
      gcs.pipe(bucket_path[len('gs://') :], f.read())
    np.testing.assert_array_equal(
      text.get_tokenizer(name, bucket_path, 16)(texts), text.get_tokenizer(name, path, 16)(texts)
    )
  missing = f'gs://{BUCKET}/lit/LiT-B16B_2.txt'
  with pytest.raises(FileNotFoundError, match=f'^{missing}: no such vocabulary file$'):
    text.get_tokenizer('bert', missing, 16)
