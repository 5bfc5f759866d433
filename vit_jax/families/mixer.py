"""The MLP-Mixer family (Tolstikhin et al. 2021): `MlpMixer`, the original registry's
Mixer-B/16, B/32, L/16 and the released GSAM files' Mixer-S.

Its parameter tree has the patch embedding `stem/kernel` and `MixerBlock_{i}`; it has no
position embeddings and no pre-logits: its resolution is the token-mixing MLP's width (the
number of patches), and it converts to the released .npz layout only.
"""

import re
from collections.abc import Mapping
from typing import Any

import ml_collections

from vit_jax.families import vit
from vit_jax.families.preprocessing import Preprocessing
from vit_jax.flat import as_flat, get, numbered, patch_embedding, square_side
from vit_jax.models import stats
from vit_jax.models.mixer import MlpMixer

STEM = 'stem/kernel'
TOKENS = 'MixerBlock_0/token_mixing/Dense_0/kernel'
_BLOCK_RE = re.compile(r'MixerBlock_(\d+)$')
_FIELDS = ('hidden_dim', 'num_blocks', 'tokens_mlp_dim', 'channels_mlp_dim')

Config = Mapping[str, Any] | ml_collections.ConfigDict


def owns_config(config: Config) -> bool:
  """An `MlpMixer`'s fields (it has `num_blocks`)."""
  return 'num_blocks' in config


def owns_tree(flat: Mapping[str, Any]) -> bool:
  return STEM in flat


def infer_config(params: Mapping[str, Any]) -> ml_collections.ConfigDict:
  """The `MlpMixer` fields of a Mixer tree, nested or flat (`stem`, `MixerBlock_{i}`, `head`)."""
  flat = as_flat(params)
  patch, width = patch_embedding(flat, STEM)
  config = ml_collections.ConfigDict()
  config.patches = ml_collections.ConfigDict({'size': patch})
  config.hidden_dim = width
  config.num_blocks = len(numbered(flat, _BLOCK_RE, ''))
  config.tokens_mlp_dim = int(get(flat, TOKENS).shape[-1])
  channels = get(flat, 'MixerBlock_0/channel_mixing/Dense_0/kernel')
  config.channels_mlp_dim = int(channels.shape[-1])
  config.num_classes = int(flat['head/kernel'].shape[-1]) if 'head/kernel' in flat else None
  return config


def architecture(config: Config) -> tuple:
  """The fields that decide the parameter shapes; the patch first, as for a ViT."""
  return (tuple(config['patches']['size']), 'mixer', *(config[f] for f in _FIELDS))


def match_registry(config: Config) -> str | None:
  """The registered Mixer with the architecture of `config`, or None."""
  return vit.first_registered(config, owns_config, architecture)


def describe(config: Config) -> str:
  """'Mixer with hidden_dim 768, 12 blocks, tokens MLP 384, channels MLP 3072, patch 16x16'."""
  patch = 'patch ' + 'x'.join(map(str, config['patches']['size']))
  return (
    f'Mixer with hidden_dim {config["hidden_dim"]}, {config["num_blocks"]} blocks,'
    f' tokens MLP {config["tokens_mlp_dim"]}, channels MLP {config["channels_mlp_dim"]}, {patch}'
  )


def patch_pixels(config: Config) -> int:
  return config['patches']['size'][0]


def native_resolution(flat: Mapping[str, Any], config: Config) -> int | None:
  """The square image size of the token-mixing MLP's width (its number of patches)."""
  if TOKENS not in flat:
    return None
  side = square_side(flat[TOKENS].shape[0])
  return None if side is None else side * patch_pixels(config)


def token_grid(config: Config, image_size: int | tuple[int, int]) -> tuple[int, int]:
  h, w = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
  ph, pw = config['patches']['size']
  return h // ph, w // pw


def is_plain(config: Config) -> bool:
  del config
  return False


def table_columns(config: Config) -> dict[str, Any]:
  """The model table's shape columns; MLP is the channel MLP (the tokens MLP in the note)."""
  arch = (config['num_blocks'], config['hidden_dim'], config['channels_mlp_dim'], '-')
  note = f'Mixer, tokens MLP {config["tokens_mlp_dim"]}'
  return {**dict(zip(('layers', 'hidden', 'mlp', 'heads'), arch, strict=True)), 'note': note}


def unlike_hugging_face(config: Config) -> str | None:
  del config
  return 'is an MLP-Mixer'


def label(config: Config) -> str:
  """An unregistered model's name in the commands' output ('Mixer with hidden_dim ...')."""
  return describe(config)


def preprocessing(
  config: Config, resolution: int | tuple[int, int] | None = None, max_patches: int = 0
) -> Preprocessing:
  """A Mixer's preprocessing is a ViT's: a square resize, [-1, 1]."""
  return vit.preprocessing(config, resolution, max_patches)


def model_kind(config: Config) -> str:
  del config
  return 'MLP-Mixer'


def forward_flops(config: Config, resolution: int, num_classes: int) -> int:
  return stats.mixer_forward_flops(config, resolution, num_classes)


# A Mixer is built and initialised as a ViT is: a classifier of one image.
build = vit.build
init_inputs = vit.init_inputs


MODULE = MlpMixer
