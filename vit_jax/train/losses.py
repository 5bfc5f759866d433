"""DeiT's distillation losses, moved to vit_jax/tasks/distillation_losses.py: this name is
kept for the code and pages that import it from here."""

from vit_jax.tasks.distillation_losses import hard_distillation_loss, soft_distillation_loss

__all__ = ['hard_distillation_loss', 'soft_distillation_loss']
