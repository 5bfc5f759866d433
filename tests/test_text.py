"""vit_jax.text: the tokenizers give the ids derived by hand from vocabularies written here
(tests/text_vocabs.py), and equal the original's code on them: vit_jax's BertTokenizer and
SentencepieceTokenizer (preprocess.py, tensorflow_text) and big_vision's `tokenize` op."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_text
import text_vocabs as tv

from vit_jax import text

TEXTS = [
  '',
  'a',
  'The cat sat on the mat.',
  'THE CATS SAT!!',
  'Über café, naïve façade',
  'Ä Ö Ü ß ẞ ǅ',
  'Zürich',
  'İstanbul ΣΑΣ Straße',
  '中文字 日本語 한국어',
  '😀 cat 🐈\u200d⬛ 👍🏽',
  'tab\tnew\nline\r\x00end',
  '  leading and   trailing  ',
  "don't-stop #$%&",
  'Ελληνικά Русский हिन्दी عربى',
  'x' * 150,
  'a cat sat ' * 12,
]
SIGLIP = dict(eos='sticky', pad_value=1, lower=True)


# The original's code, as released.


def original_bert(vocab_path, max_len, texts):
  """vit_jax's BertTokenizer.__call__ (preprocess.py)."""
  tokenizer = tensorflow_text.BertTokenizer(vocab_path, token_out_type=tf.int32, lower_case=True)
  with tf.io.gfile.GFile(vocab_path) as f:
    vocab = f.read().split('\n')
  cls_token = vocab.index('[CLS]')
  tokens, _ = tensorflow_text.pad_model_inputs(tokenizer.tokenize(tf.constant(texts)), max_len - 1)
  return tf.concat([tf.fill([tf.shape(tokens)[0], 1], cls_token), tokens], axis=1).numpy()


def original_sentencepiece(model, max_len, texts):
  """vit_jax's SentencepieceTokenizer.__call__ (preprocess.py)."""
  tokenizer = tensorflow_text.SentencepieceTokenizer(model=model, add_eos=True)
  eos_token = tokenizer.string_to_id('</s>')

  def preprocess_tf(text):
    tokens = tokenizer.tokenize(text)
    tokens = tokens[: max_len - 1]
    return tf.pad(tokens, [(0, max_len - tf.shape(tokens)[0])], constant_values=eos_token)

  return tf.stack([preprocess_tf(t) for t in texts]).numpy()


def big_vision_tokenize(model, max_len, texts, *, eos, pad_value, lower):
  """big_vision's `tokenize(max_len, eos, pad_value, lower)` op (pp/ops_text.py) on each text."""
  tokenizer = tensorflow_text.SentencepieceTokenizer(model=model, add_eos=eos != 'none')

  def pad(tokens):
    if eos == 'sticky':
      tokens = tf.cond(
        tf.shape(tokens)[0] >= max_len,
        lambda: tf.concat([tokens[: max_len - 1], tokens[-1:]], axis=0),
        lambda: tf.pad(tokens, [(0, max_len - tf.shape(tokens)[0])], constant_values=pad_value),
      )
    else:
      tokens = tokens[:max_len]
      tokens = tf.pad(tokens, [(0, max_len - tf.shape(tokens)[0])], constant_values=pad_value)
    return tokens

  def one(txt):
    txt = tf.constant(txt)
    if lower:
      txt = tf.strings.lower(txt)
    return pad(tokenizer.tokenize(txt)).numpy()

  return np.stack([one(t) for t in texts])


@pytest.fixture(scope='module')
def bert_vocab(tmp_path_factory):
  return tv.write_bert_vocab(tmp_path_factory.mktemp('bert') / 'vocab.txt')


@pytest.fixture(scope='module')
def word_model(tmp_path_factory):
  path = tmp_path_factory.mktemp('sp') / 'words.model'
  path.write_bytes(tv.word_model())
  return str(path)


@pytest.fixture(scope='module')
def trained_model(tmp_path_factory):
  path = tmp_path_factory.mktemp('sp') / 'trained.model'
  path.write_bytes(tv.trained_model())
  return str(path)


# BERT.


def _bert_row(*pieces, max_len=8):
  ids = [tv.CLS, *(p if isinstance(p, int) else tv.BERT_ID[p] for p in pieces)]
  return ids + [0] * (max_len - len(ids))


def test_bert_ids_by_hand(bert_vocab):
  """Case-folded (full folding: ß -> ss, İ -> i + dot), NFD, accents dropped, punctuation and
  CJK characters split off, word pieces, [UNK] for a word without pieces; [CLS] first."""
  cases = {
    'the cat sat': ('the', 'cat', 'sat'),
    'The CATS sat!': ('the', 'cat', '##s', 'sat', '!'),
    '': (),
    'Über Café naïve': ('uber', 'cafe', 'naive'),
    'Straße İstanbul ZÜRICH': ('strasse', 'istanbul', 'zurich'),
    '中文 😀': ('中', '文', '😀'),
    'dogs 日': (tv.UNK, tv.UNK),
    "don't-stop": ('don', "'", 't', '-', 'stop'),
    'the cats sat on a mat': ('the', 'cat', '##s', 'sat', 'on', 'a', 'mat'),  # 7: no padding
    'the cat sat on the mat the cat sat': ('the', 'cat', 'sat', 'on', 'the', 'mat', 'the'),
  }
  tokenizer = text.get_tokenizer('bert', bert_vocab, 8)
  ids = tokenizer(list(cases))
  assert ids.dtype == np.int32 and ids.shape == (len(cases), 8)
  np.testing.assert_array_equal(ids, [_bert_row(*pieces) for pieces in cases.values()])
  assert tokenizer.cls_token == 101 and tokenizer.vocab_size == len(tv.BERT_VOCAB)


def test_bert_the_originals_own_case(tmp_path):
  """vit_jax's preprocess_test: [CLS] at line 1, no [UNK] line: an unknown word is the one id
  past the vocabulary (the lookup table's out-of-vocabulary bucket)."""
  vocab = tv.write_bert_vocab(tmp_path / 'v.txt', ['[PAD]', '[CLS]', 'some', 'test', 'words'])
  tokenizer = text.get_tokenizer('bert', vocab, max_len=3)
  ids = tokenizer(['some', 'test', 'words', 'xxx'])
  np.testing.assert_array_equal(ids, [[1, 2, 0], [1, 3, 0], [1, 4, 0], [1, 5, 0]])


@pytest.mark.parametrize('max_len', [1, 2, 8, 16])
def test_bert_equals_the_original(bert_vocab, max_len):
  ours = text.get_tokenizer('bert', bert_vocab, max_len)(TEXTS)
  np.testing.assert_array_equal(ours, original_bert(bert_vocab, max_len, TEXTS))
  assert ours.shape == (len(TEXTS), max_len)


def test_bert_cls_is_its_line_index(tmp_path):
  """[CLS] anywhere in the file: its id is its line, as the original's vocab.index('[CLS]')."""
  lines = ['[PAD]', '[UNK]', 'the', 'cat', '[SEP]', '[CLS]', 'sat']
  vocab = tv.write_bert_vocab(tmp_path / 'v.txt', lines)
  ids = text.get_tokenizer('bert', vocab, 5)(['The cat', 'sat dog'])
  np.testing.assert_array_equal(ids, [[5, 2, 3, 0, 0], [5, 6, 1, 0, 0]])
  np.testing.assert_array_equal(ids, original_bert(vocab, 5, ['The cat', 'sat dog']))


# Sentencepiece.


def _sp_row(*ids, max_len, pad):
  return list(ids) + [pad] * (max_len - len(ids))


def test_sentencepiece_lit_ids_by_hand(word_model):
  """LiT's: </s> appended, clipped to max_len - 1, padded with the </s> id: </s> is last."""
  a, cat, sat = (tv.SP_ID[w] for w in ('a', 'cat', 'sat'))
  eos = tv.SP_EOS
  cases = {
    'a cat': [a, cat, eos],
    '': [eos],
    'ä zürich 中文 😀': [tv.SP_ID[w] for w in ('ä', 'zürich', '中文', '😀')] + [eos],
    'Zürich a dog': [tv.SP_UNK, a, tv.SP_UNK, eos],  # no lower-casing
    'a cat sat a cat sat a': [a, cat, sat, a, cat, sat, a, eos],  # 8 = max_len: as it is
    'a cat sat a cat sat a cat sat': [a, cat, sat, a, cat, sat, a, eos],  # clipped, </s> kept
  }
  tokenizer = text.get_tokenizer('sentencepiece', word_model, 8)
  ids = tokenizer(list(cases))
  assert ids.dtype == np.int32
  np.testing.assert_array_equal(ids, [_sp_row(*r, max_len=8, pad=eos) for r in cases.values()])
  assert tokenizer.eos_token == eos and tokenizer.vocab_size == 3 + len(tv.SP_WORDS)


def test_sentencepiece_siglip_ids_by_hand(word_model):
  """SigLIP's (eos='sticky', pad_value=1, lower=True): ASCII letters lower-cased only (as
  big_vision's tf.strings.lower), padding 1, </s> kept at the end of a clipped text."""
  a, cat, sat = (tv.SP_ID[w] for w in ('a', 'cat', 'sat'))
  eos = tv.SP_EOS
  cases = {
    'A CAT': [a, cat, eos],
    'ZÜRICH Zürich': [tv.SP_UNK, tv.SP_ID['zürich'], eos],  # Ü is not ASCII: kept
    'Ä ä': [tv.SP_UNK, tv.SP_ID['ä'], eos],
    '': [eos],
    'A cat sat a cat sat a cat': [a, cat, sat, a, cat, sat, a, eos],
  }
  tokenizer = text.get_tokenizer('sentencepiece', word_model, 8, pad_value=1, lower=True)
  ids = tokenizer(list(cases))
  np.testing.assert_array_equal(ids, [_sp_row(*r, max_len=8, pad=1) for r in cases.values()])


@pytest.mark.parametrize(
  'eos,pad_value,expected',
  [  # big_vision's docstring of `tokenize`, with id('</s>') = 2 and id('a') = 3 here
    ('none', 0, [[3, 0, 0], [3, 3, 0], [3, 3, 3]]),
    ('yes', 0, [[3, 2, 0], [3, 3, 2], [3, 3, 3]]),
    ('sticky', 0, [[3, 2, 0], [3, 3, 2], [3, 3, 2]]),
    ('sticky', 1, [[3, 2, 1], [3, 3, 2], [3, 3, 2]]),
  ],
)
def test_sentencepiece_eos_modes_of_big_vision(word_model, eos, pad_value, expected):
  tokenizer = text.get_tokenizer('sentencepiece', word_model, 3, eos=eos, pad_value=pad_value)
  np.testing.assert_array_equal(tokenizer(['a', 'a a', 'a a a']), expected)


@pytest.mark.parametrize('max_len', [1, 3, 4, 16, 17])
def test_sentencepiece_equals_the_original(trained_model, max_len):
  with open(trained_model, 'rb') as f:
    model = f.read()
  ours = text.get_tokenizer('sentencepiece', trained_model, max_len)(TEXTS)
  np.testing.assert_array_equal(ours, original_sentencepiece(model, max_len, TEXTS))


@pytest.mark.parametrize('options', [SIGLIP, dict(eos='yes', pad_value=0, lower=False)])
@pytest.mark.parametrize('max_len', [1, 3, 4, 17])
def test_sentencepiece_equals_big_vision(trained_model, max_len, options):
  with open(trained_model, 'rb') as f:
    model = f.read()
  ours = text.get_tokenizer('sentencepiece', trained_model, max_len, **options)(TEXTS)
  np.testing.assert_array_equal(ours, big_vision_tokenize(model, max_len, TEXTS, **options))


def test_the_comparisons_cover_short_fitting_and_clipped_texts(trained_model):
  with open(trained_model, 'rb') as f:
    tokenizer = tensorflow_text.SentencepieceTokenizer(model=f.read(), add_eos=True)
  lengths = {len(ids) for ids in tokenizer.tokenize(TEXTS).to_list()}  # </s> included
  # max_len 3 and 17 fit some texts exactly, 4 and 16 leave them one position of padding, and
  # every max_len clips some.
  assert {1, 3, 15, 17} <= lengths and max(lengths) > 17, lengths


# Both.


@pytest.fixture(params=['bert', 'sentencepiece', 'siglip'])
def make_tokenizer(request, bert_vocab, trained_model):
  if request.param == 'bert':
    return lambda: text.get_tokenizer('bert', bert_vocab, 16)
  options = SIGLIP if request.param == 'siglip' else {}
  return lambda: text.get_tokenizer('sentencepiece', trained_model, 16, **options)


@pytest.fixture
def tokenizer(make_tokenizer):
  return make_tokenizer()


def test_tf_data_gives_the_same_ids(tokenizer):
  """One text per element, or a batch per element: the ids of the numpy call."""
  expected = tokenizer(TEXTS)
  dataset = tf.data.Dataset.from_tensor_slices(TEXTS)
  one = np.concatenate(list(dataset.map(tokenizer.preprocess_tf).batch(5).as_numpy_iterator()))
  batched = np.concatenate(list(dataset.batch(5).map(tokenizer.preprocess_tf).as_numpy_iterator()))
  np.testing.assert_array_equal(one, expected)
  np.testing.assert_array_equal(batched, expected)
  assert dataset.map(tokenizer.preprocess_tf).element_spec.shape == (16,)


def test_a_tokenizer_built_inside_a_tf_data_map_gives_the_same_ids(make_tokenizer):
  expected = make_tokenizer()(TEXTS)
  dataset = tf.data.Dataset.from_tensor_slices(TEXTS).batch(len(TEXTS))
  (ids,) = dataset.map(lambda t: make_tokenizer().preprocess_tf(t)).as_numpy_iterator()
  np.testing.assert_array_equal(ids, expected)


def test_no_texts_give_no_rows(tokenizer):
  ids = tokenizer([])
  assert ids.shape == (0, 16) and ids.dtype == np.int32


def test_one_string_or_a_matrix_of_texts_is_refused(tokenizer):
  with pytest.raises(TypeError, match='one text'):
    tokenizer('a cat')
  with pytest.raises(ValueError, match=r'got shape \(1, 1\)'):
    tokenizer.preprocess_tf([['a cat']])


# Errors: one line naming the problem.


def _one_line(error: pytest.ExceptionInfo) -> str:
  message = str(error.value)
  assert '\n' not in message, message
  return message


@pytest.mark.parametrize('name', ['bert', 'sentencepiece'])
def test_a_missing_vocabulary_is_one_line(tmp_path, name):
  missing = str(tmp_path / 'LiT-B16B.txt')
  with pytest.raises(FileNotFoundError) as error:
    text.get_tokenizer(name, missing, 16)
  assert _one_line(error) == f'{missing}: no such vocabulary file'


def test_an_unknown_tokenizer_is_one_line(bert_vocab):
  with pytest.raises(ValueError) as error:
    text.get_tokenizer('wordpiece', bert_vocab, 16)
  assert _one_line(error) == "unknown tokenizer 'wordpiece'; choose one of bert, sentencepiece"


def test_the_wrong_tokenizer_for_a_file_is_one_line(bert_vocab, trained_model):
  with pytest.raises(ValueError) as error:
    text.get_tokenizer('sentencepiece', bert_vocab, 16)
  assert _one_line(error).startswith(f'{bert_vocab}: not a sentencepiece model')
  with pytest.raises(ValueError) as error:
    text.get_tokenizer('bert', trained_model, 16)
  assert _one_line(error).startswith(f'{trained_model}: not a BERT vocabulary')


def test_a_vocabulary_without_cls_is_one_line(tmp_path):
  vocab = tv.write_bert_vocab(tmp_path / 'v.txt', ['[PAD]', '[UNK]', 'the'])
  with pytest.raises(ValueError) as error:
    text.get_tokenizer('bert', vocab, 16)
  assert _one_line(error) == f'{vocab}: not a BERT vocabulary (no [CLS] line)'


@pytest.mark.parametrize(
  'name,options,match',
  [
    ('bert', dict(max_len=0), 'max_len must be a positive integer'),
    ('sentencepiece', dict(max_len=16, eos='always'), "eos='always': choose one of"),
    ('bert', dict(max_len=16, lower=True), 'lower'),
  ],
)
def test_bad_options_are_one_line(bert_vocab, word_model, name, options, match):
  vocab = bert_vocab if name == 'bert' else word_model
  with pytest.raises((ValueError, TypeError), match=match) as error:
    text.get_tokenizer(name, vocab, **options)
  _one_line(error)
