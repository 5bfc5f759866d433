"""What is compiled: the variants of a model measured side by side (compute dtype, attention,
rematerialisation, unrolled or scanned blocks, precision policy), the model of each, and the
weights they share."""

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from vit_jax import families
from vit_jax.models import get_config, model_from_config, precision

DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16, 'float16': jnp.float16}
ATTENTION = ('xla', 'fused')
REMAT = ('none', 'full', 'dots', 'dots_saveable')
LAYERS = ('unrolled', 'scan')


@dataclasses.dataclass(frozen=True)
class Variant:
  """One model variant: compute dtype, attention, rematerialisation, unrolled or scanned,
  precision policy."""

  dtype: str = 'float32'
  attention: str = 'xla'
  remat: str = 'none'
  layers: str = 'unrolled'
  precision: str = 'matmul'

  @property
  def name(self) -> str:
    scan = '/scan' if self.layers == 'scan' else ''
    policy = '' if self.precision == 'matmul' else f'/{self.precision}'
    return f'{self.dtype}/{self.attention}/remat={self.remat}{scan}{policy}'


def variants_from(
  dtypes: Sequence[str],
  attentions: Sequence[str],
  remats: Sequence[str],
  layers: Sequence[str] = ('unrolled',),
  precisions: Sequence[str] = ('matmul',),
) -> list[Variant]:
  """The cartesian product, checked; the first one is the reference for agreement. The
  precision policy applies to 16-bit dtypes only: float32 is measured once."""
  for flag, values, allowed in (
    ('--dtype', dtypes, DTYPES),
    ('--attention', attentions, ATTENTION),
    ('--remat', remats, REMAT),
    ('--layers', layers, LAYERS),
    ('--precision', precisions, precision.POLICIES),
  ):
    bad = [v for v in values if v not in allowed]
    if bad or not values:
      raise ValueError(f'{flag}={",".join(values)}: expected a comma list of {", ".join(allowed)}')
  product = itertools.product(dtypes, precisions, attentions, layers, remats)
  variants = [Variant(d, a, r, n, p) for d, p, a, n, r in product]
  policy = lambda v: v.precision if precision.is_mixed(DTYPES[v.dtype]) else precisions[0]
  return [v for v in variants if v.precision == policy(v)]


def model_config(name: str, overrides: dict[str, Any] | None = None) -> ml_collections.ConfigDict:
  """The registered config with `overrides` (a dict value updates only the keys it names)."""
  config = get_config(name).to_dict()
  for key, value in (overrides or {}).items():
    if isinstance(value, dict) and isinstance(config.get(key), dict):
      config[key] = {**config[key], **value}
    else:
      config[key] = value
  return ml_collections.ConfigDict(config)


def build_model(config: ml_collections.ConfigDict, num_classes: int, variant: Variant):
  """The model of `variant`; fields at their defaults are left out, so that a model without
  them (MLP-Mixer: no attention, remat or scan) runs the default variant of each."""
  fields = {
    'attention_impl': (variant.attention, 'xla'),
    'remat_policy': (variant.remat, 'none'),
    'scan_layers': (variant.layers == 'scan', False),
    'precision_policy': (variant.precision, 'matmul'),
  }
  chosen = {k: value for k, (value, default) in fields.items() if value != default}
  return model_from_config(config, num_classes=num_classes, dtype=DTYPES[variant.dtype], **chosen)


def save_params(
  path: str, config: ml_collections.ConfigDict, num_classes: int, resolution: int, seed: int = 0
) -> None:
  """`init_params` as the .npz checkpoint `vit-export` reads: the weights that `--onnx`
  compares."""
  from vit_jax import checkpoint

  checkpoint.save_npz(init_params(config, num_classes, resolution, seed), path)


def init_params(
  config: ml_collections.ConfigDict, num_classes: int, resolution: int, seed: int = 0
) -> Any:
  """float32 weights from the model's initialisers; the zero-initialised head gets
  N(0, 1/width) noise so that the logits differ between classes (and top-1 means something).
  """
  model = build_model(config, num_classes, Variant())
  params = jax.jit(lambda: families.init_params(model, jax.random.key(seed), resolution))()
  params = jax.tree.map(np.asarray, params)
  if 'head' in params:
    kernel = params['head']['kernel']
    rng = np.random.default_rng(seed)
    noise = rng.standard_normal(kernel.shape) / np.sqrt(kernel.shape[0])
    params['head'] = {**params['head'], 'kernel': noise.astype(np.float32)}
  return params
