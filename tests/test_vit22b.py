"""ViT-22B's block options (parallel blocks, QK norm, no QKV bias, norms without bias and
centering): off they are the released model bit for bit; on, timm's blocks compute the same
numbers on the same weights; every path (scanned, rematerialised, fused, masked) agrees."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import timm  # an oracle pinned in requirements/test.in: missing, these tests fail
import torch
from conftest import randomize
from timm.layers import LayerNorm, RmsNorm
from timm.models.vision_transformer import ParallelScalingBlock

from vit_jax import families
from vit_jax.models import attention, blocks, get_model, model_from_config

# The options at the values that leave the original ViT block, stated here, not imported.
OFF = {'parallel_block': False, 'qk_norm': False, 'qkv_bias': True, 'norm_bias': True}
VIT22B = {'parallel_block': True, 'qk_norm': True, 'qkv_bias': False, 'norm_bias': False}
# A tiny ViT: 16 px images in patches of 4 (16 tokens and the class token), width 32, 4 heads
# of 8, MLP 96 (not a multiple of the width's other splits, so a wrong split shows), one block
# (the options are the block's; a second one only costs compile time).
D, HEADS, MLP, PATCH, SIZE, CLASSES, LAYERS = 32, 4, 96, 4, 16, 5, 1


def _tiny(options: dict, layers: int = LAYERS, **fields):
  return model_from_config(
    {
      'patches': {'size': (PATCH, PATCH)},
      'hidden_size': D,
      'transformer': {
        'num_layers': layers,
        'mlp_dim': MLP,
        'num_heads': HEADS,
        'dropout_rate': 0.0,
        'attention_dropout_rate': 0.0,
        **options,
      },
      'classifier': 'token',
      'representation_size': None,
      'resnet': None,
      'num_classes': CLASSES,
      **fields,
    }
  )


def _images(n: int = 3, seed: int = 1) -> np.ndarray:
  return np.random.default_rng(seed).uniform(-1, 1, (n, SIZE, SIZE, 3)).astype(np.float32)


def _flat(tree) -> dict:
  return {'/'.join(k.key for k in p): x for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def test_options_off_are_the_released_block_bit_for_bit():
  """The defaults given explicitly build the tree of the registry config and its logits."""
  images = np.random.default_rng(1).uniform(-1, 1, (3, 32, 32, 3)).astype(np.float32)
  plain = get_model('ViT-Ti_16', num_classes=7, transformer={'num_layers': LAYERS})
  explicit = get_model('ViT-Ti_16', num_classes=7, transformer={'num_layers': LAYERS, **OFF})
  shapes = families.param_shapes(plain, 32)
  assert jax.tree.structure(shapes) == jax.tree.structure(families.param_shapes(explicit, 32))
  params = randomize(shapes)

  def logits(model):  # one program: run op by op, Ti/16's shapes (this test's alone) compile each
    return jax.jit(model.apply, static_argnames='train')({'params': params}, images, train=False)

  np.testing.assert_array_equal(logits(explicit), logits(plain))


def test_options_name_their_parameters():
  flat = _flat(families.param_shapes(_tiny(VIT22B), SIZE))
  attn = 'Transformer/encoderblock_0/MultiHeadDotProductAttention_0'
  assert flat[f'{attn}/query_norm/scale'].shape == (D // HEADS,)
  assert flat[f'{attn}/key_norm/scale'].shape == (D // HEADS,)
  assert f'{attn}/out/bias' in flat and 'Transformer/encoderblock_0/MlpBlock_0/Dense_0/bias' in flat
  for gone in ('query/bias', 'key/bias', 'value/bias', 'query_norm/bias'):
    assert f'{attn}/{gone}' not in flat, gone
  assert not [k for k in flat if 'LayerNorm_1' in k]
  assert not [k for k in flat if 'norm' in k.lower() and k.endswith('/bias')]
  assert 'Transformer/encoder_norm/scale' in flat


# --- timm, the oracle: its parallel ViT-22B block and its QK-normed attention.


def _timm_vit(parallel: bool, qk_norm: bool, qkv_bias: bool, rms: bool, fuse_out: bool):
  """A tiny timm ViT (tanh GELU, as ours by default), every weight random (norm gains ~1)."""
  block = functools.partial(ParallelScalingBlock, fuse_out_proj=fuse_out) if parallel else None
  kwargs = {'block_fn': block} if parallel else {}
  model = timm.create_model(
    'vit_tiny_patch16_224',
    img_size=SIZE, patch_size=PATCH, embed_dim=D, depth=LAYERS, num_heads=HEADS, mlp_ratio=MLP / D,
    qkv_bias=qkv_bias, qk_norm=qk_norm, num_classes=CLASSES, act_layer='gelu_tanh',
    norm_layer=RmsNorm if rms else LayerNorm, **kwargs,
  ).eval()  # fmt: skip
  generator = torch.Generator().manual_seed(0)
  with torch.no_grad():
    for module in model.modules():
      for name, p in module.named_parameters(recurse=False):
        gain = isinstance(module, (LayerNorm, RmsNorm)) and name == 'weight'
        p.copy_(float(gain) + 0.3 * torch.randn(p.shape, generator=generator))
  return model


def _heads(w: np.ndarray) -> np.ndarray:
  """A torch (heads * head_dim, D) projection -> our (D, heads, head_dim) kernel."""
  return w.T.reshape(D, HEADS, D // HEADS)


def _norm(state: dict, theirs: str) -> dict:
  out = {'scale': state[f'{theirs}.weight']}
  return out | ({'bias': state[f'{theirs}.bias']} if f'{theirs}.bias' in state else {})


def _dense(w: np.ndarray, b: np.ndarray | None, kernel: np.ndarray | None = None) -> dict:
  out = {'kernel': w.T if kernel is None else kernel}
  return out if b is None else out | {'bias': b}


def _parallel_block(s: dict, p: str) -> dict:
  """timm's ParallelScalingBlock -> ours: `in_proj` (MLP, q, k, v rows) split along its output,
  a fused `out_proj` along its input (its bias into `out`, zeros for Dense_1)."""
  w_mlp, w_q, w_k, w_v = np.split(s[f'{p}.in_proj.weight'], [MLP, MLP + D, MLP + 2 * D])
  if f'{p}.in_proj.bias' in s:
    b_mlp, *b_qkv = np.split(s[f'{p}.in_proj.bias'], [MLP, MLP + D, MLP + 2 * D])
  else:
    b_mlp, b_qkv = s[f'{p}.mlp_bias'], [None] * 3
  if f'{p}.out_proj.weight' in s:
    w_out, w_fc2 = np.split(s[f'{p}.out_proj.weight'], [D], axis=1)
    b_out, b_fc2 = s[f'{p}.out_proj.bias'], np.zeros(D, np.float32)
  else:
    w_out, b_out = s[f'{p}.attn_out_proj.weight'], s[f'{p}.attn_out_proj.bias']
    w_fc2, b_fc2 = s[f'{p}.mlp_out_proj.weight'], s[f'{p}.mlp_out_proj.bias']
  attn = {
    n: _dense(w, None if b is None else b.reshape(HEADS, -1), _heads(w))
    for n, w, b in zip(('query', 'key', 'value'), (w_q, w_k, w_v), b_qkv, strict=True)
  }
  attn['out'] = _dense(w_out, b_out, w_out.T.reshape(HEADS, D // HEADS, D))
  if f'{p}.q_norm.weight' in s:
    attn |= {'query_norm': _norm(s, f'{p}.q_norm'), 'key_norm': _norm(s, f'{p}.k_norm')}
  return {
    'LayerNorm_0': _norm(s, f'{p}.in_norm'),
    'MultiHeadDotProductAttention_0': attn,
    'MlpBlock_0': {'Dense_0': _dense(w_mlp, b_mlp), 'Dense_1': _dense(w_fc2, b_fc2)},
  }


def _sequential_block(s: dict, p: str) -> dict:
  """timm's Block -> ours: its fused `qkv` split into query, key, value."""
  ws = np.split(s[f'{p}.attn.qkv.weight'], 3)
  bs = np.split(s[f'{p}.attn.qkv.bias'], 3) if f'{p}.attn.qkv.bias' in s else [None] * 3
  attn = {
    n: _dense(w, None if b is None else b.reshape(HEADS, -1), _heads(w))
    for n, w, b in zip(('query', 'key', 'value'), ws, bs, strict=True)
  }
  w_out = s[f'{p}.attn.proj.weight']
  attn['out'] = _dense(w_out, s[f'{p}.attn.proj.bias'], w_out.T.reshape(HEADS, D // HEADS, D))
  if f'{p}.attn.q_norm.weight' in s:
    attn |= {'query_norm': _norm(s, f'{p}.attn.q_norm'), 'key_norm': _norm(s, f'{p}.attn.k_norm')}
  mlp = {
    f'Dense_{i}': _dense(s[f'{p}.mlp.fc{i + 1}.weight'], s[f'{p}.mlp.fc{i + 1}.bias'])
    for i in range(2)
  }
  return {
    'LayerNorm_0': _norm(s, f'{p}.norm1'),
    'MultiHeadDotProductAttention_0': attn,
    'LayerNorm_1': _norm(s, f'{p}.norm2'),
    'MlpBlock_0': mlp,
  }


def _ours(model, parallel: bool) -> dict:
  s = {k: v.detach().numpy() for k, v in model.state_dict().items()}
  block = _parallel_block if parallel else _sequential_block
  return {
    'embedding': _dense(s['patch_embed.proj.weight'], s['patch_embed.proj.bias'],
                        s['patch_embed.proj.weight'].transpose(2, 3, 1, 0)),
    'cls': s['cls_token'],
    'Transformer': {
      'posembed_input': {'pos_embedding': s['pos_embed']},
      **{f'encoderblock_{i}': block(s, f'blocks.{i}') for i in range(LAYERS)},
      'encoder_norm': _norm(s, 'norm'),
    },
    'head': _dense(s['head.weight'], s['head.bias']),
  }  # fmt: skip


@pytest.mark.parametrize(
  'options, fuse_out, impl',
  [
    (VIT22B, False, 'xla'),  # ViT-22B's block
    (VIT22B, True, 'fused'),  # a fused out-projection, split; jax.nn.dot_product_attention
    ({**OFF, 'parallel_block': True}, False, 'xla'),  # parallel, with every bias
    ({**VIT22B, 'parallel_block': False}, False, 'xla'),  # the sequential block, QK-normed
  ],
)
def test_logits_equal_timm_on_the_same_weights(options, fuse_out, impl):
  parallel = options['parallel_block']
  theirs = _timm_vit(
    parallel, options['qk_norm'], options['qkv_bias'], not options['norm_bias'], fuse_out
  )
  images = _images()
  with torch.no_grad():
    want = theirs(torch.from_numpy(images.transpose(0, 3, 1, 2))).numpy()
  model = _tiny(options, attention_impl=impl, gelu_approximate=True)
  params = _ours(theirs, parallel)
  assert jax.tree.structure(params) == jax.tree.structure(families.param_shapes(model, SIZE))
  got = model.apply({'params': params}, images, train=False)
  assert np.abs(want).max() > 0.5  # logits worth comparing
  np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)


def test_qk_norm_in_the_masked_attention_ignores_the_padding():
  """NaFlex's path: with padding tokens masked out, the real tokens' outputs are those of the
  sequence without the padding."""
  layer = attention.MultiHeadDotProductAttention(
    num_heads=HEADS, qk_norm=True, qkv_bias=False, norm_bias=False
  )
  x = jnp.asarray(np.random.default_rng(2).normal(size=(2, 9, D)), jnp.float32)
  params = randomize(jax.eval_shape(lambda: layer.init(jax.random.key(0), x, True))['params'], 3)
  mask = jnp.arange(9)[None, :] < jnp.asarray([[6], [9]])  # the first example: 6 real tokens
  # Compiled: op by op, each of the three shapes would compile every operation.
  attend = jax.jit(lambda x, mask=None: layer.apply({'params': params}, x, True, mask=mask))
  out = attend(x, mask)
  np.testing.assert_allclose(out[0, :6], attend(x[:1, :6])[0], atol=1e-5)
  np.testing.assert_allclose(out[1], attend(x[1:])[0], atol=1e-5)


def test_scanned_and_rematerialised_blocks_equal_the_unrolled_ones():
  images = _images()
  unrolled = _tiny(VIT22B, layers=3)
  scanned = _tiny(VIT22B, layers=3, scan_layers=True, remat_policy='full')
  params = randomize(families.param_shapes(unrolled, SIZE))
  stacked = blocks.stack_encoder_blocks(params)
  assert jax.tree.structure(stacked) == jax.tree.structure(families.param_shapes(scanned, SIZE))
  np.testing.assert_allclose(
    scanned.apply({'params': stacked}, images, train=False),
    unrolled.apply({'params': params}, images, train=False),
    atol=1e-5,
  )


def test_a_training_step_moves_the_new_norm_scales():
  model = _tiny(VIT22B)
  images, labels = _images(4), jnp.arange(4) % CLASSES
  params = randomize(families.param_shapes(model, SIZE))

  def loss(p):
    logits = model.apply({'params': p}, images, train=True, rngs={'dropout': jax.random.key(0)})
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], 1))

  grads = _flat(jax.jit(jax.grad(loss))(params))
  new = [k for k in grads if k.endswith(('query_norm/scale', 'key_norm/scale'))]
  new += [k for k in grads if k.endswith('LayerNorm_0/scale') or 'encoder_norm' in k]
  assert len(new) == LAYERS * 3 + 1
  for key in new:
    g = np.asarray(grads[key])
    assert np.all(np.isfinite(g)) and np.abs(g).max() > 1e-6, key


def test_bfloat16_keeps_float32_parameters_and_agrees():
  images = _images()
  f32 = _tiny(VIT22B)
  params = randomize(families.param_shapes(f32, SIZE), scale=0.1)
  ref = f32.apply({'params': params}, images, train=False)
  for policy in ('matmul', 'activations'):
    bf16 = _tiny(VIT22B, dtype=jnp.bfloat16, precision_policy=policy)
    shapes = families.param_shapes(bf16, SIZE)
    assert {x.dtype for x in jax.tree.leaves(shapes)} == {jnp.dtype(jnp.float32)}
    out = bf16.apply({'params': params}, images, train=False)
    assert out.dtype == jnp.float32
    assert np.abs(out - ref).max() < 0.05 * np.abs(ref).max(), policy


@pytest.mark.parametrize(
  'options, match',
  [
    ({'qk_norm': 'False'}, r"transformer.qk_norm='False'; give True or False"),
    ({'qk_norm': True, 'num_heads': D}, 'over its head_dim, here 1: use fewer heads'),
    ({'qk_norm': True, 'num_heads': 5}, 'not divisible by num_heads=5'),
  ],
)
def test_invalid_options_are_one_line_errors(options, match):
  model = _tiny({**VIT22B, **options})
  with pytest.raises(ValueError, match=match) as raised:
    families.param_shapes(model, SIZE)
  assert '\n' not in str(raised.value)


def test_registry_overrides_take_the_options_and_still_refuse_typos():
  model = get_model('ViT-B_16', transformer={'qk_norm': True})
  assert model.transformer['qk_norm'] is True
  with pytest.raises(KeyError, match='qk_nrom'):
    get_model('ViT-B_16', transformer={'qk_nrom': True})


def test_a_saved_tree_loads_back_with_its_options_read_off_the_shapes(tmp_path):
  """The options are the checkpoint's shapes: an .npz of a ViT-22B-style tree fits the model
  that computes it, with no config beside it."""
  from vit_jax import checkpoint

  model = _tiny(VIT22B)
  params = randomize(families.param_shapes(model, SIZE))
  checkpoint.save_npz(params, tmp_path / 'vit22b_tiny.npz')
  fitted = checkpoint.fit(tmp_path / 'vit22b_tiny.npz')
  assert {k: fitted.config.transformer[k] for k in VIT22B} == VIT22B
  images = _images()
  np.testing.assert_array_equal(
    fitted.model().apply({'params': fitted.params}, images, train=False),
    model.apply({'params': params}, images, train=False),
  )


def test_the_registry_tells_vit22b_from_a_plain_vit_of_its_shape():
  from vit_jax.checkpoint import infer_config
  from vit_jax.families import vit

  shapes = families.param_shapes(get_model('ViT-22B_14', num_classes=1000), 224)
  config = infer_config(shapes)
  assert vit.match_registry(config) == 'ViT-22B_14'
  for option in VIT22B:  # any one option back at its default: no registered architecture
    config.transformer[option] = OFF[option]
    assert vit.match_registry(config) is None, option
    config.transformer[option] = VIT22B[option]


@pytest.mark.parametrize('to', ['timm', 'hf'])
def test_exports_to_pytorch_vits_refuse_the_options(to):
  from vit_jax import checkpoint

  params = randomize(families.param_shapes(_tiny({**OFF, 'qk_norm': True}), SIZE))
  export = checkpoint.to_timm_state_dict if to == 'timm' else checkpoint.to_hf_state_dict
  with pytest.raises(checkpoint.CheckpointError, match=r"options \['qk_norm'\] have no") as e:
    export(params)
  assert '\n' not in str(e.value) and '--to=npz' in str(e.value)
