"""predict: preprocessing, hand-set heads, class names, the zero-head warning, bad files, --json."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from PIL import Image

import vit_jax
from vit_jax import checkpoint, data
from vit_jax.checkpoint import class_names
from vit_jax.cli import predict
from vit_jax.data import images, preprocess
from vit_jax.inference import model as model_lib
from vit_jax.inference import predict as predict_lib
from vit_jax.models import get_model

REPO = Path(__file__).resolve().parents[1]
RESOLUTION = 32  # the 'testing' model: 16-pixel patches, a 2x2 grid


def _params(random_params, num_classes, resolution=RESOLUTION, seed=0):
  model = get_model('testing', num_classes=num_classes)
  x = np.zeros((1, resolution, resolution, 3), np.float32)
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), x, train=False))['params']
  return random_params(shapes, seed=seed)


def _save(params, path):
  checkpoint.save_npz(params, path)
  return str(path)


def _images(directory, n, seed=0):
  """`n` random RGB PNGs of different sizes; returns their paths."""
  rng = np.random.default_rng(seed)
  paths = []
  for i in range(n):
    path = Path(directory) / f'img{i}.png'
    Image.fromarray(rng.integers(0, 256, (20 + 7 * i, 30 + 3 * i, 3), dtype=np.uint8)).save(path)
    paths.append(str(path))
  return paths


def _eval_inputs(paths, resolution):
  """The input pipeline's evaluation tensors of image files (`preprocess.eval_image`)."""
  return np.stack([preprocess.eval_image(images.read_image(p), resolution).numpy() for p in paths])


def _reference_probs(params, paths, resolution=RESOLUTION):
  """Softmax of the full model (head included) applied directly: an independent path."""
  model = get_model('testing', num_classes=params['head']['kernel'].shape[1])
  x = _eval_inputs(paths, resolution)
  logits = np.asarray(model.apply({'params': params}, x, train=False), np.float64)
  e = np.exp(logits - logits.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def test_preprocess_matches_the_original_tf_image_resize():
  import tensorflow as tf

  rng = np.random.default_rng(0)
  models = {r: vit_jax.load('testing', resolution=r) for r in (24, 32, 224)}  # a classifier's
  for h, w, r in [(37, 53, 24), (480, 640, 224), (1000, 750, 224), (8, 8, 32), (224, 224, 224)]:
    image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    expected = (tf.image.resize(image, [r, r]).numpy() - 127.5) / 127.5
    (got,) = models[r].preprocess(image)
    assert got.shape == (r, r, 3) and got.dtype == np.float32
    # TF places the samples in float32, we in float64: at most 0.02 of a grey level apart.
    np.testing.assert_allclose(got, expected, atol=2e-4)


@pytest.mark.parametrize('suffix', ['.png', '.jpg', '.bmp'])
def test_an_image_file_becomes_the_tensor_the_eval_pipeline_makes(tmp_path, suffix):
  """The same file through a training run's evaluation pipeline and through predict."""
  folder = tmp_path / 'images' / 'test' / 'some_class'
  folder.mkdir(parents=True)
  path = folder / f'photo{suffix}'
  rng = np.random.default_rng(0)
  Image.fromarray(rng.integers(0, 256, (37, 53, 3), dtype=np.uint8)).save(path)
  source = data.FolderSource(str(tmp_path / 'images'))
  pp = data.Data(pp=data.Pp(crop=24))
  (batch,) = data.eval_dataset(source, 'test', local_batch=1, data=pp).as_numpy_iterator()
  errors = []
  model = vit_jax.load('testing', resolution=24)
  ((names, images),) = model_lib.image_batches(model, [str(path)], 1, errors)
  assert errors == [] and names == [str(path)] and images.shape == (1, 24, 24, 3)
  np.testing.assert_allclose(images[0], batch['image'][0], atol=1e-6, rtol=0)
  assert np.abs(images[0]).max() > 0.9  # a real image, not padding


@pytest.mark.slow
def test_a_text_file_named_like_an_image_is_one_line_and_no_log(tmp_path):
  """Not an image at all: the error names it, and nothing else reaches stderr (at a24f8ac
  TensorFlow's failed decode logged two lines of its own, written as the process ends)."""
  path = tmp_path / 'notes.jpg'
  path.write_text('these are notes, not pixels\n')
  code = f'from vit_jax.data import images\ntry:\n  images.read_image({str(path)!r})\n'
  code += 'except images.ImageError as e:\n  print(e)'
  env = {k: v for k, v in os.environ.items() if k != 'TF_CPP_MIN_LOG_LEVEL'}  # as a user's
  proc = subprocess.run(
    [sys.executable, '-c', code], cwd=REPO, capture_output=True, text=True, timeout=300, env=env
  )
  assert proc.stdout.startswith(f'{path}: cannot read image (cannot identify'), proc.stdout
  assert proc.stderr == ''


def test_read_image_converts_grey_and_rgba_to_rgb(tmp_path):
  Image.fromarray(np.full((5, 7), 200, np.uint8)).save(tmp_path / 'grey.png')
  Image.fromarray(np.full((5, 7, 4), 100, np.uint8)).save(tmp_path / 'rgba.png')
  grey = images.read_image(tmp_path / 'grey.png')
  rgba = images.read_image(tmp_path / 'rgba.png')
  assert grey.shape == rgba.shape == (5, 7, 3)
  assert (grey == 200).all() and (rgba == 100).all()


def test_hand_set_head_gives_its_classes_and_probabilities(tmp_path, random_params):
  params = _params(random_params, num_classes=5)
  # A zero kernel and bias log(p): every image gets exactly p, whatever the backbone says.
  p = np.array([0.0625, 0.5, 0.125, 0.25, 0.0625])
  params['head'] = {'kernel': np.zeros((10, 5), np.float32), 'bias': np.log(p).astype(np.float32)}
  loaded = vit_jax.load(_save(params, tmp_path / 'hand.npz'))
  predictions, errors = predict_lib.predict_files(loaded, _images(tmp_path, 2), k=3)
  assert errors == []
  for pred in predictions:
    assert pred.indices.tolist() == [1, 3, 2]
    np.testing.assert_allclose(pred.probabilities, [0.5, 0.25, 0.125], rtol=1e-6)
  assert loaded.class_names is None  # 5 classes, no run config: indices


def test_predictions_equal_the_full_model_in_any_batching(tmp_path, random_params):
  params = _params(random_params, num_classes=7, seed=1)
  paths = _images(tmp_path, 5)
  expected = _reference_probs(params, paths)
  loaded = vit_jax.load(_save(params, tmp_path / 'random.npz'))
  for batch_size in (2, 5, 32):
    predictions, _ = predict_lib.predict_files(loaded, paths, k=7, batch_size=batch_size)
    assert [p.image for p in predictions] == paths
    for pred, probs in zip(predictions, expected, strict=True):
      assert pred.indices.tolist() == np.argsort(-probs, kind='stable').tolist()
      np.testing.assert_allclose(pred.probabilities, probs[pred.indices], atol=1e-5)


def test_model_and_resolution_are_inferred_from_the_shapes(tmp_path, random_params):
  params = _params(random_params, num_classes=3, resolution=48)
  path = _save(params, tmp_path / 'r48.npz')
  loaded = vit_jax.load(path)
  assert (loaded.name, loaded.resolution, loaded.grid, loaded.num_classes) == (
    'testing',
    48,
    (3, 3),
    3,
  )
  bigger = vit_jax.load(path, resolution=64)  # position embeddings resized to 4x4
  assert bigger.grid == (4, 4)
  assert bigger.params['Transformer']['posembed_input']['pos_embedding'].shape == (1, 17, 10)


def test_a_model_that_does_not_fit_is_a_clear_error(tmp_path, random_params, capsys):
  path = _save(_params(random_params, num_classes=3), tmp_path / 't.npz')
  with pytest.raises(ValueError, match=r'--model ViT-Ti_16 does not fit .* holds testing'):
    vit_jax.load(path, model='ViT-Ti_16')
  assert predict.run(path, _images(tmp_path, 1), model_name='ViT-B_16') == 1
  err = capsys.readouterr().err
  assert err.count('\n') == 1 and 'hidden_size 10, 1 layers, 2 heads' in err
  missing = str(tmp_path / 'no_such.npz')
  assert predict.run(missing, _images(tmp_path, 1)) == 1
  err = capsys.readouterr().err
  assert err.startswith('error: ') and err.count(missing) == 1, err  # the path once


def test_1000_class_heads_get_the_imagenet_names(tmp_path, random_params):
  params = _params(random_params, num_classes=1000)
  bias = np.zeros(1000, np.float32)
  bias[281], bias[207] = 30.0, 29.0  # tabby cat first, golden retriever second
  params['head'] = {'kernel': np.zeros((10, 1000), np.float32), 'bias': bias}
  loaded = vit_jax.load(_save(params, tmp_path / 'in1k.npz'))
  assert loaded.class_names_source == 'ImageNet-1k (vit_jax package data)'
  assert loaded.class_names[0] == 'tench, Tinca tinca'
  (pred,), _ = predict_lib.predict_files(loaded, _images(tmp_path, 1), k=2)
  assert pred.names == ['tabby, tabby cat', 'golden retriever']
  np.testing.assert_allclose(pred.probabilities[0], 1 / (1 + np.exp(-1) + 998 * np.exp(-30)))


def test_the_imagenet_classes_are_package_data_as_tfds_source_text_gives_them():
  """The shipped file equals what the generating script reads off tfds' source text (ids
  from imagenet2012/labels.txt, names from the siscore literal); tabby cat is class 281."""
  import importlib.util
  from pathlib import Path

  from vit_jax.data import imagenet_classes

  wnids, names = imagenet_classes.read()
  root = Path(
    next(iter(importlib.util.find_spec('tensorflow_datasets').submodule_search_locations))
  )
  assert (wnids, names) == imagenet_classes._from_tfds(root)
  assert (wnids[281], names[281]) == ('n02123045', 'tabby, tabby cat')
  assert len(set(wnids)) == 1000


def test_a_run_directory_names_its_own_classes(tmp_path, random_params):
  run = tmp_path / 'run'
  (run / 'checkpoints').mkdir(parents=True)
  names = ['zero', 'one', 'two']
  (run / 'config.json').write_text(json.dumps({'dataset': {'class_names': names}}))
  params = _params(random_params, num_classes=3)
  loaded = vit_jax.load(_save(params, run / 'checkpoints' / 'final.npz'))
  assert loaded.class_names == names
  assert loaded.class_names_source == str(run / 'config.json')
  # A run that names a tfds dataset gets the names its builder declares (no data needed).
  (run / 'config.json').write_text(json.dumps({'dataset': 'oxford_iiit_pet'}))
  pets = class_names.beside(run / 'checkpoints' / 'final.npz', 37)[0]
  assert pets[:2] == ['Abyssinian', 'american_bulldog'] and len(pets) == 37
  # Hugging Face's placeholder labels (LABEL_0, ...) are no names.
  hf = tmp_path / 'hf'
  hf.mkdir()
  (hf / 'config.json').write_text(
    json.dumps({'id2label': {str(i): f'LABEL_{i}' for i in range(3)}})
  )
  assert class_names.beside(hf / 'x.npz', 3) == (None, 'indices')
  (hf / 'config.json').write_text(json.dumps({'id2label': {'1': 'b', '0': 'a', '2': 'c'}}))
  assert class_names.beside(hf / 'x.npz', 3)[0] == ['a', 'b', 'c']


def test_zero_head_warns_instead_of_predicting(tmp_path, random_params, capsys):
  params = _params(random_params, num_classes=21)
  params['head'] = jax.tree.map(np.zeros_like, params['head'])  # as the released in21k files
  path = _save(params, tmp_path / 'in21k.npz')
  images = _images(tmp_path, 2)
  assert predict.run(path, images) == 1
  out, err = capsys.readouterr()
  assert out == ''
  assert 'warning: the head of' in err and 'all zeros' in err and '--features' in err
  # Embeddings still work, and then nothing failed.
  features = tmp_path / 'emb.npy'
  assert predict.run(path, images, features=str(features)) == 0
  assert np.load(features, allow_pickle=False).shape == (2, 10)


def test_features_are_the_pre_logits_with_the_file_list(tmp_path, random_params):
  params = _params(random_params, num_classes=4, seed=2)
  path = _save(params, tmp_path / 'c.npz')
  images = _images(tmp_path, 3)
  out = tmp_path / 'feats' / 'emb.npy'
  assert predict.run(path, images, features=str(out), as_json=True) == 0
  features = np.load(out, allow_pickle=False)
  headless = get_model('testing', num_classes=None)
  x = _eval_inputs(images, RESOLUTION)
  backbone = {k: v for k, v in params.items() if k != 'head'}
  expected = headless.apply({'params': backbone}, x, train=False)
  assert features.shape == (3, 10) and features.dtype == np.float32
  np.testing.assert_allclose(features, expected, atol=1e-5)
  sidecar = json.loads(out.with_suffix('.json').read_text())
  assert sidecar['files'] == images and sidecar['shape'] == [3, 10]
  assert sidecar['model'] == 'testing' and sidecar['resolution'] == RESOLUTION
  assert not [p for p in out.parent.iterdir() if p.name.endswith('.tmp')]


@pytest.mark.slow
def test_cli_predicts_the_good_images_and_names_the_bad_one(tmp_path, random_params):
  params = _params(random_params, num_classes=6, seed=3)
  path = _save(params, tmp_path / 'm.npz')
  good = _images(tmp_path, 2)
  bad = tmp_path / 'broken.jpg'
  bad.write_bytes(b'\xff\xd8\xff\xe0 this is not really a jpeg')
  missing = tmp_path / 'missing.png'
  argv = ['--checkpoint', path, '--json', '--top_k', '2', good[0], str(bad), str(missing), good[1]]
  proc = subprocess.run(
    [sys.executable, '-m', 'vit_jax.predict', *argv],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
    env={**os.environ, 'JAX_PLATFORMS': 'cpu'},
  )
  assert proc.returncode == 1, proc.stderr
  errors = [line for line in proc.stderr.splitlines() if line.startswith('error:')]
  assert len(errors) == 2
  assert str(bad) in errors[0] and str(missing) in errors[1]
  report = json.loads(proc.stdout)
  assert [r['image'] for r in report['results']] == good
  assert report['model'] == 'testing' and report['num_classes'] == 6
  assert len(report['errors']) == 2
  expected = _reference_probs(params, good)
  for result, probs in zip(report['results'], expected, strict=True):
    top = result['predictions']
    assert [t['class'] for t in top] == np.argsort(-probs, kind='stable')[:2].tolist()
    np.testing.assert_allclose([t['probability'] for t in top], np.sort(probs)[::-1][:2], atol=1e-5)


def test_table_output(tmp_path, random_params, capsys):
  params = _params(random_params, num_classes=3)
  params['head'] = {
    'kernel': np.zeros((10, 3), np.float32),
    'bias': np.log([0.2, 0.7, 0.1]).astype(np.float32),
  }
  path = _save(params, tmp_path / 't.npz')
  (image,) = _images(tmp_path, 1)
  assert predict.run(path, [image], k=2) == 0
  lines = capsys.readouterr().out.splitlines()
  assert lines[0] == 'testing at 32 px, 3 classes (names: indices)'
  assert lines[1:] == [image, '  1.  70.00%      1', '  2.  20.00%      0']


def test_a_training_run_directory_predicts_with_its_class_names(tmp_path, random_params):
  import orbax.checkpoint as ocp

  run = tmp_path / 'run'
  params = _params(random_params, num_classes=3, seed=4)
  manager = ocp.CheckpointManager(run / 'checkpoints')
  manager.save(7, args=ocp.args.Composite(state=ocp.args.StandardSave({'params': params})))
  manager.wait_until_finished()
  manager.close()
  (run / 'config.json').write_text(json.dumps({'class_names': ['ant', 'bee', 'cat']}))
  paths = _images(tmp_path, 2)
  expected = _reference_probs(params, paths)
  for where in (run, run / 'checkpoints' / '7' / 'state'):
    loaded = vit_jax.load(where)
    assert loaded.class_names == ['ant', 'bee', 'cat']
    predictions, _ = predict_lib.predict_files(loaded, paths, k=1)
    for pred, probs in zip(predictions, expected, strict=True):
      assert pred.names == [['ant', 'bee', 'cat'][int(np.argmax(probs))]]
      np.testing.assert_allclose(pred.probabilities, [probs.max()], atol=1e-5)


@pytest.mark.slow
def test_features_block_writes_that_blocks_patch_tokens(tmp_path, random_params):
  params = _params(random_params, num_classes=4, resolution=64, seed=4)  # a 4x4 grid
  path = _save(params, tmp_path / 'c.npz')
  images = _images(tmp_path, 3)
  out = tmp_path / 'block.npy'
  assert predict.run(path, images, features=str(out), features_block=-1, batch_size=2) == 0
  grids = np.load(out, allow_pickle=False)
  assert grids.shape == (3, 4, 4, 10) and grids.dtype == np.float32
  assert json.loads(out.with_suffix('.json').read_text())['block'] == 0  # 'testing': one block
  # The block's output by hand: the unpooled model's tokens are LayerNorm(block output).
  unpooled = get_model('testing', num_classes=None, classifier='token_unpooled')
  x = _eval_inputs(images, 64)
  backbone = {k: v for k, v in params.items() if k != 'head'}
  tokens = np.asarray(unpooled.apply({'params': backbone}, x, train=False))[:, 1:]
  grid = grids.reshape(3, 16, 10).astype(np.float64)
  norm = params['Transformer']['encoder_norm']
  normed = (grid - grid.mean(-1, keepdims=True)) / np.sqrt(grid.var(-1, keepdims=True) + 1e-6)
  np.testing.assert_allclose(normed * norm['scale'] + norm['bias'], tokens, atol=1e-5)
  # One pass gives the block and the predictions: those of a run without the block.
  loaded = vit_jax.load(path)
  with_block, _ = predict_lib.predict_files(loaded, images, k=2, block=-1)
  without, _ = predict_lib.predict_files(loaded, images, k=2)
  for a, b in zip(with_block, without, strict=True):
    np.testing.assert_array_equal(a.indices, b.indices)
    np.testing.assert_allclose(a.probabilities, b.probabilities, atol=1e-6, rtol=0)
    np.testing.assert_allclose(a.features, b.features, atol=1e-6, rtol=0)


def test_features_block_out_of_range_is_a_one_line_error(tmp_path, random_params, capsys):
  path = _save(_params(random_params, num_classes=4), tmp_path / 'c.npz')
  images = _images(tmp_path, 1)
  assert predict.run(path, images, features=str(tmp_path / 'f.npy'), features_block=1) == 2
  err = capsys.readouterr().err.strip()
  assert 'not a block index of a model with 1 blocks' in err and '\n' not in err
  assert predict.run(path, images, features_block=0) == 2
  assert '--features OUT.npy' in capsys.readouterr().err
