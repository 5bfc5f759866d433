"""Tokenizers of the image-text models, identical to the original's (tensorflow_text).

`get_tokenizer(name, vocab_path, max_len)` gives a callable from a list of texts to an int32
array (len, max_len); its `preprocess_tf` does the same to a string tensor inside a TensorFlow
graph (a `tf.data` map), one text (shape ()) or a batch (shape (n,)).

- 'bert' (LiT's BERT towers): `tensorflow_text.BertTokenizer` on the vocabulary file (texts
  case-folded, NFD-normalised, accents stripped, split into word pieces), the pieces padded
  with 0 or clipped to max_len - 1, then the `[CLS]` id (its line index in the file)
  prepended. No `[SEP]`: the model pools the first token.
- 'sentencepiece' (LiT's small text towers, SigLIP): `tensorflow_text.SentencepieceTokenizer`
  on the model file, `</s>` appended, and big_vision's `tokenize` op (`eos`, `pad_value`,
  `lower`). The default is LiT's: clipped to max_len - 1, then padded with the `</s>` id, so
  the last position is always `</s>` (the model pools it). SigLIP's: `eos='sticky',
  pad_value=1, lower=True` (`</s>` kept at the end of a clipped text, padding 1, ASCII letters
  lower-cased as big_vision's pp does).

The vocabulary file is read through the path layer (a local or a gs:// path).
"""

import abc
import hashlib
import os
from collections.abc import Sequence

import numpy as np

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')  # TensorFlow's C++ start-up notices

import tensorflow as tf
import tensorflow_text

from vit_jax import files

TOKENIZERS = ('bert', 'sentencepiece')
EOS = ('sticky', 'yes', 'none')  # big_vision's `tokenize(eos=...)`


class Tokenizer(abc.ABC):
  """Texts to int32 token ids, `max_len` of them per text."""

  max_len: int
  vocab_size: int  # how many pieces the vocabulary file has

  @abc.abstractmethod
  def _tokenize(self, texts: tf.Tensor) -> tf.Tensor:
    """A batch of texts (n,) to int32 ids (n, max_len)."""

  def preprocess_tf(self, texts: tf.Tensor | str) -> tf.Tensor:
    """Tokenizes a text () to (max_len,), or texts (n,) to (n, max_len), in a TF graph."""
    texts = tf.convert_to_tensor(texts, tf.string)
    if texts.shape.rank == 0:
      return self._tokenize(texts[None])[0]
    if texts.shape.rank != 1:
      raise ValueError(f'expected one text or a vector of texts, got shape {texts.shape}')
    return self._tokenize(texts)

  def __call__(self, texts: Sequence[str]) -> np.ndarray:
    """Tokenizes a list of texts to an int32 numpy array (len(texts), max_len)."""
    if isinstance(texts, str | bytes):
      raise TypeError('expected a list of texts, got one text; wrap it in a list')
    return self._tokenize(tf.constant(list(texts), tf.string)).numpy()


def get_tokenizer(name: str, vocab_path: files.PathLike, max_len: int, **options) -> Tokenizer:
  """The tokenizer `name` ('bert' or 'sentencepiece') on the vocabulary at `vocab_path`;
  `options` are SentencepieceTokenizer's (`eos`, `pad_value`, `lower`)."""
  if name not in TOKENIZERS:
    raise ValueError(f'unknown tokenizer {name!r}; choose one of {", ".join(TOKENIZERS)}')
  if not isinstance(max_len, int | np.integer) or max_len < 1:
    raise ValueError(f'max_len must be a positive integer, got {max_len!r}')
  if name == 'bert':
    return BertTokenizer(vocab_path, max_len, **options)
  return SentencepieceTokenizer(vocab_path, max_len, **options)


def _read(vocab_path: files.PathLike) -> bytes:
  """The vocabulary file's bytes; a missing file is a one-line error naming it."""
  try:
    return files.path(vocab_path).read_bytes()
  except (FileNotFoundError, IsADirectoryError):
    raise FileNotFoundError(f'{vocab_path}: no such vocabulary file') from None


def _tf_file(data: bytes) -> str:
  """`data` as a file of TensorFlow's in-memory file system (named by its digest and kept for
  the process), so that TensorFlow reads a vocabulary from any path the path layer reads."""
  path = f'ram://vit_jax_text/{hashlib.sha256(data).hexdigest()}'
  if not tf.io.gfile.exists(path):
    tf.io.gfile.makedirs(os.path.dirname(path))
    with tf.io.gfile.GFile(path, 'wb') as f:
      f.write(data)
  return path


class BertTokenizer(Tokenizer):
  """The original's BertTokenizer: word pieces, padded with 0 or clipped to max_len - 1,
  after the `[CLS]` id."""

  def __init__(self, vocab_path: files.PathLike, max_len: int):
    data = _read(vocab_path)
    try:
      lines = data.decode('utf-8').split('\n')
    except UnicodeDecodeError:
      raise ValueError(
        f'{vocab_path}: not a BERT vocabulary (not UTF-8 text; a sentencepiece model goes with '
        "the 'sentencepiece' tokenizer)"
      ) from None
    if '[CLS]' not in lines:
      raise ValueError(f'{vocab_path}: not a BERT vocabulary (no [CLS] line)')
    self.max_len = max_len
    self.cls_token = lines.index('[CLS]')
    with tf.init_scope():  # built once, eagerly, even when constructed inside a tf.function
      # What tensorflow_text.BertTokenizer builds from a path: the whole line is the key, its
      # line number the id, one out-of-vocabulary bucket.
      lines_to_ids = tf.lookup.TextFileInitializer(
        _tf_file(data),
        key_dtype=tf.string,
        key_index=tf.lookup.TextFileIndex.WHOLE_LINE,
        value_dtype=tf.int64,
        value_index=tf.lookup.TextFileIndex.LINE_NUMBER,
      )
      table = tf.lookup.StaticVocabularyTable(lines_to_ids, num_oov_buckets=1)
      self._tokenizer = tensorflow_text.BertTokenizer(
        table, token_out_type=tf.int32, lower_case=True
      )
      self.vocab_size = int(table.size()) - 1

  def _tokenize(self, texts: tf.Tensor) -> tf.Tensor:
    pieces = self._tokenizer.tokenize(texts)  # (n, words, pieces)
    ids, _ = tensorflow_text.pad_model_inputs(pieces, self.max_len - 1)
    cls = tf.fill([tf.shape(ids)[0], 1], self.cls_token)
    return tf.concat([cls, ids], axis=1)


class SentencepieceTokenizer(Tokenizer):
  """Sentencepiece ids with `</s>` appended, fit to max_len as big_vision's `tokenize` op.

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
    model = _read(vocab_path)
    with tf.init_scope():
      try:
        self._tokenizer = tensorflow_text.SentencepieceTokenizer(model=model, add_eos=eos != 'none')
      except tf.errors.OpError:
        raise ValueError(
          f'{vocab_path}: not a sentencepiece model (a BERT vocabulary .txt goes with the '
          "'bert' tokenizer)"
        ) from None
      self.eos_token = int(self._tokenizer.string_to_id('</s>'))
      if eos != 'none' and self._tokenizer.tokenize('').numpy().tolist() != [self.eos_token]:
        raise ValueError(f'{vocab_path}: the sentencepiece model does not end texts with </s>')
      self.vocab_size = int(self._tokenizer.vocab_size())
    self.max_len = max_len
    self.eos = eos
    self.pad_value = self.eos_token if pad_value is None else pad_value
    self.lower = lower

  def _tokenize(self, texts: tf.Tensor) -> tf.Tensor:
    if self.lower:
      texts = tf.strings.lower(texts)
    ids = self._tokenizer.tokenize(texts)  # ragged (n, None)
    lengths = ids.row_lengths()
    if self.eos == 'sticky':
      ids = ids[:, : self.max_len - 1]
    ids = ids.to_tensor(self.pad_value, shape=[None, self.max_len])  # clipped, padded
    if self.eos != 'sticky':
      return ids
    clipped = lengths >= self.max_len  # then the last position is `</s>`, not padding
    last = tf.where(clipped, self.eos_token, self.pad_value)
    return tf.concat([ids[:, :-1], last[:, None]], axis=1)
