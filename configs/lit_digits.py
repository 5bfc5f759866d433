r"""LiT on the bundled digits: the digits ViT locked, a small BERT text tower trained on captions.

  python -m vit_jax.main --config=configs/digits.py --workdir=runs/digits      # the image tower
  python -m vit_jax.main --config=configs/lit_digits.py --workdir=runs/lit_digits

The image tower is the default digits job's ViT (configs/digits.py, its run directory
`runs/digits` read as a pretrained file: any format vit_jax.checkpoint reads works), locked
(no gradient, no optimizer state) and without its 10-class head: its 64 pre-logits features
are the image embedding, so zero-shot is not the classifier itself. The text tower is a
2-layer BERT of width 64 trained from scratch, its [CLS] token through a head of width 64, on
captions made of the class name in six templates (vit_jax/data/digits_text.py, which also
builds the shipped WordPiece vocabulary, 31 tokens); one caption per image per step, drawn
as a function of the seed and the example's position in the stream (exact resume). CLIP's
softmax loss (`:sigmoid`: SigLIP's, t init log 10, b init -10). Adam, lr 1e-3, cosine,
1,000 steps of 64 pairs. `:unlocked` trains both towers (the image tower from the same file).

Expected result (docs/image-text.md; `python -m vit_jax.reproduce lit_digits --seeds=0,1,2`
runs the three seeds): zero-shot top-1 on the 360 test digits with three templates training
never saw 98.89% for each of seeds 0-2 (`zeroshot/digits` in metrics.jsonl), image-to-text
R@1 98.89%, text-to-image R@1 100% (`retrieval/digits/...`), and few-shot of the locked
features 97.13/97.96/98.15% at 1/5/10 shots (`fewshot/digits/...`), against 98.89% for the
locked ViT's own classifier (the `runs/digits` of `make run`).
"""

import ml_collections

from configs import common
from configs import digits as digits_config
from vit_jax.data import digits_text

VARIANTS = ('softmax', 'sigmoid', 'unlocked')


def text_tower() -> ml_collections.ConfigDict:
  """A 2-layer BERT of width 64 over the digits vocabulary."""
  return ml_collections.ConfigDict(
    {
      'hidden_size': 64,
      'num_layers': 2,
      'num_heads': 2,
      'mlp_dim': 128,
      'vocab_size': len(digits_text.vocabulary()),
      'max_length': 16,
      'dropout_rate': 0.0,
    }
  )


def get_config(variant: str = 'softmax') -> ml_collections.ConfigDict:
  """The digits LiT; `variant` is 'softmax' (the default), 'sigmoid' or 'unlocked'."""
  if variant not in VARIANTS:
    raise ValueError(f'configs/lit_digits.py:{variant}: expected one of {VARIANTS}')
  image = digits_config.get_config()
  config = common.get_config()
  config.task = 'contrastive'
  config.contrastive.loss = 'sigmoid' if variant == 'sigmoid' else 'softmax'
  config.contrastive.lock_image = variant != 'unlocked'
  config.dataset = 'digits'
  config.caption_templates = digits_text.TRAIN_TEMPLATES
  config.model_name = 'LiT-digits'
  config.model = ml_collections.ConfigDict(
    {
      'image': image.model.to_dict(),
      'text_model': 'bert',
      'text': text_tower().to_dict(),
      'out_dim': (None, 64),
      'temperature_init': 10.0 if variant == 'sigmoid' else 1.0,
      'bias_init': -10.0 if variant == 'sigmoid' else None,
      'pp': {'tokenizer_name': 'bert', 'size': 8, 'max_len': 12},
    }
  )
  config.pretrained_dir = ''
  config.pretrained_path = 'runs/digits'  # the default digits job's run directory
  config.pp = image.pp.to_dict()
  config.pp.tokenizer = 'bert'
  config.pp.vocab = str(digits_text.VOCAB)
  config.pp.max_len = 12
  config.optimizer = 'adam'
  config.weight_decay = 0.01
  config.grad_norm_clip = 1.0
  config.base_lr = 1e-3
  config.decay_type = 'cosine'
  config.warmup_steps = 50
  config.total_steps = 1000
  config.batch = 64
  config.accum_steps = 1
  config.progress_every = 50
  config.checkpoint_every = 500
  # At the end (every=0), on the 360 test digits: zero-shot top-1 with three templates
  # training never saw; retrieval both ways with those templates as captions (a caption
  # matches every image of its class); few-shot of the locked tower's 64 features.
  held_out = digits_text.HELD_OUT_TEMPLATES
  config.evals = {
    'zeroshot': {
      'type': 'zeroshot',
      'datasets': ('digits',),
      'templates': held_out,
      'canonicalize': False,  # the templates as training's captions are written
    },
    'retrieval': {'type': 'retrieval', 'datasets': ('digits',), 'caption_templates': held_out},
    'fewshot': {'type': 'fewshot', 'datasets': ('digits',), 'shots': (1, 5, 10)},
  }
  config.batch_eval = 360
  return config
