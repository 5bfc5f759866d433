"""Experiment configs, selected as `--config=configs/vit.py:b16,cifar10` (ml_collections files)."""
