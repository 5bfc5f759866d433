"""Image-text training (task='contrastive'): LiT's locked tower, exact resume after SIGTERM,
2 processes x 4 devices == 1 x 8, jit == shard_map == a numpy loss on 8 devices, captions
data, the configs on mock data."""

import copy
import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from conftest import assert_run_reads_back, jpeg_bytes, randomize
from PIL import Image
from scipy.special import log_expit, logsumexp

import vit_jax
from configs import lit_coco, lit_digits, siglip_lit_coco
from vit_jax import checkpoint, distributed, families, optim, parallel, rundir, text, train
from vit_jax import data as data_lib
from vit_jax.checkpoint import save_npz
from vit_jax.data import captions, digits_text
from vit_jax.models import get_config, model_from_config
from vit_jax.tasks import contrastive_losses
from vit_jax.train import loop as loop_lib
from vit_jax.train import setup, steps
from vit_jax.train import state as state_lib
from vit_jax.train.spec import with_overrides

pytestmark = pytest.mark.slow  # trained runs, 2-process runs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A tiny image tower (a digits ViT of one block, pooled by GAP: 64 features) and text tower
# (width 16, its head 64), as dotted config overrides (also `--config.KEY=VALUE` flags).
IMAGE = {
  'patches': {'size': (2, 2)},
  'hidden_size': 64,
  'transformer': {'num_layers': 1, 'mlp_dim': 32, 'num_heads': 2, 'dropout_rate': 0.0},
  'classifier': 'gap',
  'representation_size': None,
  'resnet': None,
}
TINY = {
  'model.image.transformer.num_layers': 1,
  'model.image.transformer.mlp_dim': 32,
  'model.image.transformer.num_heads': 2,
  'model.text.hidden_size': 16,
  'model.text.num_layers': 1,
  'model.text.mlp_dim': 32,
  'model.text.num_heads': 2,
  'total_steps': 6,
  'batch': 16,
  'progress_every': 1,
  'warmup_steps': 1,
  'checkpoint_every': 3,
  'data_shards': 2,  # the same global batches on 1 process and on 2
  'model.temperature_init': 10.0,  # logits that spread: gradients well above rounding
}  # the config's evaluators run once, at the end: 2 processes must gather every embedding


def image_tower(crop: int = 8) -> dict:
  """IMAGE's parameters, random, with a 10-class head (which LiT drops)."""
  shapes = families.param_shapes(model_from_config(IMAGE, num_classes=10), crop)
  return randomize(shapes, seed=1, scale=0.3)


def tiny(config: ml_collections.ConfigDict, image_file: str, **overrides):
  config = with_overrides(config, TINY)
  config.pretrained_path = image_file
  for key, value in overrides.items():
    config[key] = value
  return config


def tiny_digits(image_file: str, variant: str = 'softmax', **overrides):
  return tiny(lit_digits.get_config(variant), image_file, **overrides)


# Where two runs reduce in different orders (jit and shard_map; 1 x 8 and 2 x 4 devices),
# SGD at lr 1: its update is the gradient. Adam's first step, lr * g / (|g| + eps), turns a
# last-bit difference of the text position rows' gradients (sums over the batch that cancel
# to ~1e-9, about eps) into parameter differences of up to 3e-6 (jax 0.12 on an AMD EPYC).
LINEAR_UPDATES = {'optimizer': 'sgd', 'base_lr': 1.0}


def assert_trees_close(a: dict, b: dict, atol: float) -> None:
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_allclose(a[k], b[k], atol=atol, rtol=0, err_msg=k)


def _lines(workdir):
  return [{k: v for k, v in m.items() if k != 'img_per_sec'} for m in rundir.read_metrics(workdir)]


def _flat(tree):
  return {
    '/'.join(
      str(getattr(k, 'key', getattr(k, 'name', getattr(k, 'idx', k)))) for k in path
    ): np.asarray(x)
    for path, x in jax.tree_util.tree_leaves_with_path(jax.device_get(tree))
  }


@pytest.fixture(scope='module')
def image_file(tmp_path_factory):
  path = tmp_path_factory.mktemp('tower') / 'img.npz'
  save_npz(image_tower(), path)
  return str(path)


@pytest.fixture(scope='module')
def lit_run(tmp_path_factory, image_file):
  """6 uninterrupted steps of the tiny digits LiT on 8 devices (jit)."""
  workdir = str(tmp_path_factory.mktemp('lit') / 'ref')
  return workdir, train.train_and_evaluate(tiny_digits(image_file), workdir)


def test_locked_tower_is_bit_identical_and_has_no_optimizer_state(lit_run, image_file):
  _, result = lit_run
  saved = _flat(image_tower())  # what the file holds
  img = _flat(result['params']['img'])
  assert set(img) == set(saved) - {'head/kernel', 'head/bias'}
  for key, value in img.items():
    np.testing.assert_array_equal(value, saved[key], err_msg=key)
  opt_leaves = _flat(result['opt_state'])
  assert not [k for k in opt_leaves if '/img/' in f'/{k}/'], 'optimizer state for img/'
  # Adam's two moments of every trainable leaf, and two counts: nothing else.
  trainable = {k for k in _flat(result['params']) if not k.startswith('img/')}
  for moment in ('mu', 'nu'):
    assert {k.split(f'/{moment}/')[1] for k in opt_leaves if f'/{moment}/' in k} == trainable
  assert len(opt_leaves) == 2 * len(trainable) + 2  # and the two step counts
  lines = [m for m in _lines(lit_run[0]) if 'loss' in m]
  assert [m['step'] for m in lines] == list(range(1, 7))
  assert lines[-1]['loss'] < lines[0]['loss']


def sigterm_at(batches, index: int):
  """The training loop's batches (`loop._train_batches`), a real SIGTERM to this process
  as the one of `index` (0-based) is handed out."""

  def signalled(*args, **kwargs):
    for i, batch in enumerate(batches(*args, **kwargs)):
      if i == index:
        os.kill(os.getpid(), signal.SIGTERM)
      yield batch

  return signalled


def test_sigterm_mid_run_then_resume_is_exact(lit_run, image_file, tmp_path, monkeypatch):
  """A real SIGTERM at step 3 saves and stops; the rerun continues as the uninterrupted run."""
  ref_dir, ref = lit_run
  workdir = str(tmp_path / 'run')
  with monkeypatch.context() as m:
    m.setattr(loop_lib, '_train_batches', sigterm_at(loop_lib._train_batches, 2))
    first = train.train_and_evaluate(tiny_digits(image_file), workdir)
  assert first['status'] == 'preempted' and first['step'] == 3
  second = train.train_and_evaluate(tiny_digits(image_file), workdir)
  assert second['status'] == 'done' and second['step'] == 6
  assert_trees_close(_flat(ref['params']), _flat(second['params']), atol=0)
  assert _lines(workdir) == _lines(ref_dir)


def test_two_processes_of_four_devices_equal_one_of_eight(image_file, tmp_path):
  """launch/local.sh: 2 processes x 4 CPU devices (jax.distributed) train as 1 x 8: every
  step's loss, gradient norm, temperature, in-batch accuracies and logits, the zero-shot
  accuracy at the end, and the final parameters, read back from both run directories (1e-5,
  as the multi-host tests compare runs; SGD at lr 1, `LINEAR_UPDATES`)."""
  ref_dir = str(tmp_path / 'one')
  result = train.train_and_evaluate(tiny_digits(image_file, **LINEAR_UPDATES), ref_dir)
  workdir = str(tmp_path / 'two')
  env = {k: v for k, v in os.environ.items() if not k.startswith('VIT_JAX_')}
  env.update(
    XLA_FLAGS='--xla_force_host_platform_device_count=4', JAX_PLATFORMS='cpu',
    TF_CPP_MIN_LOG_LEVEL='3', PYTHON=sys.executable, DEVICES_PER_PROCESS='4', TIMEOUT='200',
  )  # fmt: skip
  for key in (distributed.ENV_ADDRESS, distributed.ENV_NUM_PROCESSES, distributed.ENV_PROCESS_ID):
    env.pop(key, None)
  flags = [f'--config.{k}={v}' for k, v in {**TINY, **LINEAR_UPDATES}.items()]
  command = ['bash', 'launch/local.sh', '2', '--config=configs/lit_digits.py', *flags]
  command += [f'--workdir={workdir}', f'--config.pretrained_path={image_file}']
  run = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
  got, want = _lines(workdir), _lines(ref_dir)
  assert [m['step'] for m in want if 'zeroshot/digits' in m] == [6]
  assert [sorted(m) for m in got] == [sorted(m) for m in want]
  # The 6-step model's zero-shot and retrieval ranks are near chance: its similarities tie
  # to within rounding, and the 2 x 4 layout's last bits may flip one ranking (seen on an AMD
  # EPYC: a zero-shot argmax before and after the inference layer; a caption's place around
  # recall@10 on jax 0.12). The embeddings' parameters are compared to 1e-5 below; a rank
  # metric may differ by that one query: one of the 360 images or of the 30 captions.
  one_query = {'zeroshot/digits': 1 / 360, 'img2txt_recall': 1 / 360, 'txt2img_recall': 1 / 30}
  for a, b in zip(got, want, strict=True):
    for key in [k for k in a if any(q in k for q in one_query)]:
      step = next(v for q, v in one_query.items() if q in key)
      assert abs(a.pop(key) - b.pop(key)) <= step + 1e-12, key
    np.testing.assert_allclose(
      [a[k] for k in sorted(a)], [b[k] for k in sorted(b)], rtol=1e-5, atol=1e-5, err_msg=str(a)
    )
  final, reference = _flat(checkpoint.fit(workdir).params), _flat(result['params'])
  assert final.keys() == reference.keys()
  for key in final:
    np.testing.assert_allclose(final[key], reference[key], rtol=1e-5, atol=1e-5, err_msg=key)


def test_both_towers_split_over_model_train_like_data_parallel(lit_run, image_file, tmp_path):
  """The tiny LiT on a data 4 x model 2 mesh, both towers' blocks split Megatron-style
  (config.sharding='tp'): every step's loss and the final parameters of the 8-device
  data-parallel run, to 1e-5."""
  ref_dir, reference = lit_run
  workdir = str(tmp_path / 'tp')
  config = tiny_digits(image_file, mesh='data:4,model:2', sharding='tp', evals={})  # no evals
  result = train.train_and_evaluate(config, workdir)
  specs = _flat(jax.tree.map(lambda x: 'model' in x.sharding.spec, result['params']))
  split = sorted(k for k, on_model in specs.items() if on_model)
  assert any(k.startswith('img/') and 'query/kernel' in k for k in split), split
  bert = ('attention_layer/query/kernel', 'attention_block/dense_layer/kernel',
          'mlp_block/mlp/dense_layer/kernel', 'mlp_block/dense_layer/kernel')  # fmt: skip
  assert all(any(k.startswith('txt/') and k.endswith(b) for k in split) for b in bert), split
  losses = [[m['loss'] for m in _lines(d) if 'loss' in m] for d in (workdir, ref_dir)]
  assert len(losses[0]) == TINY['total_steps']
  np.testing.assert_allclose(*losses, atol=1e-5, rtol=0)
  assert_trees_close(_flat(result['params']), _flat(reference['params']), atol=1e-5)


def _numpy_loss(name: str, zimg, ztxt, t: float, b: float) -> float:
  """The softmax (CLIP) or sigmoid (SigLIP) loss of the global batch, in numpy float64."""
  logits = np.exp(t) * zimg.astype(np.float64) @ ztxt.astype(np.float64).T
  n = len(logits)
  if name == 'softmax':
    i2t = np.mean(logsumexp(logits, axis=1) - np.diag(logits))
    t2i = np.mean(logsumexp(logits, axis=0) - np.diag(logits))
    return 0.5 * (i2t + t2i)
  labels = 2 * np.eye(n) - 1
  return -np.sum(log_expit(labels * (logits + b))) / n


def _first_step(config, devices):
  """(state, batch, setup) of step 0 on `devices`: the fresh state and the first batch."""
  s = setup.prepare(config, '/nonexistent', devices)
  tx, _ = optim.for_training(s.spec.optim, s.total_steps)
  tx = s.task.optimizer(tx)
  lay = state_lib.layout(s, tx, jax.random.key(0))
  init_rng, dropout_rng = jax.random.split(jax.random.key(0))
  state = state_lib.initial_state(s, tx, lay, init_rng, dropout_rng)
  stream = data_lib.host_train_dataset(
    s.source, s.spec.data, data_shards=1, seed=0, tokenizer=s.task.tokenizer
  )
  local = data_lib.BadExamples('training').take(next(data_lib.host_batches(stream)))
  return state, parallel.global_batch(local, parallel.batch_sharding(s.mesh)), s, tx, lay


@pytest.mark.parametrize('variant', ['softmax', 'sigmoid'])
def test_jit_and_shard_map_steps_equal_a_numpy_loss_on_8_devices(variant, image_file, monkeypatch):
  """The step's loss is the numpy loss of embeddings computed here (every device's pairs
  the negatives), under jit and shard_map alike (1e-6), and so are their updates (SGD at
  lr 1, `LINEAR_UPDATES`: the gradients); for the
  sigmoid loss also the shard_map step with `config.contrastive.logits='chunked'`, which
  then calls the chunked loss (its jit form: tests/test_contrastive.py)."""
  chunked, axes = contrastive_losses.chunked_sigmoid_loss, set()
  spy = lambda *args, axis, **kw: axes.add(axis) or chunked(*args, axis=axis, **kw)
  monkeypatch.setattr(contrastive_losses, 'chunked_sigmoid_loss', spy)
  config = tiny_digits(image_file, variant, **LINEAR_UPDATES)
  state, batch, s, tx, lay = _first_step(config, jax.devices())
  params = jax.device_get(state['params'])
  # Under one jit: op by op, every op of the towers would compile on its own.
  embed = jax.jit(lambda p, x, t: s.model.apply({'params': p}, images=x, tokens=t))
  zimg, ztxt, _ = embed(params, np.asarray(batch['image']), np.asarray(batch['text']))
  b = float(params['b'][0]) if 'b' in params else 0.0
  expected = _numpy_loss(variant, np.asarray(zimg), np.asarray(ztxt), float(params['t'][0]), b)
  runs = [('jit', 'gathered'), ('shard_map', 'gathered')]
  runs += [('shard_map', 'chunked')] if variant == 'sigmoid' else []
  results = {}
  for kind, logits in runs:
    c = dataclasses.replace(s.spec.step.contrastive, logits=logits)
    task = copy.copy(s.task)  # its spec: the step's and the logits' form
    task.spec = dataclasses.replace(
      s.spec, step=dataclasses.replace(s.spec.step, step=kind, contrastive=c)
    )
    _, schedule = optim.for_training(task.spec.optim, s.total_steps)
    fn = steps.train_step_for(task.spec, task, tx, schedule, s.mesh, lay.shardings)
    new_state, metrics = fn(jax.tree.map(jnp.copy, state), batch)
    results[kind, logits] = (float(metrics['loss']), _flat(new_state['params']))
  for loss, params in results.values():
    np.testing.assert_allclose(loss, expected, rtol=1e-6, atol=1e-6)
    assert_trees_close(params, results['jit', 'gathered'][1], atol=1e-6)
  assert axes == ({parallel.DATA_AXIS} if variant == 'sigmoid' else set())


def _stream_tokens(s, position: int, rows: int = 4) -> np.ndarray:
  """The texts of the batch at `position` of the run `s`'s training stream."""
  data = dataclasses.replace(s.spec.data, batch=rows, input_threads=1)
  ds = data_lib.train_dataset(
    s.source, 'train', data, local_batch=rows, seed=0, position=position,
    tokenizer=s.task.tokenizer,
  )  # fmt: skip
  return next(iter(ds))['text'].numpy()


def test_captions_folder_draws_one_caption_per_position(tmp_path, image_file):
  """A folder with train/captions.tsv: one of an image's captions per example, the same at
  the same position (resume), others in other epochs; each caption tokenized."""
  rng = np.random.default_rng(0)
  train_dir = tmp_path / 'pairs' / 'train'
  train_dir.mkdir(parents=True)
  lines = []
  for i in range(4):
    (train_dir / f'{i}.jpg').write_bytes(jpeg_bytes(rng, 12, 10))
    lines += [f'{i}.jpg\tthe number {d}.' for d in range(3 * i, 3 * i + 3)]
  (train_dir / captions.CAPTIONS_FILE).write_text('\n'.join(reversed(lines)) + '\n')
  source = data_lib.get_source(str(tmp_path / 'pairs'))
  assert isinstance(source, captions.FolderCaptions) and source.num_examples('train') == 4
  config = tiny_digits(image_file, dataset=str(tmp_path / 'pairs'), caption_templates=())
  config.pp.test = 'train'
  s = setup.prepare(config, '/nonexistent', jax.devices()[:1])  # once: 12 streams
  tokenizer = s.task.tokenizer
  choices = {i: set(map(tuple, tokenizer([f'the number {d}.' for d in range(3 * i, 3 * i + 3)])))
             for i in range(4)}  # fmt: skip
  drawn = [set() for _ in range(4)]
  for epoch in range(6):
    tokens = _stream_tokens(s, 4 * epoch)
    np.testing.assert_array_equal(tokens, _stream_tokens(s, 4 * epoch))
    for row in map(tuple, tokens):
      image = next(i for i, c in choices.items() if row in c)  # every row one of its captions
      drawn[image].add(row)
  assert all(len(d) >= 2 for d in drawn), drawn  # several captions drawn over the epochs
  assert sum(map(len, drawn)) > 4


# ----------------------------------------------------------------------------------------
# One tokenizer: training's captions, the in-run zero-shot evaluator, vit-zeroshot (its
# classes and its retrieval) and the reproduction's retrieval tokenize a caption alike.
# ----------------------------------------------------------------------------------------

CAPTIONS = (
  'A photo of the digit 7.',
  'THE Digit Seven, written BY hand ' + 'and scanned twice ' * 6,  # clipped: the last </s>
)
SP_MODEL = os.path.join(REPO, 'tests', 'data', 'sp_bpe.model')  # 1,200 pieces, </s> = 2


def _retrieval_tokens(loaded, tmp_path, monkeypatch) -> np.ndarray:
  """The tokens of CAPTIONS that vit-zeroshot's retrieval (--captions) embeds: what its
  model's text tower is given."""
  from vit_jax.inference import zeroshot as zeroshot_lib

  (tmp_path / 'image.jpg').write_bytes(jpeg_bytes(np.random.default_rng(0), 16, 16))
  listing = tmp_path / 'captions.tsv'
  listing.write_text(''.join(f'image.jpg\t{c}\n' for c in CAPTIONS))
  seen, text_tower = [], loaded.programs.text
  spied = dataclasses.replace(
    loaded.programs, text=lambda tokens: seen.append(np.asarray(tokens)) or text_tower(tokens)
  )
  monkeypatch.setattr(loaded, 'programs', spied)
  zeroshot_lib.retrieval_recalls(loaded, str(listing), batch_size=2)
  return seen[0]


def _ids_on_every_path(config, checkpoint_path, vocab, tmp_path, monkeypatch) -> dict:
  """The ids of CAPTIONS through each path that tokenizes texts, from the training config
  `config` (its run, as `setup.prepare` resolves it) and a file of that model (for
  vit-zeroshot)."""
  from vit_jax.evals import common as evals_common
  from vit_jax.evals import zeroshot

  s = setup.prepare(config, '/nonexistent', jax.devices()[:1])
  in_run = evals_common.Context(
    s.spec.evals, s.spec.data, s.model, s.mesh, s.source, s.task.tokenizer
  )
  settings = s.spec.evals.named['zeroshot'].settings  # the config's zero-shot evaluator
  assert zeroshot.prompt_tokenizer(in_run, settings) is s.task.tokenizer  # one object in a run
  alone = dataclasses.replace(in_run, tokenizer=None)  # resolved from the family again
  loaded = vit_jax.load(str(checkpoint_path), vocab=str(vocab))
  tokenizers = {
    'training captions': s.task.tokenizer,
    'zero-shot prompts, resolved apart': zeroshot.prompt_tokenizer(alone, settings),
    'vit-zeroshot': loaded.tokenize,
  }
  ids = {name: tokenizer(list(CAPTIONS)) for name, tokenizer in tokenizers.items()}
  graph = s.task.tokenizer.preprocess_tf(tf.constant(list(CAPTIONS)))
  ids['training pipeline (TensorFlow)'] = graph.numpy()
  ids['vit-zeroshot retrieval'] = _retrieval_tokens(loaded, tmp_path, monkeypatch)
  return ids


def _assert_all_equal(ids: dict) -> np.ndarray:
  (first, want), *others = ids.items()
  for name, got in others:
    np.testing.assert_array_equal(got, want, err_msg=f'{name} != {first}')
  return want


def test_a_caption_is_tokenized_alike_on_every_path_bert(
  lit_run, image_file, tmp_path, monkeypatch
):
  """The digits LiT (BERT, 12 tokens): its run directory for vit-zeroshot."""
  workdir, _ = lit_run
  config = tiny_digits(image_file)
  ids = _ids_on_every_path(config, workdir, digits_text.VOCAB, tmp_path, monkeypatch)
  want = _assert_all_equal(ids)
  cls = digits_text.vocabulary().index('[CLS]')
  assert want.shape == (2, 12) and (want[:, 0] == cls).all() and want[0, -1] == 0  # pad 0


def test_a_caption_is_tokenized_alike_on_every_path_siglip(tmp_path, monkeypatch):
  """A tiny SigLIP (sentencepiece, `lower_case`): every path lower-cases and pads with 1,
  the clipped caption keeps its </s> (big_vision's options), from the model's `pp` alone."""
  fields = get_config('SigLIP-B16-224')
  fields.image.update({'patches': {'size': (8, 8)}, 'hidden_size': 32})
  fields.image.transformer.update({'num_layers': 1, 'mlp_dim': 64, 'num_heads': 4})
  fields.text.update({'width': 32, 'num_layers': 1, 'num_heads': 4, 'mlp_dim': 64})
  fields.text.vocab_size, fields.out_dim = 1200, (None, 32)
  fields.pp.size, fields.pp.max_len = 32, 16
  config = lit_digits.get_config('sigmoid')
  config.model = fields.to_dict()
  config.pp.tokenizer, config.pp.vocab, config.pp.max_len = 'sentencepiece', SP_MODEL, 16
  config.contrastive.lock_image, config.pretrained_path = False, ''  # both towers from scratch
  params = randomize(families.param_shapes(model_from_config(fields), 32, 16), seed=3)
  params['t'], params['b'] = np.array([1.5], np.float32), np.array([-2.0], np.float32)
  save_npz(params, tmp_path / 'siglip.npz')
  ids = _ids_on_every_path(config, tmp_path / 'siglip.npz', SP_MODEL, tmp_path, monkeypatch)
  want = _assert_all_equal(ids)
  assert want.shape == (2, 16) and (want[0, -1], want[1, -1]) == (1, 2)  # padding 1; </s>
  lowered = text.get_tokenizer('sentencepiece', SP_MODEL, 16, eos='sticky', pad_value=1)
  np.testing.assert_array_equal(want, lowered([c.lower() for c in CAPTIONS]))
  assert (want != text.get_tokenizer('sentencepiece', SP_MODEL, 16)(list(CAPTIONS))).any()


def _mock_coco(self, *args, **kwargs):
  """coco_captions' train split: 16 JPEGs with five captions each (tfds' own mock draws the
  captions' `id` and `text` at different lengths)."""
  rng = np.random.default_rng(0)
  images = [jpeg_bytes(rng, 40, 48) for _ in range(16)]
  texts = [[f'the {i} picture number {j}' for j in range(5)] for i in range(16)]
  return tf.data.Dataset.from_tensor_slices({'image': images, 'captions': {'text': texts}})


@pytest.mark.parametrize(
  'module, variant', [(lit_coco, ''), (lit_coco, 'img_head'), (siglip_lit_coco, '')]
)
def test_configs_run_on_mock_data(module, variant, tmp_path, image_file):
  """The COCO configs, tiny towers, two steps on coco_captions (tfds' mock data), with finite
  losses (`:img_head` too: its image head trains from a random start), then their COCO
  retrieval evaluator over the mock's 16 images and 80 captions; the digits config is the
  reference run's."""
  config = tiny(module.get_config(variant), image_file, total_steps=2, checkpoint_every=2)
  config.zeroshot_every = 0  # COCO names no classes
  config.model.image, config.model.out_dim = IMAGE, (64 if variant else None, 64)
  vocab = tmp_path / 'vocab.txt'
  vocab.write_text('\n'.join([*digits_text.SPECIAL, 'the', 'picture', 'number', *'0123456789']))
  config.pp.vocab, config.pp.crop = str(vocab), 8
  config.model.pp.max_len = config.pp.max_len = 8  # the model's tokenizer length
  config.model.text.vocab_size = 18
  with tfds.testing.mock_data(as_dataset_fn=_mock_coco):
    result = train.train_and_evaluate(config, str(tmp_path / 'run'))
  assert result['status'] == 'done'
  lines = _lines(str(tmp_path / 'run'))
  steps = [m for m in lines if 'loss' in m]
  assert len(steps) == 2 and all(np.isfinite(m['loss']) for m in steps)
  assert ('bias' in lines[0]) == (module is siglip_lit_coco)
  counts = {
    k.rsplit('/', 1)[1]: v for k, v in lines[-1].items() if k.endswith(('_images', '_texts'))
  }
  assert counts == {'num_images': 16, 'num_texts': 80}
  assert 0 <= lines[-1]['retrieval_coco/coco_captions/img2txt_recall@1'] <= 1


def test_a_contrastive_run_on_a_dataset_without_captions_is_one_line(image_file):
  """No captions and no caption templates: `prepare` stops before any compute, naming the
  three fixes (at a24f8ac the input pipeline failed inside TensorFlow, after the init)."""
  config = tiny_digits(image_file, caption_templates=())
  with pytest.raises(ValueError) as stop:
    setup.prepare(config, '/nonexistent', jax.devices()[:1])
  line = str(stop.value)
  assert line.startswith("Dataset 'digits' has no captions") and '\n' not in line
  for fix in ('captions.tsv', '--config.dataset', '--config.caption_templates'):
    assert fix in line


def test_the_image_tower_of_an_image_text_file_starts_a_run(lit_run, tmp_path):
  """`pretrained_path=FILE:img`, as docs/image-text.md and configs/lit_coco.py write it: the
  LiT file's image tower, locked, is the run's (at a24f8ac setup looked for a file named
  'FILE:img' and stopped: not found)."""
  _, result = lit_run
  path = str(tmp_path / 'lit.npz')
  save_npz(jax.device_get(result['params']), path)
  config = tiny_digits(f'{path}:img', total_steps=1, checkpoint_every=0, evals={})
  run = train.train_and_evaluate(config, str(tmp_path / 'run'), devices=jax.devices()[:1])
  got, want = _flat(run['params']['img']), _flat(result['params']['img'])
  assert got.keys() == want.keys()
  for key in got:
    np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_the_seeds_of_the_reproduction_keep_out_of_a_run_directory(lit_run):
  """`vit_jax.reproduce lit_digits --workdir=W` trains W/seed_<s>; a W that is a run of
  `vit_jax.main` (the docs' runs/lit_digits, say) is refused in one line, before any training
  (at a24f8ac the seeds' runs were written inside it)."""
  from vit_jax.reproduce import lit_digits as reproduce

  workdir, _ = lit_run
  with pytest.raises(ValueError, match=rf'^{workdir} is a run directory .*={workdir}_seeds$'):
    reproduce.report('runs/digits', workdir, [0])


@pytest.mark.parametrize(
  'policy, residual', [('matmul', jnp.float32), ('activations', jnp.bfloat16)]
)
def test_the_precision_policy_reaches_both_towers(image_file, policy, residual):
  """`config.dtype='bfloat16'` with `config.precision`: both towers take the policy, as a ViT
  does; the BERT tower's residual stream is float32 under 'matmul', bfloat16 under
  'activations' (at a24f8ac the policy was recorded in config.json but not applied)."""
  config = tiny_digits(image_file, dtype='bfloat16', precision=policy)
  model = setup.prepare(config, '/nonexistent', jax.devices()[:1]).model
  assert model.image['precision_policy'] == model.text['precision_policy'] == policy
  params = families.param_shapes(model, 8, 12)
  images, tokens = jnp.zeros((2, 8, 8, 3)), jnp.ones((2, 12), jnp.int32)
  zimg, ztxt, out = jax.eval_shape(
    lambda p: model.apply({'params': p}, images=images, tokens=tokens), params
  )
  assert out['txt/transformed'].dtype == residual
  assert zimg.dtype == ztxt.dtype == jnp.float32


@pytest.mark.parametrize('suffix', ['', ':img'])
def test_a_classifier_fine_tunes_from_an_image_text_runs_image_tower(lit_run, suffix, caplog):
  """`pretrained_path=RUN` (or `RUN:img`) of a LiT run, in a classification run: the image
  tower, a fresh 10-class head, nothing of the text tower's settings compared or warned
  about (at a24f8ac a run directory's image-text tree could not be read at all)."""
  from configs import digits as digits_config

  workdir, result = lit_run
  config = with_overrides(digits_config.get_config(), {'pp.crop': 8})
  config.model = {**config.model.to_dict(), **IMAGE}
  config.pretrained_path = workdir + suffix
  s = setup.prepare(config, '/nonexistent', jax.devices()[:1])
  init = jax.device_get(jax.jit(s.task.init_fn())(jax.random.key(0)))
  with caplog.at_level('WARNING'):
    fitted = _flat(s.task.pretrained(s.pretrained_path, init))
  assert not [r for r in caplog.records if 'the file states' in r.getMessage()]
  want = _flat(result['params']['img'])
  assert fitted.keys() == want.keys() | {'head/kernel', 'head/bias'}
  for key in want:
    np.testing.assert_array_equal(fitted[key], want[key], err_msg=key)
  assert fitted['head/kernel'].shape == (64, 10) and not fitted['head/kernel'].any()


@pytest.mark.parametrize('converted', [False, True])
def test_an_image_text_run_or_file_continues_with_both_towers(lit_run, converted, tmp_path):
  """`pretrained_path` of a LiT run (or its converted .npz) in a contrastive run: both
  towers and `t` continue as they were (at a24f8ac only the image tower was read, the text
  tower started afresh); `RUN:img` is the image tower alone."""
  from vit_jax.cli import convert

  workdir, result = lit_run
  path = workdir
  if converted:
    path = str(tmp_path / 'lit.npz')
    convert.convert(workdir, path, to='npz', out=lambda line: None)
  s = setup.prepare(tiny_digits(path), '/nonexistent', jax.devices()[:1])
  init = jax.device_get(jax.jit(s.task.init_fn())(jax.random.key(0)))
  got, want = _flat(s.task.pretrained(path, init)), _flat(result['params'])
  assert got.keys() == want.keys()
  for key in got:
    np.testing.assert_array_equal(got[key], want[key], err_msg=key)
  tower_only = _flat(s.task.pretrained(f'{workdir}:img', init))
  assert np.array_equal(tower_only['img/embedding/kernel'], want['img/embedding/kernel'])
  assert np.array_equal(tower_only['txt/head/kernel'], _flat(init)['txt/head/kernel'])


def test_a_trainable_image_head_trains_with_finite_losses(image_file, tmp_path):
  """The digits LiT with a 64-wide image head trained beside the text tower (out_dim=(64, 64),
  train_image_head): finite losses, a head that is nowhere zero, the locked tower as read (at
  a24f8ac the zero-initialised head stopped the run at step 1: a NaN gradient)."""
  config = tiny_digits(image_file, total_steps=3, checkpoint_every=0, evals={})
  config.model.out_dim = (64, 64)
  config.contrastive.train_image_head = True
  result = train.train_and_evaluate(config, str(tmp_path / 'run'), devices=jax.devices()[:1])
  lines = _lines(str(tmp_path / 'run'))
  assert result['status'] == 'done' and [m['step'] for m in lines] == [1, 2, 3]
  assert all(np.isfinite(m['loss']) and np.isfinite(m['grad_norm']) for m in lines), lines
  img = _flat(result['params']['img'])
  tower = checkpoint.flatten(checkpoint.load(image_file))
  np.testing.assert_array_equal(img['embedding/kernel'], tower['embedding/kernel'])  # locked
  assert np.all(img['head/kernel'] != 0)


def test_vit_zeroshot_on_the_run_and_on_its_converted_file_prints_the_runs_number(
  lit_run, tmp_path, capsys
):
  """`vit-zeroshot --dataset=digits` on the run directory, and on the .npz `vit-convert`
  writes of it, uses the run's vocabulary and zero-shot templates and prints the run's own
  zero-shot top-1; the .npz carries them beside it (FILE.txt, FILE.json), and its text
  tower's 2 heads (at a24f8ac both commands stopped: no ViT parameters in the run)."""
  from vit_jax.cli import convert
  from vit_jax.cli import zeroshot as zeroshot_cli

  workdir, result = lit_run
  options = {'json': True, 'cache_dir': ''}
  assert zeroshot_cli.run(workdir, [], dataset='digits', options=options) == 0
  assert json.loads(capsys.readouterr().out)['accuracy'] == result['zeroshot/digits']
  converted = tmp_path / 'lit.npz'
  convert.convert(workdir, str(converted), to='npz', out=lambda line: None)
  assert (tmp_path / 'lit.txt').read_bytes() == Path(digits_text.VOCAB).read_bytes()
  side = json.loads((tmp_path / 'lit.json').read_text())
  assert side['zeroshot']['templates'] == list(lit_digits.get_config().evals.zeroshot.templates)
  assert zeroshot_cli.run(str(converted), [], dataset='digits', options=options) == 0
  assert json.loads(capsys.readouterr().out)['accuracy'] == result['zeroshot/digits']
  fitted = checkpoint.fit(converted)
  assert fitted.config.text.num_heads == 2 and fitted.config.pp.max_len == 12
  # Patch sequences are a NaFlex model's: a ViT tower's run says so in one line.
  assert zeroshot_cli.run(workdir, [], dataset='digits', options={'max_patches': 16}) == 1
  error = capsys.readouterr().err.strip().splitlines()
  assert len(error) == 1 and '--max_patches=16' in error[0] and 'not patches' in error[0]


def test_vit_predict_with_classes_classifies_zero_shot_as_vit_zeroshot(lit_run, tmp_path, capsys):
  """`vit-predict --classes=...` on an image-text run: vit-zeroshot's classes and
  probabilities, not the refusal of a24f8ac ("has no classes to predict")."""
  from vit_jax.cli import predict
  from vit_jax.cli import zeroshot as zeroshot_cli
  from vit_jax.data import digits as digits_data

  workdir, _ = lit_run
  images, _ = digits_data.load('test')
  paths = []
  for i in range(3):
    paths.append(str(tmp_path / f'{i}.png'))
    Image.fromarray(images[i]).save(paths[-1])
  classes = ','.join(digits_text.CLASS_NAMES)
  assert predict.run(workdir, paths, k=3, as_json=True, classes=classes) == 0
  got = json.loads(capsys.readouterr().out)
  options = {'json': True, 'top_k': 3, 'cache_dir': ''}
  assert zeroshot_cli.run(workdir, paths, classes, options=options) == 0
  assert got == json.loads(capsys.readouterr().out)
  assert [len(row['top_k']) for row in got['predictions']] == [3, 3, 3]
  assert predict.run(workdir, paths[:1]) == 1  # no head: the line names --classes
  assert '--classes=a,b,c' in capsys.readouterr().err


def test_the_run_directory_reads_back_as_its_model(lit_run, tmp_path):
  """`fit` and `convert` read a LiT run directory back to its final parameters, bit for bit;
  the run's config states what the shapes cannot: the text tower's 2 heads (BERT's kernels are
  (D, D): its shapes alone give D / 64 = 1) and the model's tokenizer settings."""
  workdir, result = lit_run
  assert_run_reads_back(workdir, result['params'], tmp_path)
  fitted = checkpoint.fit(workdir)
  assert fitted.config.text.num_heads == lit_digits.text_tower().num_heads == 2
  pp = {'tokenizer_name': 'bert', 'size': 8, 'max_len': 12, 'round_to_uint8': False}  # its own
  assert fitted.config.pp.to_dict() == pp


def _recall_at(similarities: np.ndarray, match: np.ndarray, k: int) -> float:
  """A query's hit at k: a match among its k most similar keys (a plain sort per row)."""
  hits = [match[q][np.argsort(-row, kind='stable')[:k]].any() for q, row in enumerate(similarities)]
  return float(np.mean(hits))


def test_a_contrastive_run_logs_its_evaluators_by_name(image_file, tmp_path):
  """configs/lit_digits.py's evaluators by name (zero-shot, retrieval, few-shot) and a second
  few-shot one log at the end of a LiT run. Few-shot reads the locked tower's pre-logits,
  so it equals `fewshot.accuracies` on the image file's own features; retrieval equals a
  sort of the similarities of embeddings computed in one batch (a caption matches every
  image of its class)."""
  from vit_jax.evals import fewshot

  config = tiny_digits(image_file, total_steps=2, checkpoint_every=0)
  config.evals.fewshot.update(shots=(1,), seeds=1)
  config.evals.fewshot_2 = {'type': 'fewshot', 'datasets': ('digits',), 'shots': (2,), 'seeds': 1}
  result = train.train_and_evaluate(config, str(tmp_path / 'run'), devices=jax.devices()[:1])
  last = _lines(str(tmp_path / 'run'))[-1]
  ks = (1, 5, 10)
  recalls = [f'retrieval/digits/{d}_recall@{k}' for d in ('img2txt', 'txt2img') for k in ks]
  for key in ['fewshot/digits/1shot', 'fewshot_2/digits/2shot', 'zeroshot/digits', *recalls]:
    assert key in last and result[key] == last[key], key
  assert (last['retrieval/digits/num_images'], last['retrieval/digits/num_texts']) == (360, 30)

  spec = setup.spec_lib.from_config(config)
  source = data_lib.get_source('digits')
  split = {}
  for name in ('train', 'test'):
    ds = data_lib.eval_dataset(source, name, spec.data, local_batch=2048)
    batch = next(ds.as_numpy_iterator())
    keep = batch['mask'] > 0
    split[name] = batch['image'][keep], batch['label'][keep]
  headless = model_from_config(IMAGE, num_classes=0)
  tower = {'params': jax.device_get(result['params']['img'])}
  features = {n: np.asarray(headless.apply(tower, x, train=False)) for n, (x, _) in split.items()}
  for shots, key in ((1, 'fewshot/digits/1shot'), (2, 'fewshot_2/digits/2shot')):
    want = fewshot.accuracies(
      (features['train'], split['train'][1]), (features['test'], split['test'][1]),
      10, (shots,), (1024.0,), 1,
    )  # fmt: skip
    assert last[key] == pytest.approx(want[(shots, 1024.0)], abs=1e-6), key

  model = setup.build_model(spec.model, 10)
  params = jax.device_get(result['params'])
  images, labels = split['test']
  prompts = [t.format(c) for c in '0123456789' for t in digits_text.HELD_OUT_TEMPLATES]
  tokens = text.get_tokenizer('bert', str(digits_text.VOCAB), 12)(prompts)
  zimg = np.asarray(model.apply({'params': params}, images=images)[0])
  ztxt = np.asarray(model.apply({'params': params}, tokens=tokens)[1])
  classes = np.repeat(np.arange(10), len(digits_text.HELD_OUT_TEMPLATES))
  match = labels[:, None] == classes[None]
  for k in ks:
    i2t, t2i = _recall_at(zimg @ ztxt.T, match, k), _recall_at(ztxt @ zimg.T, match.T, k)
    assert last[f'retrieval/digits/img2txt_recall@{k}'] == pytest.approx(i2t, abs=1e-9)
    assert last[f'retrieval/digits/txt2img_recall@{k}'] == pytest.approx(t2i, abs=1e-9)


COCO_IMAGES = 12


def _mock_coco_test(self, *args, **kwargs):
  """coco_captions' mock: 12 JPEGs, each with 5 captions, every third with 2 more (the few of
  COCO with 6 or 7), which the protocol leaves out."""
  rng = np.random.default_rng(1)
  images = [jpeg_bytes(rng, 40, 48) for _ in range(COCO_IMAGES)]
  texts = [  # words of the digits vocabulary, no two captions alike: no ties to rank
    [f'the numeral {i // 10} {i % 10} {j}' for j in range(5 + 2 * (i % 3 == 0))]
    for i in range(COCO_IMAGES)
  ]
  signature = {
    'image': tf.TensorSpec([], tf.string),
    'captions': {'text': tf.TensorSpec([None], tf.string)},
  }
  rows = ({'image': x, 'captions': {'text': t}} for x, t in zip(images, texts, strict=True))
  return tf.data.Dataset.from_generator(lambda: rows, output_signature=signature)


def _coco_recalls(model, params, preprocess) -> dict[str, float]:
  """The protocol computed plainly: every mock image preprocessed by `preprocess` and
  embedded in one batch, its first 5 captions, recall@k by sorting the similarities."""
  data = list(_mock_coco_test(None).as_numpy_iterator())
  pixels = np.stack([preprocess(tf.io.decode_jpeg(r['image'], channels=3)) for r in data])
  captions = [c.decode() for r in data for c in r['captions']['text'][:5]]
  tokens = text.get_tokenizer('bert', str(digits_text.VOCAB), 12)(captions)
  zimg = np.asarray(model.apply({'params': params}, images=pixels)[0])
  ztxt = np.asarray(model.apply({'params': params}, tokens=tokens)[1])
  match = np.arange(COCO_IMAGES)[:, None] == np.repeat(np.arange(COCO_IMAGES), 5)[None]
  out = {}
  for k in (1, 5, 10):
    out[f'img2txt_recall@{k}'] = _recall_at(zimg @ ztxt.T, match, k)
    out[f'txt2img_recall@{k}'] = _recall_at(ztxt @ zimg.T, match.T, k)
  return out


def test_the_coco_protocol_in_vit_zeroshot_and_in_a_run(lit_run, image_file, tmp_path, capsys):
  """COCO's retrieval protocol on mock coco_captions: `vit-zeroshot --dataset=coco_captions`
  on the LiT run (the preprocessing its model states, `vit_jax.load(...).preprocessing`)
  and a run's 'retrieval' evaluator with max_texts=5 (the evaluation preprocessing) each
  equal the plain computation, over 12 images and their first 5 captions."""
  from vit_jax.cli import zeroshot as zeroshot_cli
  from vit_jax.data import preprocess
  from vit_jax.evals import common as evals_common

  workdir, result = lit_run
  config = tiny_digits(image_file)
  config.evals = {'coco': {'type': 'retrieval', 'datasets': ('coco_captions',), 'max_texts': 5}}
  with tfds.testing.mock_data(as_dataset_fn=_mock_coco_test):
    code = zeroshot_cli.run(workdir, [], dataset='coco_captions', options={'json': True})
    printed = json.loads(capsys.readouterr().out)
    s = setup.prepare(config, str(tmp_path / 'run'), jax.devices()[:1])
    params = jax.device_get(result['params'])
    in_run = evals_common.evaluate(s.evaluators['coco'], {'': params})
  assert code == 0 and (printed['num_images'], printed['num_texts']) == (COCO_IMAGES, 60)
  assert (in_run['coco/coco_captions/num_images'], in_run['coco/coco_captions/num_texts']) == (
    COCO_IMAGES, 60,
  )  # fmt: skip
  spec = vit_jax.load(workdir).preprocessing
  lit = _coco_recalls(s.model, params, lambda x: preprocess.input_op(spec, x))
  crop = s.spec.data.pp.crop
  evaluation = _coco_recalls(s.model, params, lambda x: preprocess.eval_image(x, crop))
  for key, value in lit.items():
    assert printed[key] == pytest.approx(value, abs=1e-9), key
    assert in_run[f'coco/coco_captions/{key}'] == pytest.approx(evaluation[key], abs=1e-9), key


def test_an_evaluator_the_run_cannot_have_is_one_line(image_file):
  """ImageNet ReaL asked of an image-text run (no class logits), zero-shot asked of a
  classifier (no text tower), and config.evals beside the flat keys it replaces: each stops
  `prepare` with one line naming the fix (at a24f8ac the first was dropped in silence)."""
  from configs import digits as digits_config

  cases = [
    (tiny_digits(image_file, real_split='validation'), r"^config.real_split='validation' .*"),
    (digits_config.get_config(), r'^config.evals.zs evaluates an image-text model .*'),
    (tiny_digits(image_file, zeroshot_every=5), r'^config.zeroshot_every and config.evals .*'),
  ]
  cases[1][0].evals = {'zs': {'type': 'zeroshot', 'datasets': ('digits',)}}
  cases[2][0].zeroshot.datasets = ('digits',)
  for config, match in cases:
    with pytest.raises(ValueError, match=match) as stop:
      setup.prepare(config, '/nonexistent', jax.devices()[:1])
    assert '\n' not in str(stop.value)


def test_vit_zeroshot_embeds_a_runs_images_as_its_evaluator_bit_for_bit(
  lit_run, image_file, tmp_path
):
  """vit-zeroshot on a LiT run directory (`vit_jax.load` of the run: the run's own evaluation
  preprocessing, no uint8 cast) and the run's zero-shot evaluator give the same image
  embeddings bit for bit, on pictures whose resized pixels are not integers (13 to 17 x 11
  brought to the run's 8 px). Before, vit-zeroshot cast the resized pixels to uint8."""
  from vit_jax.evals import zeroshot as zeroshot_eval
  from vit_jax.inference import zeroshot as inference_zeroshot

  workdir, _ = lit_run
  rng = np.random.default_rng(0)
  for split, count in (('train', 1), ('test', 5)):
    (tmp_path / split / 'a').mkdir(parents=True)
    for i in range(count):
      pixels = rng.integers(0, 256, (13 + i, 11, 3), dtype=np.uint8)
      Image.fromarray(pixels).save(tmp_path / split / 'a' / f'{i}.png')
  paths = sorted(str(p) for p in (tmp_path / 'test' / 'a').glob('*.png'))
  model = vit_jax.load(workdir)
  assert not model.preprocessing.round_to_uint8
  x = model.preprocess(paths) * 127.5 + 127.5
  assert np.abs(x - np.round(x)).max() > 0.1  # the resized pixels are not integers
  names, ours, errors = inference_zeroshot.embed_files(model, paths, batch_size=32)
  assert names == paths and not errors
  evaluator = setup.prepare(tiny_digits(image_file), workdir, jax.devices()).evaluators['zeroshot']
  task = zeroshot_eval.Task('pictures', data_lib.get_source(str(tmp_path)), 'test', None, 1)
  theirs, _ = evaluator._images(model.params, task)  # the evaluator's own pass over a split
  np.testing.assert_array_equal(ours, theirs)
