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
             any caption of the image's class (the run's `retrieval/digits/img2txt_recall@1`,
             vit_jax/evals/retrieval.py);
  t2i r@1    text-to-image recall@1 of the same captions (`.../txt2img_recall@1`);
and the locked ViT's own classifier (`accuracy_test` of `--image_run`), for comparison.
"""

from collections.abc import Sequence

import numpy as np

from configs import lit_digits
from vit_jax import files, rundir, train


def run_seed(image_run: str, workdir: str, seed: int) -> dict[str, float]:
  """Trains (or reads) the seed's run; its zero-shot and retrieval metrics (its evaluators')."""
  config = lit_digits.get_config()
  config.pretrained_path = image_run
  config.seed = seed
  result = train.train_and_evaluate(config, files.join(workdir, f'seed_{seed}'))
  return {
    'zeroshot': result['zeroshot/digits'],
    'i2t r@1': result['retrieval/digits/img2txt_recall@1'],
    't2i r@1': result['retrieval/digits/txt2img_recall@1'],
  }


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
