"""Vocabulary files for the tokenizer tests, written by the tests: a BERT WordPiece vocabulary
laid out as BERT's own (`[PAD]`, `[unused0..98]`, `[UNK]` = 100, `[CLS]` = 101, `[SEP]`,
`[MASK]`, then the pieces) and a sentencepiece word model whose ids are the positions of its
pieces. (tests/data holds the vocabularies of the comparisons with tensorflow_text.)"""

from sentencepiece import sentencepiece_model_pb2

BERT_SPECIAL = ['[PAD]', *(f'[unused{i}]' for i in range(99)), '[UNK]', '[CLS]', '[SEP]', '[MASK]']
BERT_PIECES = [
  'the', 'cat', 'sat', 'on', 'a', 'mat', '##s', '!', '.', ',', "'", '-', 'don', 't', 'stop',
  'uber', 'cafe', 'naive', 'strasse', 'istanbul', 'zurich', '中', '文', '😀',
]  # fmt: skip
BERT_VOCAB = BERT_SPECIAL + BERT_PIECES
UNK, CLS = 100, 101
BERT_ID = {piece: BERT_VOCAB.index(piece) for piece in BERT_PIECES}

# The word model: <unk> 0, <s> 1, </s> 2 (sentencepiece's default ids), then one piece a word.
SP_WORDS = ['a', 'cat', 'sat', 'ä', 'zürich', '中文', '😀']
SP_UNK, SP_EOS = 0, 2
SP_ID = {word: 3 + i for i, word in enumerate(SP_WORDS)}


def write_bert_vocab(path, lines=BERT_VOCAB) -> str:
  """A WordPiece vocabulary file: one piece a line, the id of a piece its line index."""
  with open(path, 'w', encoding='utf-8') as f:
    f.write('\n'.join(lines) + '\n')
  return str(path)


def word_model(words=SP_WORDS) -> bytes:
  """A serialised sentencepiece model that splits on spaces and maps each word of `words` to
  3 + its index, any other word to <unk> (0); no normalisation but the whitespace rules."""
  model = sentencepiece_model_pb2.ModelProto()
  spec = model.trainer_spec
  spec.model_type = sentencepiece_model_pb2.TrainerSpec.WORD
  spec.unk_id, spec.bos_id, spec.eos_id, spec.pad_id = 0, 1, 2, -1
  model.normalizer_spec.name = 'identity'
  model.normalizer_spec.add_dummy_prefix = True
  model.normalizer_spec.remove_extra_whitespaces = True
  model.normalizer_spec.escape_whitespaces = True
  piece = sentencepiece_model_pb2.ModelProto.SentencePiece
  model.pieces.add(piece='<unk>', score=0.0, type=piece.UNKNOWN)
  model.pieces.add(piece='<s>', score=0.0, type=piece.CONTROL)
  model.pieces.add(piece='</s>', score=0.0, type=piece.CONTROL)
  for word in words:
    model.pieces.add(piece='\u2581' + word, score=0.0, type=piece.NORMAL)
  return model.SerializeToString()
