"""vit-embed: sharded, resumable embeddings of the digits and of image folders, against the model
applied directly; a stop (an exception mid-write, a real SIGTERM to the command) and a rerun,
and two processes, equal one uninterrupted run bit for bit; unreadable images are listed;
vit-zeroshot reads the stored embeddings."""

import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from conftest import digest, randomize, unreadable_files, write_image_folder

from vit_jax import checkpoint
from vit_jax.cli import embed
from vit_jax.data import digits, embeddings, preprocess
from vit_jax.models import get_model

RESOLUTION = 32  # the 'testing' model: 16-pixel patches, a 2x2 grid
SHARD = 100  # the 360 digits test images in 4 shards, the last of 60
OPTIONS = {'dataset': 'digits', 'split': 'test', 'shard_size': SHARD, 'batch_size': 50}
ONE = dict(OPTIONS, process_index=0, process_count=1)


def _names(shards, kinds=(('embeddings', 'npy'), ('ids', 'json')), of=4) -> list[str]:
  return [f'{kind}-{i:05d}-of-{of:05d}.{ext}' for kind, ext in kinds for i in shards]


@pytest.fixture(scope='module')
def classifier(tmp_path_factory):
  """A 'testing' ViT of random weights: (its file, its parameters)."""
  model = get_model('testing', num_classes=10)
  x = np.zeros((1, RESOLUTION, RESOLUTION, 3), np.float32)
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), x, train=False))['params']
  params = randomize(shapes, seed=4)
  path = str(tmp_path_factory.mktemp('model') / 'vit.npz')
  checkpoint.save_npz(params, path)
  return path, params


@pytest.fixture(scope='module')
def reference(classifier, tmp_path_factory):
  """One uninterrupted run over the digits test split, in one process."""
  out = str(tmp_path_factory.mktemp('reference') / 'out')
  assert embed.run(classifier[0], out, ONE) == 0
  return out


def _pre_logits(params, images) -> np.ndarray:
  """The headless model applied directly to the images, resized as evaluation resizes them."""
  x = np.stack([preprocess.eval_image(image, RESOLUTION).numpy() for image in images])
  backbone = {k: v for k, v in params.items() if k != 'head'}
  return np.asarray(
    get_model('testing', num_classes=None).apply({'params': backbone}, x, train=False)
  )


def test_digits_embeddings_are_the_pre_logits_in_shards(classifier, reference):
  manifest, array, ids = embeddings.read(reference)
  images, _ = digits.load('test')
  np.testing.assert_allclose(array, _pre_logits(classifier[1], images), atol=1e-5)
  assert array.dtype == np.float32 and ids == list(range(360))
  assert manifest['count'] == 360 and manifest['dimension'] == 10 and manifest['bad'] == []
  assert [s['count'] for s in manifest['shards']] == [100, 100, 100, 60]
  assert manifest['kind'] == 'pre-logits' and manifest['model'] == 'testing'
  assert manifest['input'] == {'dataset': 'digits', 'split': 'test'}
  assert sorted(os.listdir(reference)) == sorted([*_names(range(4)), 'embed.json', 'manifest.json'])


def test_a_stop_mid_write_then_a_rerun_equals_one_run(classifier, reference, tmp_path, monkeypatch):
  out = tmp_path / 'out'
  save, saved = np.save, []

  def save_then_stop(f, array, **kwargs):  # the third shard stops half-way through its .npy
    if len(saved) == 2:
      f.write(b'\x93NUMPY half')
      raise KeyboardInterrupt
    saved.append(len(array))
    save(f, array, **kwargs)

  monkeypatch.setattr(np, 'save', save_then_stop)
  with pytest.raises(KeyboardInterrupt):
    embed.run(classifier[0], str(out), ONE)
  monkeypatch.setattr(np, 'save', save)
  assert sorted(os.listdir(out)) == sorted([*_names([0, 1]), 'embed.json'])
  # What a kill leaves (no exception to clean up): a temporary file, embeddings without ids.
  (out / '.embeddings-00003-of-00004.npy.x1y2.tmp').write_bytes(b'\x93NUMPY')
  (out / 'embeddings-00002-of-00004.npy').write_bytes(b'\x93NUMPY')
  shard, redone = embed.embed_shard, []
  monkeypatch.setattr(embed, 'embed_shard', lambda *a: redone.append(a[2]) or shard(*a))
  assert embed.run(classifier[0], str(out), ONE) == 0
  assert redone == [200, 300]  # the finished shards are not redone
  assert digest(out) == digest(reference)


def test_a_sigterm_from_outside_then_a_rerun_equals_one_run(classifier, tmp_path, monkeypatch):
  """`python -m vit_jax.embed` stopped by a real SIGTERM while it waits on its last input (a
  FIFO: the process is there, deterministically, after three finished shards)."""
  root = write_image_folder(tmp_path / 'images', {'train': 9})
  fifo = os.path.join(root, 'zz.png')  # sorted last: shard 3 of [0, 3), [3, 6), [6, 9), [9]
  os.mkfifo(fifo)
  out, whole = tmp_path / 'out', tmp_path / 'whole'
  options = {'folder': root, 'shard_size': 3, 'batch_size': 3, 'process_index': 0}
  options['process_count'] = 1
  argv = [f'--{k}={v}' for k, v in options.items()]
  command = [sys.executable, '-m', 'vit_jax.embed', f'--checkpoint={classifier[0]}', f'--out={out}']
  env = dict(os.environ, JAX_PLATFORMS='cpu', CUDA_VISIBLE_DEVICES='')
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  proc = subprocess.Popen([*command, *argv], cwd=repo, env=env, stderr=subprocess.PIPE, text=True)
  try:
    deadline = time.monotonic() + 60
    while not (out / 'ids-00002-of-00004.json').exists():
      assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
      time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
  finally:
    proc.kill()
  assert sorted(os.listdir(out)) == sorted([*_names(range(3)), 'embed.json'])  # nothing partial
  os.unlink(fifo)
  write_image_folder(tmp_path / 'last', {'train': 1})
  os.rename(tmp_path / 'last/train/a/000.jpg', os.path.join(root, 'zz.png'))
  shard, redone = embed.embed_shard, []
  monkeypatch.setattr(embed, 'embed_shard', lambda *a: redone.append(a[2]) or shard(*a))
  assert embed.run(classifier[0], str(out), options) == 0
  assert redone == [9]  # the three finished shards are kept
  assert embed.run(classifier[0], str(whole), options) == 0
  assert digest(out) == digest(whole)


def test_an_exported_model_embeds_as_its_checkpoint(classifier, reference, tmp_path):
  """vit-export's StableHLO (the model exported without its head: its features) read back by
  `--checkpoint=EXPORT_DIR`, preprocessed as export.json says: the checkpoint's pre-logits."""
  from vit_jax.export import export_model

  headless = str(tmp_path / 'headless.npz')
  checkpoint.save_npz({k: v for k, v in classifier[1].items() if k != 'head'}, headless)
  export_model(headless, tmp_path / 'exported', formats=('stablehlo',), model='testing')
  out = str(tmp_path / 'out')
  assert embed.run(str(tmp_path / 'exported'), out, ONE) == 0
  manifest, array, ids = embeddings.read(out)
  expected = embeddings.read(reference)
  np.testing.assert_allclose(array, expected[1], rtol=0, atol=1e-6)
  assert ids == expected[2] and manifest['kind'] == 'features'
  assert [s['count'] for s in manifest['shards']] == [100, 100, 100, 60]


def test_two_processes_equal_one(classifier, reference, tmp_path):
  out = tmp_path / 'out'
  assert embed.run(classifier[0], str(out), dict(OPTIONS, process_index=1, process_count=2)) == 0
  assert sorted(os.listdir(out)) == sorted([*_names([1, 3]), 'embed.json'])  # no manifest yet
  assert embed.run(classifier[0], str(out), dict(OPTIONS, process_index=0, process_count=2)) == 0
  assert digest(out) == digest(reference)


def test_unreadable_images_are_listed_and_the_others_embedded(classifier, tmp_path, capsys):
  root = write_image_folder(tmp_path / 'images', {'train': 5}, bad=unreadable_files())
  out = str(tmp_path / 'out')
  options = {'folder': root, 'shard_size': 3, 'process_index': 0, 'process_count': 1}
  assert embed.run(classifier[0], out, options) == 0
  manifest, array, ids = embeddings.read(out)
  good = ['train/a/000.jpg', 'train/a/003.png', 'train/b/001.jpg', 'train/b/004.jpg']
  good.append('train/c/002.jpg')
  assert ids == good
  bad = ['train/a/empty.jpg', 'train/a/notes.jpg', 'train/a/truncated.jpg']
  assert [b['id'] for b in manifest['bad']] == bad
  assert all(b['reason'].startswith('cannot read image (') for b in manifest['bad'])
  images = [preprocess.read_image(os.path.join(root, p)) for p in good]
  np.testing.assert_allclose(array, _pre_logits(classifier[1], images), atol=1e-5)
  assert [s['count'] for s in manifest['shards']] == [2, 1, 2]  # 8 files, 3 a shard
  assert '3 unreadable' in capsys.readouterr().err


def test_zeroshot_on_stored_embeddings_equals_zeroshot_on_the_images(tmp_path, capsys, monkeypatch):
  """vit-zeroshot's accuracy (digits) and recalls (a captions folder) from vit-embed's stored
  image embeddings are those it gives on the images; and an image-text model exported by
  vit-export embeds images and texts as its file."""
  from test_zeroshot import write_lit_file

  from vit_jax.cli import zeroshot as zeroshot_cli
  from vit_jax.evals import zeroshot as zeroshot_eval

  lit = str(write_lit_file(tmp_path))
  out = str(tmp_path / 'out')
  assert embed.run(lit, out, ONE) == 0
  manifest, zimg, ids = embeddings.read(out)
  assert manifest['kind'] == 'image' and zimg.shape == (360, 32) and ids == list(range(360))
  loaded = zeroshot_cli.load(lit)
  x = np.stack([loaded.preprocess(image).numpy() for image in digits.load('test')[0]])
  expected = loaded.model.apply({'params': loaded.params}, images=x)[0]  # the model directly
  np.testing.assert_allclose(zimg, expected, atol=1e-5)
  options = {'json': True, 'cache_dir': '', 'batch_size': 50}
  capsys.readouterr()
  results = []
  embedded_again = lambda *a: pytest.fail('images embedded again')
  for extra in ({}, {'embeddings': out}):
    with monkeypatch.context() as m:
      if extra:
        m.setattr(zeroshot_cli, '_embed_split', embedded_again)
      assert zeroshot_cli.run(lit, [], dataset='digits', options={**options, **extra}) == 0
    results.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
  assert results[0] == results[1] and results[0]['count'] == 360
  # Retrieval over a captions folder's split from stored image embeddings: the same recalls.
  from conftest import jpeg_bytes

  from vit_jax.data import captions

  pairs = tmp_path / 'pairs' / 'test'
  pairs.mkdir(parents=True)
  rng = np.random.default_rng(0)
  for i in range(6):
    (pairs / f'{i}.jpg').write_bytes(jpeg_bytes(rng, 12 + i, 10))
  lines = [f'{i}.jpg\tthe digit {i}' for i in range(6)] + ['2.jpg\ta two']
  (pairs / captions.CAPTIONS_FILE).write_text('\n'.join(lines) + '\n')
  folder = str(tmp_path / 'pairs')
  stored = {'dataset': folder, 'split': 'test', 'process_count': 1}
  assert embed.run(lit, str(tmp_path / 'pairs_emb'), stored) == 0
  assert zeroshot_cli.run(lit, [], dataset=folder, options=options) == 0
  results.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
  with monkeypatch.context() as m:  # no image embedded again
    m.setattr(zeroshot_cli, '_embed_split', embedded_again)
    stored = {**options, 'embeddings': str(tmp_path / 'pairs_emb')}
    assert zeroshot_cli.run(lit, [], dataset=folder, options=stored) == 0
  results.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
  assert results[2] == results[3] and results[2]['num_texts'] == 7
  # Texts: the tower's normalised embeddings of each line, ids the line numbers.
  texts = tmp_path / 'texts.txt'
  texts.write_text('a photo of a cat\n\nthe dog\n')
  assert embed.run(lit, str(tmp_path / 'texts'), {'texts': str(texts), 'process_count': 1}) == 0
  _, ztxt, ids = embeddings.read(str(tmp_path / 'texts'))
  tokens = np.asarray(loaded.tokenizer(['a photo of a cat', 'the dog']), np.int32)
  expected = zeroshot_eval.text_embedder(loaded.model)(loaded.params, tokens)
  assert ids == [1, 3]
  np.testing.assert_allclose(ztxt, expected, atol=1e-5)
  # The model exported (StableHLO alone) embeds as the checkpoint: images and texts.
  from vit_jax.export import export_model

  export_model(lit, tmp_path / 'exported', formats=('stablehlo',))
  exported = str(tmp_path / 'exported')
  assert embed.run(exported, str(tmp_path / 'ximg'), ONE) == 0
  assert embed.run(exported, str(tmp_path / 'xtxt'), {'texts': str(texts), 'process_count': 1}) == 0
  np.testing.assert_allclose(embeddings.read(str(tmp_path / 'ximg'))[1], zimg, rtol=0, atol=1e-6)
  np.testing.assert_allclose(embeddings.read(str(tmp_path / 'xtxt'))[1], ztxt, rtol=0, atol=1e-6)
