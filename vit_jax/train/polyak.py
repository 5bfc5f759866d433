"""Polyak averaging of the parameters: an exponential moving average, debiased.

After training step t (t = 1, 2, ...) with parameters p_t, the average with decay d is

  avg_t = sum_{s=1..t} (1 - d) d^(t-s) p_s / (1 - d^t),

whose weights sum to one (the bias correction of Adam's moments and of
`optax.ema(debias=True)`): the starting parameters carry no weight, so a fine-tuned head that
starts at zero is not pulled back towards zero, and after a few thousand steps at d = 0.9999
the average is the plain moving average of the paper. It is kept recursively,

  avg_t = avg_{t-1} + (p_t - avg_{t-1}) (1 - d) / (1 - d^t),    (avg_1 = p_1),

as `optax.incremental_update`, inside the compiled step, sharded like the parameters.
"""

import math
from typing import Any

import jax
import jax.numpy as jnp
import optax


def step_size(step: jax.Array, decay: float) -> jax.Array:
  """(1 - d) / (1 - d^t): the weight of step t's parameters in the average."""
  bias = -jnp.expm1(step.astype(jnp.float32) * math.log(decay))  # 1 - d^t, exact at small t
  return (1.0 - decay) / bias


def update(average: Any, params: Any, step: jax.Array, decay: float) -> Any:
  """The average after step `step` (counted from 1), whose parameters are `params`."""
  return optax.incremental_update(params, average, step_size(step, decay))
