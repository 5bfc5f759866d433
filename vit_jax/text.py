"""Tokenizers of the image-text models: the ids of the original's (tensorflow_text), without it.

`get_tokenizer` (a name, a vocabulary path, max_len) gives a callable from a list of texts to
an int32 array (len, max_len); its `preprocess_tf` does the same to a string tensor inside a
TensorFlow graph (a `tf.data` map), one text (shape ()) or a batch (shape (n,)).

A model's tokenizer is its family's to choose: `vit_jax.families.two_towers.tokenizer(pp,
vocab)`, the one caller of `get_tokenizer` in vit_jax, reads the settings off the model
config's `pp`.

- 'bert' (LiT's BERT towers): `tensorflow_text.BertTokenizer(lower_case=True)` written out:
  texts folded as ICU's NFKC_Casefold (case, compatibility forms and default-ignorable
  characters), NFD-normalised, nonspacing marks (Mn) dropped, control and format characters
  (Cc, Cf) made spaces, split at ASCII whitespace, at punctuation and at each CJK ideograph, then
  WordPiece (greedy longest match first, '##' continuations, `[UNK]` for a word of no pieces or
  of over 100 bytes). The pieces are padded with 0 or clipped to max_len - 1, then the `[CLS]` id
  (its line index in the file) goes first. No `[SEP]`: the model pools the first token.
- 'sentencepiece' (LiT's small text towers, SigLIP): the sentencepiece library (the one
  tensorflow_text's SentencepieceTokenizer wraps) on the model file, `</s>` appended, fit to
  max_len as big_vision's `tokenize` op (`eos`, `pad_value`, `lower`). The default is LiT's:
  clipped to max_len - 1, then padded with the `</s>` id, so the last position is always `</s>`
  (the model pools it). SigLIP's: `eos='sticky', pad_value=1, lower=True` (`</s>` kept at the
  end of a clipped text, padding 1, ASCII letters lower-cased as big_vision's pp does).
  The EOS is the model's own (`eos_id`: `</s>` in these models).
- 'gemma' (SigLIP 2): big_vision's `tok(model=gemma, bos=no, eos=sticky)` on Gemma's
  sentencepiece model: no `<bos>`, `<eos>` (id 1) appended and kept last in a clipped text,
  padding with the pad id 0 (not the EOS, as SigLIP 1 padded). The file must have Gemma's ids
  (pad 0, eos 1, bos 2, unk 3), else a one-line error.

Unicode properties come from Python's `unicodedata`, whose Unicode version may be older than
the ICU and RE2 tables inside tensorflow_text: a character assigned after it is left as it is.
The vocabulary file is read through the path layer (a local or a gs:// path). TensorFlow is
imported only by `preprocess_tf`.
"""

import abc
import functools
import itertools
import unicodedata
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from vit_jax import files

if TYPE_CHECKING:
  import tensorflow as tf

TOKENIZERS = ('bert', 'sentencepiece', 'gemma')


def sentencepiece_module():
  """sentencepiece, imported on first use: the core install leaves it to the extra [text]."""
  try:
    import sentencepiece
  except ImportError:
    raise ImportError(
      "sentencepiece is missing: the image-text tokenizers need it: pip install 'vit_jax[text]'"
    ) from None
  return sentencepiece


# Gemma's special ids (its tokenizer.model): pad, eos, bos, unk.
GEMMA_IDS = {'pad': 0, 'eos': 1, 'bos': 2, 'unk': 3}
EOS = ('sticky', 'yes', 'none')  # big_vision's `tokenize(eos=...)`
MAX_BYTES_PER_WORD = 100  # tensorflow_text's WordpieceTokenizer default: longer words are [UNK]

# Unicode's Default_Ignorable_Code_Point (DerivedCoreProperties.txt): NFKC_Casefold drops them.
_DEFAULT_IGNORABLE = dict.fromkeys(
  itertools.chain.from_iterable(
    range(first, last + 1)
    for first, last in (
      (0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160),
      (0x17B4, 0x17B5), (0x180B, 0x180F), (0x200B, 0x200F), (0x202A, 0x202E),
      (0x2060, 0x206F), (0x3164, 0x3164), (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF),
      (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A),
      (0xE0000, 0xE0FFF),
    )
  )
)  # fmt: skip
# tensorflow_text's bert_tokenizer._DELIM_REGEX: words end at whitespace (RE2's \s), and
# ASCII punctuation and symbols, Unicode punctuation and CJK ideographs are words of their own.
_WHITESPACE = frozenset(' \t\n\f\r')
_PUNCTUATION = frozenset('!"#$%&\'()*+,-./:;<=>?@[\\]^_`{|}~')
_CJK = (
  (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
  (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
)  # fmt: skip


class Tokenizer(abc.ABC):
  """Texts to int32 token ids, `max_len` of them per text."""

  max_len: int
  vocab_size: int  # how many pieces the vocabulary file has

  @abc.abstractmethod
  def _tokenize(self, texts: list[bytes]) -> np.ndarray:
    """UTF-8 texts (as a tf.string holds them: maybe not valid) to int32 ids (len, max_len)."""

  def __call__(self, texts: Sequence[str | bytes]) -> np.ndarray:
    """Tokenizes a list of texts (str, or UTF-8 bytes) to an int32 array (len, max_len)."""
    if isinstance(texts, str | bytes):
      raise TypeError('expected a list of texts, got one text; wrap it in a list')
    return self._tokenize([t if isinstance(t, bytes) else t.encode('utf-8') for t in texts])

  def preprocess_tf(self, texts: 'tf.Tensor | str | Sequence[str]') -> 'tf.Tensor':
    """Tokenizes a text () to (max_len,), or texts (n,) to (n, max_len), in a TF graph (a
    tf.numpy_function: map it over batches of texts rather than over single texts)."""
    import tensorflow as tf  # here only: tokenizing lists of texts needs no TensorFlow

    texts = tf.convert_to_tensor(texts, tf.string)
    if texts.shape.rank not in (0, 1):
      raise ValueError(f'expected one text or a vector of texts, got shape {texts.shape}')
    batch = texts[None] if texts.shape.rank == 0 else texts
    ids = tf.numpy_function(lambda t: self(list(t)), [batch], tf.int32, stateful=False)
    ids.set_shape([batch.shape[0], self.max_len])
    return ids[0] if texts.shape.rank == 0 else ids


def get_tokenizer(name: str, vocab_path: files.PathLike, max_len: int, **options) -> Tokenizer:
  """The tokenizer `name` ('bert', 'sentencepiece' or 'gemma') on the vocabulary at
  `vocab_path`; `options` are SentencepieceTokenizer's (`eos`, `pad_value`, `lower`)."""
  if name not in TOKENIZERS:
    raise ValueError(f'unknown tokenizer {name!r}; choose one of {", ".join(TOKENIZERS)}')
  if not isinstance(max_len, int | np.integer) or max_len < 1:
    raise ValueError(f'max_len must be a positive integer, got {max_len!r}')
  if name == 'bert':
    return BertTokenizer(vocab_path, int(max_len), **options)
  if name == 'gemma':
    return _gemma(vocab_path, int(max_len), **options)
  return SentencepieceTokenizer(vocab_path, int(max_len), **options)


def _gemma(vocab_path: files.PathLike, max_len: int, **options) -> 'SentencepieceTokenizer':
  """SigLIP 2's tokenizer: a sentencepiece model with Gemma's special ids, sticky `<eos>`,
  padding with the pad id."""
  options = {'eos': 'sticky', 'pad_value': GEMMA_IDS['pad'], **options}
  tokenizer = SentencepieceTokenizer(vocab_path, max_len, **options)
  processor = tokenizer._processor
  ids = {'pad': processor.pad_id(), 'eos': processor.eos_id()}
  ids |= {'bos': processor.bos_id(), 'unk': processor.unk_id()}
  if ids != GEMMA_IDS:
    raise ValueError(
      f"{vocab_path}: not a Gemma tokenizer model (its ids {ids}; Gemma's {GEMMA_IDS}): "
      "SigLIP 2 reads Gemma's tokenizer.model"
    )
  return tokenizer


def _read(vocab_path: files.PathLike) -> bytes:
  """The vocabulary file's bytes; a missing file is a one-line error naming it."""
  try:
    return files.path(vocab_path).read_bytes()
  except (FileNotFoundError, IsADirectoryError):
    raise FileNotFoundError(f'{vocab_path}: no such vocabulary file') from None


def _fit(rows: Iterable[list[int]], max_len: int, pad_value: int) -> np.ndarray:
  """Each row clipped to max_len and padded with pad_value: an int32 array (rows, max_len)."""
  rows = [row[:max_len] for row in rows]
  ids = np.full((len(rows), max_len), pad_value, np.int32)
  filled = np.arange(max_len) < np.array([len(row) for row in rows], np.int64)[:, None]
  ids[filled] = np.fromiter(itertools.chain.from_iterable(rows), np.int32)  # row-major order
  return ids


# BERT.


def nfkc_casefold(text: str) -> str:
  """ICU's NFKC_Casefold (tensorflow_text's case_fold_utf8): NFKC, full case folding and the
  default-ignorable characters dropped, repeated until nothing changes (as Unicode defines it)."""
  while True:
    folded = unicodedata.normalize('NFKC', text).casefold().translate(_DEFAULT_IGNORABLE)
    folded = unicodedata.normalize('NFKC', folded)
    if folded == text:
      return folded
    text = folded


class _Characters(dict):
  """A `str.translate` table, filled as characters come, for what BasicTokenizer does to each
  character after NFD: a nonspacing mark (Mn) is dropped; whitespace (RE2's \\s: ASCII only),
  a control (Cc) or a format (Cf) character becomes a space; ASCII punctuation and symbols, any
  Unicode punctuation (P*) and a CJK ideograph become words of their own."""

  def __missing__(self, code: int) -> str:
    c = chr(code)
    category = unicodedata.category(c)
    if category == 'Mn':
      self[code] = ''
    elif c in _WHITESPACE or category in ('Cc', 'Cf'):
      self[code] = ' '
    elif c in _PUNCTUATION or category[0] == 'P' or any(a <= code <= b for a, b in _CJK):
      self[code] = f' {c} '
    else:
      self[code] = c
    return self[code]


_CHARACTERS = _Characters()


def basic_tokenize(text: str) -> list[str]:
  """tensorflow_text's BasicTokenizer(lower_case=True): the words WordPiece splits."""
  text = text.lower() if text.isascii() else unicodedata.normalize('NFD', nfkc_casefold(text))
  return [word for word in text.translate(_CHARACTERS).split(' ') if word]


def _vocabulary(data: bytes, vocab_path: files.PathLike) -> list[str]:
  """The lines of a BERT vocabulary file, a piece a line (the line index its id), read as
  tensorflow_text reads it (TensorFlow's text-file table: '\\r' before '\\n' dropped, a
  repeated or an empty line refused)."""
  try:
    text = data.decode('utf-8')
  except UnicodeDecodeError:
    raise ValueError(
      f'{vocab_path}: not a BERT vocabulary (not UTF-8 text; a sentencepiece model goes with '
      "the 'sentencepiece' tokenizer)"
    ) from None
  lines = [line.removesuffix('\r') for line in text.removesuffix('\n').split('\n')]
  if '' in lines:
    raise ValueError(f'{vocab_path}: not a BERT vocabulary (line {lines.index("") + 1} is empty)')
  if len(set(lines)) != len(lines):
    repeated = next(line for i, line in enumerate(lines) if line in lines[:i])
    raise ValueError(f'{vocab_path}: not a BERT vocabulary ({repeated!r} is on two lines)')
  if '[CLS]' not in lines:
    raise ValueError(f'{vocab_path}: not a BERT vocabulary (no [CLS] line)')
  return lines


class BertTokenizer(Tokenizer):
  """The original's BertTokenizer: word pieces, padded with 0 or clipped to max_len - 1,
  after the `[CLS]` id."""

  def __init__(self, vocab_path: files.PathLike, max_len: int):
    lines = _vocabulary(_read(vocab_path), vocab_path)
    self.max_len = max_len
    self.vocab_size = len(lines)
    self._ids = {piece: i for i, piece in enumerate(lines)}
    self.cls_token = self._ids['[CLS]']
    # Without an [UNK] line, tensorflow_text's table gives its one out-of-vocabulary id.
    self.unk_token = self._ids.get('[UNK]', len(lines))
    self._word_ids = functools.lru_cache(maxsize=1 << 16)(self._wordpiece)

  def _wordpiece(self, word: str) -> tuple[int, ...]:
    """WordPiece: the longest piece in the vocabulary first, '##' before a continuation; a
    word that does not split into pieces, or has over MAX_BYTES_PER_WORD bytes, is [UNK]."""
    if len(word.encode('utf-8', 'surrogateescape')) > MAX_BYTES_PER_WORD:
      return (self.unk_token,)
    ids, start = [], 0
    while start < len(word):
      prefix = '##' if start else ''
      for end in range(len(word), start, -1):
        piece = self._ids.get(prefix + word[start:end])
        if piece is not None:
          ids.append(piece)
          start = end
          break
      else:
        return (self.unk_token,)
    return tuple(ids)

  def _tokenize(self, texts: list[bytes]) -> np.ndarray:
    # A byte that is not UTF-8 stays a character of its word (a lone surrogate), which no
    # piece matches, as in tensorflow_text.
    words = (basic_tokenize(t.decode('utf-8', 'surrogateescape')) for t in texts)
    rows = ([self.cls_token, *itertools.chain.from_iterable(map(self._word_ids, w))] for w in words)
    return _fit(rows, self.max_len, 0)


# Sentencepiece.


class SentencepieceTokenizer(Tokenizer):
  """Sentencepiece ids with the EOS (`</s>`) appended, fit to max_len as big_vision's
  `tokenize` op.

  eos: 'sticky' (a text clipped to max_len keeps `</s>` last), 'yes' (`</s>` appended, then
    clipped), 'none' (no `</s>`).
  pad_value: the id that fills short texts; None: the `</s>` id (LiT: with 'sticky' the last
    position is always `</s>`).
  lower: lower-case ASCII letters first (`tf.strings.lower`, as big_vision's pp for SigLIP).
  """

  def __init__(
    self,
    vocab_path: files.PathLike,
    max_len: int,
    *,
    eos: str = 'sticky',
    pad_value: int | None = None,
    lower: bool = False,
  ):
    if eos not in EOS:
      raise ValueError(f'eos={eos!r}: choose one of {", ".join(EOS)}')
    model, sentencepiece = _read(vocab_path), sentencepiece_module()
    try:  # (sentencepiece takes empty bytes for no model at all)
      processor = sentencepiece.SentencePieceProcessor(model_proto=model) if model else None
    except RuntimeError:
      processor = None
    if processor is None:
      raise ValueError(
        f'{vocab_path}: not a sentencepiece model (a BERT vocabulary .txt goes with the '
        "'bert' tokenizer)"
      )
    self._processor = processor
    self.eos_token = processor.eos_id()  # `</s>` in LiT's and SigLIP's models, Gemma's `<eos>`
    if eos != 'none' and (
      self.eos_token < 0 or processor.encode('', add_eos=True) != [self.eos_token]
    ):
      raise ValueError(f'{vocab_path}: the sentencepiece model has no end-of-text piece')
    self.vocab_size = processor.get_piece_size()
    self.max_len = max_len
    self.eos = eos
    self.pad_value = self.eos_token if pad_value is None else pad_value
    self.lower = lower

  def _tokenize(self, texts: list[bytes]) -> np.ndarray:
    if self.lower:  # bytes.lower, as tf.strings.lower: ASCII letters only
      texts = [t.lower() for t in texts]
    rows = self._processor.encode(texts, add_eos=self.eos != 'none', num_threads=1)
    if self.eos != 'sticky':
      return _fit(rows, self.max_len, self.pad_value)
    ids = _fit((row[: self.max_len - 1] for row in rows), self.max_len, self.pad_value)
    clipped = np.array([len(row) >= self.max_len for row in rows], bool)
    ids[clipped, -1] = self.eos_token  # a clipped text keeps its `</s>` last
    return ids
