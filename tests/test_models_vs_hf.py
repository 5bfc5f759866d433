"""The forward pass against an independent implementation: Hugging Face ViT in PyTorch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch  # the oracle is a test requirement (requirements/test.in): missing, it fails
import transformers

from vit_jax.models import get_model

pytestmark = pytest.mark.slow


def _hf_state_dict(p, num_layers: int) -> dict:
  """Our tree mapped by hand to HF's 4.x key names (kernels transposed, heads flattened)."""
  t = lambda x: torch.from_numpy(np.ascontiguousarray(np.asarray(x)))
  d = p['cls'].shape[-1]
  sd = {
    'vit.embeddings.cls_token': t(p['cls']),
    'vit.embeddings.position_embeddings': t(p['Transformer']['posembed_input']['pos_embedding']),
    'vit.embeddings.patch_embeddings.projection.weight': t(
      np.transpose(p['embedding']['kernel'], (3, 2, 0, 1))
    ),
    'vit.embeddings.patch_embeddings.projection.bias': t(p['embedding']['bias']),
    'vit.layernorm.weight': t(p['Transformer']['encoder_norm']['scale']),
    'vit.layernorm.bias': t(p['Transformer']['encoder_norm']['bias']),
    'classifier.weight': t(p['head']['kernel'].T),
    'classifier.bias': t(p['head']['bias']),
  }
  for i in range(num_layers):
    b = p['Transformer'][f'encoderblock_{i}']
    a = b['MultiHeadDotProductAttention_0']
    h = f'vit.encoder.layer.{i}'
    for name in ('query', 'key', 'value'):
      sd[f'{h}.attention.attention.{name}.weight'] = t(a[name]['kernel'].reshape(d, d).T)
      sd[f'{h}.attention.attention.{name}.bias'] = t(a[name]['bias'].reshape(d))
    sd[f'{h}.attention.output.dense.weight'] = t(a['out']['kernel'].reshape(d, d).T)
    sd[f'{h}.attention.output.dense.bias'] = t(a['out']['bias'])
    sd[f'{h}.layernorm_before.weight'] = t(b['LayerNorm_0']['scale'])
    sd[f'{h}.layernorm_before.bias'] = t(b['LayerNorm_0']['bias'])
    sd[f'{h}.layernorm_after.weight'] = t(b['LayerNorm_1']['scale'])
    sd[f'{h}.layernorm_after.bias'] = t(b['LayerNorm_1']['bias'])
    sd[f'{h}.intermediate.dense.weight'] = t(b['MlpBlock_0']['Dense_0']['kernel'].T)
    sd[f'{h}.intermediate.dense.bias'] = t(b['MlpBlock_0']['Dense_0']['bias'])
    sd[f'{h}.output.dense.weight'] = t(b['MlpBlock_0']['Dense_1']['kernel'].T)
    sd[f'{h}.output.dense.bias'] = t(b['MlpBlock_0']['Dense_1']['bias'])
  return sd


def test_logits_equal_hugging_face_vit(tmp_path, random_params):
  from safetensors.torch import save_file

  num_layers, hidden, heads, mlp, patch, size, classes = 3, 48, 4, 96, 8, 32, 7
  model = get_model(
    'testing',
    num_classes=classes,
    hidden_size=hidden,
    patches={'size': (patch, patch)},
    transformer={'num_layers': num_layers, 'num_heads': heads, 'mlp_dim': mlp},
  )
  images = np.random.default_rng(1).uniform(-1, 1, (3, size, size, 3)).astype(np.float32)
  params = model.init(jax.random.key(0), jnp.asarray(images), train=False)['params']
  params = jax.tree.map(np.asarray, random_params(params, scale=0.1))
  ours = np.asarray(model.apply({'params': params}, images, train=False))

  config = transformers.ViTConfig(
    hidden_size=hidden,
    num_hidden_layers=num_layers,
    num_attention_heads=heads,
    intermediate_size=mlp,
    image_size=size,
    patch_size=patch,
    num_labels=classes,
    hidden_act='gelu_pytorch_tanh',  # the tanh GELU the released weights use
    layer_norm_eps=1e-6,
    qkv_bias=True,
  )
  config.save_pretrained(tmp_path)
  save_file(_hf_state_dict(params, num_layers), str(tmp_path / 'model.safetensors'))
  hf = transformers.ViTForImageClassification.from_pretrained(tmp_path).eval()
  with torch.no_grad():
    theirs = hf(pixel_values=torch.from_numpy(images.transpose(0, 3, 1, 2))).logits.numpy()

  assert np.abs(ours).max() > 0.1  # a real signal, not zeros against zeros
  np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)
