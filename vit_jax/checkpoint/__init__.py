"""Checkpoints: read every released ViT format into our tree, fit it to a model, write it out:

params = load(path)                            # our names, numpy arrays, format detected
fitted = fit(path, 'ViT-B_16', 10, 384)        # a runnable model: params fitted, config
params = load_pretrained(path, init_params, model_config)  # fine-tuning surgery
save_npz(params, 'out.npz')                    # the released Google layout (an image-text
                                               # tree: LiT's)
export_hf(params, model_config, 'out_dir')     # model.safetensors + config.json, transformers
                                               # (a SigLIP model: SiglipModel or, NaFlex,
                                               # Siglip2Model + processor)
export_timm(params, model_config, 'out_dir')   # model.safetensors + config.json, timm
export(params, model_config, 'out_dir', to=name)  # any format of FORMATS that writes
"""

from vit_jax.checkpoint import (
  catalog,
  formats,
  hf,
  hf_siglip,
  npz,
  orbax,
  pytorch,
  surgery,
  timm,
  tree,
  two_towers,
)
from vit_jax.checkpoint.formats import (
  FORMATS,
  Format,
  detect_format,
  export,
  export_hf,
  export_timm,
  load,
  read,
)
from vit_jax.checkpoint.hf import from_hf_state_dict, to_hf_state_dict
from vit_jax.checkpoint.loader import Fitted, Found, fit, holds_image_text, load_pretrained
from vit_jax.checkpoint.surgery import (
  LoadReport,
  merge_pretrained,
  resample_patch_embedding,
  resize_posemb,
)
from vit_jax.checkpoint.timm import from_timm_state_dict, to_timm_state_dict
from vit_jax.checkpoint.tree import CheckpointError, flatten, infer_config, unflatten
from vit_jax.checkpoint.two_towers import save_npz

__all__ = [
  'FORMATS',
  'CheckpointError',
  'Fitted',
  'Format',
  'Found',
  'LoadReport',
  'catalog',
  'detect_format',
  'export',
  'export_hf',
  'export_timm',
  'fit',
  'flatten',
  'formats',
  'from_hf_state_dict',
  'from_timm_state_dict',
  'hf',
  'hf_siglip',
  'holds_image_text',
  'infer_config',
  'load',
  'load_pretrained',
  'merge_pretrained',
  'npz',
  'orbax',
  'pytorch',
  'read',
  'resample_patch_embedding',
  'resize_posemb',
  'save_npz',
  'surgery',
  'timm',
  'to_hf_state_dict',
  'to_timm_state_dict',
  'tree',
  'two_towers',
  'unflatten',
]
