r"""Fine-tuning SigLIP 2 on image-text pairs: both towers start from a released file.

  python -m vit_jax.main --config=configs/siglip2_finetune.py:B16-256 \
    --workdir=runs/siglip2_coco --config.pretrained_path=siglip2_b16_256.npz \
    --config.pp.vocab=gemma_tokenizer.model
  python -m vit_jax.main --config=configs/siglip2_finetune.py:B16-naflex \
    --workdir=runs/siglip2_naflex_coco --config.pretrained_path=siglip2_b16_naflex.npz \
    --config.pp.vocab=gemma_tokenizer.model [--config.pp.max_patches=256]
  python -m vit_jax.main --config=configs/siglip2_finetune.py:B16-naflex-packed \
    --workdir=runs/siglip2_naflex_packed --config.pretrained_path=siglip2_b16_naflex.npz \
    --config.pp.vocab=gemma_tokenizer.model

The argument is a SigLIP 2 model of the registry without its prefix (`B16-256`,
`So400m14-384`, `B16-naflex`, ...; `vit-models` lists them), the file its `siglip2_*.npz`
(big_vision's layout, read by name). big_vision released no SigLIP 2 training code; its
maintainers point fine-tuners to `siglip_lit_coco.py`, and this is that recipe with both
towers unlocked and started from the file (image tower, text tower, `t` and `b`): tfds
`coco_captions` train, the sigmoid loss, Adam (b1 0.9, b2 0.999) at lr 1e-5 (a pretrained
model: 100 times below the from-scratch recipe's) with cosine decay after 100 warmup steps,
weight decay 1e-4 on the kernels, gradient clipping at 1, batch 512, 5,000 steps. Images:
the fixed-resolution models take the whole image resized to their size (`pp.area_min=1`) and
flipped; a NaFlex model takes each image at its own aspect ratio as at most `pp.max_patches`
patches of 16 (256, its evaluation sequence; any other length is a flag), flipped. Texts:
Gemma's tokenizer as SigLIP 2 (lower case, 64 ids, sticky <eos>, padding 0). The COCO
retrieval evaluator runs every 1,000 steps (Karpathy's test split, the first 5 captions).
The loss's logits are gathered (`config.contrastive.logits`, the default): at batch 512 they
take 1 MiB; `--config.contrastive.logits=chunked` gives the same loss in memory linear in the
batch, for batches of tens of thousands (docs/benchmarks.md).

`B16-naflex-packed` (any NaFlex model with `-packed`) trains on NaViT's packed rows
(vit_jax/data/packing.py, docs/naflex-packing.md): rows of 256 patch slots holding up to 8
images each, every image's patch budget drawn uniformly from {64, 80, ..., 256} (NaViT's
resolution sampling), 256 rows a batch (about 470 images: the rows read 3 images each and
leave out those that fit no row, 39% on that distribution, docs/naflex-packing.md); the
sigmoid loss runs over the images in the batch, and evaluation takes each image alone as at
most `pp.max_patches` patches, as unpacked.

Expected result: not measured in this project (no COCO, no SigLIP 2 file and no
accelerator here); the tests run it on mock data with tiny towers (`B16-naflex` end to end;
`B16-naflex-packed`'s step on packed mock pairs, against the same pairs one a row).
"""

import ml_collections

from configs import common, lit_coco
from vit_jax import families
from vit_jax.models import MODEL_CONFIGS
from vit_jax.models import get_config as model_config

PREFIX = 'SigLIP2-'


PACKED = '-packed'


def get_config(variant: str = 'B16-256') -> ml_collections.ConfigDict:
  """SigLIP 2 `variant` (e.g. 'B16-256', 'B16-naflex', 'B16-naflex-packed') fine-tuned on
  COCO captions."""
  packed = variant.endswith('naflex' + PACKED)  # packed rows are NaFlex's
  variant = variant.removesuffix(PACKED) if packed else variant
  name = PREFIX + variant
  if name not in MODEL_CONFIGS:
    known = [n.removeprefix(PREFIX) for n in MODEL_CONFIGS if n.startswith(PREFIX)]
    raise ValueError(f'configs/siglip2_finetune.py:{variant}: expected one of {known}')
  model = model_config(name)
  config = common.get_config()
  config.task = 'contrastive'
  config.contrastive.loss = 'sigmoid'
  config.contrastive.lock_image = False
  config.dataset = 'coco_captions'
  config.model_name = name
  config.model = model.to_dict()
  config.pretrained_dir = ''
  config.pretrained_path = 'siglip2_' + '_'.join(variant.lower().rsplit('-', 1)) + '.npz'
  config.pp.train = 'train'
  config.pp.test = 'val'
  if families.of_config(model).sequence_patch(model) is None:
    config.pp.crop = model.pp.size
  else:  # NaFlex: patch sequences (of the model's patch), no crop
    config.pp.max_patches = model.pp.max_patches
  config.pp.area_min = 1.0  # the whole image
  config.pp.flip = True
  config.pp.tokenizer = model.pp.tokenizer_name
  config.pp.max_len = model.pp.max_len
  config.pp.vocab = 'gemma_tokenizer.model'
  config.optimizer = 'adam'
  config.b1, config.b2 = 0.9, 0.999
  config.base_lr = 1e-5
  config.weight_decay = 1e-4 / config.base_lr  # big_vision's convention (vit_jax/optim.py)
  config.grad_norm_clip = 1.0
  config.decay_type = 'cosine'
  config.total_steps = 5_000
  config.warmup_steps = 100
  config.batch = 512
  config.accum_steps = 1  # a contrastive batch is one set of negatives
  config.progress_every = 50
  config.checkpoint_every = 1_000
  config.evals = {'retrieval_coco': dict(lit_coco.RETRIEVAL_COCO)}
  if packed:
    config.pp.pack_tokens, config.pp.pack_images, config.pp.pack_read = 256, 8, 3
    config.pp.pack_budgets = tuple(range(64, 257, 16))
    config.batch = 256  # rows
  return config
