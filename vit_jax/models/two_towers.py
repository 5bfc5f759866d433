"""Image-text two-tower models: LiT (Zhai et al., arXiv:2111.07991) and SigLIP (Zhai et al.,
arXiv:2303.15343), the original vit_jax `LitModel` and big_vision's `two_towers.Model`.

  model = get_model('LiT-B16B_2')
  variables = model.init(rng, images=images, tokens=tokens)
  zimg, ztxt, out = model.apply(variables, images=images, tokens=tokens)
  probs = jax.nn.softmax(out['t'] * zimg @ ztxt.T)                 # LiT
  probs = jax.nn.sigmoid(out['t'] * zimg @ ztxt.T + out['b'])      # SigLIP

The parameter tree: `img` (this project's `VisionTransformer`, or SigLIP 2's `NaFlexViT` with
`image_model='naflex'`; its `head` of width out_dim[0] when set), `txt` (a text tower of
`vit_jax.models.text`, its `head` of width out_dim[1]), `t` (1,) the log temperature and, for
SigLIP, `b` (1,) the learned logit bias.
"""

from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from vit_jax.models import naflex
from vit_jax.models.naflex import NaFlexViT
from vit_jax.models.text import TEXT_MODELS
from vit_jax.models.vit import VisionTransformer

# The image towers: a ViT of square-ish images, or NaFlex's sequences of native-aspect patches.
IMAGE_MODELS = {'vit': VisionTransformer, 'naflex': NaFlexViT}


def _normalized(z: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
  """(z / (|z| + 1e-8), |z|): the original's normalisation, the epsilon outside the norm.
  The norm's gradient at a zero vector is 0, not NaN (sqrt's derivative at 0 is infinite):
  the square root is taken of 1 there, and its result not used."""
  squares = jnp.sum(z * z, axis=-1, keepdims=True)
  nonzero = squares > 0
  norm = jnp.where(nonzero, jnp.sqrt(jnp.where(nonzero, squares, 1.0)), 0.0)
  return z / (norm + 1e-8), norm


def out_dims(out_dim: int | tuple[int | None, int | None]) -> tuple[int | None, int | None]:
  """(image head width, text head width); one int sets both."""
  if isinstance(out_dim, int):
    return out_dim, out_dim
  image, text = out_dim
  return image, text


def tower_classes(config: Mapping[str, Any]) -> dict[str, type[nn.Module]]:
  """The module each tower field builds: {'image': VisionTransformer or NaFlexViT, 'text': ...}."""
  text_model = config.get('text_model', 'bert')
  if text_model not in TEXT_MODELS:
    raise ValueError(f'text_model={text_model!r}; expected one of {sorted(TEXT_MODELS)}')
  image_model = config.get('image_model', 'vit')
  if image_model not in IMAGE_MODELS:
    raise ValueError(f'image_model={image_model!r}; expected one of {sorted(IMAGE_MODELS)}')
  return {'image': IMAGE_MODELS[image_model], 'text': TEXT_MODELS[text_model]}


def image_inputs(image_model: str, images: Any, images_per_row: int = 0) -> dict[str, Any]:
  """The image tower's call's keyword arguments: a ViT's NHWC `inputs`, a NaFlex tower's
  patch sequences (a dict, or packed as the input pipeline gives them), with
  `images_per_row` K > 0 rows of up to K images each (`NaFlexViT`)."""
  if image_model != 'naflex':
    if images_per_row:
      raise ValueError(
        f'images_per_row={images_per_row} packs NaFlex images; image_model={image_model!r}'
        " takes one image an example: use image_model='naflex' or images_per_row=0"
      )
    return {'inputs': images}
  return {**naflex.inputs(images), 'images_per_row': images_per_row}


class TwoTowerModel(nn.Module):
  """An image tower and a text tower mapping to one embedding space.

  Attributes:
    image: the image tower's fields (`VisionTransformer`'s, every ViT option: dtype,
      attention_impl, scan_layers, remat_policy, ...; or `NaFlexViT`'s); its `num_classes`
      is out_dim[0].
    text: the text tower's fields (`vit_jax.models.text.BertTower` or `TextTransformer`);
      its `num_classes` is out_dim[1].
    text_model: 'bert' or 'text_transformer'.
    image_model: 'vit' (NHWC images) or 'naflex' (images as patch sequences: a dict of
      `patches`, `ptype`, `yidx`, `xidx`, vit_jax/data/naflex.py).
    out_dim: (image head, text head) widths; None leaves that tower's head out (its pooled
      features are the embedding).
    temperature_init: exp of the initial `t` (LiT: 1, so t = 0; SigLIP: 10).
    bias_init: initial value of the learned logit bias `b` (SigLIP: -10); None: no `b`.
    pp: the preprocessing the towers were trained with, as the original's configs carry it
      (`tokenizer_name`, `size`, `max_len`); read by tokenizers and evaluators, not here.
  """

  image: Mapping[str, Any]
  text: Mapping[str, Any]
  text_model: str = 'bert'
  image_model: str = 'vit'
  out_dim: int | tuple[int | None, int | None] = (None, 768)
  temperature_init: float = 1.0
  bias_init: float | None = None
  pp: Mapping[str, Any] | None = None

  @nn.compact
  def __call__(
    self,
    *,
    images: jnp.ndarray | Mapping[str, jnp.ndarray] | None = None,
    tokens: jnp.ndarray | None = None,
    train: bool = False,
    images_per_row: int = 0,
  ) -> tuple[jnp.ndarray | None, jnp.ndarray | None, dict[str, Any]]:
    """(zimg, ztxt, out): L2-normalised (B, D) embeddings of NHWC images in [-1, 1] (a NaFlex
    tower's: patch sequences, `naflex.inputs`) and of int32 tokens (B, L), each None when its
    input is; `out['t']` = exp(t), `out['b']` the logit bias (SigLIP), and the towers'
    intermediate values (`txt/pre_logits`, ...). `images_per_row` K > 0 (NaFlex): rows of
    up to K images packed (`NaFlexViT`), zimg (B, K, D), an empty slot's finite."""
    image_dim, text_dim = out_dims(self.out_dim)
    classes = tower_classes({'text_model': self.text_model, 'image_model': self.image_model})
    zimg = ztxt = None
    out = {}
    if tokens is not None:
      text = classes['text'](**{**self.text, 'num_classes': text_dim}, name='txt')
      ztxt, out_txt = text(tokens, train=train)
      out.update({f'txt/{k}': v for k, v in out_txt.items()})
      ztxt, out['txt/norm'] = _normalized(ztxt)
    if images is not None:
      # The head starts random (big_vision's towers): a zero head embeds every image at 0.
      fields = {'head_zeroinit': False, **self.image, 'num_classes': image_dim}
      image = classes['image'](**fields, name='img')
      zimg, out['img/norm'] = _normalized(
        image(**image_inputs(self.image_model, images, images_per_row), train=train)
      )
    log_t = jnp.log(self.temperature_init)
    t = self.param('t', lambda _, shape: jnp.full(shape, log_t, jnp.float32), (1,))
    out['t'] = jnp.exp(t)
    if self.bias_init is not None:
      b_init = self.bias_init
      out['b'] = self.param('b', lambda _, shape: jnp.full(shape, b_init, jnp.float32), (1,))
    return zimg, ztxt, out
