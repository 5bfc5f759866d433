"""The contrastive task (`config.task='contrastive'`): a two-tower model trained on image-text
pairs with the losses of vit_jax/tasks/contrastive_losses.py, in the same trainer.

What differs from classification, each in one method here:
  check        a two-tower model, one micro-batch, no labels to mix or distill, a tokenizer
               (the model's settings, `config.pp.vocab` its vocabulary);
  build        the tokenizer read once (`tokenizer`): the input pipeline's, the model's;
  init         the model is initialised on images and tokens (`init_fn`);
  pretrained   a whole image-text file or run continues (both towers); any other file (any
               format vit_jax.checkpoint reads) is the image tower's: it is fitted to
               `params['img']` as fine-tuning fits a ViT; the text tower starts from
               scratch, or with `text_pretrained_path` from a BERT file (Hugging Face's
               BertModel, the original TF checkpoint: vit_jax/checkpoint/bert.py), its
               head fresh (`pretrained`);
  locking      LiT: with `contrastive.lock_image` the image tower is `locked` (`labels`):
               the loss sees it through `stop_gradient`, so no gradient is computed for it,
               and the optimizer is an `optax.multi_transform` that gives it
               `optax.set_to_zero()`, so the optimizer state holds no leaf of it and its
               parameters stay bit-identical (`optimizer`); `train_image_head` leaves
               `img/head` trainable;
  loss         the model's embeddings of the batch's images and texts `{'image', 'text'}`,
               and the loss over every device's embeddings, with its metrics. The towers run
               without dropout (`train=False`), as LiT's and SigLIP's recipes train them: a
               locked tower is in inference mode anyway, and the jit and shard_map steps then
               compute the same numbers. A packed batch (NaFlex Patch n' Pack, `slots`
               (R, K) beside it) holds R * K pairs, its empty slots out of the loss;
  reduce       inside `jax.shard_map` the loss is already the global one on every device;
               the gradients of each device's own terms are summed (`lax.psum`), and the
               metrics' `lax.pmean` types them replicated;
  evaluators   few-shot of the image tower, zero-shot and retrieval (config.evals); no
               test-split pass, and ImageNet ReaL is a one-line error: no class logits.
"""

import dataclasses
import functools
from typing import Any

import jax
import numpy as np
import optax
from absl import logging

from vit_jax import families, files
from vit_jax.tasks import common, contrastive_losses

TRAIN, LOCKED = 'train', 'locked'


@dataclasses.dataclass(frozen=True)
class Contrastive:
  """`config.contrastive`: image-text training of a two-tower model (`task='contrastive'`).

  LiT (Zhai et al., arXiv:2111.07991) locks the image tower: it is read from the pretrained
  file (any format vit_jax.checkpoint reads; `pretrained_path`), gets no gradient and has no
  optimizer state; only the text tower (and `t`, `b`) train. The losses are
  vit_jax/tasks/contrastive_losses.py's, over every device's embeddings.
  """

  # 'softmax' (CLIP, LiT: symmetric cross-entropy) or 'sigmoid' (SigLIP; the model's
  # bias_init sets the learned bias b).
  loss: str = 'softmax'
  # The sigmoid loss's logits: 'gathered', every device's (its rows, B) at once, memory
  # quadratic in the batch; or 'chunked', a tile at a time (the texts visiting every device
  # in the shard_map step), memory linear in the batch (vit_jax/tasks/contrastive_losses.py).
  logits: str = 'gathered'
  # Lock the image tower (LiT); False trains both towers.
  lock_image: bool = True
  # With the image tower locked, train its head (out_dim[0] set) all the same.
  train_image_head: bool = False


def _locked(path: tuple, c: Contrastive) -> bool:
  keys = [str(getattr(k, 'key', k)) for k in path]
  if not c.lock_image or keys[0] != 'img':
    return False
  return not (c.train_image_head and len(keys) > 1 and keys[1] == 'head')


def labels(params: Any, c: Contrastive) -> Any:
  """The tree of 'train' / 'locked' of each parameter."""
  return jax.tree_util.tree_map_with_path(lambda p, _: LOCKED if _locked(p, c) else TRAIN, params)


def frozen(params: Any, c: Contrastive) -> Any:
  """`params` with the locked ones behind `stop_gradient`: no gradient is computed for them."""
  return jax.tree_util.tree_map_with_path(
    lambda p, x: jax.lax.stop_gradient(x) if _locked(p, c) else x, params
  )


def _like(tree: Any, like: Any) -> Any:
  """`tree`'s values as numpy arrays of `like`'s dtypes."""
  return jax.tree.map(lambda x, a: np.asarray(x, np.asarray(a).dtype), tree, like)


def _check_labels_free(spec: Any) -> None:
  step = spec.step
  if step.accum_steps != 1:
    raise ValueError(
      f'config.accum_steps={step.accum_steps}: a contrastive batch does not split into '
      'micro-batches (each would be its own set of negatives); use --config.accum_steps=1.'
    )
  if step.mixup or step.cutmix or step.label_smoothing or step.distill.enabled:
    raise ValueError(
      "config.task='contrastive' has no labels to mix, smooth or distill: set mixup, cutmix "
      'and label_smoothing to 0 and no distill.teacher_checkpoint.'
    )


def _check_text_file(spec: Any, path: str, pretrained_path: str | None) -> None:
  """`config.text_pretrained_path` fits the run: a BERT text tower, a file that exists, no
  whole image-text file beside it; one-line ValueErrors (the file's shapes are checked as it
  is read, in `pretrained`)."""
  from vit_jax import checkpoint
  from vit_jax.checkpoint import bert

  if spec.model.fields.get('text_model') != 'bert':
    raise ValueError(
      f"config.text_pretrained_path={path!r} reads a BERT, but the model's text tower is "
      f"{spec.model.fields.get('text_model')!r}: use a model with text_model='bert'"
    )
  if not files.path(path).exists() and bert.tf_checkpoint(files.path(path)) is None:
    raise ValueError(f'config.text_pretrained_path={path!r}: no such file or directory')
  if pretrained_path and checkpoint.holds_image_text(pretrained_path):
    raise ValueError(
      f'config.pretrained_path={pretrained_path!r} holds a whole image-text model, text tower '
      f"included: leave config.text_pretrained_path='' or give {pretrained_path}:img"
    )


class Task(common.Task):
  """Image-text pairs; the step's batch `{'image': f32 (B, H, W, 3), 'text': int32 (B, L)}`,
  or packed (`pp.pack_tokens` > 0): `{'image': f32 (R, T, P + 3) rows of up to K NaFlex
  images, 'text': int32 (R, K, L) slot k's caption, 'slots': int32 (R, K) 1 where slot k
  holds an image}`."""

  batch_keys = ('image', 'text', 'slots')  # 'slots' where packed, as `common.Task`'s
  # No class logits: no test-split pass; few-shot, zero-shot and retrieval evaluate it.
  class_logits = False
  # The BERT file of the text tower (`config.text_pretrained_path`), None: none or resumed.
  text_pretrained_path: str | None = None

  @classmethod
  def check(cls, spec: Any) -> None:
    c = spec.step.contrastive
    common.one_of('contrastive.loss', c.loss, contrastive_losses.LOSSES)
    common.one_of('contrastive.logits', c.logits, contrastive_losses.LOGITS)
    try:
      contrastive_losses.check(c.loss, c.logits)
    except ValueError as e:
      raise ValueError(f'config.contrastive: {e}') from None
    family = families.of_config(spec.model.fields)
    if not family.image_text:
      raise ValueError(
        "config.task='contrastive' trains an image-text model: set config.model to a two-tower "
        "model's fields (image, text, ...; vit_jax.models.get_config('LiT-B16B_2'))."
      )
    _check_labels_free(spec)
    pp = spec.data.pp
    if not pp.vocab:
      raise ValueError(
        "config.task='contrastive' tokenizes captions: set --config.pp.vocab=FILE (the "
        "vocabulary of the model's tokenizer)."
      )
    try:
      family.tokenizer_settings(spec.model.fields.get('pp'), name=pp.tokenizer, max_len=pp.max_len)
    except ValueError as e:
      raise ValueError(f'config.pp: {e}') from None

  @classmethod
  def build(cls, spec, model, pretrained_path=None, resuming=False) -> 'Task':
    """A locked image tower needs its file (a resumed run has it in its checkpoint)."""
    if spec.step.contrastive.lock_image and not pretrained_path and not resuming:
      raise ValueError(
        'config.contrastive.lock_image=True locks the image tower, but no pretrained file is '
        'given: set --config.pretrained_path=FILE (any format; PATH:img for an image-text '
        'file), or --config.contrastive.lock_image=False to train both towers.'
      )
    task = cls(spec, model)
    # Resolved once: a resumed run has the text tower in its checkpoint.
    text_path = spec.init.text_pretrained_path
    task.text_pretrained_path = None if resuming or not text_path else text_path
    if task.text_pretrained_path:
      _check_text_file(spec, task.text_pretrained_path, pretrained_path)
    pp = spec.data.pp
    try:
      task.tokenizer = task.family.tokenizer(
        model.pp, pp.vocab, name=pp.tokenizer, max_len=pp.max_len
      )
    except (ValueError, FileNotFoundError) as e:
      raise ValueError(f'config.pp: {e}') from None
    return task

  def has_pretrained(self, path: str | None) -> bool:
    """A pretrained file, or a BERT file for the text tower."""
    return path is not None or self.text_pretrained_path is not None

  def pretrained(self, path: str | None, host_params: Any) -> Any:
    """`host_params` from the files: the file or run at `path` (None: none) as `_pretrained`
    fits it, then the text tower's encoder from `text_pretrained_path` (its head as it was);
    the file's mismatches with the model's text config are one-line CheckpointErrors."""
    params = host_params if path is None else self._pretrained(path, host_params)
    if self.text_pretrained_path is None:
      return params
    from vit_jax.checkpoint import bert

    source = self.text_pretrained_path
    read = bert.read(source)
    for line in bert.check_fits(read, self.spec.model.fields['text'], source):
      logging.warning('config.text_pretrained_path: %s', line)
    txt, report = bert.fit_tower(read, params['txt'], source)
    for line in [read.description, *report.lines()]:
      logging.info('config.text_pretrained_path: %s', line)
    return {**params, 'txt': _like(txt, host_params['txt'])}

  def _pretrained(self, path: str, host_params: Any) -> Any:
    """`host_params` from the file or run at `path`: a whole image-text model (a LiT or
    SigLIP file, a run of this task) continues, both towers and `t`, `b`, fitted to the
    model; any other file (a ViT, `PATH:img` for an image-text file's tower) is the image
    tower, fitted as fine-tuning fits a ViT (a fresh head), the text tower from scratch."""
    from vit_jax import checkpoint

    if checkpoint.holds_image_text(path):
      fitted = checkpoint.fit(path, self.spec.model.fields, init_params=host_params)
      return _like(fitted.params, host_params)
    config = self.family.image_config(self.spec.model.fields)
    resize = self.spec.init.resize_patch_embedding
    img = checkpoint.load_pretrained(
      path, host_params['img'], config, keep_head=False, resize_patch_embedding=resize
    )
    return {**host_params, 'img': _like(img, host_params['img'])}

  def optimizer(self, tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """`tx` on the trainable parameters; the locked ones get zero updates and no state."""
    c = self.spec.step.contrastive
    if not c.lock_image:
      return tx
    transforms = {TRAIN: tx, LOCKED: optax.set_to_zero()}
    return optax.multi_transform(transforms, lambda p: labels(p, c))

  def loss(self, params, batch, axis: str | None = None):
    """(loss, metrics) of the batch's pairs, every device's embeddings the negatives
    (`axis`: the mesh axis inside `jax.shard_map`)."""
    c = self.spec.step.contrastive
    params = frozen(params, c)
    zimg, ztxt, valid = self.embed(params, batch)
    t, b = params['t'], params.get('b')
    return contrastive_losses.loss(
      c.loss, zimg, ztxt, t, b, axis=axis, logits=c.logits, valid=valid
    )

  def embed(self, params, batch) -> tuple[jax.Array, jax.Array, jax.Array | None]:
    """(zimg, ztxt, valid): the (B, D) embeddings of the batch's B pairs and which count:
    all (None) of B images and texts; of a packed batch's R rows of K slots, B = R * K in
    row-major order (a device's rows are a block of the global batch's, as unpacked), the
    empty slots' (`slots` 0) invalid: out of the loss (the towers give them finite values,
    as a NaN there would reach the parameters' gradient as 0 * NaN)."""
    inputs, slots = {'images': batch['image'], 'tokens': batch['text']}, batch.get('slots')
    if slots is not None:  # each row's K slots as K pairs
      rows, per_row = slots.shape
      inputs |= {'tokens': batch['text'].reshape(rows * per_row, -1), 'images_per_row': per_row}
    zimg, ztxt, _ = self.model.apply({'params': params}, **inputs, train=False)
    if slots is None:
      return zimg, ztxt, None
    return zimg.reshape(-1, zimg.shape[-1]), ztxt, slots.reshape(-1)

  def loss_and_grad(self, params, batch, rng, first_id, inputs, axis=None):
    del rng, first_id, inputs  # no dropout, no inputs
    grad_fn = jax.value_and_grad(functools.partial(self.loss, axis=axis), has_aux=True)
    (loss, metrics), grads = grad_fn(params, batch)
    return loss, grads, metrics

  def reduce(self, loss, grads, metrics, axis):
    grads = jax.lax.psum(grads, axis)
    # The metrics of the parameters alone (the temperature, the bias) are the same on every
    # device but typed device-varying: their mean is the value, typed replicated (the mean
    # of the others, already replicated, is themselves).
    return loss, grads, jax.lax.pmean(metrics, axis)
