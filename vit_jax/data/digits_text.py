"""Captions of the bundled digits, and the WordPiece vocabulary built from them.

The digits have no captions: an image's captions are its class name in `TRAIN_TEMPLATES`
(image-text training, configs/lit_digits.py); zero-shot classification embeds the class
names in `HELD_OUT_TEMPLATES`, which training never sees. No released vocabulary can be
downloaded here, so the vocabulary is built from every caption of both sets (the words of
the held-out templates must have ids too) by this module and shipped beside it:

  python -m vit_jax.data.digits_text      # writes vit_jax/data/vocab/digits.txt

A BERT vocabulary (`text.BertTokenizer`): BERT's special tokens, then every word of the
captions as BERT's BasicTokenizer splits it, sorted; WordPiece then finds each word whole.
"""

import sys
from pathlib import Path

from vit_jax import text

# The digits source's class names (`DigitsSource().class_names()`), which the captions fill in.
CLASS_NAMES = tuple(str(i) for i in range(10))
TRAIN_TEMPLATES = (
  'a photo of the digit {}.',
  'the number {}.',
  'a handwritten {}.',
  'a small image of a {}.',
  'a blurry {}.',
  'this is a {}.',
)
HELD_OUT_TEMPLATES = (
  'a drawing of the digit {}.',
  'a scan of a handwritten {}.',
  'the numeral {}.',
)
SPECIAL = ('[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]')
VOCAB = Path(__file__).parent / 'vocab' / 'digits.txt'


def captions(templates=TRAIN_TEMPLATES) -> list[str]:
  """Every class name in every template, class by class."""
  return [t.format(name) for name in CLASS_NAMES for t in templates]


def vocabulary() -> list[str]:
  words = {
    w for c in captions(TRAIN_TEMPLATES + HELD_OUT_TEMPLATES) for w in text.basic_tokenize(c)
  }
  return [*SPECIAL, *sorted(words)]


def main(argv: list[str]) -> None:
  path = Path(argv[1]) if len(argv) > 1 else VOCAB
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(''.join(f'{w}\n' for w in vocabulary()))
  print(f'Wrote {path}: {len(vocabulary())} tokens.')


if __name__ == '__main__':
  main(sys.argv)
