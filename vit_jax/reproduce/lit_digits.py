r"""The digits LiT demonstration: zero-shot and retrieval over seeds, against the locked ViT.

  python -m vit_jax.main --config=configs/digits.py --workdir=runs/digits
  python -m vit_jax.reproduce lit_digits --image_run=runs/digits \
      --workdir=runs/lit_digits_seeds --seeds=0,1,2

Trains configs/lit_digits.py (the digits ViT of `--image_run` locked, a small BERT text tower
from scratch) once per seed in `WORKDIR/seed_<s>` (a finished run is read, not retrained),
then on the 360 test digits reports, per seed and as mean +- std:
  zeroshot   top-1 of the class whose held-out prompts (digits_text.HELD_OUT_TEMPLATES, never
             trained on) embed closest (the run's `zeroshot/digits`, vit_jax/evals/zeroshot.py);
  i2t r@1    image-to-text recall@1 over the 30 held-out captions (3 per class): a hit is
             any caption of the image's class (vit_jax/evals/retrieval.py);
  t2i r@1    text-to-image recall@1 of the same captions;
and the locked ViT's own classifier (`accuracy_test` of `--image_run`), for comparison.
"""

from collections.abc import Sequence

import jax
import numpy as np

from configs import lit_digits
from vit_jax import data as data_lib
from vit_jax import families, files, rundir, text, train
from vit_jax.data import digits_text
from vit_jax.evals import retrieval, zeroshot
from vit_jax.train import setup as setup_lib


def _test_images(config) -> tuple[np.ndarray, np.ndarray]:
  """The 360 test digits, preprocessed as evaluation does, and their labels."""
  spec = setup_lib.spec_lib.from_config(config)
  source = data_lib.get_source('digits')
  ds = data_lib.eval_dataset(source, 'test', spec.data, local_batch=360)
  batches = list(data_lib.host_batches(ds))
  keep = np.concatenate([b['mask'] for b in batches]) > 0
  images = np.concatenate([b['image'] for b in batches])[keep]
  return images, np.concatenate([b['label'] for b in batches])[keep]


def caption_tokenizer(model, max_len: int = 0) -> text.Tokenizer:
  """The captions' tokenizer: the model's (its `pp`) on the digits vocabulary, as training's."""
  return families.of_module(model).tokenizer(model.pp, digits_text.VOCAB, max_len=max_len)


def retrieval_of(model, params, images, labels, max_len: int) -> dict[str, float]:
  """Recall@1 both ways between the test images and the held-out captions of the classes."""
  tokenizer = caption_tokenizer(model, max_len)
  captions = zeroshot.prompt_texts(digits_text.CLASS_NAMES, digits_text.HELD_OUT_TEMPLATES)
  zimg = np.asarray(model.apply({'params': params}, images=images)[0])
  ztxt = np.asarray(model.apply({'params': params}, tokens=tokenizer(captions))[1])
  per_class = len(digits_text.HELD_OUT_TEMPLATES)
  classes = np.repeat(np.arange(len(digits_text.CLASS_NAMES)), per_class)
  owner = np.array([np.flatnonzero(labels == c)[0] for c in classes])  # an image of the class
  r = retrieval.recalls(zimg, ztxt, owner, ks=(1,), image_labels=labels)
  return {'i2t r@1': r['img2txt/r@1'], 't2i r@1': r['txt2img/r@1']}


def run_seed(image_run: str, workdir: str, seed: int) -> dict[str, float]:
  """Trains (or reads) the seed's run; its zero-shot and retrieval metrics."""
  config = lit_digits.get_config()
  config.pretrained_path = image_run
  config.seed = seed
  run = files.join(workdir, f'seed_{seed}')
  result = train.train_and_evaluate(config, run)
  model = setup_lib.prepare(config, run).model
  images, labels = _test_images(config)
  out = {'zeroshot': result['zeroshot/digits']}
  params = jax.device_get(result['params'])
  out.update(retrieval_of(model, params, images, labels, config.pp.max_len))
  return out


def report(image_run: str, workdir: str, seeds: Sequence[int]) -> str:
  """The per-seed lines, the mean +- std of each metric, and the locked classifier's."""
  if rundir.is_run(workdir) or rundir.latest_step(workdir) is not None:
    raise ValueError(
      f"{workdir} is a run directory (of python -m vit_jax.main): the seeds' runs need a "
      f'folder of their own, such as --workdir={str(workdir).rstrip("/")}_seeds'
    )
  rows = {seed: run_seed(image_run, workdir, seed) for seed in seeds}
  keys = list(next(iter(rows.values())))
  lines = [
    f'seed {s}: ' + ', '.join(f'{k} {100 * r[k]:.2f}%' for k in keys) for s, r in rows.items()
  ]
  for k in keys:
    values = 100 * np.array([row[k] for row in rows.values()])
    lines.append(f'{k}: {values.mean():.2f} +- {values.std():.2f}% over {len(values)} seeds')
  locked = (rundir.last_evaluation(image_run) or {}).get('accuracy_test')
  if locked is not None:
    lines.append(f'locked ViT classifier (accuracy_test of {image_run}): {100 * locked:.2f}%')
  return '\n'.join(lines)
