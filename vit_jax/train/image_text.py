"""The contrastive task (`config.task='contrastive'`): a two-tower model trained on image-text
pairs with the losses of vit_jax/train/contrastive.py, in the classification trainer.

What differs from classification, each in one function here:
  init         the model is initialised on images and tokens (`init_fn`);
  pretrained   the pretrained file (any format vit_jax.checkpoint reads) is the image
               tower's: it is fitted to `params['img']` as fine-tuning fits a ViT, the text
               tower starts from scratch (`pretrained_params`);
  locking      LiT: with `contrastive.lock_image` the image tower is `locked` (`labels`):
               the loss sees it through `stop_gradient`, so no gradient is computed for it,
               and the optimizer is an `optax.multi_transform` that gives it
               `optax.set_to_zero()`, so the optimizer state holds no leaf of it and its
               parameters stay bit-identical; `train_image_head` leaves `img/head` trainable;
  loss         the model's embeddings of the batch's images and texts, and the loss over
               every device's embeddings (`loss_fn`); the steps are in vit_jax/train/steps.py.
               The towers run without dropout (`train=False`), as LiT's and SigLIP's
               recipes train them: a locked tower is in inference mode anyway, and the
               jit and shard_map steps then compute the same numbers.
"""

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from vit_jax.models import two_towers
from vit_jax.train import contrastive
from vit_jax.train import spec as spec_lib

TRAIN, LOCKED = 'train', 'locked'


def is_contrastive(spec: spec_lib.RunSpec) -> bool:
  return spec.step.task == 'contrastive'


def dummy_inputs(spec: spec_lib.RunSpec) -> dict[str, jax.Array]:
  """One image and one text of the run's shapes, to initialise the model on."""
  crop = spec.data.pp.crop
  return {
    'images': jnp.zeros((1, crop, crop, 3), jnp.float32),
    'tokens': jnp.zeros((1, spec.data.pp.max_len), jnp.int32),
  }


def init_fn(spec: spec_lib.RunSpec, model) -> Callable[[jax.Array], Any]:
  """rng -> the model's initial parameters (either task)."""
  if is_contrastive(spec):
    inputs = dummy_inputs(spec)
    return lambda rng: model.init(rng, **inputs, train=False)['params']
  crop = spec.data.pp.crop
  dummy = jnp.zeros((1, crop, crop, 3), jnp.float32)
  return lambda rng: model.init(rng, dummy, train=False)['params']


def _locked(path: tuple, c: spec_lib.Contrastive) -> bool:
  keys = [str(getattr(k, 'key', k)) for k in path]
  if not c.lock_image or keys[0] != 'img':
    return False
  return not (c.train_image_head and len(keys) > 1 and keys[1] == 'head')


def labels(params: Any, c: spec_lib.Contrastive) -> Any:
  """The tree of 'train' / 'locked' of each parameter."""
  return jax.tree_util.tree_map_with_path(lambda p, _: LOCKED if _locked(p, c) else TRAIN, params)


def lock(tx: optax.GradientTransformation, step: spec_lib.Step) -> optax.GradientTransformation:
  """`tx` on the trainable parameters; the locked ones get zero updates and no state."""
  if step.task != 'contrastive' or not step.contrastive.lock_image:
    return tx
  transforms = {TRAIN: tx, LOCKED: optax.set_to_zero()}
  return optax.multi_transform(transforms, lambda p: labels(p, step.contrastive))


def frozen(params: Any, c: spec_lib.Contrastive) -> Any:
  """`params` with the locked ones behind `stop_gradient`: no gradient is computed for them."""
  return jax.tree_util.tree_map_with_path(
    lambda p, x: jax.lax.stop_gradient(x) if _locked(p, c) else x, params
  )


def loss_fn(model, c: spec_lib.Contrastive, axis: str | None = None) -> Callable:
  """(params, batch) -> (loss, metrics): the contrastive loss of the batch's pairs, every
  device's embeddings the negatives (`axis`: the mesh axis inside `jax.shard_map`)."""

  def fn(params, batch):
    params = frozen(params, c)
    inputs = {'images': batch['image'], 'tokens': batch['text']}
    zimg, ztxt, _ = model.apply({'params': params}, **inputs, train=False)
    return contrastive.loss(c.loss, zimg, ztxt, params['t'], params.get('b'), axis=axis)

  return fn


def image_config(fields: Mapping[str, Any]) -> dict[str, Any]:
  """The image tower's ViT config (its head: out_dim[0])."""
  image_dim, _ = two_towers.out_dims(fields.get('out_dim', (None, 768)))
  image = fields['image']
  image = image.to_dict() if hasattr(image, 'to_dict') else dict(image)
  return {**image, 'num_classes': image_dim}


def pretrained_params(path: str, host_params: Mapping[str, Any], fields) -> dict[str, Any]:
  """`host_params` with the image tower from the file at `path`, fitted as fine-tuning fits
  a ViT (a fresh head; `PATH:img` takes an image-text file's image tower)."""
  from vit_jax.checkpoint import load_pretrained

  config = image_config(fields)
  img = load_pretrained(path, host_params['img'], config, keep_head=False)
  img = jax.tree.map(lambda x, a: np.asarray(x, dtype=np.asarray(a).dtype), img, host_params['img'])
  return {**host_params, 'img': img}
