r"""The digits LiT demonstration: zero-shot and retrieval over seeds, against the locked ViT.

  python -m vit_jax.main --config=configs/digits.py --workdir=runs/digits
  python -m vit_jax.reproduce.lit_digits --image_run=runs/digits --workdir=runs/lit_digits

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

import jax
import numpy as np
from absl import app, flags

from configs import lit_digits
from vit_jax import data as data_lib
from vit_jax import files, rundir, text, train
from vit_jax.data import digits_text
from vit_jax.evals import retrieval, zeroshot
from vit_jax.train import setup as setup_lib

FLAGS = flags.FLAGS
flags.DEFINE_string('image_run', 'runs/digits', 'The digits ViT run (configs/digits.py).')
flags.DEFINE_string('workdir', 'runs/lit_digits', 'Where the runs go: WORKDIR/seed_<s>.')
flags.DEFINE_list('seeds', ['0', '1', '2'], 'The seeds.')
flags.DEFINE_string('variant', 'softmax', 'configs/lit_digits.py:VARIANT.')


def _test_images(config) -> tuple[np.ndarray, np.ndarray]:
  """The 360 test digits, preprocessed as evaluation does, and their labels."""
  spec = setup_lib.spec_lib.from_config(config)
  source = data_lib.get_source('digits')
  ds = data_lib.eval_dataset(source, 'test', spec.data, local_batch=360)
  batches = list(data_lib.host_batches(ds))
  keep = np.concatenate([b['mask'] for b in batches]) > 0
  images = np.concatenate([b['image'] for b in batches])[keep]
  return images, np.concatenate([b['label'] for b in batches])[keep]


def retrieval_of(model, params, images, labels, max_len: int) -> dict[str, float]:
  """Recall@1 both ways between the test images and the held-out captions of the classes."""
  tokenizer = text.get_tokenizer('bert', digits_text.VOCAB, max_len)
  captions = zeroshot.prompt_texts(digits_text.CLASS_NAMES, digits_text.HELD_OUT_TEMPLATES)
  zimg = np.asarray(model.apply({'params': params}, images=images)[0])
  ztxt = np.asarray(model.apply({'params': params}, tokens=tokenizer(captions))[1])
  per_class = len(digits_text.HELD_OUT_TEMPLATES)
  classes = np.repeat(np.arange(len(digits_text.CLASS_NAMES)), per_class)
  owner = np.array([np.flatnonzero(labels == c)[0] for c in classes])  # an image of the class
  r = retrieval.recalls(zimg, ztxt, owner, ks=(1,), image_labels=labels)
  return {'i2t r@1': r['img2txt/r@1'], 't2i r@1': r['txt2img/r@1']}


def run_seed(seed: int) -> dict[str, float]:
  config = lit_digits.get_config(FLAGS.variant)
  config.pretrained_path = FLAGS.image_run
  config.seed = seed
  result = train.train_and_evaluate(config, files.join(FLAGS.workdir, f'seed_{seed}'))
  s = setup_lib.prepare(config, files.join(FLAGS.workdir, f'seed_{seed}'))
  params = jax.device_get(result['params'])
  images, labels = _test_images(config)
  out = {'zeroshot': result['zeroshot/digits']}
  out.update(retrieval_of(s.model, params, images, labels, config.pp.max_len))
  return out


def main(argv):
  del argv
  rows = {int(s): run_seed(int(s)) for s in FLAGS.seeds}
  locked = (rundir.last_evaluation(FLAGS.image_run) or {}).get('accuracy_test')
  keys = list(next(iter(rows.values())))
  for seed, row in rows.items():
    print(f'seed {seed}: ' + ', '.join(f'{k} {100 * row[k]:.2f}%' for k in keys))
  for k in keys:
    values = 100 * np.array([row[k] for row in rows.values()])
    print(f'{k}: {values.mean():.2f} +- {values.std():.2f}% over {len(values)} seeds')
  if locked is not None:
    print(f'locked ViT classifier (accuracy_test of {FLAGS.image_run}): {100 * locked:.2f}%')


if __name__ == '__main__':
  app.run(main)
