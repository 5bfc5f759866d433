"""Shared test set-up: 8 simulated CPU devices, and random weights for oracle comparisons."""

import os

# Before jax is imported anywhere: 8 CPU devices so sharding tests can build real meshes.
os.environ['XLA_FLAGS'] = (
  os.environ.get('XLA_FLAGS', '') + ' --xla_force_host_platform_device_count=8'
).strip()
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

import jax
import numpy as np
import pytest


def randomize(params, seed: int = 0, scale: float = 0.2):
  """Every leaf replaced by N(0, scale) noise (float32), so no weight is left at a zero init."""
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda x: (scale * rng.standard_normal(x.shape)).astype(np.float32), params)


@pytest.fixture
def random_params():
  return randomize
