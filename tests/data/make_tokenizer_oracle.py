"""Writes the tokenizer tests' vocabularies and the ids the original's tokenizers give on them.

The reference is tensorflow_text, called exactly as the original code calls it; vit_jax does
not depend on it, so this script is run by hand, once, in a virtualenv of its own:

  pip install tensorflow tensorflow-text sentencepiece
  python tests/data/make_tokenizer_oracle.py

It writes beside itself:
- bert_vocab.txt: a BERT WordPiece vocabulary laid out as BERT's own ([PAD], [unused0..98],
  [UNK] = 100, [CLS] = 101, [SEP], [MASK]), then pieces drawn from TEXTS (whole words, single
  characters, '##' continuations; some characters left out, so that [UNK] occurs).
- sp_unigram.model: a unigram sentencepiece model trained on TEXTS with a small normalisation
  rule set of its own and T5's ids (<pad> 0, </s> 1, <unk> 2: SigLIP's pad value 1 is its </s>).
- sp_bpe.model: a BPE model with byte fallback, digits split, whitespace kept as it is.
- tokenizer_oracle.json: for each text of TEXTS and BYTE_TEXTS (not valid UTF-8), the ids of
  - vit_jax's BertTokenizer (preprocess.py: tensorflow_text.BertTokenizer(lower_case=True),
    pad_model_inputs(max_len - 1), [CLS] first) on bert_vocab.txt;
  - vit_jax's SentencepieceTokenizer (SentencepieceTokenizer(add_eos=True), clipped to
    max_len - 1, padded with </s>) and big_vision's `tokenize` op (eos 'sticky', 'yes', 'none';
    pad_value; lower) on both models;
  at several max_len. Each row is stored without its trailing padding (the entry's `pad`);
  padded back to max_len it is tensorflow_text's row exactly.
  And BasicTokenizer(lower_case=True) on every code point of Unicode planes 0-3 and 14 (every
  character assigned so far; planes 4-13 are unassigned, 15-16 private use): the code points are
  joined by 'x' in blocks of 4,096, and the oracle holds a digest of each block's words. Left out
  of the blocks, and listed with their words: code points unassigned in this Python's
  `unicodedata` that tensorflow_text changes (its ICU and RE2 tables are newer).
"""

import hashlib
import io
import json
import os
import random
import re
import sys
import unicodedata

import numpy as np
import sentencepiece
import tensorflow as tf
import tensorflow_text
from tensorflow_text.python.ops.bert_tokenizer import BasicTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
BLOCK = 0x1000
PLANES = [*range(0, 0x40000, BLOCK), 0xE0000]  # the blocks of planes 0-3 and 14

HAND = [
  # ASCII.
  '', ' ', '   ', '\t\n', '\r\n\x0b\x0c', 'a', 'A', 'The cat sat on the mat.', 'THE CATS SAT!!',
  "don't-stop #$%&", 'hello,world', 'e-mail: someone@example.com', 'https://example.com/a_b?c=d&e=f',
  'C++ and C# (and F#)', '3.14159 + 2 = 5.14159', '1,000,000 $100 50% #1', 'a photo of a {}.',
  'a bad photo of the dog.', "it's a 'quote' and \"double\"", 'under_score snake_case camelCase',
  'ALL CAPS SENTENCE WITH WORDS', '...', '~`^|\\<>[]{}',
  'tabs\tand\nnewlines\r\nand\x0bvertical\x0cfeed', '  leading and   trailing  ', 'x' * 100,
  'x' * 101, 'a cat sat ' * 12, 'supercalifragilisticexpialidocious',
  'antidisestablishmentarianism',
  'the quick brown fox jumps over the lazy dog', 'THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG',
  'semi;colon:colon a/b\\c', '0123456789 007 42', 'i.e. e.g. etc. Dr. Smith vs. Mr. Jones',
  'a photo of many cats and dogs playing together in the garden on a sunny afternoon ' * 3,
  # Runs of a character: segmentations of equal score, which sentencepiece breaks by its rule.
  '!!!!!!!', '..........', '?!?!?!', 'hahahaha', 'zzzzzzzzzz', '-----', '=====', '((((((',
  'x' * 32, 'a' * 16, 'ababababab', '!!!???', '(((nested)))',
  # Latin with diacritics, case folding.
  'Über café, naïve façade', 'Ä Ö Ü ß ẞ ǅ', 'Zürich', 'İstanbul ΣΑΣ Straße', 'ÀÁÂÃÄÅ àáâãäå ÈÉÊË',
  'Ñandú piñata', 'Ærøskøbing ÆØÅ æøå', 'Łódź Gdańsk', 'Çà et là, où?', 'crème brûlée',
  'Dvořák Škoda', 'Iñtërnâtiônàlizætiøn', 'ǄǅǆǇǈǉ', 'ﬁ ﬂ ﬀ ﬃ ﬄ ﬅ ﬆ', 'ŉ ǰ ẖ ẗ ẘ ẙ ẚ',
  'ı İ i I', 'Ĳ ĳ Ŀ ŀ', 'e\u0301 a\u0308 o\u0303 n\u0303', 'Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o̙̔ͮ̇͐̇',
  'Tiếng Việt có dấu', 'Ω K Å µ ſ', 'ÉCOLE ÉLÉMENTAIRE', 'Ångström', 'ÞÓRR þórr Ðð',
  # Other scripts.
  'Ελληνικά ΑΒΓΔ άέήί ΐΰ', 'ὈΔΥΣΣΕΎΣ', 'ᾈ ᾉ ᾼ ῼ', 'Русский ЁЖЗ ёжз Й й', 'Українська Ґ ґ Ї ї',
  'ж' * 50, 'ж' * 51, 'हिन्दी देवनागरी', 'عربى العربية', 'עברית שָׁלוֹם', 'ภาษาไทย', 'ქართული ᲐᲑᲒ',
  'Ꭰ ꭰ ᏸ ᏣᎳᎩ', 'Հայերեն ԱԲԳ', 'తెలుగు தமிழ் বাংলা', 'ᠮᠣᠩᠭᠣᠯ', 'ⲀⲂⲄ 𐐀𐐁 𐐨',
  # CJK.
  '中文字 日本語 한국어', '我爱你', '東京タワー', 'ひらがな カタカナ ｶﾀｶﾅ ｶﾞｷﾞ', '漢字かな交じり文',
  '𠀀𠀁 𪜀 𫝀 𫠠 𬺰', '丽丸乁', '豈更車', '\u3000全角スペース\u3000',
  'ＡＢＣ\u3000ｘｙｚ\u3000１２３', '「引用」『二重』【括弧】', '中文，标点。！？',
  '한국어 문장입니다', 'ㄱㄴㄷ ㅏㅑ', '㈱ ㍿ ㋿ ㎏ ㎡',
  # Emoji and symbols.
  '😀 cat 🐈\u200d⬛ 👍🏽', '👨\u200d👩\u200d👧\u200d👦', '🇩🇪🇯🇵', '❤️ ❤', '1️⃣ #️⃣', '©®™ ℃ ℉ № ℡',
  '€100 £50 ¥1000 ₹', '→ ← ↑ ↓ ⇒', '∑∏∫√∞≈≠≤≥', '½ ¼ ¾ ⅓', '① ② ⑩ ⑴ ⒜', 'x² y³ H₂O',
  'Ⅰ Ⅱ Ⅻ ⅻ', '♠♣♥♦ ♪♫', '¡Hola! ¿Qué?', '«guillemets» „Anführung“', '—em–en-‐‑', '… • · ‧ § ¶ † ‡',
  'cat😀dog', 'a€b a$b a+b a^b a|b',
  # Control, format and space characters.
  'a\x00b', '\x00', 'a\x01b\x1fc\x7fd', 'a\x85b', 'a\u200bb', 'a\u200cb\u200dc', 'a\u200eb\u200fc',
  'a\ufeffb', 'soft\u00adhyphen', 'a\u2060b', 'a\u0600b', 'a\u061cb', 'a\u2066b\u2069',
  'a\u00a0b', 'a\u1680b', 'a\u2000b\u2002c\u200ad', 'a\u2028b\u2029c', 'a\u202fb\u205fc',
  'a\u3000b', 'x\ufe0fy', 'a\U000e0041b', 'a\ue000b', 'a\ufffdb', 'a\uffffb', 'a\U0001d173b',
  '\u200b', '\u00a0\u00a0', '\x85\x85', 'a\u3164b', 'a\u115fb',
]  # fmt: skip

WORDS = [
  'a', 'the', 'cat', 'cats', 'dog', 'photo', 'of', 'on', 'mat', 'sat', 'big', 'small', 'red',
  'blue', 'running', 'jumped', 'quickly', 'house', 'tree', 'flower', 'car', 'plane', 'bird',
  'nation', 'national', 'international', 'playing', 'player', 'unbelievable', 'zebra', 'quiz',
  'café', 'naïve', 'Zürich', 'Straße', 'İstanbul', 'ÆØÅ', 'ΣΑΣ', 'Ёлка', 'москва', '中文',
  '日本', '東京', '한국', '😀', '🐈', 'ﬁne', 'ＡＢＣ', '①', 'x²',
]  # fmt: skip
EXTRAS = [*'.,!?;:-\'"()[]#$%&*+/@_~', '\u200b', '\u00a0', '\t', '\n', '\x00', '\u3000']


def generated_texts(n: int = 250, seed: int = 0) -> list[str]:
  """Texts mixing WORDS in random case with punctuation, spaces and odd characters."""
  rng = random.Random(seed)
  texts = []
  for _ in range(n):
    parts = []
    for _ in range(rng.randint(1, 12)):
      word = rng.choice(WORDS)
      word = rng.choice([word, word, word.upper(), word.title(), word.capitalize()])
      if rng.random() < 0.2:
        word += rng.choice(EXTRAS)
      parts.append(word)
      parts.append(rng.choice([' ', ' ', ' ', '', '  ', rng.choice(EXTRAS)]))
    texts.append(''.join(parts))
  return texts


# Texts of a known number of words (one piece each), either side of each max_len.
COUNTED = [' '.join(['cat'] * n) for n in (1, 2, 3, 4, 5, 6, 15, 16, 17, 62, 63, 64, 65)]
TEXTS = HAND + COUNTED + generated_texts()
# Strings that are not valid UTF-8 (a tf.string may hold any bytes), after TEXTS in the oracle.
BYTE_TEXTS = [
  b'CAF\xe9 OK', b'\xff\xfe', b'a\xc3b', b'\xe2\x82 x', b'\xed\xa0\x80 surrogate', b'\xc0\xaf',
  b'ok \xf4\x90\x80\x80', b'A\xe9B.C,D', b'\xe9\x00x\xe2\x80\x8by', b'e\xcc\x81 \xff e\xcc\x81',
  b'\xef\xac\x81 \xff', b'\xf0\x9f\x98 y', b'\xe2(\xa1', b'the cat \x80\x81 sat', b'\xe9' * 10,
  b'x' * 99 + b'\xff', b'x' * 100 + b'\xff', b'\xc3\x84\xe9\xc3\x9f',
]  # fmt: skip
INPUTS = [t.encode('utf-8') for t in TEXTS] + BYTE_TEXTS
# The max_len of each tokenizer: the original's (LiT, BERT) and big_vision's (the three eos modes).
MAX_LENS = {
  'bert': [1, 2, 5, 16, 64],
  'sp_unigram.model': dict(lit=[1, 2, 5, 16, 64], sticky=[1, 5, 16, 64], yes=[3, 16], none=[3, 16]),
  'sp_bpe.model': dict(lit=[1, 16, 64], sticky=[5, 64], yes=[3], none=[3]),
}
# big_vision's options for each eos mode: SigLIP's (sticky), and the other two.
BIG_VISION = dict(
  sticky=dict(eos='sticky', pad_value=1, lower=True),
  yes=dict(eos='yes', pad_value=0, lower=False),
  none=dict(eos='none', pad_value=0, lower=True),
)
# What tensorflow_text's rules do to a code point unassigned in any Unicode version: drop it
# when Unicode reserves it as default-ignorable (NFKC_Casefold), make it a word of its own when
# it falls in BasicTokenizer's CJK ranges (bert_tokenizer._DELIM_REGEX), else keep it. Changing
# an unassigned code point otherwise means that its tables (ICU's, RE2's) know a character that
# Python's unicodedata does not.
RESERVED_IGNORABLE = [(0x2065, 0x2065), (0xFFF0, 0xFFF8), (0xE0000, 0xE0000), (0xE0002, 0xE001F)]
RESERVED_IGNORABLE += [(0xE0080, 0xE00FF), (0xE01F0, 0xE0FFF)]
CJK = [(0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F)]
CJK += [(0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F)]


def unassigned_words(c: int) -> list[str]:
  """BasicTokenizer's words of 'x', c, 'x' for a code point c unassigned in every version."""
  if any(a <= c <= b for a, b in RESERVED_IGNORABLE):
    return ['xx']
  if any(a <= c <= b for a, b in CJK):
    return ['x', chr(c), 'x']
  return [f'x{chr(c)}x']


# The original's code, as released (only what the tokenizers use).


class VitJaxBertTokenizer:
  """vit_jax's preprocess.BertTokenizer (its dataclass written as a class)."""

  def __init__(self, vocab_path, max_len):
    self.max_len = max_len
    self._tokenizer = tensorflow_text.BertTokenizer(
      vocab_path, token_out_type=tf.int32, lower_case=True
    )
    with tf.io.gfile.GFile(vocab_path) as f:
      vocab = f.read().split('\n')
    self.cls_token = vocab.index('[CLS]')

  def _preprocess(self, texts):
    token_ids = self._tokenizer.tokenize(texts)
    tokens, mask = tensorflow_text.pad_model_inputs(token_ids, self.max_len - 1)
    del mask  # Recovered from zero padding in model.
    count = tf.shape(tokens)[0]
    return tf.concat([tf.fill([count, 1], self.cls_token), tokens], axis=1)

  def __call__(self, texts):
    return self._preprocess(tf.constant(texts)).numpy()


class VitJaxSentencepieceTokenizer:
  """vit_jax's preprocess.SentencepieceTokenizer."""

  def __init__(self, vocab_path, max_len):
    self.max_len = max_len
    self._tokenizer = tensorflow_text.SentencepieceTokenizer(
      model=tf.io.gfile.GFile(vocab_path, 'rb').read(), add_eos=True
    )
    self.eos_token = self._tokenizer.string_to_id('</s>')

  def preprocess_tf(self, text):
    tokens = self._tokenizer.tokenize(text)
    tokens = tokens[: self.max_len - 1]  # to guarantee eos at end
    return tf.pad(tokens, [(0, self.max_len - tf.shape(tokens)[0])], constant_values=self.eos_token)

  def __call__(self, texts):
    return tf.stack([self.preprocess_tf(text) for text in texts]).numpy()


def big_vision_tokenize(input_text, tokenizer, max_len, *, pad_value, force_eos):
  """big_vision's pp/ops_text.tokenize (multi_text=False)."""

  def pad(tokens):
    # Truncate/pad to max_len.
    if force_eos:
      tokens = tf.cond(
        tf.shape(tokens)[0] >= max_len,
        lambda: tf.concat(
          # For too long, cut them off, but do keep the final EOS token.
          [tokens[: max_len - 1], tokens[-1:]],
          axis=0,
        ),
        lambda: tf.pad(tokens, [(0, max_len - tf.shape(tokens)[0])], constant_values=pad_value),
      )
    else:
      tokens = tokens[:max_len]
      tokens = tf.pad(tokens, [(0, max_len - tf.shape(tokens)[0])], constant_values=pad_value)
    tokens.set_shape([max_len])
    return tokens

  tokens = tokenizer.tokenize(input_text)
  return pad(tokens)


def big_vision_pp_tokenize(model, texts, max_len, eos, pad_value, lower):
  """big_vision's `tokenize(max_len, eos, model, lower, pad_value)` pp op on each text
  (create_tokenizer, then `tf.strings.lower` when lower, then `tokenize`)."""
  tokenizer = tensorflow_text.SentencepieceTokenizer(model=model, add_eos=eos != 'none')
  if isinstance(pad_value, str):
    pad_value = tokenizer.string_to_id(pad_value)

  def one(txt):
    txt = tf.constant(txt)
    if lower:
      txt = tf.strings.lower(txt)
    return big_vision_tokenize(
      txt, tokenizer, max_len, pad_value=pad_value, force_eos=eos == 'sticky'
    ).numpy()

  return np.stack([one(t) for t in texts])


# The vocabularies.


def write_bert_vocab(path):
  """BERT's special lines, then pieces from TEXTS' words (tensorflow_text's BasicTokenizer)."""
  words = BasicTokenizer(lower_case=True).tokenize(TEXTS).flat_values.numpy()
  counts = {}
  for word in (w.decode('utf-8') for w in words):
    counts[word] = counts.get(word, 0) + 1
  by_count = sorted(counts, key=lambda w: (-counts[w], w))
  withheld = set('qz€😀我ж')  # no piece: words with these are [UNK] unless whole in the vocab
  chars = sorted({c for w in by_count for c in w} - withheld)
  pieces = [w for w in by_count[:150] if len(w) > 1 and len(w.encode()) <= 100]
  pieces += ['ж', '##ж', 'x', '##x', 'cat', '##s', '##ing', '##ed', '##er', '##ly', '##tion']
  pieces += ['un', '##believ', '##able', 'inter', '##national', 'play', 'run', '##ning']
  pieces += chars + ['##' + c for c in chars if c.isascii() or c in 'éöüαβж中文']
  special = ['[PAD]', *(f'[unused{i}]' for i in range(99)), '[UNK]', '[CLS]', '[SEP]', '[MASK]']
  lines = list(dict.fromkeys(special + pieces))  # each piece once, in order
  assert all(line and '\n' not in line and '\r' not in line for line in lines)
  with open(path, 'w', encoding='utf-8') as f:
    f.write('\n'.join(lines) + '\n')


def write_sentencepiece_models():
  """sp_unigram.model and sp_bpe.model, trained on TEXTS."""
  # The unigram model's normalisation: a few NFKC mappings (fullwidth letters, ligatures,
  # no-break and ideographic spaces), as sentencepiece's TSV rules (code points in hex).
  rules = [(f'{c:X}', f'{c - 0xFF21 + 0x41:X}') for c in range(0xFF21, 0xFF3B)]
  rules += [(f'{c:X}', f'{c - 0xFF41 + 0x61:X}') for c in range(0xFF41, 0xFF5B)]
  rules += [('FB01', '66 69'), ('FB02', '66 6C'), ('A0', '20'), ('3000', '20'), ('2460', '31')]
  tsv = os.path.join(HERE, 'sp_rules.tsv')
  with open(tsv, 'w') as f:
    f.write(''.join(f'{a}\t{b}\n' for a, b in rules))
  common = dict(num_threads=1, minloglevel=2, hard_vocab_limit=False)
  try:
    for name, options in {
      'sp_unigram.model': dict(
        model_type='unigram', vocab_size=1000, character_coverage=0.99,
        normalization_rule_tsv=tsv, pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
      ),
      'sp_bpe.model': dict(
        model_type='bpe', vocab_size=1200, character_coverage=0.9995, byte_fallback=True,
        split_digits=True, normalization_rule_name='identity', remove_extra_whitespaces=False,
      ),
    }.items():  # fmt: skip
      out = io.BytesIO()
      sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(TEXTS), model_writer=out, **common, **options
      )
      with open(os.path.join(HERE, name), 'wb') as f:
        f.write(out.getvalue())
  finally:
    os.remove(tsv)


# The oracle.


def trimmed(ids: np.ndarray, pad: int) -> list[list[int]]:
  """Each row without its trailing `pad` values (padding it back restores the row)."""
  rows = []
  for row in ids.tolist():
    while row and row[-1] == pad:
      row.pop()
    rows.append(row)
  return rows


def bert_entries(vocab_path):
  entries = []
  for max_len in MAX_LENS['bert']:
    ids = VitJaxBertTokenizer(vocab_path, max_len)(INPUTS)
    assert ids.shape == (len(INPUTS), max_len) and ids.dtype == np.int32
    entries.append(dict(max_len=max_len, pad=0, ids=trimmed(ids, 0)))
  return entries


def sentencepiece_entries(model_path):
  with open(model_path, 'rb') as f:
    model = f.read()
  max_lens = MAX_LENS[os.path.basename(model_path)]
  entries = []
  for max_len in max_lens['lit']:  # LiT: vit_jax's SentencepieceTokenizer
    tokenizer = VitJaxSentencepieceTokenizer(model_path, max_len)
    ids, eos = tokenizer(INPUTS), int(tokenizer.eos_token)
    entries.append(dict(options={}, max_len=max_len, pad=eos, ids=trimmed(ids, eos)))
  for mode, options in BIG_VISION.items():  # big_vision's pp op
    for max_len in max_lens[mode]:
      ids = big_vision_pp_tokenize(model, INPUTS, max_len, **options)
      pad = options['pad_value']
      entries.append(dict(options=options, max_len=max_len, pad=pad, ids=trimmed(ids, pad)))
  return entries


def words_digest(words) -> str:
  """A short digest of a list of words (they hold no '\\n': it is whitespace, a word break)."""
  return hashlib.sha256('\n'.join(words).encode('utf-8')).hexdigest()[:16]


def character_entries():
  """BasicTokenizer on every code point of PLANES, 'x' on either side of it: the code points
  Python's unicodedata leaves unassigned that tensorflow_text does not treat as unassigned
  (with their words), and a digest of the words of each block (the others joined by 'x')."""
  basic = BasicTokenizer(lower_case=True)

  def words(texts):
    return [[w.decode('utf-8') for w in row] for row in basic.tokenize(texts).to_list()]

  excluded = {}
  blocks = {}
  for start in PLANES:
    points = [c for c in range(start, start + BLOCK) if not 0xD800 <= c <= 0xDFFF]
    for c, row in zip(points, words([f'x{chr(c)}x' for c in points]), strict=True):
      if unicodedata.category(chr(c)) == 'Cn' and row != unassigned_words(c):
        excluded[f'{c:04X}'] = row
    kept = (chr(c) for c in points if f'{c:04X}' not in excluded)
    blocks[f'{start:04X}'] = words_digest(words(['x'.join(kept)])[0])
  return dict(block=BLOCK, unicode=unicodedata.unidata_version, excluded=excluded, blocks=blocks)


def dump(oracle, path):
  """JSON with each list of ids, or of words, on one line (the texts one a line)."""
  lines = []

  def mark(x, key=None):
    if isinstance(x, dict):
      return {k: mark(v, k) for k, v in x.items()}
    if isinstance(x, list) and key != 'texts':
      if x and all(isinstance(v, dict | list) for v in x):
        return [mark(v) for v in x]
      lines.append(json.dumps(x, ensure_ascii=False, separators=(',', ':')))
      return f'\0{len(lines) - 1}\0'  # replaced by the line below
    return x

  text = json.dumps(mark(oracle), ensure_ascii=False, indent=1)
  text = re.sub(r'"\\u0000(\d+)\\u0000"', lambda m: lines[int(m[1])], text)
  with open(path, 'w', encoding='utf-8') as f:
    f.write(text + '\n')


def main():
  vocab = os.path.join(HERE, 'bert_vocab.txt')
  write_bert_vocab(vocab)
  write_sentencepiece_models()
  oracle = dict(
    versions=dict(
      tensorflow=tf.__version__,
      tensorflow_text=tensorflow_text.__version__,
      sentencepiece=sentencepiece.__version__,
      python=sys.version.split()[0],
    ),
    texts=TEXTS,
    byte_texts=[t.hex() for t in BYTE_TEXTS],
    bert=dict(vocab='bert_vocab.txt', entries=bert_entries(vocab)),
    sentencepiece={
      name: sentencepiece_entries(os.path.join(HERE, name))
      for name in ('sp_unigram.model', 'sp_bpe.model')
    },
    characters=character_entries(),
  )
  dump(oracle, os.path.join(HERE, 'tokenizer_oracle.json'))


if __name__ == '__main__':
  main()
