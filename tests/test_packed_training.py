"""Training on packed NaFlex rows (several images a row, vit_jax/data/packing.py): a packed
batch trains as the same images one a row, in the jit and the shard_map step."""

import jax
import ml_collections
import numpy as np
import pytest
from test_steps import _flat, _state

from configs import digits_naflex
from vit_jax import optim, parallel, tasks
from vit_jax.train import setup, spec, steps

PATCH, CLASSES = 2, 10
# Each image's patch grid (rows, columns), and the packed rows of 16 slots that hold them
# (a hand-made layout: images by index, at most 4 a row; the last row is empty).
GRIDS = ((2, 3), (4, 4), (1, 5), (3, 3), (2, 2), (5, 1), (1, 1), (3, 4), (2, 5), (4, 2),
         (1, 3), (2, 4), (3, 1), (1, 2), (2, 2), (2, 2))  # fmt: skip
ROWS = ((1,), (0, 3), (7, 4), (8, 2, 6), (9, 11), (15, 5, 10, 12), (13, 14), ())
TOKENS, SLOTS = 16, 4


def _run_spec(packed: bool, step: str = 'jit') -> spec.RunSpec:
  config = ml_collections.ConfigDict(digits_naflex.get_config().to_dict())
  tiny = {'hidden_size': 16, 'transformer.num_layers': 2, 'transformer.mlp_dim': 32,
          'transformer.num_heads': 2}  # fmt: skip
  overrides = {
    **{f'model.{k}': v for k, v in tiny.items()}, 'num_classes': CLASSES, 'step': step,
    'optimizer': 'sgd', 'base_lr': 0.5, 'warmup_steps': 1, 'total_steps': 10,
    'weight_decay': 0.0, 'pp.pack_tokens': TOKENS if packed else 0, 'pp.pack_images': SLOTS,
  }  # fmt: skip
  return spec.from_config(spec.with_overrides(config, overrides))


def _images(rng, patch: int = PATCH) -> list[np.ndarray]:
  """Each image's sequence (n, P + 3): random patches, ptype 1, its grid's rows and columns."""
  out = []
  for rows, cols in GRIDS:
    y, x = np.divmod(np.arange(rows * cols), cols)
    index = np.stack([np.ones_like(y), y, x], -1)
    out.append(np.concatenate([rng.uniform(-1, 1, (rows * cols, patch * patch * 3)), index], -1))
  return out


def _one_a_row(images, key: str, values) -> dict[str, np.ndarray]:
  """The images one a row of TOKENS slots, each with its `key` value (a label, a text)."""
  rows = np.zeros((len(images), TOKENS, images[0].shape[1]), np.float32)
  for i, image in enumerate(images):
    rows[i, : len(image)] = image
  return {'image': rows, key: values}


def _packed(images, key: str, values) -> dict[str, np.ndarray]:
  """ROWS' layout: slot k of a row holds its (k+1)-th image, its tokens marked k + 1, and
  the image's `key` value."""
  rows = np.zeros((len(ROWS), TOKENS, images[0].shape[1]), np.float32)
  slots = np.zeros((len(ROWS), SLOTS), np.int32)
  per_slot = np.zeros((len(ROWS), SLOTS, *values.shape[1:]), values.dtype)
  for r, members in enumerate(ROWS):
    offset = 0
    for k, i in enumerate(members):
      n = len(images[i])
      rows[r, offset : offset + n] = images[i]
      rows[r, offset : offset + n, -3] = k + 1
      offset += n
      per_slot[r, k], slots[r, k] = values[i], 1
  return {'image': rows, key: per_slot, 'slots': slots}


def _train(run: spec.RunSpec, batches, classes=CLASSES) -> tuple[dict, list[float]]:
  """Two steps of the spec's compiled step on 2 devices (4 rows each): final parameters and
  losses."""
  mesh = parallel.create_mesh(jax.devices()[:2])
  model = setup.build_model(run.model, num_classes=classes)
  tx, schedule = optim.for_training(run.optim, run.loop.total_steps)
  state = _state(run, model, tx)
  shardings = parallel.tree_shardings(state, mesh, run.step.sharding)
  step_fn = steps.train_step_for(run, tasks.build(run, model), tx, schedule, mesh, shardings)
  state, losses = jax.device_put(state, shardings), []
  for batch in batches:
    state, metrics = step_fn(state, parallel.global_batch(batch, parallel.batch_sharding(mesh)))
    losses.append(float(metrics['loss']))
  return _flat(state['params']), losses


def _assert_packed_trains_as_one_a_row(run_spec, batches, classes, shard_map=False) -> None:
  """`batches` (one a row, packed) pairs: the jit step's losses and parameters of the packed
  ones equal the unpacked ones' to 1e-5; with `shard_map`, the shard_map step's the jit
  step's to 1e-6."""
  want, want_losses = _train(run_spec(False), [b[0] for b in batches], classes)
  packed, losses = _train(run_spec(True), [b[1] for b in batches], classes)
  assert want_losses[1] < want_losses[0]  # the first step trains
  np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
  for key in want:
    np.testing.assert_allclose(packed[key], want[key], atol=1e-5, err_msg=key)
  if shard_map:
    per_device, sm_losses = _train(run_spec(True, 'shard_map'), [b[1] for b in batches], classes)
    np.testing.assert_allclose(sm_losses, losses, rtol=1e-6)
    for key in want:
      np.testing.assert_allclose(per_device[key], packed[key], atol=1e-6, err_msg=key)


def test_a_packed_batch_trains_as_its_images_one_a_row_in_jit_and_shard_map():
  """16 images of mixed grids packed 0 to 4 a row in 8 rows (one empty) against the same
  images one a row, two SGD steps on the batch: the losses and parameters equal to 1e-5, so
  the first step's loss and gradient do; the shard_map step (4 rows a device, the empty row
  on the second) equals the jit step."""
  rng = np.random.default_rng(0)
  images, labels = _images(rng), rng.integers(0, CLASSES, len(GRIDS)).astype(np.int32)
  batches = [(_one_a_row(images, 'label', labels), _packed(images, 'label', labels))] * 2
  assert sorted(i for row in ROWS for i in row) == list(range(len(GRIDS)))
  _assert_packed_trains_as_one_a_row(_run_spec, batches, CLASSES, shard_map=True)


def _siglip_spec(packed: bool) -> spec.RunSpec:
  """configs/siglip2_finetune.py:B16-naflex-packed (packed) or :B16-naflex with
  test_naflex's tiny towers, from scratch, on ROWS' rows of TOKENS slots."""
  from test_lit import SP_MODEL
  from test_naflex import TINY_NAFLEX

  from configs import siglip2_finetune

  config = siglip2_finetune.get_config('B16-naflex-packed' if packed else 'B16-naflex')
  if packed:
    assert (config.pp.pack_tokens, config.pp.pack_images, config.batch) == (256, 8, 256)
  config.model = {**config.model.to_dict(), **TINY_NAFLEX}
  overrides = {
    'pp.tokenizer': 'sentencepiece', 'pp.vocab': SP_MODEL, 'pp.max_len': 16,
    'pp.max_patches': 16, 'pretrained_path': '', 'optimizer': 'sgd',
    'base_lr': 0.5, 'warmup_steps': 1, 'weight_decay': 0.0, 'batch': len(ROWS),
    'pp.pack_tokens': TOKENS if packed else 0, 'pp.pack_images': SLOTS, 'pp.pack_budgets': (),
  }  # fmt: skip
  return spec.from_config(spec.with_overrides(config, overrides))


def test_a_packed_batch_of_pairs_trains_as_its_pairs_one_a_row_with_the_sigmoid_loss():
  """The packed SigLIP 2 fine-tune's step (configs/siglip2_finetune.py:B16-naflex-packed,
  tiny towers, the sigmoid loss): the 16 images of mixed grids with their texts packed in
  ROWS' 8 rows against the same pairs one a row (:B16-naflex): two SGD steps' losses and
  parameters equal to 1e-5. (The shard_map step on packed rows: the test above, and the
  masked losses' tests in test_contrastive.)"""
  rng = np.random.default_rng(1)
  images = _images(rng, patch=4)  # TINY_NAFLEX's patches
  texts = rng.integers(1, 1200, (len(GRIDS), 16)).astype(np.int32)
  batches = [(_one_a_row(images, 'text', texts), _packed(images, 'text', texts))] * 2
  _assert_packed_trains_as_one_a_row(_siglip_spec, batches, None)


def test_packing_asks_for_a_model_of_patch_sequences():
  from configs import digits

  config = ml_collections.ConfigDict(digits.get_config().to_dict())
  with pytest.raises(ValueError, match='pack_tokens=16 packs patch sequences'):
    spec.from_config(spec.with_overrides(config, {'pp.pack_tokens': 16}))


# configs/digits_naflex.py:packed with one block of width 16: 4 steps of 8 rows (24 digits read
# a step), evaluated at the end only, the digits read as 2 shards (the batches do not depend on
# the process count).
PACKED_CONFIG = '--config=configs/digits_naflex.py:packed'
E2E = {
  'model.hidden_size': 16, 'model.transformer.num_layers': 1, 'model.transformer.mlp_dim': 32,
  'model.transformer.num_heads': 2, 'total_steps': 4, 'batch': 8, 'checkpoint_every': 4,
  'eval_every': 0, 'warmup_steps': 1, 'progress_every': 1, 'data_shards': 2,
}  # fmt: skip


def _metrics(workdir: str) -> list[dict]:
  from vit_jax import rundir

  keys = ('step', 'loss', 'grad_norm', 'dropped_images')
  return [{k: m[k] for k in keys if k in m} for m in rundir.read_metrics(workdir)]


@pytest.mark.slow
def test_packed_run_resumes_exactly_after_sigterm_and_two_processes_train_alike(
  tmp_path, monkeypatch
):
  """launch/local.sh, 2 processes x 1 device, trains the packed run uninterrupted; the same
  run in this process on 2 devices, a real SIGTERM at step 2 then a rerun, ends on its
  metrics and parameters bit for bit: the resume is exact (the rows are a function of their
  chunk's index) and 2 processes train as 1 (a 2-device sum adds the same two numbers)."""
  import os
  import subprocess
  import sys

  from conftest import process_env
  from test_lit import sigterm_at
  from test_multihost import LAUNCH, REPO, RUN_TIMEOUT_S, _final_params

  from vit_jax import train
  from vit_jax.train import loop as loop_lib

  two = str(tmp_path / 'two')
  flags = [f'--config.{k}={v}' for k, v in E2E.items()]
  launch = ['bash', os.path.join(LAUNCH, 'local.sh'), '2', PACKED_CONFIG]
  env = {**process_env(1), 'PYTHON': sys.executable, 'DEVICES_PER_PROCESS': '1', 'TIMEOUT': '120'}
  run = subprocess.run(
    [*launch, f'--workdir={two}', *flags], cwd=REPO, env=env, capture_output=True, text=True,
    timeout=RUN_TIMEOUT_S,
  )  # fmt: skip
  assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
  trained = [m for m in _metrics(two) if 'loss' in m]
  assert len(trained) == 4 and all(0 <= m['dropped_images'] < 24 for m in trained)

  config = spec.with_overrides(digits_naflex.get_config('packed'), {**E2E, 'checkpoint_every': 2})
  workdir = str(tmp_path / 'one')
  with monkeypatch.context() as m:
    m.setattr(loop_lib, '_train_batches', sigterm_at(loop_lib._train_batches, 1))
    first = train.train_and_evaluate(config, workdir, devices=jax.devices()[:2])
  assert first['status'] == 'preempted' and first['step'] == 2
  second = train.train_and_evaluate(config, workdir, devices=jax.devices()[:2])
  assert second['status'] == 'done' and second['step'] == 4
  assert _metrics(workdir) == _metrics(two)
  ours, theirs = _flat(second['params']), _final_params(two)
  assert ours.keys() == theirs.keys()
  for key in theirs:
    np.testing.assert_array_equal(ours[key], theirs[key], err_msg=key)


def test_vit_embed_pack_gives_each_image_its_unpacked_embedding(tmp_path, monkeypatch):
  """vit-embed --pack=32 --images_per_row=4 on a tiny SigLIP 2 NaFlex model and a folder of
  images of 8 aspect ratios: the ids and, to 1e-5, the embeddings of the unpacked command,
  in fewer rows (the 8 images, at most 16 patches each, in at most 6 rows of 32)."""
  from conftest import jpeg_bytes, randomize
  from test_naflex import SHAPES, TINY_NAFLEX

  from vit_jax import checkpoint, families
  from vit_jax.cli import embed
  from vit_jax.data import embeddings, packing
  from vit_jax.models import get_config, model_from_config

  model = model_from_config({**get_config('SigLIP2-B16-naflex').to_dict(), **TINY_NAFLEX})
  path = str(tmp_path / 'siglip2_tiny_naflex.npz')
  checkpoint.save_npz(randomize(families.param_shapes(model), seed=5, scale=0.3), path)
  folder = tmp_path / 'images'
  folder.mkdir()
  rng = np.random.default_rng(1)
  for i, (h, w) in enumerate(SHAPES):
    (folder / f'{i}.jpg').write_bytes(jpeg_bytes(rng, h, w))
  options = {'folder': str(folder), 'process_count': 1, 'batch_size': 8, 'max_patches': 16}
  assert embed.run(path, str(tmp_path / 'one'), options) == 0
  rows = []
  pack_rows = packing.pack_rows

  def counting(*args, **kwargs):
    packed = pack_rows(*args, **kwargs)
    rows.append(len(packed['image']))
    return packed

  monkeypatch.setattr(packing, 'pack_rows', counting)
  packed = {**options, 'pack': 32, 'images_per_row': 4}
  assert embed.run(path, str(tmp_path / 'packed'), packed) == 0
  want, got = embeddings.read(str(tmp_path / 'one')), embeddings.read(str(tmp_path / 'packed'))
  assert got[2] == want[2] == [f'{i}.jpg' for i in range(len(SHAPES))]
  assert len(rows) == 1 and rows[0] <= 6
  np.testing.assert_allclose(got[1], want[1], atol=1e-5)
  assert 'packed 4 a row of 32' in got[0]['preprocessing']
