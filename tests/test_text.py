"""vit_jax.text: the tokenizers give the ids derived by hand from vocabularies written here
(tests/text_vocabs.py), and the ids of the original's code on the vocabularies in tests/data:
tests/data/tokenizer_oracle.json holds what vit_jax's BertTokenizer and SentencepieceTokenizer
(preprocess.py, on tensorflow_text) and big_vision's `tokenize` op gave, called exactly as
released, on hundreds of texts (tests/data/make_tokenizer_oracle.py wrote it; tensorflow_text
is not needed here)."""

import hashlib
import itertools
import json
import subprocess
import sys
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import sentencepiece
import tensorflow as tf
import text_vocabs as tv

from vit_jax import text

DATA = Path(__file__).parent / 'data'
ORACLE = json.loads((DATA / 'tokenizer_oracle.json').read_text(encoding='utf-8'))
# The oracle's texts, then its strings that are not valid UTF-8 (as a tf.string may hold).
INPUTS = [t.encode() for t in ORACLE['texts']] + [bytes.fromhex(t) for t in ORACLE['byte_texts']]
SIGLIP = dict(eos='sticky', pad_value=1, lower=True)


def _padded(rows, max_len, pad):
  """The oracle's rows (stored without their trailing padding) padded back to max_len."""
  return np.array([row + [pad] * (max_len - len(row)) for row in rows], np.int32)


def _assert_rows_equal(ours, expected, context=''):
  """Equal ids; else the first texts that differ, ours then the oracle's."""
  assert ours.shape == expected.shape and ours.dtype == np.int32
  wrong = [i for i in range(len(INPUTS)) if not np.array_equal(ours[i], expected[i])]
  lines = [f'{INPUTS[i]!r}: {ours[i].tolist()} != {expected[i].tolist()}' for i in wrong[:5]]
  assert not wrong, '\n'.join([f'{len(wrong)} texts differ {context}', *lines])


@pytest.fixture(scope='module')
def bert_vocab(tmp_path_factory):
  return tv.write_bert_vocab(tmp_path_factory.mktemp('bert') / 'vocab.txt')


@pytest.fixture(scope='module')
def word_model(tmp_path_factory):
  path = tmp_path_factory.mktemp('sp') / 'words.model'
  path.write_bytes(tv.word_model())
  return str(path)


@pytest.fixture(scope='module')
def trained_model():
  return str(DATA / 'sp_unigram.model')


# Gemma's settings and piece names (SigLIP 2's tokenizer.model, which cannot be downloaded
# here): a BPE model trained in the test as Gemma's was.
GEMMA_SETTINGS = dict(
  model_type='bpe', pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece='<pad>',
  eos_piece='<eos>', bos_piece='<bos>', unk_piece='<unk>', user_defined_symbols=['<mask>'],
  byte_fallback=True, split_digits=True, add_dummy_prefix=False,
  remove_extra_whitespaces=False, normalization_rule_name='identity',
)  # fmt: skip
GEMMA_CORPUS = [
  'a photo of a cat', 'a photo of two dogs on the beach', 'the 2025 model reads 256 pieces',
  'an apple with a note', 'a cold drink on a hot day', 'cow on the beach at noon',
] * 20  # fmt: skip


@pytest.fixture(scope='module')
def gemma_model(tmp_path_factory):
  import io

  model = io.BytesIO()
  sentencepiece.SentencePieceTrainer.train(
    sentence_iterator=iter(GEMMA_CORPUS), model_writer=model, vocab_size=320,
    hard_vocab_limit=False, minloglevel=2, **GEMMA_SETTINGS,
  )  # fmt: skip
  path = tmp_path_factory.mktemp('gemma') / 'tokenizer.model'
  path.write_bytes(model.getvalue())
  return str(path)


def test_gemma_ids_are_big_visions_sticky_eos_and_padding_0(gemma_model):
  """`tok(model=gemma, bos=no, eos=sticky)`: the pieces, <eos> (1) after them and kept last
  when clipped (`x[:L-1] + x[-1:]`), padding 0, no <bos>; the family's (SigLIP 2's pp) lower-
  cases first. At a24f8ac the EOS was looked up as the piece '</s>', which Gemma's model does
  not have: every SigLIP 2 tokenizer stopped."""
  from vit_jax.families import two_towers
  from vit_jax.models import get_config

  processor = sentencepiece.SentencePieceProcessor(model_file=gemma_model)
  texts = ['a photo of a cat', 'a cold drink on a hot day at the beach with 2025 apples']
  pieces = [processor.encode(t) for t in texts]
  assert len(pieces[0]) + 1 < 16 < len(pieces[1]) + 1 and 2 not in pieces[0] + pieces[1]
  want = np.zeros((2, 16), np.int32)
  want[0, : len(pieces[0]) + 1] = [*pieces[0], 1]
  want[1] = [*pieces[1][:15], 1]
  np.testing.assert_array_equal(text.get_tokenizer('gemma', gemma_model, 16)(texts), want)
  siglip2 = two_towers.tokenizer(get_config('SigLIP2-B16-224').pp, gemma_model)
  assert siglip2.max_len == 64
  np.testing.assert_array_equal(siglip2(['A Photo of a CAT']), siglip2(['a photo of a cat']))
  assert siglip2(['a photo of a cat'])[0, len(pieces[0])] == 1  # <eos>, then padding 0
  assert not siglip2(['a photo of a cat'])[0, len(pieces[0]) + 1 :].any()


def test_a_model_without_gemmas_ids_is_refused_as_gemma(word_model):
  with pytest.raises(ValueError) as error:
    text.get_tokenizer('gemma', word_model, 16)
  assert _one_line(error).startswith(f'{word_model}: not a Gemma tokenizer model (its ids')


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


@pytest.mark.parametrize(
  'entry',
  ORACLE['bert']['entries'],
  ids=[f'max_len={e["max_len"]}' for e in ORACLE['bert']['entries']],
)
def test_bert_equals_tensorflow_text(entry):
  """The original's BertTokenizer on bert_vocab.txt, every text of the oracle."""
  tokenizer = text.get_tokenizer('bert', DATA / ORACLE['bert']['vocab'], entry['max_len'])
  _assert_rows_equal(tokenizer(INPUTS), _padded(entry['ids'], entry['max_len'], entry['pad']))


def test_bert_reads_the_vocabulary_as_tensorflow_does(tmp_path):
  """'\\r\\n' line ends read as '\\n' ones (TensorFlow's text-file table drops the '\\r'); the
  whole line is the piece (spaces and tabs included)."""
  lines = ['[PAD]', '[UNK]', '[CLS]', 'the ', 'cat', 'the\tx', 'the']
  (tmp_path / 'crlf.txt').write_bytes(('\r\n'.join(lines) + '\r\n').encode())
  ids = text.get_tokenizer('bert', tmp_path / 'crlf.txt', 5)(['The cat', 'the\tx'])
  np.testing.assert_array_equal(ids, [[2, 6, 4, 0, 0], [2, 6, 1, 0, 0]])


def test_basic_tokenizer_equals_tensorflow_text_on_every_character():
  """tensorflow_text's BasicTokenizer(lower_case=True) on every code point of Unicode planes
  0-3 and 14 (every character assigned so far), 'x' between them, a block of 4,096 a text: the
  oracle holds a digest of each block's words. Left out, by the oracle's explicit list: the
  code points Python's unicodedata (of the Unicode version the oracle names) has not assigned
  but tensorflow_text's newer ICU and RE2 tables know (and fold, drop or split)."""
  chars = ORACLE['characters']
  excluded = {int(c, 16) for c in chars['excluded']}
  if unicodedata.unidata_version == chars['unicode']:
    assert all(unicodedata.category(chr(c)) == 'Cn' for c in excluded)
  wrong = []
  for start, digest in chars['blocks'].items():
    start = int(start, 16)
    points = range(start, start + chars['block'])
    kept = (chr(c) for c in points if not 0xD800 <= c <= 0xDFFF and c not in excluded)
    words = text.basic_tokenize('x'.join(kept))
    if hashlib.sha256('\n'.join(words).encode()).hexdigest()[: len(digest)] != digest:
      wrong.append(f'{start:04X}')
  assert not wrong, f'the words differ in the blocks at {wrong}'
  assert len(chars['blocks']) == 65 and len(excluded) == 210  # as docs/image-text.md lists


def test_bert_cls_is_its_line_index(tmp_path):
  """[CLS] anywhere in the file: its id is its line, as the original's vocab.index('[CLS]')."""
  lines = ['[PAD]', '[UNK]', 'the', 'cat', '[SEP]', '[CLS]', 'sat']
  vocab = tv.write_bert_vocab(tmp_path / 'v.txt', lines)
  ids = text.get_tokenizer('bert', vocab, 5)(['The cat', 'sat dog'])
  np.testing.assert_array_equal(ids, [[5, 2, 3, 0, 0], [5, 6, 1, 0, 0]])


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


SENTENCEPIECE = [(model, e) for model, entries in ORACLE['sentencepiece'].items() for e in entries]


@pytest.mark.parametrize(
  'model,entry',
  SENTENCEPIECE,
  ids=[
    f'{m.split(".")[0]}-{e["options"].get("eos", "lit")}-{e["max_len"]}' for m, e in SENTENCEPIECE
  ],
)
def test_sentencepiece_equals_tensorflow_text(model, entry):
  """The original's SentencepieceTokenizer (options {}: LiT's) and big_vision's `tokenize` op
  (eos, pad_value, lower) on both models, every text of the oracle. On the unigram model some
  texts have segmentations of equal score: sentencepiece 0.2.1 breaks the ties as the copy
  inside tensorflow_text does (0.2.2 and later do not)."""
  max_len = entry['max_len']
  tokenizer = text.get_tokenizer('sentencepiece', DATA / model, max_len, **entry['options'])
  version = f'sentencepiece {sentencepiece.__version__} (the locks, requirements/: 0.2.1)'
  _assert_rows_equal(tokenizer(INPUTS), _padded(entry['ids'], max_len, entry['pad']), version)


def test_the_oracle_covers_empty_fitting_and_clipped_texts():
  """At each max_len of the oracle some texts fit exactly, some leave one position of padding,
  some are clipped by one and some by more; some texts have no piece at all."""
  bert = text.get_tokenizer('bert', DATA / ORACLE['bert']['vocab'], 256)
  lengths = {'bert': set((bert(INPUTS) != 0).sum(axis=1).tolist())}  # [CLS] included
  for model, add_eos in itertools.product(ORACLE['sentencepiece'], (True, False)):
    processor = sentencepiece.SentencePieceProcessor(model_file=str(DATA / model))
    lengths[model, add_eos] = {len(ids) for ids in processor.encode(INPUTS, add_eos=add_eos)}
  assert max(lengths['bert']) < 256 and min(lengths['bert']) == 1  # [CLS] alone
  for model in ORACLE['sentencepiece']:
    assert min(lengths[model, True]) == 1 and min(lengths[model, False]) == 0  # </s> alone
  entries = [('bert', e) for e in ORACLE['bert']['entries']]
  entries += [((m, e['options'].get('eos') != 'none'), e) for m, e in SENTENCEPIECE]
  for name, entry in entries:
    max_len = entry['max_len']
    assert {max_len - 1, max_len, max_len + 1} - {0} <= lengths[name], (name, max_len)
    assert max(lengths[name]) > max_len + 1, (name, max_len)


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
  expected = tokenizer(INPUTS)
  dataset = tf.data.Dataset.from_tensor_slices(INPUTS)
  one = np.concatenate(list(dataset.map(tokenizer.preprocess_tf).batch(5).as_numpy_iterator()))
  batched = np.concatenate(list(dataset.batch(5).map(tokenizer.preprocess_tf).as_numpy_iterator()))
  np.testing.assert_array_equal(one, expected)
  np.testing.assert_array_equal(batched, expected)
  assert dataset.map(tokenizer.preprocess_tf).element_spec.shape == (16,)


def test_a_tokenizer_built_inside_a_tf_data_map_gives_the_same_ids(make_tokenizer):
  expected = make_tokenizer()(INPUTS)
  dataset = tf.data.Dataset.from_tensor_slices(INPUTS).batch(len(INPUTS))
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
  assert (
    _one_line(error) == "unknown tokenizer 'wordpiece'; choose one of bert, sentencepiece, gemma"
  )


def test_the_wrong_tokenizer_for_a_file_is_one_line(bert_vocab, trained_model, tmp_path):
  with pytest.raises(ValueError) as error:
    text.get_tokenizer('sentencepiece', bert_vocab, 16)
  assert _one_line(error).startswith(f'{bert_vocab}: not a sentencepiece model')
  with pytest.raises(ValueError) as error:
    text.get_tokenizer('bert', trained_model, 16)
  assert _one_line(error).startswith(f'{trained_model}: not a BERT vocabulary')


def test_an_empty_model_file_is_one_line_and_nothing_else(tmp_path):
  """sentencepiece takes empty bytes for no model, whose every call logs to stderr (at exit)."""
  (tmp_path / 'LiT-L16S.model').write_bytes(b'')
  code = (
    'import sys; from vit_jax import text; text.get_tokenizer("sentencepiece", sys.argv[1], 16)'
  )
  run = subprocess.run(
    [sys.executable, '-c', code, str(tmp_path / 'LiT-L16S.model')],
    cwd=Path(__file__).parents[1],
    capture_output=True,
    text=True,
  )
  message = f'ValueError: {tmp_path}/LiT-L16S.model: not a sentencepiece model'
  assert run.returncode == 1 and run.stderr.startswith('Traceback'), run.stderr
  assert run.stderr.rstrip().splitlines()[-1].startswith(message), run.stderr


@pytest.mark.parametrize(
  'lines,problem',
  [
    (['[PAD]', '[UNK]', 'the'], 'no [CLS] line'),
    (['[PAD]', '', '[CLS]', 'the'], 'line 2 is empty'),
    (['[PAD]', '[CLS]', 'the', 'cat', 'the'], "'the' is on two lines"),
  ],
)
def test_a_vocabulary_tensorflow_text_refuses_is_one_line(tmp_path, lines, problem):
  """No [CLS] (the original's vocab.index('[CLS]') fails), an empty or a repeated line
  (TensorFlow's text-file table refuses the file)."""
  vocab = tv.write_bert_vocab(tmp_path / 'v.txt', lines)
  with pytest.raises(ValueError) as error:
    text.get_tokenizer('bert', vocab, 16)
  assert _one_line(error) == f'{vocab}: not a BERT vocabulary ({problem})'


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


def test_importing_the_tokenizers_imports_no_tensorflow():
  """TensorFlow is imported by `preprocess_tf` only: tokenizing lists of texts needs none."""
  code = (
    'import sys; from vit_jax import text; '
    "text.get_tokenizer('bert', sys.argv[1], 16)(['a cat']); "
    "assert not [m for m in sys.modules if m.startswith('tensorflow')], 'tensorflow imported'"
  )
  vocab = str(DATA / ORACLE['bert']['vocab'])
  subprocess.run([sys.executable, '-c', code, vocab], check=True, cwd=Path(__file__).parents[1])
