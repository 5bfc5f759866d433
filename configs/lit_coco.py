r"""LiT on COCO captions: a released ViT-B/16 locked, a BERT-base text tower trained on captions.

  python -m vit_jax.main --config=configs/lit_coco.py --workdir=runs/lit_coco \
    --config.pretrained_path=ViT-B_16.npz --config.pp.vocab=vocab.txt

The image tower is any B/16 file vit_jax.checkpoint reads (the original ImageNet-21k
`gs://vit_models/imagenet21k/ViT-B_16.npz`, an AugReg file, a Hugging Face or timm copy,
`PATH:img` for a LiT file's tower), locked and without its head (`:img_head` trains a
768-wide image head as well); the text tower is BERT-base (LiT-B16B_2's architecture) from
scratch, on BERT's uncased vocabulary (`vocab.txt`, any `bert-base-uncased` copy), or, as the
released LiT models did, from released BERT weights: `config.text_pretrained_path` (default
'') names a Hugging Face `bert-base-uncased` directory or the original BERT TF checkpoint,
whose encoder starts the text tower (its head fresh; docs/image-text.md, "BERT text towers"):

  python -m vit_jax.main --config=configs/lit_coco.py --workdir=runs/lit_coco \
    --config.pretrained_path=ViT-B_16.npz --config.pp.vocab=bert-base-uncased/vocab.txt \
    --config.text_pretrained_path=bert-base-uncased --config.model.text.gelu_approximate=False

(bert-base-uncased's config.json names the exact GELU; the original TF checkpoint's code
computes the tanh one, our default: leave the flag out for it). tfds
`coco_captions` (`tfds build coco_captions`; `--config.dataset=FOLDER` reads a folder with
`train/captions.tsv` instead): one of an image's five captions per step, 16 tokens.
CLIP's softmax loss, t init log 10. Adam (lr 1e-3, weight decay 0.01 of big_vision's, here
10 = 0.01 / lr), cosine after 150 warmup steps, clip 1, batch 512, 5,000 steps: big_vision's
`configs/proj/image_text/siglip_lit_coco.py` with the softmax loss
(configs/siglip_lit_coco.py is that recipe itself).

Evaluation: COCO retrieval every 1,000 steps, as big_vision's recipe (`retrieval_coco/
coco_captions/img2txt_recall@1`, ...: Karpathy's test split, the first 5 captions of each
image). Expected result: not measured in this project (no COCO and no accelerator here);
big_vision reports none for this minimal recipe either.
"""

import ml_collections

from configs import common
from vit_jax.models import get_config as model_config

VARIANTS = ('', 'img_head')
# big_vision's `retrieval_coco` every 1,000 steps: Karpathy's 5,000 test images, here with the
# protocol's first 5 captions of each (big_vision's evaluator reads them all).
RETRIEVAL_COCO = {
  'type': 'retrieval',
  'every': 1_000,
  'datasets': ('coco_captions',),
  'max_texts': 5,
}


def coco_recipe(loss: str, img_head: bool = False) -> ml_collections.ConfigDict:
  """big_vision's LiT-on-COCO recipe with `loss` ('softmax' or 'sigmoid')."""
  config = common.get_config()
  config.task = 'contrastive'
  config.contrastive.loss = loss
  config.contrastive.lock_image = True
  config.contrastive.train_image_head = img_head
  config.dataset = 'coco_captions'
  config.model_name = 'LiT-B16B_2'
  model = model_config('LiT-B16B_2').to_dict()
  model['out_dim'] = (768 if img_head else None, 768)
  model['temperature_init'] = 10.0
  model['bias_init'] = -2.71 if loss == 'sigmoid' else None
  # LiT's tanh GELU; False computes the exact one that bert-base-uncased's file names.
  model['text']['gelu_approximate'] = True
  config.model = model
  config.pretrained_dir = ''
  config.pretrained_path = 'ViT-B_16.npz'
  # A BERT file for the text tower ('': from scratch); a bert-base-uncased directory, say.
  config.text_pretrained_path = ''
  config.pp.train = 'train'
  config.pp.test = 'val'
  config.pp.crop = 224
  config.pp.area_min = 1.0  # big_vision resizes the whole image: no crop
  config.pp.flip = True
  config.pp.randaug_layers = 2
  config.pp.randaug_magnitude = 10.0
  config.pp.tokenizer = 'bert'
  config.pp.vocab = 'vocab.txt'
  config.pp.max_len = 16
  config.shuffle_buffer = 250_000
  config.optimizer = 'adam'
  config.b1, config.b2 = 0.9, 0.999
  config.base_lr = 1e-3
  config.weight_decay = 0.01 / config.base_lr  # big_vision's wd 0.01 (vit_jax/optim.py)
  config.grad_norm_clip = 1.0
  config.decay_type = 'cosine'
  config.total_steps = 5_000
  config.warmup_steps = max(int(0.03 * config.total_steps), 100)
  config.batch = 512
  config.accum_steps = 1
  config.progress_every = 50
  config.checkpoint_every = 1_000
  config.evals = {'retrieval_coco': dict(RETRIEVAL_COCO)}
  return config


def get_config(variant: str = '') -> ml_collections.ConfigDict:
  """LiT-B16B_2 on COCO captions, CLIP's softmax loss; `:img_head` trains an image head."""
  if variant not in VARIANTS:
    raise ValueError(f'configs/lit_coco.py:{variant}: expected one of {VARIANTS}')
  return coco_recipe('softmax', img_head=variant == 'img_head')
