r"""ViT-H/14 pretraining (the Table 3 recipe of configs/pretrain.py) on 16 GB accelerators.

  python -m vit_jax.main --config=configs/vit_h14_fsdp.py:imagenet2012 --workdir=/shared/h14
  sbatch --nodes=4 launch/slurm_gpu.sh --config=configs/vit_h14_fsdp.py:imagenet21k ...

Replicated, ViT-H/14 does not fit: 634M parameters (1,000 classes and the recipe's pre_logits
layer; 660M with the 21,843 classes of ImageNet-21k) at 16 bytes each (float32 weight,
gradient, Adam mu and nu) are 10.1-10.6 GB on every device before any activation. This
config changes three things:

  sharding='fsdp'        weights, gradients and both Adam moments are split over all N
                         devices (each leaf along a dimension N divides): 16 B x 660M / N,
                         0.66 GB at N=16, 0.33 GB at N=32; a block's weights are gathered
                         only while it computes (19.7M parameters, 79 MB in float32).
  remat_policy='full'    each encoder block keeps only its input for the backward pass and
                         recomputes the rest: 257 tokens x 1,280 x 2 B = 0.66 MB per block,
                         21 MB per image for the 32 blocks (instead of ~0.6 GB per image).
  dtype='bfloat16'       activations and matmuls in bfloat16; weights and optimizer state
                         stay float32 (the mixed-precision path of the model).

The 4,096-image batch is split in accum_steps=4 micro-batches: 1,024 images per pass, 32 per
device on 32 devices (64 on 16). Measured: the compiled step's arguments on 16 simulated CPU
devices are 0.54 GB per device, as the arithmetic says; docs/multihost.md has the whole budget.
"""

import ml_collections

from configs import pretrain


def get_config(dataset: str = 'imagenet2012') -> ml_collections.ConfigDict:
  """configs/pretrain.py:h14,DATASET with FSDP, full rematerialisation and bfloat16 compute."""
  config = ml_collections.ConfigDict(pretrain.get_config(f'h14,{dataset}').to_dict())
  config.sharding = 'fsdp'
  config.model.remat_policy = 'full'
  config.dtype = 'bfloat16'
  config.accum_steps = 4
  return config.lock()
