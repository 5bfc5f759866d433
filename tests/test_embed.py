"""vit-embed over all 1,797 digits (`--split=train+test`) with the digits ViT (configs/digits.py,
random weights), against the model applied directly; a stop (an exception mid-write, a real
SIGTERM to the command mid-write) and a rerun, and two processes, equal one uninterrupted run
bit for bit; the digits as image files with unreadable ones among them: those listed, the others
embedded as the dataset's; vit-zeroshot's accuracy from the digits LiT's stored embeddings (its
image tower the digits ViT) is the one it gives on the images."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import jax
import numpy as np
import pytest
from conftest import digest, randomize, unreadable_files
from PIL import Image

import vit_jax
from configs import digits as digits_config
from configs import lit_digits
from vit_jax import checkpoint, families
from vit_jax.cli import embed
from vit_jax.data import digits, digits_text, embeddings, preprocess
from vit_jax.inference import embed as embed_lib
from vit_jax.models import model_from_config

VIT = digits_config.get_config().model  # 2x2 patches of the 8x8 digits, 4 blocks of width 64
RESOLUTION = 8
SPLIT = 'train+test'  # all 1,797 digits: 1,437 train then 360 test
COUNT = 1797
SHARD = 200  # 9 shards, the last of 197
SHARDS = [SHARD] * 8 + [COUNT - 8 * SHARD]
OPTIONS = {'dataset': 'digits', 'split': SPLIT, 'shard_size': SHARD, 'batch_size': 100}
ONE = dict(OPTIONS, process_index=0, process_count=1)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _names(shards) -> list[str]:
  """The file names of these shards of the 9."""
  kinds = (('embeddings', 'npy'), ('ids', 'json'))
  return [f'{kind}-{i:05d}-of-{len(SHARDS):05d}.{ext}' for kind, ext in kinds for i in shards]


def _digits() -> np.ndarray:
  """The 1,797 images, the train split's then the test split's."""
  return np.concatenate([digits.load('train')[0], digits.load('test')[0]])


@pytest.fixture(scope='module')
def classifier(tmp_path_factory):
  """The digits ViT with random weights: (its file, its parameters)."""
  shapes = families.param_shapes(model_from_config(VIT, num_classes=10), RESOLUTION)
  params = randomize(shapes, seed=4)
  path = str(tmp_path_factory.mktemp('model') / 'vit.npz')
  checkpoint.save_npz(params, path)
  return path, params


@pytest.fixture(scope='module')
def reference(classifier, tmp_path_factory):
  """One uninterrupted run over the 1,797 digits, in one process."""
  out = str(tmp_path_factory.mktemp('reference') / 'out')
  assert embed.run(classifier[0], out, ONE) == 0
  return out


def _pre_logits(params, images) -> np.ndarray:
  """The headless model applied directly to the images, resized as evaluation resizes them."""
  x = preprocess.eval_image(images, RESOLUTION).numpy()  # a batch at once
  backbone = {k: v for k, v in params.items() if k != 'head'}
  model = model_from_config(VIT, num_classes=None)
  return np.asarray(jax.jit(lambda x: model.apply({'params': backbone}, x, train=False))(x))


def test_digits_embeddings_are_the_pre_logits_in_shards(classifier, reference):
  manifest, array, ids = embeddings.read(reference)
  np.testing.assert_allclose(array, _pre_logits(classifier[1], _digits()), atol=1e-5)
  assert array.dtype == np.float32 and ids == list(range(COUNT))
  assert manifest['count'] == COUNT and manifest['dimension'] == VIT.hidden_size
  assert manifest['bad'] == [] and [s['count'] for s in manifest['shards']] == SHARDS
  layers, heads = VIT.transformer.num_layers, VIT.transformer.num_heads
  assert f'{layers} layers, {heads} heads' in manifest['model']  # read off the shapes
  assert manifest['kind'] == 'pre-logits'
  assert manifest['input'] == {'dataset': 'digits', 'split': SPLIT}
  assert sorted(os.listdir(reference)) == sorted(
    [*_names(range(len(SHARDS))), 'embed.json', 'manifest.json']
  )


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
  (out / '.embeddings-00003-of-00009.npy.x1y2.tmp').write_bytes(b'\x93NUMPY')
  (out / 'embeddings-00002-of-00009.npy').write_bytes(b'\x93NUMPY')
  shard, redone = embed_lib.embed_shard, []
  monkeypatch.setattr(embed_lib, 'embed_shard', lambda *a: redone.append(a[2]) or shard(*a))
  assert embed.run(classifier[0], str(out), ONE) == 0
  assert redone == list(range(2 * SHARD, COUNT, SHARD))  # the finished shards are not redone
  assert digest(out) == digest(reference)


# `python -m vit_jax.embed ARGS` run as the console script runs it, its fourth shard's
# embeddings write held half-way until a signal comes; the file named first says it is held.
HELD = textwrap.dedent("""
  import runpy, sys, time
  import numpy as np
  held, save, saved = sys.argv.pop(1), np.save, []
  def save_or_hold(f, array, **kwargs):
    if len(saved) == 3:
      f.write(b'\\x93NUMPY half')
      open(held, 'w').close()
      time.sleep(120)
    saved.append(len(array))
    save(f, array, **kwargs)
  np.save = save_or_hold
  runpy.run_module('vit_jax.embed', run_name='__main__', alter_sys=True)
""")


def test_a_sigterm_mid_write_then_a_rerun_equals_one_run(
  classifier, reference, tmp_path, monkeypatch
):
  """The command stopped by a real SIGTERM while it writes its fourth shard: the three
  finished shards kept, the one in flight's temporary file removed; the rerun ends as one
  uninterrupted run."""
  out, held = tmp_path / 'out', tmp_path / 'held'
  argv = [f'--checkpoint={classifier[0]}', f'--out={out}', *(f'--{k}={v}' for k, v in ONE.items())]
  env = dict(os.environ, JAX_PLATFORMS='cpu', CUDA_VISIBLE_DEVICES='')
  command = [sys.executable, '-c', HELD, str(held), *argv]
  proc = subprocess.Popen(command, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
  try:
    deadline = time.monotonic() + 120
    while not held.exists():
      assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
      time.sleep(0.02)
    assert [n for n in os.listdir(out) if n.endswith('.tmp')]  # the write in flight
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
  finally:
    proc.kill()
  assert sorted(os.listdir(out)) == sorted([*_names(range(3)), 'embed.json'])  # nothing partial
  shard, redone = embed_lib.embed_shard, []
  monkeypatch.setattr(embed_lib, 'embed_shard', lambda *a: redone.append(a[2]) or shard(*a))
  assert embed.run(classifier[0], str(out), ONE) == 0
  assert redone == list(range(3 * SHARD, COUNT, SHARD))  # the three finished shards are kept
  assert digest(out) == digest(reference)


def test_an_exported_model_embeds_as_its_checkpoint(classifier, reference, tmp_path):
  """vit-export's StableHLO (the model exported without its head: its features) read back by
  `--checkpoint=EXPORT_DIR`, preprocessed as export.json says: the checkpoint's pre-logits."""
  from vit_jax.export import export_model

  headless = str(tmp_path / 'headless.npz')
  checkpoint.save_npz({k: v for k, v in classifier[1].items() if k != 'head'}, headless)
  export_model(headless, tmp_path / 'exported', formats=('stablehlo',))
  out = str(tmp_path / 'out')
  assert embed.run(str(tmp_path / 'exported'), out, dict(ONE, split='test')) == 0
  manifest, array, ids = embeddings.read(out)
  test = len(digits.load('test')[1])  # the test split alone: the last 360 of the 1,797
  np.testing.assert_allclose(array, embeddings.read(reference)[1][-test:], rtol=0, atol=1e-6)
  assert ids == list(range(test)) and manifest['kind'] == 'features'
  assert [s['count'] for s in manifest['shards']] == [200, 160]


def test_two_processes_equal_one(classifier, reference, tmp_path):
  out = tmp_path / 'out'
  assert embed.run(classifier[0], str(out), dict(OPTIONS, process_index=1, process_count=2)) == 0
  odd = _names(range(1, len(SHARDS), 2))
  assert sorted(os.listdir(out)) == sorted([*odd, 'embed.json'])  # no manifest yet
  assert embed.run(classifier[0], str(out), dict(OPTIONS, process_index=0, process_count=2)) == 0
  assert digest(out) == digest(reference)


def test_the_digits_as_files_with_unreadable_ones_among_them(
  classifier, reference, tmp_path, capsys
):
  """The 1,797 digits as PNG files (ids 0000.png to 1796.png), and a JPEG cut in half, an empty
  file and a text file named .jpg sorted among them: those three listed with their reason, not
  fatal; the others' embeddings are the dataset's."""
  root = tmp_path / 'digits'
  root.mkdir()
  for i, image in enumerate(_digits()):
    Image.fromarray(image).save(root / f'{i:04d}.png')
  bad = [f'{i:04d}-{name}' for i, name in zip((0, 900, 1796), unreadable_files(), strict=True)]
  for name, content in zip(bad, unreadable_files().values(), strict=True):
    (root / name).write_bytes(content)
  out = str(tmp_path / 'out')
  assert embed.run(classifier[0], out, dict(ONE, dataset='', folder=str(root))) == 0
  manifest, array, ids = embeddings.read(out)
  assert ids == [f'{i:04d}.png' for i in range(COUNT)]
  assert [b['id'] for b in manifest['bad']] == bad
  assert all(b['reason'].startswith('cannot read image (') for b in manifest['bad'])
  # Rows move within their padded batches: the same numbers up to the order of XLA's sums.
  np.testing.assert_allclose(array, embeddings.read(reference)[1], rtol=0, atol=1e-6)
  # 1,800 files in 9 shards; the bad ones sort before 0000.png, 0900.png and 1796.png.
  assert [s['count'] for s in manifest['shards']] == [199, 200, 200, 200] * 2 + [199]
  assert '3 unreadable' in capsys.readouterr().err


def test_a_folder_of_jpegs_moves_the_progress_line_each_batch(classifier, tmp_path, capsys):
  """11 JPEGs of digits at 40 px and a truncated one, batches of 4: each embedding is the model
  on TensorFlow's decode and resize of its file (the input pipeline's), and the progress line
  moves after every batch (the unreadable file counts as done)."""
  import tensorflow as tf

  root = tmp_path / 'jpegs'
  root.mkdir()
  pixels = np.repeat(np.repeat(_digits()[:11], 5, axis=1), 5, axis=2)  # 8 px -> 40 px
  for i, image in enumerate(pixels):
    Image.fromarray(image).save(root / f'{i:02d}.jpg', quality=90)
  (root / '05-cut.jpg').write_bytes((root / '05.jpg').read_bytes()[:200])
  options = dict(ONE, dataset='', folder=str(root), batch_size=4, progress=True)
  assert embed.run(classifier[0], str(tmp_path / 'out'), options) == 0
  manifest, array, ids = embeddings.read(str(tmp_path / 'out'))
  assert ids == [f'{i:02d}.jpg' for i in range(11)]
  assert [b['id'] for b in manifest['bad']] == ['05-cut.jpg']
  decoded = [preprocess.decode(tf.io.read_file(str(root / name))).numpy() for name in ids]
  np.testing.assert_allclose(array, _pre_logits(classifier[1], np.stack(decoded)), atol=1e-6)
  err = capsys.readouterr().err
  shown = [line.split(',')[0] for line in err.replace('\r', '\n').splitlines() if line]
  # Of 12 files: 00-03; 04, the cut one, 05-07; 08-10.
  assert shown[:4] == ['embedded 4/12', 'embedded 9/12', 'embedded 12/12', '11 embeddings (64 wide']


def _lit_digits(directory) -> str:
  """The digits LiT (configs/lit_digits.py: the digits ViT, a BERT text tower) with random
  weights, as `vit-convert` writes a run of it: the .npz, and its vocabulary and the text
  tower's heads and zero-shot templates beside it."""
  model = lit_digits.get_config().model
  shapes = families.param_shapes(model_from_config(model), RESOLUTION, model.pp.max_len)
  path = str(directory / 'lit_digits.npz')
  checkpoint.save_npz(randomize(shapes, seed=5), path)
  templates = digits_text.HELD_OUT_TEMPLATES  # what the run's zero-shot evaluator uses
  uses = checkpoint.two_towers.Uses(str(digits_text.VOCAB), templates, canonicalize=False)
  checkpoint.two_towers.write_beside(path, families.of_config(model).stated_fields(model), uses)
  return path


def test_zeroshot_on_stored_embeddings_equals_zeroshot_on_the_images(tmp_path, capsys, monkeypatch):
  """vit-zeroshot's accuracy (the 1,797 digits) and recalls (a captions folder) from
  vit-embed's stored image embeddings of the digits LiT are those it gives on the images; and
  the LiT exported by vit-export embeds images and texts as its file."""
  from vit_jax.cli import zeroshot as zeroshot_cli
  from vit_jax.evals import zeroshot as zeroshot_eval
  from vit_jax.inference import zeroshot as zeroshot_lib

  lit = _lit_digits(tmp_path)
  out = str(tmp_path / 'out')
  assert embed.run(lit, out, ONE) == 0
  manifest, zimg, ids = embeddings.read(out)
  assert manifest['kind'] == 'image' and zimg.shape == (COUNT, 64) and ids == list(range(COUNT))
  loaded = vit_jax.load(lit)
  x = preprocess.input_op(loaded.preprocessing, _digits()).numpy()  # a batch at once
  expected = loaded.module.apply({'params': loaded.params}, images=x)[0]  # the model directly
  np.testing.assert_allclose(zimg, expected, atol=1e-5)
  options = {'json': True, 'cache_dir': '', 'batch_size': 100, 'split': SPLIT}
  capsys.readouterr()
  results = []
  embedded_again = lambda *a: pytest.fail('images embedded again')
  for extra in ({}, {'embeddings': out}):
    with monkeypatch.context() as m:
      if extra:
        m.setattr(zeroshot_lib, '_embed_split', embedded_again)
      assert zeroshot_cli.run(lit, [], dataset='digits', options={**options, **extra}) == 0
    results.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
  assert results[0] == results[1] and results[0]['count'] == COUNT
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
  options['split'] = 'test'
  assert zeroshot_cli.run(lit, [], dataset=folder, options=options) == 0
  results.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
  with monkeypatch.context() as m:  # no image embedded again
    m.setattr(zeroshot_lib, '_embed_split', embedded_again)
    stored = {**options, 'embeddings': str(tmp_path / 'pairs_emb')}
    assert zeroshot_cli.run(lit, [], dataset=folder, options=stored) == 0
  results.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
  assert results[2] == results[3] and results[2]['num_texts'] == 7
  # Texts: the tower's normalised embeddings of each line, ids the line numbers.
  texts = tmp_path / 'texts.txt'
  texts.write_text('a photo of the digit 3.\n\nthe number 7\n')
  assert embed.run(lit, str(tmp_path / 'texts'), {'texts': str(texts), 'process_count': 1}) == 0
  _, ztxt, ids = embeddings.read(str(tmp_path / 'texts'))
  tokens = loaded.tokenize(['a photo of the digit 3.', 'the number 7'])
  expected = zeroshot_eval.text_embedder(loaded.module)(loaded.params, tokens)
  assert ids == [1, 3]
  np.testing.assert_allclose(ztxt, expected, atol=1e-5)
  # The model exported (StableHLO alone) embeds as the checkpoint: images and texts.
  from vit_jax.export import export_model

  export_model(lit, tmp_path / 'exported', formats=('stablehlo',))
  exported = str(tmp_path / 'exported')
  test = len(digits.load('test')[1])  # the test split alone: the last of the 1,797
  assert embed.run(exported, str(tmp_path / 'ximg'), dict(ONE, split='test')) == 0
  assert embed.run(exported, str(tmp_path / 'xtxt'), {'texts': str(texts), 'process_count': 1}) == 0
  ximg = embeddings.read(str(tmp_path / 'ximg'))[1]
  np.testing.assert_allclose(ximg, zimg[-test:], rtol=0, atol=1e-6)
  np.testing.assert_allclose(embeddings.read(str(tmp_path / 'xtxt'))[1], ztxt, rtol=0, atol=1e-6)
