"""Vision Transformers in JAX/Flax: models, checkpoints, data, training, benchmarks, the paper."""
