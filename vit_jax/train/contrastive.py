"""The contrastive image-text losses, moved to vit_jax/tasks/contrastive_losses.py: this name
is kept for the code and pages that import it from here."""

from vit_jax.tasks.contrastive_losses import LOSSES, loss, sigmoid_loss, softmax_loss

__all__ = ['LOSSES', 'loss', 'sigmoid_loss', 'softmax_loss']
