r"""big_vision's public SigLIP LiT recipe, `configs/proj/image_text/siglip_lit_coco.py`.

  python -m vit_jax.main --config=configs/siglip_lit_coco.py --workdir=runs/siglip_lit_coco \
    --config.pretrained_path=ViT-B_16.npz --config.pp.vocab=vocab.txt

As big_vision's file: tfds `coco_captions` train, a frozen B/16 image tower (no head;
`:img_head` trains a 768-wide one, big_vision's `img_head=True`), a BERT-base text tower
with a 768 head, 16 tokens, the sigmoid loss with `t` initialised to log 10 and `b` to
-2.71, Adam (b1 0.9, b2 0.999), lr 1e-3 with cosine decay after max(3% of the steps, 100)
= 150 warmup steps, weight decay 0.01 (big_vision's convention: 10 here, see
vit_jax/optim.py) on the kernels, gradient clipping at 1, batch 512, 5,000 steps,
resize 224, flip, RandAugment(2, 10), values in [-1, 1], shuffle buffer 250,000.
Differences: big_vision starts the text tower from released BERT-base weights; this
trainer starts it from scratch (any BERT-base `vocab.txt`) unless
`--config.text_pretrained_path` names them (default ''): a Hugging Face `bert-base-uncased`
directory (add `--config.model.text.gelu_approximate=False`, its exact GELU) or the original
BERT TF checkpoint, big_vision's (configs/lit_coco.py shows the command). big_vision
resizes the whole image; here the inception crop at area 1 (`pp.area_min=1`) takes the
whole image at a random aspect ratio. The COCO retrieval evaluator runs every 1,000 steps
as the original's, on the first 5 captions of each test image (the original reads all of
them).
The loss's logits are gathered (`config.contrastive.logits`, the default): at batch 512 they
take 1 MiB; `--config.contrastive.logits=chunked` gives the same loss in memory linear in the
batch, for batches of tens of thousands (docs/benchmarks.md).

Expected result: not measured in this project (no COCO and no accelerator here); the
recipe is big_vision's minimal example and it reports no number.
"""

import ml_collections

from configs import lit_coco


def get_config(variant: str = '') -> ml_collections.ConfigDict:
  """The SigLIP LiT recipe; `:img_head` trains the image head."""
  if variant not in lit_coco.VARIANTS:
    raise ValueError(f'configs/siglip_lit_coco.py:{variant}: expected one of {lit_coco.VARIANTS}')
  return lit_coco.coco_recipe('sigmoid', img_head=variant == 'img_head')
