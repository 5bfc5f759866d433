"""The model zoo: exact parameter counts, names, shapes, dropout, dtypes, and logits vs HF."""

import re

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from conftest import randomize

from vit_jax import families
from vit_jax.models import MODEL_CONFIGS, attention, get_model, model_from_config, precision, stats

# Every registered model at 224 px with a 1000-class head: the original vit_jax
# `models_test.MODEL_SIZES`. The gap-norep rows have no class token and one fewer
# position-embedding row (-2D); testing-unpooled has neither (-2 x 10).
EXPECTED_PARAMS = {
  'testing': 21_390,
  'testing-unpooled': 21_370,
  'ViT-Ti_16': 5_717_416,
  'ViT-S_16': 22_050_664,
  'ViT-S_32': 22_878_952,
  'ViT-B_8': 86_576_872,
  'ViT-B_16': 86_567_656,
  'ViT-B_32': 88_224_232,
  'ViT-L_16': 304_326_632,
  'ViT-L_32': 306_535_400,
  'ViT-H_14': 632_045_800,
  'ViT-S_16-gap-norep': 22_049_896,
  'ViT-S_32-gap-norep': 22_878_184,
  'ViT-B_16-gap-norep': 86_566_120,
  'ViT-B_32-gap-norep': 88_222_696,
  'R+ViT-Ti_16': 6_337_704,
  'R26+ViT-S_32': 36_431_912,
  'R26+ViT-B_32': 101_383_976,
  'R50+ViT-B_16': 98_659_112,
  'R50+ViT-L_32': 328_994_856,
  # The original table's Mixers (`models_test.MODEL_SIZES`).
  'Mixer-B_16': 59_880_472,
  'Mixer-B_32': 60_293_428,
  'Mixer-L_16': 208_196_168,
}


def vit_params(
  hidden, layers, mlp, heads, patch, resolution=224, classes=1000, *, parallel=False,
  qk_norm=False, qkv_bias=True, norm_bias=True,
):  # fmt: skip
  """A ViT's parameters by hand: patch embedding (p x p x 3 x D + D), class token (D), position
  embedding (one row of D per patch and for the class token); per block its LayerNorms (two,
  one with parallel blocks; scale D and bias D, the scale alone without bias and centering),
  q, k, v kernels (D x D each) with their biases (D each) unless qkv_bias=False, QK norms (one
  LayerNorm of head_dim for queries, one for keys), out (D x D + D), the MLP (D x M + M + M x
  D + D); the encoder norm; the head (D x C + C)."""
  d, head_dim = hidden, hidden // heads
  norm = d if not norm_bias else 2 * d
  embedding = patch * patch * 3 * d + d + d + ((resolution // patch) ** 2 + 1) * d
  attention = 3 * d * d + (3 * d if qkv_bias else 0) + d * d + d
  attention += 2 * (head_dim if not norm_bias else 2 * head_dim) if qk_norm else 0
  block = (1 if parallel else 2) * norm + attention + d * mlp + mlp + mlp * d + d
  return embedding + layers * block + norm + d * classes + classes


# The giant ViTs of later papers (ViT-g/14 and ViT-G/14: Zhai et al., arXiv:2106.04560, Table 2;
# ViT-e: PaLI, arXiv:2209.06794; ViT-22B: Dehghani et al., arXiv:2302.05442, Table 1).
GIANTS = {
  'ViT-giant_14': vit_params(1408, 40, 6144, 16, 14),
  'ViT-gigantic_14': vit_params(1664, 48, 8192, 16, 14),
  'ViT-e_14': vit_params(1792, 56, 15360, 16, 14),
  'ViT-22B_14': vit_params(
    6144, 48, 24576, 48, 14, parallel=True, qk_norm=True, qkv_bias=False, norm_bias=False
  ),
}
EXPECTED_PARAMS |= GIANTS


def mixer_params(hidden, blocks, tokens_mlp, channels_mlp, patch, resolution=224, classes=1000):
  """MLP-Mixer's parameters by hand: stem conv, per block two LayerNorms, the token MLP
  (S -> D_S -> S) and the channel MLP (C -> D_C -> C) with biases, final norm, head."""
  s = (resolution // patch) ** 2
  stem = patch * patch * 3 * hidden + hidden
  token_mlp = s * tokens_mlp + tokens_mlp + tokens_mlp * s + s
  channel_mlp = hidden * channels_mlp + channels_mlp + channels_mlp * hidden + hidden
  block = 2 * 2 * hidden + token_mlp + channel_mlp
  return stem + blocks * block + 2 * hidden + hidden * classes + classes


def deit_params(vit_params, hidden, classes=1000):
  """DeiT with distillation token over the ViT of the same size: `dist_token` (D), its
  position-embedding row (D) and `head_dist` (D x classes + classes)."""
  return vit_params + hidden + hidden + hidden * classes + classes


# Mixer-S (paper Table 1: C 512, 8 blocks, D_S 256, D_C 2048), the sizes of the GSAM files.
EXPECTED_PARAMS |= {f'Mixer-S_{p}': mixer_params(512, 8, 256, 2048, p) for p in (8, 16, 32)}
EXPECTED_PARAMS |= {
  f'DeiT-{size}-distilled': deit_params(EXPECTED_PARAMS[f'ViT-{size}'], hidden)
  for size, hidden in (('Ti_16', 192), ('S_16', 384), ('B_16', 768))
}


def test_mixer_arithmetic_reproduces_the_original_table():
  assert mixer_params(768, 12, 384, 3072, 16) == EXPECTED_PARAMS['Mixer-B_16']
  assert mixer_params(768, 12, 384, 3072, 32) == EXPECTED_PARAMS['Mixer-B_32']
  assert mixer_params(1024, 24, 512, 4096, 16) == EXPECTED_PARAMS['Mixer-L_16']


def test_vit_arithmetic_reproduces_the_original_table():
  for name, (patch, hidden, mlp, heads, layers) in {
    'ViT-Ti_16': (16, 192, 768, 3, 12),
    'ViT-S_32': (32, 384, 1536, 6, 12),
    'ViT-B_8': (8, 768, 3072, 12, 12),
    'ViT-B_16': (16, 768, 3072, 12, 12),
    'ViT-L_32': (32, 1024, 4096, 16, 24),
    'ViT-H_14': (14, 1280, 5120, 16, 32),
  }.items():
    assert vit_params(hidden, layers, mlp, heads, patch) == EXPECTED_PARAMS[name], name


def test_giant_counts_equal_timms_built_on_the_meta_device():
  """timm's vit_giant_patch14_224 and vit_gigantic_patch14_224 (class token, QKV biases, a
  1000-class head: our layout), counted without allocating their weights."""
  import timm
  import torch

  for name, theirs in (
    ('ViT-giant_14', 'vit_giant_patch14_224'),
    ('ViT-gigantic_14', 'vit_gigantic_patch14_224'),
  ):
    with torch.device('meta'):
      model = timm.create_model(theirs, pretrained=False, num_classes=1000)
    assert sum(p.numel() for p in model.parameters()) == EXPECTED_PARAMS[name], name


def test_deit_counts_round_to_the_published_ones():
  # timm `results-imagenet.csv` param_count (millions) of deit_*_distilled_patch16_224.
  published = {'Ti_16': 5.91, 'S_16': 22.44, 'B_16': 87.34}
  for size, millions in published.items():
    assert round(EXPECTED_PARAMS[f'DeiT-{size}-distilled'] / 1e6, 2) == millions, size


def test_every_registered_classifier_has_an_expected_count():
  assert set(families.classifiers()) == set(EXPECTED_PARAMS)  # image-text: test_two_towers.py


@pytest.mark.slow
@pytest.mark.parametrize('name', sorted(EXPECTED_PARAMS))
def test_exact_parameter_count(name):
  # The giants' 40 to 56 blocks traced once, stacked (`scan_layers`): the same count, sooner.
  scan = {'scan_layers': True} if name in GIANTS else {}
  shapes = families.param_shapes(get_model(name, num_classes=1000, **scan), 224)
  assert stats.count_params(shapes) == EXPECTED_PARAMS[name]


def test_b16_tree_names_and_shapes_match_the_released_layout():
  shapes = families.param_shapes(get_model('ViT-B_16', num_classes=1000), 224)
  flat = {
    '/'.join(k.key for k in path): x.shape
    for path, x in jax.tree_util.tree_flatten_with_path(shapes)[0]
  }
  assert len(flat) == 200
  block = 'Transformer/encoderblock_11'
  expected = {
    'embedding/kernel': (16, 16, 3, 768),
    'cls': (1, 1, 768),
    'Transformer/posembed_input/pos_embedding': (1, 197, 768),
    f'{block}/LayerNorm_0/scale': (768,),
    f'{block}/MultiHeadDotProductAttention_0/query/kernel': (768, 12, 64),
    f'{block}/MultiHeadDotProductAttention_0/key/bias': (12, 64),
    f'{block}/MultiHeadDotProductAttention_0/out/kernel': (12, 64, 768),
    f'{block}/MultiHeadDotProductAttention_0/out/bias': (768,),
    f'{block}/LayerNorm_1/bias': (768,),
    f'{block}/MlpBlock_0/Dense_0/kernel': (768, 3072),
    f'{block}/MlpBlock_0/Dense_1/kernel': (3072, 768),
    'Transformer/encoder_norm/scale': (768,),
    'head/kernel': (768, 1000),
    'head/bias': (1000,),
  }
  for key, shape in expected.items():
    assert flat[key] == shape, key


@pytest.mark.parametrize(
  'name, tokens, embedding',
  [
    ('R+ViT-Ti_16', 50, (8, 8, 64, 192)),  # /32 overall, as in the released files
    ('R26+ViT-S_32', 50, (1, 1, 2048, 384)),
    ('R50+ViT-B_16', 197, (1, 1, 1024, 768)),
    ('R50+ViT-L_32', 50, (1, 1, 2048, 1024)),
  ],
)
def test_hybrid_stem_layout(name, tokens, embedding):
  shapes = families.param_shapes(get_model(name, num_classes=1000), 224)
  assert shapes['Transformer']['posembed_input']['pos_embedding'].shape[1] == tokens
  assert shapes['embedding']['kernel'].shape == embedding
  assert shapes['conv_root']['kernel'].shape == (7, 7, 3, 64)
  assert shapes['gn_root']['scale'].shape == (64,)
  if name != 'R+ViT-Ti_16':
    assert shapes['block1']['unit1']['conv_proj']['kernel'].shape == (1, 1, 64, 256)
    assert shapes['block2']['unit1']['gn3']['scale'].shape == (512,)


def test_unknown_model_lists_close_matches():
  with pytest.raises(KeyError, match=re.escape('ViT-B_16')):
    get_model('ViT-B16')


def test_override_of_a_nested_field():
  model = get_model('ViT-L_16', transformer={'dropout_rate': 0.0}, num_classes=10)
  assert model.transformer['dropout_rate'] == 0.0
  assert model.transformer['num_layers'] == 24
  with pytest.raises(KeyError, match='dropout'):
    get_model('ViT-L_16', transformer={'dropot_rate': 0.0})


@pytest.mark.slow
@pytest.mark.parametrize(
  'classifier, out_shape',
  [
    ('token', (2, 7)),
    ('gap', (2, 7)),
    ('unpooled', (2, 4, 7)),
    ('token_unpooled', (2, 5, 7)),
  ],
)
def test_output_shape_per_classifier(classifier, out_shape):
  model = get_model('testing', num_classes=7, classifier=classifier)
  images = jnp.zeros((2, 32, 32, 3))
  params = randomize(families.param_shapes(model, 32))
  assert model.apply({'params': params}, images, train=False).shape == out_shape


def test_representation_layer_and_features_only():
  model = get_model('testing', num_classes=None, representation_size=6)
  images = jnp.zeros((3, 32, 32, 3))
  params = randomize(families.param_shapes(model, 32))
  assert params['pre_logits']['kernel'].shape == (10, 6)
  assert 'head' not in params
  out = model.apply({'params': params}, images, train=False)
  assert out.shape == (3, 6)
  assert np.all(np.abs(out) <= 1.0)  # tanh


@pytest.mark.slow
def test_head_is_zero_initialised_with_bias_init():
  model = get_model('testing', num_classes=5, head_bias_init=-10.0)
  images = jnp.ones((1, 32, 32, 3))
  params = jax.jit(lambda: model.init(jax.random.key(0), images, train=False))()['params']
  np.testing.assert_array_equal(params['head']['kernel'], 0.0)
  np.testing.assert_array_equal(model.apply({'params': params}, images, train=False), -10.0)


def test_dropout_depends_on_rng_only_in_training(random_params):
  model = get_model('testing', num_classes=5)  # dropout_rate 0.1
  images = jax.random.uniform(jax.random.key(1), (2, 32, 32, 3), minval=-1, maxval=1)
  params = random_params(families.param_shapes(model, 32))
  train = lambda seed: model.apply(
    {'params': params}, images, train=True, rngs={'dropout': jax.random.key(seed)}
  )
  assert np.abs(train(0) - train(1)).max() > 1e-3
  np.testing.assert_array_equal(train(0), train(0))
  np.testing.assert_array_equal(
    model.apply({'params': params}, images, train=False),
    model.apply({'params': params}, images, train=False),
  )


def _without_drop_path(name: str) -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict(MODEL_CONFIGS[name].to_dict())
  del config.transformer['drop_path_rate']
  return config


@pytest.mark.slow
def test_stochastic_depth_at_rate_0_is_the_plain_model(random_params):
  """drop_path_rate=0 builds the same tree and, with the same dropout key, the same logits
  as a model config without the key."""
  images = jax.random.uniform(jax.random.key(1), (4, 32, 32, 3), minval=-1, maxval=1)
  plain = model_from_config(_without_drop_path('testing'), num_classes=5)
  zero = get_model('testing', num_classes=5, transformer={'num_layers': 3, 'drop_path_rate': 0.0})
  plain = plain.clone(transformer={**plain.transformer, 'num_layers': 3})
  params = random_params(families.param_shapes(plain, 32))
  assert jax.tree.structure(params) == jax.tree.structure(families.param_shapes(zero, 32))
  rngs = {'dropout': jax.random.key(2)}  # dropout_rate 0.1: the keys are used alike
  np.testing.assert_array_equal(
    zero.apply({'params': params}, images, train=True, rngs=rngs),
    plain.apply({'params': params}, images, train=True, rngs=rngs),
  )


@pytest.mark.slow
def test_stochastic_depth_is_off_at_evaluation_and_random_in_training(random_params):
  images = jax.random.uniform(jax.random.key(1), (8, 32, 32, 3), minval=-1, maxval=1)
  no_dropout = {'num_layers': 3, 'dropout_rate': 0.0}
  plain = get_model('testing', num_classes=5, transformer=no_dropout)
  model = get_model('testing', num_classes=5, transformer={**no_dropout, 'drop_path_rate': 0.5})
  params = {'params': random_params(families.param_shapes(plain, 32))}
  evaluated = model.apply(params, images, train=False)
  np.testing.assert_array_equal(evaluated, model.apply(params, images, train=False))
  np.testing.assert_array_equal(evaluated, plain.apply(params, images, train=False))
  train = lambda seed: model.apply(
    params, images, train=True, rngs={'dropout': jax.random.key(seed)}
  )
  np.testing.assert_array_equal(train(0), train(0))
  assert np.abs(train(0) - train(1)).max() > 1e-3
  # Without dropout, the training path of the plain model is its evaluation.
  np.testing.assert_array_equal(plain.apply(params, images, train=True), evaluated)


@pytest.mark.slow
@pytest.mark.parametrize('scan_layers', [False, True])
def test_stochastic_depth_keeps_block_i_with_probability_one_minus_rate_i_over_l_minus_1(
  scan_layers, random_params
):
  """Four blocks at drop_path_rate 0.6: over 4,000 examples block i keeps each branch of an
  example with frequency 1 - 0.6 i / 3 (binomial std <= 0.008), and a kept branch is the
  branch scaled by 1 / keep."""
  n, rate = 4000, 0.6
  images = jax.random.uniform(jax.random.key(1), (n, 16, 16, 3), minval=-1, maxval=1)
  fields = {'num_layers': 4, 'dropout_rate': 0.0, 'drop_path_rate': rate}
  model = get_model('testing', num_classes=5, transformer=fields, scan_layers=scan_layers)
  params = random_params(families.param_shapes(model, 16))
  _, state = model.apply(
    {'params': params}, images, train=True, rngs={'dropout': jax.random.key(3)},
    capture_intermediates=True,
  )  # fmt: skip
  blocks = state['intermediates']['Transformer']
  if scan_layers:
    stacked = blocks['encoderblock']
    blocks = {f'encoderblock_{i}': jax.tree.map(lambda x, i=i: x[i], stacked) for i in range(4)}
  for i in range(4):
    keep = 1.0 - rate * i / 3
    block = blocks[f'encoderblock_{i}']
    if 'DropPath_1' not in block:  # rate 0: no draw at all
      assert keep == 1.0
      continue
    for branch in ('DropPath_0', 'DropPath_1'):
      out = np.asarray(block[branch]['__call__'][0])
      kept = np.abs(out).reshape(n, -1).max(-1) > 0
      assert abs(kept.mean() - keep) < 0.035, (i, branch, kept.mean(), keep)
    mlp = np.asarray(block['MlpBlock_0']['__call__'][0])
    out = np.asarray(block['DropPath_1']['__call__'][0])
    np.testing.assert_allclose(out[kept], mlp[kept] / keep, rtol=1e-6)


@pytest.mark.slow
def test_bfloat16_compute_keeps_float32_params_and_agrees(random_params):
  images = jax.random.uniform(jax.random.key(1), (4, 64, 64, 3), minval=-1, maxval=1)
  f32 = get_model('ViT-Ti_16', num_classes=10)
  bf16 = get_model('ViT-Ti_16', num_classes=10, dtype=jnp.bfloat16)
  params = families.param_shapes(bf16, 64)  # what init returns, by jax.eval_shape
  assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}
  params = random_params(params, scale=0.05)
  ref = f32.apply({'params': params}, images, train=False)
  out = bf16.apply({'params': params}, images, train=False)
  assert out.dtype == jnp.float32
  # bfloat16 keeps 8 bits of mantissa; through 12 blocks the logits stay within 5% of their range.
  assert np.abs(out - ref).max() < 0.05 * np.abs(ref).max()
  np.testing.assert_array_equal(out.argmax(-1), ref.argmax(-1))


@pytest.mark.slow
@pytest.mark.parametrize('overrides', [{'attention_impl': 'fused'}, {'remat_policy': 'full'}])
def test_fused_attention_and_remat_leave_logits_unchanged(overrides, random_params):
  images = jax.random.uniform(jax.random.key(1), (2, 32, 32, 3), minval=-1, maxval=1)
  base = get_model('ViT-Ti_16', num_classes=10, patches={'size': (8, 8)})
  variant = get_model('ViT-Ti_16', num_classes=10, patches={'size': (8, 8)}, **overrides)
  params = random_params(families.param_shapes(base, 32), scale=0.05)
  assert jax.tree.structure(params) == jax.tree.structure(families.param_shapes(variant, 32))
  np.testing.assert_allclose(
    variant.apply({'params': params}, images, train=False),
    base.apply({'params': params}, images, train=False),
    atol=1e-5,
  )


@pytest.mark.slow
@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_attend_backward_equals_autodiff_of_the_plain_formula(dtype):
  """attention.attend's hand-written backward pass against XLA differentiating softmax(q k^T) v."""
  keys = jax.random.split(jax.random.key(3), 4)
  q, k, v, dy = (jax.random.normal(key, (2, 3, 17, 8)) for key in keys)

  def plain(q, k, v):  # the same mixed-precision matmuls, differentiated by JAX
    logits = precision.einsum('bhqd,bhkd->bhqk', q, k, dtype)
    return precision.einsum('bhqk,bhkd->bhqd', jax.nn.softmax(logits), v, dtype)

  y, pullback = jax.vjp(lambda *a: attention.attend(*a, dtype), q, k, v)
  y_ref, pullback_ref = jax.vjp(plain, q, k, v)
  tol = 1e-5 if dtype == jnp.float32 else 3e-2
  np.testing.assert_allclose(y, y_ref, atol=tol)
  for name, got, want in zip('qkv', pullback(dy), pullback_ref(dy), strict=True):
    assert got.dtype == jnp.float32, name
    scale = float(np.abs(want).max())
    assert scale > 0.1, name  # a gradient worth comparing
    np.testing.assert_allclose(got, want, atol=tol * scale, err_msg=name)


@pytest.mark.slow
def test_training_gradients_equal_with_and_without_kept_attention_weights(random_params):
  """The model takes `attend` unless the weights are kept (mutable intermediates). Two blocks
  (each block takes the same path), compiled: cheaper than op by op here."""
  images = jax.random.uniform(jax.random.key(1), (2, 32, 32, 3), minval=-1, maxval=1)
  two_blocks = {'num_layers': 2}
  model = get_model('ViT-Ti_16', num_classes=10, patches={'size': (8, 8)}, transformer=two_blocks)
  params = random_params(families.param_shapes(model, 32), scale=0.05)

  def loss(p, keep):
    if keep:
      logits, state = model.apply({'params': p}, images, train=True, mutable=['intermediates'])
      assert len(jax.tree.leaves(state)) == 2  # one attention map per block
    else:
      logits = model.apply({'params': p}, images, train=True)
    return jnp.sum(jnp.sin(logits))

  grad = jax.jit(jax.grad(loss), static_argnums=1)
  got, want = grad(params, False), grad(params, True)
  leaves = zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want), strict=True)
  for (path, g), w in leaves:
    np.testing.assert_allclose(g, w, atol=1e-6, rtol=1e-4, err_msg=jax.tree_util.keystr(path))


@pytest.mark.slow
def test_analytic_flops_match_xla_cost_analysis():
  # XLA also counts elementwise work (norms, softmax, GELU); matmuls dominate.
  for name in ('ViT-B_16', 'R50+ViT-B_16'):
    analytic = families.forward_flops(MODEL_CONFIGS[name], 224, 1000)
    xla = families.xla_forward_flops(get_model(name, num_classes=1000), 224)
    assert 0.99 < analytic / xla <= 1.0, name


def _matmul_flops(name: str, resolution: int = 224, classes: int = 1000, **overrides) -> int:
  """2 FLOPs per multiply-add of every matmul, counted from the parameter shapes: a kernel
  meets every patch (embedding), every token (encoder) or the pooled vector (pre_logits,
  head); plus the two attention products q.k and weights.v, T x T x D each per layer."""
  model = get_model(name, num_classes=classes, **overrides)
  shapes = jax.tree_util.tree_flatten_with_path(families.param_shapes(model, resolution))[0]
  patch = model.patches['size'][0]
  patches = (resolution // patch) ** 2
  tokens = patches + (model.classifier == 'token')
  flops = 0
  for path, leaf in shapes:
    key = '/'.join(k.key for k in path)
    if key.endswith('kernel'):
      uses = patches if key == 'embedding/kernel' else tokens if 'Transformer' in key else 1
      flops += 2 * uses * int(np.prod(leaf.shape))
  return flops + model.transformer['num_layers'] * 2 * (2 * tokens * tokens * model.hidden_size)


@pytest.mark.slow
@pytest.mark.parametrize(
  'name, overrides',
  [
    ('ViT-B_16', {}),
    ('ViT-Ti_16', {}),
    ('ViT-L_32', {}),
    ('ViT-H_14', {}),
    ('ViT-22B_14', {}),  # parallel blocks: the same matmuls
    ('ViT-S_16-gap-norep', {}),
    ('ViT-B_32', {'representation_size': 768}),
  ],
)
def test_analytic_flops_count_every_matmul(name, overrides):
  config = MODEL_CONFIGS[name].to_dict()
  config.update(overrides)
  analytic = families.forward_flops(ml_collections.ConfigDict(config), 224, 1000)
  assert analytic == _matmul_flops(name, **overrides)
  if name == 'ViT-B_16':  # timm's model card for B/16 at 224 px: 17.6 GMACs (one decimal)
    assert analytic == pytest.approx(2 * 17.6e9, rel=0.003)
