"""The image-text models (LiT, SigLIP): exact parameter counts, the call, the released file
layouts read and written, and embeddings against independent implementations: transformers'
`BertModel` and `SiglipModel` on the same weights, and the text transformer's equations in
numpy. Files are written here in the released layouts, with tiny towers."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import big_vision_siglip, randomize
from jax.sharding import PartitionSpec as P
from numpy_models import l2_normalize, text_transformer, vit

from vit_jax import checkpoint, families, parallel
from vit_jax.checkpoint import hf_siglip, tree
from vit_jax.cli import convert, predict
from vit_jax.families import two_towers
from vit_jax.models import MODEL_CONFIGS, get_config, get_model, model_from_config, stats

# The original vit_jax `models_test.py` counts (224 px, 16 tokens).
LIT_PARAMS = {
  'LiT-B16B': 195_871_489,
  'LiT-B16B_2': 195_280_897,
  'LiT-L16L': 638_443_521,
  'LiT-L16S': 331_140_353,
  'LiT-L16Ti': 311_913_089,
}
SIZE, LEN, VOCAB = 32, 16, 60
QKV = ('query', 'key', 'value')
IMAGE = {'patches': {'size': (8, 8)}, 'hidden_size': 32}
IMAGE_ENCODER = {'num_layers': 2, 'mlp_dim': 64, 'num_heads': 4}
BERT = {'hidden_size': 32, 'num_layers': 2, 'num_heads': 2, 'mlp_dim': 64, 'vocab_size': VOCAB}
TEXT = {'width': 32, 'num_layers': 2, 'num_heads': 4, 'mlp_dim': 64, 'vocab_size': VOCAB}


def vit_params(hidden, mlp, layers, patch=16, tokens=197, head=0):
  """A ViT by hand: patch conv, cls, posemb, per block 2 LayerNorms, q/k/v/out with biases
  and the MLP, final LayerNorm, an optional head of width `head`."""
  block = 2 * 2 * hidden + 4 * (hidden * hidden + hidden) + 2 * hidden * mlp + mlp + hidden
  embed = patch * patch * 3 * hidden + hidden + hidden + tokens * hidden
  return embed + layers * block + 2 * hidden + (hidden * head + head if head else 0)


def bert_params(hidden, mlp, layers, head):
  """BERT by hand: token (30,522), position (512) and segment (2) embeddings, LayerNorm,
  per layer q/k/v/out Dense, LayerNorm, MLP, LayerNorm, then the head."""
  embed = (30_522 + 512 + 2) * hidden + 2 * hidden
  layer = 4 * (hidden * hidden + hidden) + 2 * hidden * mlp + mlp + hidden + 4 * hidden
  return embed + layers * layer + hidden * head + head


def text_transformer_params(width, mlp, layers, vocab, positions, head):
  """The text transformer by hand: embedding, posemb, pre-norm blocks, final norm, head."""
  block = 2 * 2 * width + 4 * (width * width + width) + 2 * width * mlp + mlp + width
  return vocab * width + positions * width + layers * block + 2 * width + width * head + head


def test_lit_counts_by_hand_are_the_originals():
  b16, l16 = vit_params(768, 3072, 12), vit_params(1024, 4096, 24)
  assert b16 + 768 * 768 + 768 + bert_params(768, 3072, 12, 768) + 1 == LIT_PARAMS['LiT-B16B']
  assert b16 + bert_params(768, 3072, 12, 768) + 1 == LIT_PARAMS['LiT-B16B_2']
  assert l16 + bert_params(1024, 4096, 24, 1024) + 1 == LIT_PARAMS['LiT-L16L']
  small = text_transformer_params(384, 1536, 12, 16_000, 16, 1024)
  assert l16 + small + 1 == LIT_PARAMS['LiT-L16S']
  tiny = text_transformer_params(192, 768, 12, 16_000, 16, 1024)
  assert l16 + tiny + 1 == LIT_PARAMS['LiT-L16Ti']


def _registered_shapes(name):
  model = get_model(name)
  return families.param_shapes(model, model.pp['size'], model.pp['max_len'])


@pytest.mark.slow
@pytest.mark.parametrize('name', sorted(LIT_PARAMS))
def test_lit_exact_counts_and_the_registry_names_its_shapes(name):
  shapes = _registered_shapes(name)  # jax.eval_shape: nothing allocated
  assert stats.count_params(shapes) == LIT_PARAMS[name]
  assert two_towers.match_registry(two_towers.infer_config(shapes)) == name


# (variant, patch, size, text length): one per English SigLIP layout.
SIGLIP = {'B': (16, 224, 64), 'L': (16, 256, 64), 'So400m': (14, 224, 16)}
BV_SIZES = {'B': (768, 12, 3072, 12), 'L': (1024, 24, 4096, 16), 'So400m': (1152, 27, 4304, 16)}


def _siglip_by_hand(variant: str) -> int:
  """The parameters of SIGLIP[variant], counted by hand."""
  patch, size, length = SIGLIP[variant]
  width, layers, mlp, _ = BV_SIZES[variant]
  # The image ViT has no class token; its MAP head: probe, attention, LayerNorm, MLP.
  image = vit_params(width, mlp, layers, patch, (size // patch) ** 2) - width
  image += width + 4 * (width * width + width) + 2 * width + 2 * width * mlp + mlp + width
  text = text_transformer_params(width, mlp, layers, 32_000, length, width)
  return image + text + 2  # t, b


@pytest.mark.slow
@pytest.mark.parametrize('variant', sorted(SIGLIP))
def test_siglip_counts_by_hand_and_by_transformers(variant):
  import torch
  from transformers import SiglipConfig, SiglipModel

  patch, size, length = SIGLIP[variant]
  width, layers, mlp, heads = BV_SIZES[variant]
  name = f'SigLIP-{variant}{patch}-{size}'
  shapes = _registered_shapes(name)
  assert stats.count_params(shapes) == _siglip_by_hand(variant)
  towers = {'hidden_size': width, 'num_hidden_layers': layers, 'intermediate_size': mlp}
  towers['num_attention_heads'] = heads
  config = SiglipConfig(
    text_config={**towers, 'vocab_size': 32_000, 'max_position_embeddings': length},
    vision_config={**towers, 'image_size': size, 'patch_size': patch},
  )
  with torch.device('meta'):  # shapes only
    hf = SiglipModel(config)
  assert stats.count_params(shapes) == sum(p.numel() for p in hf.parameters())
  assert two_towers.match_registry(two_towers.infer_config(shapes)) == name


# SigLIP 2's standard files (big_vision's README_siglip2.md): (variant, patch, size).
SIGLIP2 = (
  ('B', 32, 256), ('B', 16, 224), ('B', 16, 256), ('B', 16, 384), ('B', 16, 512),
  ('L', 16, 256), ('L', 16, 384), ('L', 16, 512), ('So400m', 14, 224), ('So400m', 14, 384),
  ('So400m', 16, 256), ('So400m', 16, 384), ('So400m', 16, 512), ('g-opt', 16, 256),
  ('g-opt', 16, 384),
)  # fmt: skip
BV_SIZES['g-opt'] = (1536, 40, 6144, 16)  # big_vision vit.py's decode_variant


def _siglip2_by_hand(variant: str, patch: int, size: int) -> int:
  """SigLIP 2 by hand: SigLIP's MAP ViT, a text transformer of Gemma's 256,000 pieces and 64
  positions (g-opt's is So400m's, its head to 1536), t and b."""
  width, layers, mlp, _ = BV_SIZES[variant]
  image = vit_params(width, mlp, layers, patch, (size // patch) ** 2) - width
  image += width + 4 * (width * width + width) + 2 * width + 2 * width * mlp + mlp + width
  text_width, text_layers, text_mlp, _ = BV_SIZES['So400m' if variant == 'g-opt' else variant]
  text = text_transformer_params(text_width, text_mlp, text_layers, 256_000, 64, width)
  return image + text + 2


@pytest.mark.slow
def test_siglip2_counts_by_hand_for_every_file_and_by_transformers():
  """All 15 standard SigLIP 2 models. The first file of each architecture (variant and patch):
  the registry's shapes count what the architecture gives by hand, and as transformers'
  SiglipModel (its text projection to 1536 for g-opt); the other files differ from it only in
  `pp.size` (the position embedding, counted by hand). Every one has Gemma's tokenizer."""
  import torch
  from transformers import SiglipConfig, SiglipModel

  first = {}
  for variant, patch, size in SIGLIP2:
    name = f'SigLIP2-{variant}{patch}-{size}'
    config = get_config(name)
    assert config.pp.to_dict() == {
      'tokenizer_name': 'gemma', 'max_len': 64, 'lower_case': True, 'size': size,
    }  # fmt: skip
    if (variant, patch) in first:  # one architecture, another resolution
      assert two_towers.architecture(config) == two_towers.architecture(first[variant, patch])
      continue
    first[variant, patch] = config
    shapes = _registered_shapes(name)
    assert stats.count_params(shapes) == _siglip2_by_hand(variant, patch, size), name
    assert two_towers.match_registry(two_towers.infer_config(shapes)) == name
    width, layers, mlp, heads = BV_SIZES[variant]
    text_width, text_layers, text_mlp, text_heads = BV_SIZES[
      'So400m' if variant == 'g-opt' else variant
    ]
    text = {'hidden_size': text_width, 'num_hidden_layers': text_layers}
    text |= {'intermediate_size': text_mlp, 'num_attention_heads': text_heads}
    text |= {'vocab_size': 256_000, 'max_position_embeddings': 64, 'projection_size': width}
    vision = {'hidden_size': width, 'num_hidden_layers': layers, 'intermediate_size': mlp}
    vision |= {'num_attention_heads': heads, 'image_size': size, 'patch_size': patch}
    with torch.device('meta'):  # shapes only
      hf = SiglipModel(SiglipConfig(text_config=text, vision_config=vision))
    assert stats.count_params(shapes) == sum(p.numel() for p in hf.parameters()), name
  assert len(first) == 6
  # So400m/14 at 384 px: 27 x 27 patches of 14 (378 px), its file read back by its name.
  shapes = _registered_shapes('SigLIP2-So400m14-384')
  assert two_towers.match_registry(two_towers.infer_config(shapes)) == 'SigLIP2-So400m14-384'


def test_vit_models_lists_classifiers_and_image_text_models_with_their_counts():
  """`vit-models` rows: a classifier at the table's 224 px, an image-text model at its own
  size (SigLIP L/16 at 256 px), counts from the original's models_test and by hand."""
  from vit_jax.cli import models as models_cli

  names = ('ViT-B_16', 'LiT-B16B', 'SigLIP-L16-256')
  rows = {r['model']: r for r in models_cli.table_rows(224, 1000, names=names)}
  assert rows['ViT-B_16']['params'] == 86_567_656 and not rows['ViT-B_16']['image_text']
  assert rows['LiT-B16B']['params'] == LIT_PARAMS['LiT-B16B'] and rows['LiT-B16B']['image_text']
  assert rows['SigLIP-L16-256']['params'] == _siglip_by_hand('L')
  assert rows['SigLIP-L16-256']['note'].startswith('SigLIP at 256 px; text transformer')
  assert (rows['SigLIP-L16-256']['layers'], rows['SigLIP-L16-256']['hidden']) == (24, 1024)


def test_image_text_models_are_in_the_one_registry_and_not_among_the_classifiers():
  image_text = {n for n, c in MODEL_CONFIGS.items() if families.of_config(c).image_text}
  assert set(LIT_PARAMS) <= image_text
  assert {f'SigLIP-{v}{p}-{s}' for v, (p, s, _) in SIGLIP.items()} <= image_text
  assert not image_text & set(families.classifiers())
  assert image_text | set(families.classifiers()) == set(MODEL_CONFIGS)
  config = get_config('LiT-L16S')
  assert (config.text_model, tuple(config.out_dim)) == ('text_transformer', (None, 1024))
  assert config.pp.to_dict() == {'tokenizer_name': 'sentencepiece', 'size': 224, 'max_len': 16}
  assert get_config('LiT-B16B').text.to_dict() == {
    'hidden_size': 768,
    'num_layers': 12,
    'num_heads': 12,
    'mlp_dim': 3072,
    'vocab_size': 30_522,
    'max_length': 512,
    'num_segments': 2,
  }
  siglip = get_config('SigLIP-So400m14-384')
  assert (siglip.image.classifier, siglip.pp.max_len, siglip.bias_init) == ('map', 64, -10.0)
  with pytest.raises(KeyError, match='LiT-B16B_2'):
    get_config('LiT-B16B2')


def test_tower_overrides_merge_deeply():
  model = get_model('LiT-L16Ti', image={'transformer': {'num_layers': 2}}, text={'num_layers': 2})
  assert dict(model.image['transformer']) == {
    'num_layers': 2,
    'mlp_dim': 4096,
    'num_heads': 16,
    'dropout_rate': 0.1,
    'attention_dropout_rate': 0.0,
    'drop_path_rate': 0.0,
  }
  assert (model.text['num_layers'], model.text['width']) == (2, 192)
  assert get_model('LiT-B16B', image={'dtype': 'bfloat16'}).image['dtype'] == 'bfloat16'
  with pytest.raises(KeyError, match=re.escape("image.transformer fields ['num_layer']")):
    get_model('LiT-L16Ti', image={'transformer': {'num_layer': 2}})
  with pytest.raises(TypeError, match=re.escape('TextTransformer (text tower) has no field')):
    get_model('LiT-L16Ti', text={'widht': 2})
  with pytest.raises(TypeError, match='has no field num_classes'):  # the head is out_dim's
    get_model('LiT-B16B', image={'num_classes': 10})
  with pytest.raises(KeyError, match="transformer fields \\['dropot_rate'\\]"):
    get_model('ViT-L_16', transformer={'dropot_rate': 0.0})


def tiny_config(name, out_dim, text=None):
  """The registered model `name` with tiny towers (the image tower at 32 px)."""
  config = get_config(name)
  config.image.update(IMAGE)
  config.image.transformer.update(IMAGE_ENCODER)
  config.text.update(text or (BERT if config.text_model == 'bert' else TEXT))
  config.out_dim = out_dim
  config.pp.size = SIZE
  return config


def _inputs(seed=0, pad=0):
  rng = np.random.default_rng(seed)
  images = rng.uniform(-1, 1, (3, SIZE, SIZE, 3)).astype(np.float32)
  tokens = rng.integers(2, VOCAB, (3, LEN)).astype(np.int32)
  if pad:
    tokens[:, LEN - pad :] = 0
  return images, tokens


@pytest.mark.slow
def test_the_call_embeds_normalised_and_either_input_may_be_none():
  model = model_from_config(tiny_config('SigLIP-B16-224', (None, 32)))
  scalars = model.init(jax.random.key(0))['params']  # without inputs: t and b alone
  assert sorted(scalars) == ['b', 't']
  np.testing.assert_allclose(scalars['t'], [np.log(10.0)], rtol=1e-7)
  np.testing.assert_array_equal(scalars['b'], [-10.0])
  params = randomize(families.param_shapes(model, SIZE, LEN)) | scalars
  assert sorted(params) == ['b', 'img', 't', 'txt']
  images, tokens = _inputs()

  @jax.jit
  def calls(params):  # both inputs, images alone, texts alone
    variables = {'params': params}
    return (
      model.apply(variables, images=images, tokens=tokens),
      model.apply(variables, images=images),
      model.apply(variables, tokens=tokens),
    )

  (zimg, ztxt, out), (zimg_alone, no_text, _), (no_image, ztxt_alone, _) = calls(params)
  np.testing.assert_allclose(out['t'], [10.0], rtol=1e-6)
  np.testing.assert_array_equal(out['b'], [-10.0])
  # z / (|z| + 1e-8), the norm kept in `out`; a float32 norm of a unit vector is off by an ulp
  # or two (1.2e-7 each above 1), so 1e-7 failed on summation order alone
  expected = 1 / (1 + 1e-8 / out['img/norm'][:, 0])
  np.testing.assert_allclose(np.linalg.norm(zimg, axis=1), expected, rtol=4e-7)
  raw = out['txt/pre_logits'] @ params['txt']['head']['kernel'] + params['txt']['head']['bias']
  np.testing.assert_allclose(ztxt, raw / (out['txt/norm'] + 1e-8), rtol=1e-5, atol=1e-7)
  assert no_text is None and no_image is None
  np.testing.assert_allclose(zimg_alone, zimg, atol=1e-6, rtol=0)
  np.testing.assert_allclose(ztxt_alone, ztxt, atol=1e-6, rtol=0)


def test_tower_heads_start_random_and_a_zero_embedding_has_a_finite_gradient():
  """big_vision's towers: the image head (and the text head) start from LeCun-normal
  weights, never zero, so no image embeds at 0; and the loss of a zero image embedding has
  a finite gradient (at a24f8ac: a zero head, and NaN from the norm's derivative)."""
  model = model_from_config(tiny_config('LiT-B16B', (16, 16)))
  images, tokens = _inputs()
  params = jax.jit(lambda: families.init_params(model, jax.random.key(0), SIZE, LEN))()
  for tower in ('img', 'txt'):
    kernel = np.asarray(params[tower]['head']['kernel'])
    assert np.all(kernel != 0), tower
    np.testing.assert_allclose(kernel.std(), 1 / np.sqrt(kernel.shape[0]), rtol=0.2)  # LeCun
  zero_head = {
    **params,
    'img': {**params['img'], 'head': jax.tree.map(jnp.zeros_like, params['img']['head'])},
  }

  def loss(params):
    zimg, ztxt, _ = model.apply({'params': params}, images=images, tokens=tokens)
    return -(zimg * ztxt).sum()

  grads = jax.jit(jax.grad(loss))(zero_head)
  assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads))
  np.testing.assert_array_equal(
    model.apply({'params': zero_head}, images=images)[0], np.zeros((3, 16), np.float32)
  )


def test_bert_tower_has_flaxformers_names_and_shapes():
  model = model_from_config(tiny_config('LiT-B16B', (16, 24)))
  txt = tree.flatten(families.param_shapes(model, SIZE, LEN)['txt'])
  e, d, m = 'BertEncoder_0/embedder', 32, 64
  want = {
    f'{e}/embedders_token_ids/embedding': (VOCAB, d),
    f'{e}/embedders_position_ids/embedding': (512, d),
    f'{e}/embedders_segment_ids/embedding': (2, d),
    'BertEncoder_0/layer_norm/scale': (d,),
    'BertEncoder_0/layer_norm/bias': (d,),
    'head/kernel': (d, 24),
    'head/bias': (24,),
  }
  for i in range(2):
    layer = f'BertEncoder_0/encoder_block/layer_sequence/layers_{i}'
    for name in ('query', 'key', 'value'):  # flaxformer's reshaped (D, D) kernels
      want |= {f'{layer}/attention_block/attention_layer/{name}/kernel': (d, d)}
      want |= {f'{layer}/attention_block/attention_layer/{name}/bias': (d,)}
    for sub, kernel in (
      ('attention_block/dense_layer', (d, d)),
      ('mlp_block/mlp/dense_layer', (d, m)),
      ('mlp_block/dense_layer', (m, d)),
    ):
      want |= {f'{layer}/{sub}/kernel': kernel, f'{layer}/{sub}/bias': (kernel[1],)}
    for norm in ('attention_block', 'mlp_block'):
      want |= {f'{layer}/{norm}/layer_norm/scale': (d,), f'{layer}/{norm}/layer_norm/bias': (d,)}
  assert {k: v.shape for k, v in txt.items()} == want


def _hf_randomize(model, seed):
  """Every weight N(0, 0.2), every LayerNorm scale 1 + N(0, 0.1): nothing left at init."""
  import torch

  generator = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=generator, dtype=p.dtype)
      is_scale = ('LayerNorm' in name or 'layer_norm' in name or 'layernorm' in name) and (
        name.endswith('weight')
      )
      p.copy_(1 + 0.1 * noise if is_scale else 0.2 * noise)
  return model.double().eval()


def bert_from_hf(sd, layers):
  """transformers' BertModel weights -> flaxformer's BertEncoder names (the map of flaxformer's
  `bert_checkpoint_converter`, whose TF names are these), kernels transposed."""
  e, out = 'BertEncoder_0/embedder', {}
  out[f'{e}/embedders_token_ids/embedding'] = sd['embeddings.word_embeddings.weight']
  out[f'{e}/embedders_position_ids/embedding'] = sd['embeddings.position_embeddings.weight']
  out[f'{e}/embedders_segment_ids/embedding'] = sd['embeddings.token_type_embeddings.weight']
  out['BertEncoder_0/layer_norm/scale'] = sd['embeddings.LayerNorm.weight']
  out['BertEncoder_0/layer_norm/bias'] = sd['embeddings.LayerNorm.bias']
  for i in range(layers):
    ours, hf = f'BertEncoder_0/encoder_block/layer_sequence/layers_{i}', f'encoder.layer.{i}'
    pairs = {f'attention_block/attention_layer/{n}': f'attention.self.{n}' for n in QKV}
    pairs |= {
      'attention_block/dense_layer': 'attention.output.dense',
      'mlp_block/mlp/dense_layer': 'intermediate.dense',
      'mlp_block/dense_layer': 'output.dense',
    }
    for o, h in pairs.items():
      out[f'{ours}/{o}/kernel'] = sd[f'{hf}.{h}.weight'].T
      out[f'{ours}/{o}/bias'] = sd[f'{hf}.{h}.bias']
    for o, h in (('attention_block', 'attention.output'), ('mlp_block', 'output')):
      out[f'{ours}/{o}/layer_norm/scale'] = sd[f'{hf}.{h}.LayerNorm.weight']
      out[f'{ours}/{o}/layer_norm/bias'] = sd[f'{hf}.{h}.LayerNorm.bias']
  return out


def _random_vit(seed, head=None):
  """A tiny image ViT's flat tree (our Linen names) with random values."""
  config = tiny_config('LiT-B16B', (head, 24)).image.to_dict()
  shapes = families.param_shapes(model_from_config(config, num_classes=head), SIZE)
  return tree.flatten(randomize(shapes, seed))


def test_lit_bert_file_equals_transformers_bert_model(tmp_path):
  import torch
  from transformers import BertConfig, BertModel

  config = BertConfig(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=512,
    type_vocab_size=2,
    hidden_act='gelu_new',  # the tanh GELU, flax's nn.gelu
    layer_norm_eps=1e-12,
    attn_implementation='eager',
  )
  bert = _hf_randomize(BertModel(config, add_pooling_layer=False), seed=1)
  sd = {k: v.numpy() for k, v in bert.state_dict().items()}
  rng = np.random.default_rng(2)
  head = {'head/kernel': 0.2 * rng.standard_normal((32, 24)), 'head/bias': rng.normal(size=24)}
  flat = {f'txt/{k}': v for k, v in {**bert_from_hf(sd, 2), **head}.items()}
  flat |= {f'img/{k}': v for k, v in _random_vit(3, head=16).items()} | {'t': np.array([2.5])}
  np.savez(tmp_path / 'LiT-B16B.npz', **{k: np.float32(v) for k, v in flat.items()})

  fitted = checkpoint.fit(tmp_path / 'LiT-B16B.npz', tiny_config('LiT-B16B', (16, 24)))
  images, tokens = _inputs(pad=5)  # 11 tokens, 5 of padding (0)
  apply = jax.jit(fitted.model().apply)
  zimg, ztxt, out = apply({'params': fitted.params}, images=images, tokens=tokens)

  def hf_text(mask):
    with torch.no_grad():
      x = bert(input_ids=torch.tensor(tokens).long(), attention_mask=mask).last_hidden_state
    x = x[:, 0].numpy() @ head['head/kernel'] + head['head/bias']
    return l2_normalize(x)

  mask = torch.tensor(tokens != 0).long()
  np.testing.assert_allclose(ztxt, hf_text(mask), atol=1e-5, rtol=0)
  assert np.abs(hf_text(torch.ones_like(mask)) - hf_text(mask)).max() > 1e-3  # padding counts
  img = {k.removeprefix('img/'): np.float64(np.float32(v)) for k, v in flat.items() if 'img/' in k}
  np.testing.assert_allclose(zimg, l2_normalize(vit(img, images)), atol=1e-5, rtol=0)
  np.testing.assert_allclose(out['t'], [np.exp(np.float32(2.5))], rtol=1e-6)


def _normal(rng, shapes):
  """N(0, 0.2) arrays, LayerNorm scales 1 + N(0, 0.1), float32."""
  out = {}
  for key, shape in shapes.items():
    noise = rng.standard_normal(shape)
    out[key] = (1 + 0.1 * noise if key.endswith('/scale') else 0.2 * noise).astype(np.float32)
  return out


def text_transformer_shapes(width=32, layers=2, heads=4, mlp=64, head=24):
  """The simple text transformer's names (vit_jax `models_lit.TextTransformer`) and shapes."""
  hd = width // heads
  shapes = {'Embed_0/embedding': (VOCAB, width), 'pos_embedding': (1, LEN, width)}
  for i in range(layers):
    b = f'Encoder_0/encoderblock_{i}'
    attn = f'{b}/MultiHeadDotProductAttention_0'
    shapes |= {f'{attn}/{n}/kernel': (width, heads, hd) for n in QKV}
    shapes |= {f'{attn}/{n}/bias': (heads, hd) for n in QKV}
    shapes |= {f'{attn}/out/kernel': (heads, hd, width), f'{attn}/out/bias': (width,)}
    shapes |= {
      f'{b}/MlpBlock_0/Dense_0/kernel': (width, mlp),
      f'{b}/MlpBlock_0/Dense_0/bias': (mlp,),
    }
    shapes |= {
      f'{b}/MlpBlock_0/Dense_1/kernel': (mlp, width),
      f'{b}/MlpBlock_0/Dense_1/bias': (width,),
    }
    for norm in ('LayerNorm_0', 'LayerNorm_1'):
      shapes |= {f'{b}/{norm}/scale': (width,), f'{b}/{norm}/bias': (width,)}
  shapes |= {'Encoder_0/encoder_norm/scale': (width,), 'Encoder_0/encoder_norm/bias': (width,)}
  return shapes | {'head/kernel': (width, head), 'head/bias': (head,)}


@pytest.fixture
def lit_text_transformer_file(tmp_path):
  """A LiT-L16S-like file in the released layout: `img/` ViT, `txt/` text transformer, `t`."""
  rng = np.random.default_rng(4)
  flat = {f'txt/{k}': v for k, v in _normal(rng, text_transformer_shapes()).items()}
  flat |= {f'img/{k}': v for k, v in _random_vit(5).items()}
  flat['t'] = np.array([1.7], np.float32)
  np.savez(tmp_path / 'LiT-L16S.npz', **flat)
  return tmp_path / 'LiT-L16S.npz', flat


def _tower(flat, prefix):
  return {k.removeprefix(prefix): np.float64(v) for k, v in flat.items() if k.startswith(prefix)}


def test_lit_text_transformer_file_equals_the_numpy_equations(lit_text_transformer_file):
  path, flat = lit_text_transformer_file
  fitted = checkpoint.fit(path)  # the architecture read off the shapes
  assert fitted.config.text_model == 'text_transformer'
  assert tuple(fitted.config.out_dim) == (None, 24)
  images, tokens = _inputs()
  tokens[:, -4:] = 1  # sticky </s>: the pooled last token is the end of the sequence
  apply = jax.jit(fitted.model().apply)
  zimg, ztxt, out = apply({'params': fitted.params}, images=images, tokens=tokens)
  want = l2_normalize(text_transformer(_tower(flat, 'txt/'), tokens))
  np.testing.assert_allclose(ztxt, want, atol=1e-5, rtol=0)
  first = l2_normalize(text_transformer(_tower(flat, 'txt/'), tokens, pool='first'))
  assert np.abs(first - want).max() > 1e-2  # the pooled token matters
  np.testing.assert_allclose(zimg, l2_normalize(vit(_tower(flat, 'img/'), images)), atol=1e-5)
  np.testing.assert_allclose(out['t'], np.exp(flat['t']), rtol=1e-6)


def _write_siglip(path, vocab: int = VOCAB):
  """A tiny SigLIP in big_vision's layout at `path`, from a transformers `SiglipModel` with
  random weights and `vocab` text pieces (mapped to our names by `hf_siglip`, whose mapping
  this test and tests/test_hf_siglip.py check against transformers' outputs); returns (path,
  the torch model)."""
  from transformers import SiglipConfig, SiglipModel

  towers = {'hidden_size': 32, 'num_hidden_layers': 2, 'num_attention_heads': 4}
  towers['intermediate_size'] = 64
  config = SiglipConfig(
    text_config={**towers, 'vocab_size': vocab, 'max_position_embeddings': LEN},
    vision_config={**towers, 'image_size': SIZE, 'patch_size': 8},
  )
  config.text_config._attn_implementation = config.vision_config._attn_implementation = 'eager'
  hf = _hf_randomize(SiglipModel(config), seed=6)
  sd = {k: v.numpy() for k, v in hf.state_dict().items()}
  np.savez(path, **big_vision_siglip(hf_siglip.from_state_dict(sd, lambda name: 4)))
  return path, hf


@pytest.fixture
def siglip_file(tmp_path):
  return _write_siglip(tmp_path / 'siglip.npz')


@pytest.mark.parametrize('generation', ['SigLIP', 'SigLIP 2'])
def test_big_vision_siglip_file_equals_transformers_siglip_model(generation, tmp_path):
  """A big_vision file of each generation (SigLIP 2: a narrow tower keeping all 256,000 of
  Gemma's embedding rows) reads as its generation, with its tokenizer, and gives
  transformers' embeddings and logits."""
  import torch

  vocab = 256_000 if generation == 'SigLIP 2' else VOCAB
  path, hf = _write_siglip(tmp_path / 'siglip.npz', vocab)
  fitted = checkpoint.fit(path)
  assert fitted.config.text.vocab_size == vocab
  assert fitted.config.pp.tokenizer_name == ('gemma' if vocab == 256_000 else 'sentencepiece')
  assert fitted.config.pp.lower_case
  assert "prefix 'params/'" in fitted.found.description
  assert 'scan-stacked blocks' in fitted.found.description
  assert fitted.config.image.classifier == 'map'
  images, tokens = _inputs()
  apply = jax.jit(fitted.model().apply)
  zimg, ztxt, out = apply({'params': fitted.params}, images=images, tokens=tokens)
  with torch.no_grad():
    want = hf(
      input_ids=torch.tensor(tokens).long(),
      pixel_values=torch.tensor(images).permute(0, 3, 1, 2).double(),
    )
  np.testing.assert_allclose(zimg, want.image_embeds.numpy(), atol=1e-5, rtol=0)
  np.testing.assert_allclose(ztxt, want.text_embeds.numpy(), atol=1e-5, rtol=0)
  logits = out['t'] * zimg @ ztxt.T + out['b']  # SigLIP: sigmoid of these, not a softmax
  np.testing.assert_allclose(logits, want.logits_per_image.numpy(), atol=1e-4, rtol=1e-5)


def _npz(path):
  with np.load(path) as f:
    return {k: f[k] for k in f.files}


def test_lit_file_is_written_back_in_its_own_names(lit_text_transformer_file, tmp_path):
  path, flat = lit_text_transformer_file
  restored = checkpoint.load(path)
  assert sorted(restored) == ['img', 't', 'txt']
  checkpoint.save_npz(restored, tmp_path / 'again.npz')
  again = _npz(tmp_path / 'again.npz')
  assert again.keys() == flat.keys()
  for key, value in flat.items():
    np.testing.assert_array_equal(again[key], value, err_msg=key)
  lines = []
  convert.convert(str(path), str(tmp_path / 'converted.npz'), 'npz', out=lines.append)
  converted = _npz(tmp_path / 'converted.npz')
  assert converted.keys() == flat.keys()
  for key, value in flat.items():
    np.testing.assert_array_equal(converted[key], value, err_msg=key)
  assert 'image-text model' in lines[0] and 'LiT layout' in lines[1]


def test_big_vision_file_is_written_in_the_lit_layout_and_reads_back_equal(siglip_file, tmp_path):
  path, _ = siglip_file
  restored, description = checkpoint.read(path)
  assert description.startswith("npz (image-text model, prefix 'params/'; img: big_vision")
  assert 'txt: text transformer, scan-stacked blocks; t, b' in description
  checkpoint.save_npz(restored, tmp_path / 'lit.npz')
  written = _npz(tmp_path / 'lit.npz')
  assert {'t', 'b', 'img/Transformer/posembed_input/pos_embedding'} <= written.keys()
  assert 'txt/Encoder_0/encoderblock_1/MlpBlock_0/Dense_0/kernel' in written
  assert not [k for k in written if k.startswith('params/') or '/encoderblock/' in k]
  again = tree.flatten(checkpoint.load(tmp_path / 'lit.npz'))
  first = tree.flatten(restored)
  assert again.keys() == first.keys()
  for key, value in first.items():
    np.testing.assert_array_equal(again[key], value, err_msg=key)


def test_image_tower_alone_is_a_plain_vit(lit_text_transformer_file, tmp_path):
  path, flat = lit_text_transformer_file
  tower, description = checkpoint.read(f'{path}:img')
  assert 'image tower of an image-text model' in description
  assert tree.flatten(tower).keys() == _tower(flat, 'img/').keys()
  fitted = checkpoint.fit(f'{path}:img', num_classes=5)  # fine-tuning: a fresh head
  assert (fitted.config.num_classes, fitted.config.classifier) == (5, 'token')
  assert fitted.report.fresh == ['head/kernel', 'head/bias']
  # The trainer's path: a ViT model fine-tuned from the file takes its image tower.
  vit_config = {**tiny_config('LiT-B16B', (None, 24)).image.to_dict(), 'num_classes': 5}
  init = randomize(families.param_shapes(model_from_config(vit_config), SIZE), seed=9)
  loaded = tree.flatten(checkpoint.load_pretrained(path, init, vit_config))
  assert loaded.keys() == tree.flatten(fitted.params).keys()
  for key, value in tree.flatten(fitted.params).items():
    want = tree.flatten(init)[key] if key.startswith('head/') else value
    np.testing.assert_array_equal(loaded[key], want, err_msg=key)


def test_bad_combinations_are_one_line_errors(lit_text_transformer_file, tmp_path, capsys):
  path, flat = lit_text_transformer_file
  np.savez(tmp_path / 'vit.npz', **_tower(flat, 'img/'))
  cases = [
    (lambda: checkpoint.fit(f'{tmp_path}/vit.npz:img'), 'holds no image-text model'),
    (lambda: checkpoint.load(f'{tmp_path}/vit.npz:img'), 'drop ":img"'),
    (lambda: checkpoint.fit(f'{path}:img', 'LiT-L16S'), 'drop ":img"'),
    (lambda: checkpoint.fit(path, num_classes=5), f'read {path}:img'),
    (lambda: checkpoint.fit(path, 'LiT-B16B'), 'does not fit the checkpoint'),
    (lambda: checkpoint.fit(tmp_path / 'vit.npz', 'LiT-L16S'), 'holds no image-text model'),
    (lambda: convert.convert(str(path), str(tmp_path / 'hf'), 'hf'), 'a LiT model (a softmax'),
    (lambda: convert.convert(str(path), str(tmp_path / 'hf'), 'timm'), 'to npz or hf only'),
  ]
  for call, message in cases:
    with pytest.raises(checkpoint.CheckpointError, match=re.escape(message)) as e:
      call()
    assert '\n' not in str(e.value)
  assert not (tmp_path / 'hf').exists()
  # vit-predict without --classes: an image-text model has no head to predict with.
  capsys.readouterr()
  (tmp_path / 'cat.png').write_bytes(b'')  # there (a missing image is said first), unread
  assert predict.run(str(path), [str(tmp_path / 'cat.png')]) == 1
  err = capsys.readouterr().err
  assert f"classify zero-shot, or take its image tower's features from {path}:img" in err
  assert err.startswith('error: ') and err.count('\n') == 1, err


def test_towers_take_the_vit_options(lit_text_transformer_file):
  path, _ = lit_text_transformer_file
  fitted = checkpoint.fit(path)
  images, tokens = _inputs()
  want = jax.jit(fitted.model().apply)({'params': fitted.params}, images=images, tokens=tokens)
  want = want[:2]
  options = {'attention_impl': 'fused', 'scan_layers': True}

  def stacked(tower, encoder):  # encoderblock_{i} -> encoderblock, big_vision's scanned layout
    blocks = dict(fitted.params[tower][encoder])
    layers = [blocks.pop(f'encoderblock_{i}') for i in range(2)]
    blocks['encoderblock'] = jax.tree.map(lambda *x: np.stack(x), *layers)
    return {**fitted.params[tower], encoder: blocks}

  scanned = {**fitted.params, 'img': stacked('img', 'Transformer')}
  scanned['txt'] = stacked('txt', 'Encoder_0')
  model = fitted.model(image=options, text=options)
  got = jax.jit(model.apply)({'params': scanned}, images=images, tokens=tokens)[:2]
  for a, b in zip(got, want, strict=True):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
  bf16 = fitted.model(image={'dtype': 'bfloat16'}, text={'dtype': 'bfloat16'})
  got = jax.jit(bf16.apply)({'params': fitted.params}, images=images, tokens=tokens)[:2]
  for a, b in zip(got, want, strict=True):
    assert a.dtype == jnp.float32
    np.testing.assert_allclose(a, b, atol=3e-2, rtol=0)


def test_sharding_rules_apply_to_each_towers_paths():
  config = tiny_config('LiT-L16Ti', (None, 24), text={**TEXT, 'vocab_size': 1024})
  config.image.transformer.mlp_dim = 512  # leaves of 32 x 512: large enough to shard
  model = model_from_config(config)
  params = randomize(families.param_shapes(model, SIZE, LEN))
  mesh = parallel.create_mesh()
  rules = [('^txt/', 'replicate'), ('.*', 'fsdp')]  # e.g. LiT: the image tower locked
  shardings = parallel.tree_shardings(params, mesh, rules)
  mlp = shardings['img']['Transformer']['encoderblock_0']['MlpBlock_0']['Dense_0']['kernel']
  assert mlp.spec == P(None, 'data')
  assert shardings['txt']['Embed_0']['embedding'].spec == P()  # 1024 x 32, by its rule
  images, tokens = _inputs()
  want = jax.jit(model.apply)({'params': params}, images=images, tokens=tokens)[:2]
  got = jax.jit(model.apply)(
    {'params': parallel.place(params, shardings)}, images=images, tokens=tokens
  )[:2]
  for a, b in zip(got, want, strict=True):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


def test_damaged_image_text_files_are_one_line_errors(lit_text_transformer_file, tmp_path):
  path, flat = lit_text_transformer_file
  data = path.read_bytes()
  (tmp_path / 'cut.npz').write_bytes(data[: len(data) // 2])  # a download cut short
  missing = 'txt/Encoder_0/encoderblock_1/MlpBlock_0/Dense_1/kernel'
  np.savez(tmp_path / 'hole.npz', **{k: v for k, v in flat.items() if k != missing})
  np.savez(tmp_path / 'no_t.npz', **{k: v for k, v in flat.items() if k != 't'})
  cases = [
    ('cut.npz', 'not a readable .npz checkpoint'),
    ('hole.npz', f'{tmp_path}/hole.npz:txt: the checkpoint lacks 1 model parameter(s)'),
    ('no_t.npz', 'an image-text model without its temperature t'),
  ]
  for name, message in cases:
    with pytest.raises(checkpoint.CheckpointError, match=re.escape(message)) as e:
      checkpoint.fit(tmp_path / name)
    assert '\n' not in str(e.value)
