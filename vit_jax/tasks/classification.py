"""The classification task (`config.task='classification'`, the default): images and labels.

  init         the model initialised on one image of the run's crop;
  pretrained   the file (any format vit_jax.checkpoint reads) fitted as fine-tuning fits it:
               a fresh head, position embeddings resized (checkpoint surgery);
  mixing       mixup/CutMix of the batch (vit_jax/tasks/mixing.py) where the spec asks, first,
               over the global batch (in the shard_map step, across its devices);
  loss         softmax cross-entropy (label smoothing on the targets) or per-class sigmoid
               cross-entropy, summed over classes; the labels are class indices (B,) or soft
               targets (B, num_classes) after mixup/CutMix;
  gradient     the mean loss and its gradient over `accum_steps` micro-batches
               (`optim.accumulate_gradient`); inside `jax.shard_map` each device's, and
               `reduce` is their `lax.pmean`, as the original's pmapped `update_fn`;
  packed rows  NaFlex rows holding several images (`pp.pack_tokens`, vit_jax/data/packing.py):
               the batch's `label` and `slots` are (rows, images a row), the model pools each
               image, and the loss is the mean over the images of the global batch (empty
               slots count nowhere), so it equals the loss of the same images one per row.

With dropout, each example gets its own key fold_in(rng, global example id), so the masks do
not depend on how the batch is split over devices or micro-batches. DeiT's distillation
(vit_jax/tasks/distillation.py) is this task with a teacher's loss.
"""

from typing import Any

import jax
import jax.numpy as jnp
import optax

from vit_jax import families, optim
from vit_jax.tasks import common, mixing


def uses_dropout(model) -> bool:
  """Whether the model drops out (or drops paths) in training: then each example gets its
  own key."""
  t = getattr(model, 'transformer', None) or {}
  rates = ('dropout_rate', 'attention_dropout_rate', 'drop_path_rate')
  return any(t.get(rate, 0.0) for rate in rates)


class Task(common.Task):
  """Images and labels; the step's batch `{'image': f32 (B, H, W, 3), 'label': int32 (B,)}`."""

  @classmethod
  def check(cls, spec: Any) -> None:
    family = families.of_config(spec.model.fields)
    if family.image_text:
      raise ValueError(
        'config.model is an image-text model (two towers, no class logits): train it with '
        '--config.task=contrastive, or fine-tune its image tower as a classifier '
        '(--config.pretrained_path=FILE:img).'
      )
    step = spec.step
    if (step.mixup or step.cutmix) and families.takes_patch_sequences(spec.model.fields):
      raise ValueError(
        f'config.mixup={step.mixup}, config.cutmix={step.cutmix}: they mix pixel images, and'
        ' this model takes patch sequences: set both to 0.'
      )

  def __init__(self, spec: Any, model: Any):
    super().__init__(spec, model)
    self.num_classes = spec.data.num_classes
    self._dropout = uses_dropout(model)
    self._mix = mixing.make_mix(spec.step.mixup, spec.step.cutmix, self.num_classes)

  def pretrained(self, path: str, host_params: Any) -> Any:
    from vit_jax.checkpoint import load_pretrained

    resize = self.spec.init.resize_patch_embedding
    fields = self.spec.model.fields
    return load_pretrained(
      path, host_params, fields, keep_head=False, resize_patch_embedding=resize
    )

  def heads(self) -> dict[str, bool]:
    """The model's call arguments in training beside the images: none."""
    return {}

  def _forward(self, params, images, ids, rng, **call):
    variables, heads = {'params': params}, {**self.heads(), **call}
    if not self._dropout:
      return self.model.apply(variables, images, train=True, **heads)

    def one(image, i):
      key = jax.random.fold_in(rng, i)
      out = self.model.apply(variables, image[None], train=True, rngs={'dropout': key}, **heads)
      return jax.tree.map(lambda x: x[0], out)

    return jax.vmap(one)(images, ids)

  def loss(self, params, images, labels, ids, rng, *inputs) -> jax.Array:
    """The mean loss of `images` (global example ids `ids`) against `labels`: class indices
    (B,) or soft targets (B, num_classes); `inputs`: the step's (`inputs`). Packed rows:
    `labels` is (class indices, weights), each (rows, slots), and the loss the weighted sum
    (`_slot_weights`)."""
    if isinstance(labels, tuple):  # packed rows: (labels, weights), each (rows, slots)
      labels, weights = labels
      logits = self._forward(params, images, ids, rng, images_per_row=labels.shape[-1])
      targets = self._targets(labels, index_ndim=2)
      return jnp.sum(self._example_losses(logits, targets) * weights)
    logits = self._forward(params, images, ids, rng)
    targets = self._targets(labels, index_ndim=1)
    if self.spec.step.loss == 'sigmoid_xent':
      return self._example_losses(logits, targets).mean()
    return self.softmax_loss(logits, targets, images, *inputs)

  def _targets(self, labels, index_ndim: int) -> jax.Array:
    """Class indices (`index_ndim` axes) or soft targets (one more, mixup's) as targets,
    smoothed where the softmax loss asks."""
    targets = labels if labels.ndim > index_ndim else jax.nn.one_hot(labels, self.num_classes)
    step = self.spec.step
    if step.loss != 'sigmoid_xent' and step.label_smoothing:
      targets = optax.smooth_labels(targets, step.label_smoothing)
    return targets

  def _example_losses(self, logits, targets) -> jax.Array:
    """Each example's loss: the sigmoid cross-entropy summed over classes, or the softmax's."""
    if self.spec.step.loss == 'sigmoid_xent':
      return optax.sigmoid_binary_cross_entropy(logits, targets).sum(-1)
    return optax.softmax_cross_entropy(logits, targets)

  def softmax_loss(self, logits, targets, images, *inputs) -> jax.Array:
    """The mean softmax cross-entropy of `logits` against the (smoothed) `targets`."""
    del images, inputs
    return optax.softmax_cross_entropy(logits, targets).mean()

  def loss_and_grad(self, params, batch, rng, first_id, inputs, axis=None):
    if self._mix is not None:
      key = jax.random.fold_in(rng, mixing.KEY_DATA)
      images, labels = self._mix(batch['image'], batch['label'], key, axis)
      batch = {**batch, 'image': images, 'label': labels}
    ids = first_id + jnp.arange(batch['label'].shape[0], dtype=jnp.int32)
    labels = batch['label']
    if 'slots' in batch:
      labels = (labels, self._slot_weights(batch['slots'], axis))

    def loss_and_grad(params, images, labels, ids):
      return jax.value_and_grad(self.loss)(params, images, labels, ids, rng, *inputs)

    data = (batch['image'], labels, ids)
    accum_steps = self.spec.step.accum_steps
    loss, grads = optim.accumulate_gradient(loss_and_grad, params, data, accum_steps, axis)
    return loss, grads, {}

  def _slot_weights(self, slots, axis) -> jax.Array:
    """Packed rows: each slot's weight in the loss, so that the mean over micro-batches (and
    over devices, `reduce`) of the weighted sums is the mean over the global batch's images."""
    count, shards = jnp.sum(slots), 1
    if axis is not None:  # this device's rows: the images of all of them count
      count, shards = jax.lax.psum(count, axis), jax.lax.axis_size(axis)
    scale = self.spec.step.accum_steps * shards / jnp.maximum(count, 1)
    return slots.astype(jnp.float32) * scale

  def reduce(self, loss, grads, metrics, axis):
    loss, grads = jax.lax.pmean((loss, grads), axis)
    return loss, grads, metrics
