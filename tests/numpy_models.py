"""Independent float64 numpy implementations of the model equations, used as test oracles.

Written from the papers and the reference code's equations (vit_jax `models_vit.py` and
`models_mixer.py`, big_vision `models/vit.py`, DeiT), reading parameters by their on-disk
names from flat `{'a/b': array}` dicts; nothing here imports `vit_jax`.
"""

import numpy as np
import scipy.special

EPS = 1e-6  # flax LayerNorm


def layer_norm(x, p, prefix):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + EPS) * p[f'{prefix}/scale'] + p[f'{prefix}/bias']


def gelu_tanh(x):
  return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def gelu_exact(x):
  """x Phi(x), Phi the standard normal CDF (PyTorch's `nn.GELU()`)."""
  return 0.5 * x * (1 + scipy.special.erf(x / np.sqrt(2)))


def mlp(x, p, prefix, gelu=gelu_tanh):
  """Dense_0, GELU (the tanh approximation unless told), Dense_1 over the last axis."""
  h = gelu(x @ p[f'{prefix}/Dense_0/kernel'] + p[f'{prefix}/Dense_0/bias'])
  return h @ p[f'{prefix}/Dense_1/kernel'] + p[f'{prefix}/Dense_1/bias']


def patchify(images, kernel, bias):
  """A conv with stride = kernel size and no padding, as a matmul over flattened patches."""
  n, height, width, c = images.shape
  ph, pw, _, d = kernel.shape
  h, w = height // ph, width // pw
  x = images[:, : h * ph, : w * pw].reshape(n, h, ph, w, pw, c).transpose(0, 1, 3, 2, 4, 5)
  return x.reshape(n, h * w, ph * pw * c) @ kernel.reshape(ph * pw * c, d) + bias, (h, w)


def attention(xq, xkv, p, prefix):
  """softmax(q k^T / sqrt(head_dim)) v with (D, heads, head_dim) kernels and an output
  projection (heads, head_dim, D)."""
  q = (
    np.einsum('nqd,dhk->nhqk', xq, p[f'{prefix}/query/kernel'])
    + p[f'{prefix}/query/bias'][None, :, None]
  )
  k = (
    np.einsum('nsd,dhk->nhsk', xkv, p[f'{prefix}/key/kernel'])
    + p[f'{prefix}/key/bias'][None, :, None]
  )
  v = (
    np.einsum('nsd,dhk->nhsk', xkv, p[f'{prefix}/value/kernel'])
    + p[f'{prefix}/value/bias'][None, :, None]
  )
  logits = np.einsum('nhqk,nhsk->nhqs', q, k) / np.sqrt(q.shape[-1])
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  y = np.einsum('nhqs,nhsk->nqhk', weights, v)
  return np.einsum('nqhk,hkd->nqd', y, p[f'{prefix}/out/kernel']) + p[f'{prefix}/out/bias']


def encoder(
  x,
  p,
  blocks,
  mha='MultiHeadDotProductAttention_0',
  ln2='LayerNorm_1',
  mlp_='MlpBlock_0',
  gelu=gelu_tanh,
  norm='Transformer/encoder_norm',
):
  """Pre-norm blocks `blocks` (prefixes), then the final LayerNorm `norm`. The module names
  inside a block are the caller's (pre-Linen on disk: _1, LayerNorm_2, MlpBlock_3)."""
  for b in blocks:
    y = layer_norm(x, p, f'{b}/LayerNorm_0')
    x = x + attention(y, y, p, f'{b}/{mha}')
    x = x + mlp(layer_norm(x, p, f'{b}/{ln2}'), p, f'{b}/{mlp_}', gelu)
  return layer_norm(x, p, norm)


def sincos2d(h, w, width, temperature=10_000.0):
  """big_vision's `posemb_sincos_2d`, element by element: token t = (row y, column x) gets
  [sin(x w_i)]_i, [cos(x w_i)]_i, [sin(y w_i)]_i, [cos(y w_i)]_i, w_i = T^(-i/(width/4-1))."""
  quarter = width // 4
  pe = np.zeros((h * w, width))
  for y in range(h):
    for x in range(w):
      for i in range(quarter):
        omega = temperature ** (-i / (quarter - 1))
        t = y * w + x
        pe[t, i] = np.sin(x * omega)
        pe[t, quarter + i] = np.cos(x * omega)
        pe[t, 2 * quarter + i] = np.sin(y * omega)
        pe[t, 3 * quarter + i] = np.cos(y * omega)
  return pe[None]


def mixer(p, images):
  """MLP-Mixer logits from a flat dict in the released Mixer names."""
  x, _ = patchify(images, p['stem/kernel'], p['stem/bias'])
  i = 0
  while f'MixerBlock_{i}/LayerNorm_0/scale' in p:
    b = f'MixerBlock_{i}'
    y = layer_norm(x, p, f'{b}/LayerNorm_0').transpose(0, 2, 1)  # mix across the patches
    x = x + mlp(y, p, f'{b}/token_mixing').transpose(0, 2, 1)
    x = x + mlp(layer_norm(x, p, f'{b}/LayerNorm_1'), p, f'{b}/channel_mixing')
    i += 1
  x = layer_norm(x, p, 'pre_head_layer_norm').mean(axis=1)
  return x @ p['head/kernel'] + p['head/bias']


def _blocks(p, prefix='Transformer/encoderblock_'):
  depth = len({k.split('/')[1] for k in p if k.startswith(prefix)})
  return [f'{prefix}{i}' for i in range(depth)]


def deit(p, images, gelu=gelu_tanh):
  """DeiT (Touvron et al.): [cls, dist_token, patches] + position embedding, the ViT encoder
  (our Linen names), `head` on token 0 and `head_dist` on token 1: returns both logits."""
  x, _ = patchify(images, p['embedding/kernel'], p['embedding/bias'])
  n = x.shape[0]
  prefix = [np.repeat(p[name], n, axis=0) for name in ('cls', 'dist_token')]
  x = np.concatenate([*prefix, x], axis=1) + p['Transformer/posembed_input/pos_embedding']
  x = encoder(x, p, _blocks(p), gelu=gelu)
  return (
    x[:, 0] @ p['head/kernel'] + p['head/bias'],
    x[:, 1] @ p['head_dist/kernel'] + p['head_dist/bias'],
  )


def big_vision_vit(p, images, pool, gelu=gelu_tanh):
  """big_vision's ViT (`models/vit.py`) on a flat dict in its own layout (no `params/`
  prefix, unscanned): position embedding (`pos_embedding`, or sincos2d when the dict has none)
  added to the patches, then the class token for pool 'tok'; encoder; pooling 'gap', 'tok' or
  'map' (MAPHead_0: the probe attends over the tokens, then + MLP(LN)); optional pre_logits
  (Dense + tanh); head."""
  x, (h, w) = patchify(images, p['embedding/kernel'], p['embedding/bias'])
  n, _, d = x.shape
  x = x + (p['pos_embedding'] if 'pos_embedding' in p else sincos2d(h, w, d))
  if pool == 'tok':
    x = np.concatenate([np.repeat(p['cls'], n, axis=0), x], axis=1)
  x = encoder(x, p, _blocks(p), gelu=gelu)
  if pool == 'map':
    probe = np.repeat(p['MAPHead_0/probe'], n, axis=0)
    y = attention(probe, x, p, 'MAPHead_0/MultiHeadDotProductAttention_0')
    y = y + mlp(layer_norm(y, p, 'MAPHead_0/LayerNorm_0'), p, 'MAPHead_0/MlpBlock_0', gelu)
    x = y[:, 0]
  else:
    x = x.mean(axis=1) if pool == 'gap' else x[:, 0]
  if 'pre_logits/kernel' in p:
    x = np.tanh(x @ p['pre_logits/kernel'] + p['pre_logits/bias'])
  return x @ p['head/kernel'] + p['head/bias']


def vit(p, images, gelu=gelu_tanh):
  """The original ViT (vit_jax `models_vit.py`, classifier 'token') on a flat dict in our Linen
  names: [cls, patches] + `Transformer/posembed_input`, encoder, token 0, optional pre_logits
  (Dense + tanh), optional head."""
  x, _ = patchify(images, p['embedding/kernel'], p['embedding/bias'])
  x = np.concatenate([np.repeat(p['cls'], x.shape[0], axis=0), x], axis=1)
  x = x + p['Transformer/posembed_input/pos_embedding']
  x = encoder(x, p, _blocks(p), gelu=gelu)[:, 0]
  if 'pre_logits/kernel' in p:
    x = np.tanh(x @ p['pre_logits/kernel'] + p['pre_logits/bias'])
  return x @ p['head/kernel'] + p['head/bias'] if 'head/kernel' in p else x


def text_transformer(p, tokens, pool='last'):
  """The simple text transformer (vit_jax `models_lit.TextTransformer`, big_vision
  `text_transformer`) on a flat dict in its names (no `txt/` prefix, unscanned): embedding
  rows of the tokens + `pos_embedding`, pre-norm blocks `Encoder_0/encoderblock_{i}`,
  `Encoder_0/encoder_norm`, the last (or first) token, optional head."""
  x = p['Embed_0/embedding'][tokens] + p['pos_embedding']
  x = encoder(x, p, _blocks(p, 'Encoder_0/encoderblock_'), norm='Encoder_0/encoder_norm')
  x = x[:, -1] if pool == 'last' else x[:, 0]
  return x @ p['head/kernel'] + p['head/bias'] if 'head/kernel' in p else x


def l2_normalize(z):
  """An embedding divided by its L2 norm + 1e-8 (LiT's and big_vision's normalisation)."""
  return z / (np.linalg.norm(z, axis=-1, keepdims=True) + 1e-8)
