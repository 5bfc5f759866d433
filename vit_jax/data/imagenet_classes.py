"""ImageNet-1k's 1000 classes in label order: WordNet ids and readable names, shipped as
package data (`imagenet2012_classes.tsv`: `wnid<TAB>name` a line).

The file is generated once from the source text of tensorflow_datasets (its
`datasets/imagenet2012/labels.txt` for the ids, the `IMAGENET_LABELS_LIST` literal of
`datasets/siscore/labels.py` for the names, read with `ast.literal_eval`, never imported):

  python -m vit_jax.data.imagenet_classes
"""

import ast
import importlib.util
import sys
from pathlib import Path

NUM_CLASSES = 1000
FILE = Path(__file__).with_name('imagenet2012_classes.tsv')


def read() -> tuple[list[str], list[str]]:
  """(WordNet ids, names) of the 1000 classes, from the package data."""
  rows = [line.split('\t') for line in FILE.read_text().splitlines() if line]
  if len(rows) != NUM_CLASSES or any(len(r) != 2 for r in rows):
    raise ValueError(f'{FILE}: expected {NUM_CLASSES} lines of wnid<TAB>name.')
  return [r[0] for r in rows], [r[1] for r in rows]


def _from_tfds(root: Path) -> tuple[list[str], list[str]]:
  wnids = (root / 'datasets' / 'imagenet2012' / 'labels.txt').read_text().split()
  tree = ast.parse((root / 'datasets' / 'siscore' / 'labels.py').read_text())
  names = next(
    ast.literal_eval(node.value)
    for node in tree.body
    if isinstance(node, ast.Assign)
    and len(node.targets) == 1
    and getattr(node.targets[0], 'id', None) == 'IMAGENET_LABELS_LIST'
  )
  if len(wnids) != NUM_CLASSES or len(names) != NUM_CLASSES:
    raise ValueError(f'{root}: expected {NUM_CLASSES} ids and names.')
  return wnids, [str(n) for n in names]


def main() -> None:
  spec = importlib.util.find_spec('tensorflow_datasets')  # located, not imported
  root = Path(next(iter(spec.submodule_search_locations)))
  wnids, names = _from_tfds(root)
  if any('\t' in n or '\n' in n for n in names):
    sys.exit('A class name holds a tab or a newline.')
  FILE.write_text(''.join(f'{w}\t{n}\n' for w, n in zip(wnids, names, strict=True)))
  print(f'Wrote {FILE} ({NUM_CLASSES} classes).')


if __name__ == '__main__':
  main()
