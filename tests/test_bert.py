"""BERT text towers from BERT files (vit_jax/checkpoint/bert.py), against transformers.

A tiny `BertModel` (hidden 32, 2 layers, 2 heads, MLP 64, vocabulary 100, 16 positions) with
random weights, saved by `save_pretrained`, and the same weights in the original BERT TF
checkpoint's names, read into our `BertTower`: its features (the final layer's [CLS] token;
our tower has no pooler) equal `BertModel`'s `last_hidden_state[:, 0]` on random ids with
padding (id 0) masked as `attention_mask = ids != 0`, which is how our tower treats padding
for the [CLS] row. transformers' `BertTokenizer` is the oracle of our 'bert' tokenizer's ids,
which differ by design: ours (LiT's) adds no `[SEP]` and pads with 0 to `max_len`. A
contrastive run with `config.text_pretrained_path` starts with the file's text tower.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf
import text_vocabs as tv
import torch
from transformers import BertConfig, BertForPreTraining, BertModel, BertTokenizer

from configs import lit_digits
from vit_jax import families, text
from vit_jax.checkpoint import CheckpointError, bert, flatten
from vit_jax.families import two_towers
from vit_jax.models.text import BertTower
from vit_jax.train import setup
from vit_jax.train.spec import with_overrides

SIZES = dict(
  vocab_size=100,
  hidden_size=32,
  num_hidden_layers=2,
  num_attention_heads=2,
  intermediate_size=64,
  max_position_embeddings=16,
  type_vocab_size=2,
)
# The original BERT's TF variable of each Hugging Face module (google-research/bert's
# modeling.py scopes), `{i}` a layer.
TF_NAMES = {
  'embeddings.word_embeddings': 'bert/embeddings/word_embeddings',
  'embeddings.position_embeddings': 'bert/embeddings/position_embeddings',
  'embeddings.token_type_embeddings': 'bert/embeddings/token_type_embeddings',
  'embeddings.LayerNorm': 'bert/embeddings/LayerNorm',
  'encoder.layer.{i}.attention.self.query': 'bert/encoder/layer_{i}/attention/self/query',
  'encoder.layer.{i}.attention.self.key': 'bert/encoder/layer_{i}/attention/self/key',
  'encoder.layer.{i}.attention.self.value': 'bert/encoder/layer_{i}/attention/self/value',
  'encoder.layer.{i}.attention.output.dense': 'bert/encoder/layer_{i}/attention/output/dense',
  'encoder.layer.{i}.attention.output.LayerNorm': (
    'bert/encoder/layer_{i}/attention/output/LayerNorm'
  ),
  'encoder.layer.{i}.intermediate.dense': 'bert/encoder/layer_{i}/intermediate/dense',
  'encoder.layer.{i}.output.dense': 'bert/encoder/layer_{i}/output/dense',
  'encoder.layer.{i}.output.LayerNorm': 'bert/encoder/layer_{i}/output/LayerNorm',
  'pooler.dense': 'bert/pooler/dense',
}


def randomized(model):
  """Every weight N(0, 0.2), every LayerNorm scale 1 + N(0, 0.1); float64, eval mode."""
  generator = torch.Generator().manual_seed(0)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=generator, dtype=p.dtype)
      p.copy_(1 + 0.1 * noise if 'LayerNorm.weight' in name else 0.2 * noise)
  return model.double().eval()


def token_ids(seed=0):
  """4 rows of 12 random ids, the last 0, 3, 5 and 8 of them padding (0)."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(1, SIZES['vocab_size'], (4, 12))
  for row, pad in enumerate((0, 3, 5, 8)):
    ids[row, 12 - pad :] = 0
  return ids.astype(np.int32)


def oracle(model, ids, mask=None):
  """BertModel's [CLS] features of `ids`, padding masked out of the keys (the default)."""
  mask = torch.tensor(ids != 0).long() if mask is None else mask
  with torch.no_grad():
    out = model(input_ids=torch.tensor(ids).long(), attention_mask=mask)
  return out.last_hidden_state[:, 0].numpy()


def ours(read: bert.BertFile, ids):
  """Our BertTower's features of `ids` with the file's encoder and fields."""
  tower = BertTower(**read.fields)
  features, _ = jax.jit(tower.apply)({'params': read.tree}, jnp.asarray(ids))
  return np.asarray(features)


@pytest.mark.parametrize(
  'act, cls, as_file', [('gelu', BertModel, False), ('gelu_new', BertForPreTraining, True)]
)
def test_hugging_face_bert_gives_bert_models_cls_features(act, cls, as_file, tmp_path):
  """A BertModel directory (exact GELU, bert-base-uncased's 'gelu') and a BertForPreTraining
  .safetensors file (`bert.` prefix, `cls.*` heads ignored; tanh 'gelu_new'): the GELU and
  heads from config.json, the pooler left out, BertModel's [CLS] features to 1e-5."""
  config = BertConfig(**SIZES, hidden_act=act, attn_implementation='eager')
  model = randomized(cls(config))
  model.float().save_pretrained(tmp_path)
  encoder = model.double().bert if cls is BertForPreTraining else model
  read = bert.read(tmp_path / 'model.safetensors' if as_file else tmp_path)
  assert read.fields['gelu_approximate'] == (act == 'gelu_new')
  assert read.fields['num_heads'] == 2 and set(read.left_out) == set(bert.POOLER)
  assert read.ignored == (7 if cls is BertForPreTraining else 0)  # its 7 cls.* weights
  ids = token_ids()
  np.testing.assert_allclose(ours(read, ids), oracle(encoder, ids), atol=1e-5, rtol=0)
  unmasked = oracle(encoder, ids, torch.ones(ids.shape, dtype=torch.long))
  assert np.abs(unmasked - oracle(encoder, ids)).max() > 1e-2  # the padding mask counts


def write_tf_checkpoint(state, prefix):
  """`state` (a BertModel's) as the original BERT's TF checkpoint: its variable names, kernels
  (in, out), LayerNorm gamma/beta; a `cls/` head and `global_step` beside them."""
  variables = {'global_step': tf.Variable(np.int64(7))}
  variables['cls/predictions/output_bias'] = tf.Variable(np.zeros(SIZES['vocab_size']))
  for key, value in state.items():
    module, leaf = key.rsplit('.', 1)
    i = module.split('.')[2] if module.startswith('encoder.layer.') else None
    template = module if i is None else module.replace(f'.{i}.', '.{i}.', 1)
    name = TF_NAMES[template].format(i=i)
    if 'LayerNorm' in module:
      name += {'weight': '/gamma', 'bias': '/beta'}[leaf]
    elif module.startswith('embeddings.'):
      pass  # the embedding table itself, (rows, D)
    else:
      name += '/kernel' if leaf == 'weight' else '/bias'
      value = value.T if leaf == 'weight' else value
    variables[name] = tf.Variable(np.float32(value))
  tf.compat.v1.train.Saver(var_list=variables).save(None, prefix, write_meta_graph=False)


def test_original_tf_checkpoint_gives_the_same_features(tmp_path):
  """The same weights in the original BERT TF checkpoint (`bert_model.ckpt` + its
  bert_config.json, whose 'gelu' the original code computes as the tanh GELU): BertModel's
  [CLS] features with `hidden_act='gelu_new'`, to 1e-5; the head and step ignored."""
  model = randomized(BertModel(BertConfig(**SIZES, hidden_act='gelu_new')))
  state = {k: v.numpy() for k, v in model.state_dict().items() if 'position_ids' not in k}
  write_tf_checkpoint(state, str(tmp_path / 'bert_model.ckpt'))
  names = dict(tf.train.list_variables(str(tmp_path / 'bert_model.ckpt')))
  assert names['bert/encoder/layer_1/attention/self/query/kernel'] == [32, 32]
  config = {'hidden_act': 'gelu', 'num_attention_heads': 2}  # as the released files' say
  (tmp_path / 'bert_config.json').write_text(json.dumps(config))
  read = bert.read(tmp_path)
  assert read.fields['gelu_approximate'] and read.fields['num_heads'] == 2
  assert read.ignored == 2 and set(read.left_out) == set(bert.POOLER)
  ids = token_ids(1)
  np.testing.assert_allclose(ours(read, ids), oracle(model, ids), atol=1e-5, rtol=0)


def test_bert_tokenizer_ids_are_ours_with_its_sep(tmp_path):
  """transformers' BertTokenizer on the same vocabulary: its ids, without the `[SEP]` it
  appends (LiT's tokenizer adds none), clipped to max_len and padded with 0, are ours."""
  vocab = tv.write_bert_vocab(tmp_path / 'vocab.txt')
  texts = ['The cat sat on a mat!', "don't stop", 'Café, naïve Zürich.', 'the cats', '中文 😀']
  texts.append(' '.join(['the cat sat'] * 6))  # clipped at max_len
  hf = BertTokenizer(vocab=vocab, do_lower_case=True)  # transformers 5: `vocab`
  sep = hf.convert_tokens_to_ids('[SEP]')
  max_len = 8
  want = np.zeros((len(texts), max_len), np.int32)
  for row, ids in enumerate(hf(texts)['input_ids']):
    assert ids[-1] == sep
    ids = ids[:-1][:max_len]
    want[row, : len(ids)] = ids
  np.testing.assert_array_equal(text.get_tokenizer('bert', vocab, max_len)(texts), want)


TEXT = {  # the model's text tower of SIZES, exact GELU as bert-base-uncased's
  'hidden_size': 32,
  'num_layers': 2,
  'num_heads': 2,
  'mlp_dim': 64,
  'vocab_size': 100,
  'max_length': 16,
  'gelu_approximate': False,
}


@pytest.fixture(scope='module')
def bert_dir(tmp_path_factory):
  """A BertModel directory (`save_pretrained`) of SIZES, exact GELU, and the model."""
  model = randomized(BertModel(BertConfig(**SIZES, attn_implementation='eager')))
  path = tmp_path_factory.mktemp('bert') / 'bert-tiny'
  model.float().save_pretrained(path)
  return path, model.double()


def lit_config(bert_path, **text):
  """The digits LiT, both towers trained, the image tower from scratch, its text tower
  SIZES' BERT from `bert_path`."""
  config = lit_digits.get_config('unlocked')
  config.pretrained_path = ''
  config.text_pretrained_path = str(bert_path)
  config.model.text = {**TEXT, **text}
  return config


def test_a_contrastive_run_starts_its_text_tower_from_the_file(bert_dir, tmp_path):
  """`config.text_pretrained_path` of a run without a pretrained image file: the run starts
  from files (`has_pretrained`), and the task's `pretrained` gives its text tower the file's
  encoder (BertModel's [CLS] features to 1e-5) and keeps the model's head (zeros here)."""
  path, model = bert_dir
  s = setup.prepare(lit_config(path), str(tmp_path / 'run'), jax.devices()[:1])
  assert s.pretrained_path is None and s.task.has_pretrained(s.pretrained_path)
  shapes = families.param_shapes(s.model, 8, 12)
  zeros = jax.tree.map(lambda a: np.zeros(a.shape, a.dtype), shapes)
  params = s.task.pretrained(s.pretrained_path, zeros)
  txt, img = params['txt'], flatten(params['img'])
  assert txt['head']['kernel'].shape == (32, 64) and not txt['head']['kernel'].any()
  assert not any(v.any() for v in img.values())  # the image tower as initialised
  ids = token_ids(2)
  _, out = BertTower(num_classes=64, **TEXT).apply({'params': txt}, jnp.asarray(ids))
  np.testing.assert_allclose(out['pre_logits'], oracle(model, ids), atol=1e-5, rtol=0)


def test_misuses_are_one_line_errors(bert_dir, tmp_path):
  """A width or head count unlike the model's names the flags; a file that is not BERT, a
  text transformer model and a classification run are refused in one line."""
  path, _ = bert_dir
  read = bert.read(path)
  with pytest.raises(CheckpointError, match=r'set --config.model.text.hidden_size=32$'):
    bert.check_fits(read, {**TEXT, 'hidden_size': 64}, str(path))
  with pytest.raises(CheckpointError, match=r'--config.model.text.num_heads=2$'):
    bert.check_fits(read, {**TEXT, 'num_heads': 4}, str(path))
  assert bert.check_fits(read, {**TEXT, 'max_length': 8}, str(path)) == []  # first rows
  notes = bert.check_fits(read, {**TEXT, 'gelu_approximate': True}, str(path))
  assert notes == [
    f'{path}: the file states gelu_approximate=False, the model has True'
    ' (--config.model.text.gelu_approximate=False follows the file)'
  ]
  torch.save(torch.nn.Linear(2, 2).state_dict(), tmp_path / 'other.bin')
  with pytest.raises(CheckpointError, match=r'not a BERT checkpoint \(no embeddings'):
    bert.read(tmp_path / 'other.bin')
  with pytest.raises(CheckpointError, match=r'^\S+: not a BERT checkpoint; expected'):
    bert.read(tmp_path)
  config = lit_config(path)
  config.model.text_model = 'text_transformer'
  config.model.text = {'width': 32, 'num_layers': 1, 'mlp_dim': 64, 'num_heads': 2}
  with pytest.raises(ValueError, match=r"reads a BERT, but the model's text tower is"):
    setup.prepare(config, str(tmp_path / 'run'), jax.devices()[:1])
  config = with_overrides(lit_config(path), {'task': 'classification'})
  with pytest.raises(ValueError, match=r'^config.text_pretrained_path starts the text tower'):
    setup.prepare(config, str(tmp_path / 'run'), jax.devices()[:1])


def test_a_runs_exact_gelu_is_stated_beside_its_converted_file():
  """A run whose BERT computes the exact GELU (started from bert-base-uncased) states it, as
  it states the heads, so `vit-convert`'s FILE.json and `fit` keep it (the shapes cannot)."""
  model = {'text_model': 'bert', 'text': TEXT}
  assert two_towers.stated_fields(model)['text'] == {'num_heads': 2, 'gelu_approximate': False}
  model['text'] = {**TEXT, 'gelu_approximate': True}
  assert two_towers.stated_fields(model)['text'] == {'num_heads': 2}
