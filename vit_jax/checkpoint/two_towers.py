"""Image-text (two-tower) checkpoints: LiT's released .npz files and big_vision's (SigLIP).

Layouts read (flat '/'-joined keys of an .npz):

* LiT (`gs://vit_models/lit/{name}.npz`): `img/...`, the image ViT in the original vit_jax
  layout (Linen names; pre-Linen ones are renumbered as for any ViT file); `txt/...`, the text
  tower: flaxformer's BERT (`txt/BertEncoder_0/...`) or the simple text transformer
  (`txt/Embed_0`, `txt/pos_embedding`, `txt/Encoder_0/encoderblock_{i}`, `.../encoder_norm`);
  a `head` per tower where the model's out_dim has one; the scalar `t` (shape (1,)).
* big_vision (`two_towers.Model` checkpoints, e.g. SigLIP's `webli_en_*.npz`): the same towers
  under `params/`, the image tower in big_vision's ViT layout (read as `npz` reads a
  big_vision ViT: top-level `pos_embedding`, scan-stacked `Transformer/encoderblock`, a MAP
  head), the text tower scan-stacked as `Encoder_0/encoderblock` (unstacked here; an
  `Encoder_0/pos_embedding` of older files is added into `pos_embedding`, as big_vision's
  loader does), `t` and the learned logit bias `b`.

A file is an image-text model when it holds an image tower (`img/embedding/kernel`) and a text
tower of one of the two kinds, under no prefix or `params/`; any other file is read by `npz`
as one ViT (of a big_vision file whose text tower is incomplete, the image tower, the rest
named as left out). `PATH:img` reads the image tower of an image-text file alone, as a ViT.

Our tree: `{'img': the ViT tree, 'txt': the text tower's tree, 't': (1,), 'b': (1,)}` (the
params of `vit_jax.models.TwoTowerModel`). `save_npz` writes it in the LiT layout: `img/` in
our (Linen) names with the image tower's `Transformer/posembed_input`, `txt/`, `t`, `b`:
a LiT file read and written back has its own keys, shapes and values.
"""

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

import ml_collections
import numpy as np
from etils.epath import Path

from vit_jax import families, files, rundir
from vit_jax.checkpoint import hf_siglip, npz
from vit_jax.checkpoint.surgery import LoadReport, merge_pretrained
from vit_jax.checkpoint.tree import CheckpointError, flatten, shape_str, unflatten
from vit_jax.families.two_towers import TOWERS, owns_tree, text_length, text_model_of
from vit_jax.flat import as_flat
from vit_jax.models import model_from_config
from vit_jax.models.two_towers import out_dims

SCALARS = ('t', 'b')  # the log temperature; SigLIP's learned logit bias
PREFIXES = ('', 'params/')
# Beside FILE.npz, as the released LiT files have them: the vocabulary (FILE.txt for BERT,
# FILE.model for sentencepiece), and FILE.json (`npz.write_sidecar`), what `convert` of a run
# adds (`Uses`).
VOCAB_SUFFIX = {'bert': '.txt', 'sentencepiece': '.model', 'gemma': '.model'}
# Image-text files can be read for one tower alone: `PATH:img` is the image ViT.
_TOWER_SUFFIX = re.compile(r'^(?P<path>.+):(?P<tower>img)$')
# The text tower fields its parameter shapes show.


def split_tower(path: Any) -> tuple[Any, str | None]:
  """`'file.npz:img'` -> `('file.npz', 'img')`; any other path -> `(path, None)`."""
  match = _TOWER_SUFFIX.match(str(path))
  if match is None:
    return path, None
  return match.group('path'), match.group('tower')


@dataclasses.dataclass(frozen=True)
class Uses:
  """How an image-text checkpoint is used beyond its weights: the tokenizer's vocabulary
  file (None where none is known), and the zero-shot templates it was evaluated with."""

  vocab: str | None
  templates: tuple[str, ...] | None = None
  canonicalize: bool = True


def _zeroshot_settings(config: Mapping[str, Any]) -> dict[str, Any]:
  """The settings of a run's zero-shot evaluator (config.json): its first of type 'zeroshot'
  in `evals`, or the flat `zeroshot` section where `zeroshot_every` ran it; {} for none."""
  named = [e for e in (config.get('evals') or {}).values() if e.get('type') == 'zeroshot']
  if named:
    return named[0]
  return (config.get('zeroshot') or {}) if config.get('zeroshot_every') else {}


def uses(path: Any, tokenizer_name: str, vocab: str | None = None) -> Uses:
  """A training run's (its config.json: its zero-shot evaluator's vocabulary or
  `config.pp.vocab`, and the evaluator's templates), or a file's (the first of `vocab_places`
  that exists, FILE.json); `vocab` (a --vocab flag), where given, is the vocabulary."""
  run = rundir.find_run(path)
  if run is not None:
    config = rundir.read_config(run)
    evaluated, pp = _zeroshot_settings(config), config.get('pp') or {}
    found = evaluated.get('vocab') or (config.get('zeroshot') or {}).get('vocab')
    found = found or pp.get('vocab') or None
  else:
    found = None if vocab else _vocab_beside(path, tokenizer_name)
    evaluated = npz.read_sidecar(path).get('zeroshot') or {}
  templates = tuple(evaluated['templates']) if evaluated.get('templates') else None
  return Uses(vocab or found, templates, bool(evaluated.get('canonicalize', True)))


def vocab_places(path: Any, tokenizer_name: str) -> list[str]:
  """Where a checkpoint's vocabulary is looked for: a training run's config.json (its
  zero-shot evaluator's `vocab`, `pp.vocab`); a Hugging Face SigLIP directory's file of the
  tokenizer (spiece.model: SigLIP's sentencepiece; tokenizer.model: Gemma's); for a file,
  FILE.txt or FILE.model beside FILE.npz, then that Hugging Face file in the file's folder
  (as for a folder's model.safetensors)."""
  run = rundir.find_run(path)
  if run is not None:
    return [f"{run / rundir.CONFIG_FILE} (pp.vocab, a zeroshot evaluator's vocab)"]
  # transformers' file of this tokenizer (a BERT vocabulary has none).
  hf_name = (
    [hf_siglip.TOKENIZERS[tokenizer_name][1]] if tokenizer_name in hf_siglip.TOKENIZERS else []
  )
  if files.path(path).is_dir():
    return [str(files.path(path) / name) for name in hf_name or hf_siglip.VOCAB_FILES]
  folder = files.path(path).parent
  return [npz.stem(path) + VOCAB_SUFFIX[tokenizer_name], *(str(folder / name) for name in hf_name)]


def missing_vocab(path: Any, tokenizer_name: str, flag: str | None = '--vocab') -> str:
  """THE line for a checkpoint whose vocabulary was not found: every place looked (as
  `vocab_places`), and the flag that gives it (None: the command has none)."""
  places = ' or '.join(vocab_places(path, tokenizer_name))
  line = f'no tokenizer vocabulary beside the checkpoint: expected {places} (a {tokenizer_name}'
  return line + (f' vocabulary); give it with {flag}=FILE' if flag else ' vocabulary)')


def vocab_tokenizer(config: Any, vocab: str) -> Any:
  """The tokenizer of the image-text model `config` on the vocabulary file `vocab`, checked
  against its text tower: a vocabulary of more pieces than it embeds is not its own."""
  tokenizer = families.of_config(config).tokenizer(dict(config.get('pp') or {}), vocab)
  rows = dict(config.text)['vocab_size']
  if tokenizer.vocab_size > rows:
    raise ValueError(
      f'{vocab}: {tokenizer.vocab_size} pieces, but the text tower embeds {rows}: not this '
      "checkpoint's vocabulary"
    )
  return tokenizer


def _vocab_beside(path: Any, tokenizer_name: str) -> str | None:
  """The first of `vocab_places` outside a run that exists; None if none does."""
  found = [files.path(p) for p in vocab_places(path, tokenizer_name)]
  return next((str(p) for p in found if p.exists()), None)


def write_beside(path: Any, model_fields: Mapping[str, Any], used: Uses) -> list[str]:
  """Beside the .npz at `path`: the vocabulary under the released name and FILE.json (the
  model's stated fields, the zero-shot settings), so the file is used as its run was; the
  paths written."""
  written = []
  name = dict(model_fields.get('pp') or {}).get('tokenizer_name', 'bert')
  if used.vocab is not None:
    vocab = npz.stem(path) + VOCAB_SUFFIX[name]
    files.atomic_write(vocab, lambda f: f.write(files.path(used.vocab).read_bytes()))
    written.append(vocab)
  zeroshot = None
  if used.templates is not None:
    zeroshot = {'templates': list(used.templates), 'canonicalize': used.canonicalize}
  return [*written, *npz.write_sidecar(path, model_fields, zeroshot=zeroshot)]


def holds_towers(path: Any) -> bool:
  """Whether the .npz at `path` holds an image-text model (its keys are read, not its
  arrays)."""
  with files.path(path).open('rb') as f, np.load(f, allow_pickle=False) as archive:
    return _layout_prefix(dict.fromkeys(archive.files)) is not None


def _layout_prefix(flat: Mapping[str, Any]) -> str | None:
  """The prefix under which `flat` holds an image-text model, or None."""
  for prefix in PREFIXES:
    if f'{prefix}img/embedding/kernel' in flat and text_model_of(flat, f'{prefix}txt/'):
      return prefix
  return None


def _sub(flat: Mapping[str, Any], prefix: str) -> dict[str, Any]:
  return {k[len(prefix) :]: v for k, v in flat.items() if k.startswith(prefix)}


def _text_tree(flat: dict[str, np.ndarray], source: str) -> tuple[dict, str]:
  """A text tower's flat dict -> (our tree, a description)."""
  npz.check_arrays(flat, source)
  text_model = text_model_of(flat)
  if text_model == 'bert':
    return unflatten(flat), 'BERT'
  tree = npz.convert_pre_linen(unflatten(flat))
  encoder = tree['Encoder_0']
  parts = ['text transformer']
  if npz.unstack_blocks(encoder, 'txt/Encoder_0'):
    parts.append('scan-stacked blocks')
  if 'pos_embedding' in encoder:  # older big_vision files added a second one in the encoder
    tree['pos_embedding'] = tree.get('pos_embedding', 0) + encoder.pop('pos_embedding')
    parts.append('Encoder_0/pos_embedding added into pos_embedding')
  return tree, ', '.join(parts)


def _scalars(flat: Mapping[str, Any], prefix: str, source: str) -> dict[str, np.ndarray]:
  """`t` (required) and `b` (if present) as (1,) float arrays."""
  if f'{prefix}t' not in flat:
    raise CheckpointError(f'{source}: an image-text model without its temperature {prefix}t')
  out = {}
  for name in SCALARS:
    value = flat.get(f'{prefix}{name}')
    if value is not None:
      if np.size(value) != 1:
        raise CheckpointError(
          f'{source}: {prefix}{name} has shape {shape_str(np.shape(value))}; expected (1,)'
        )
      out[name] = np.reshape(value, (1,))
  npz.check_arrays(out, source)
  return out


def _strip_npz(description: str) -> str:
  return description.removeprefix('npz (').removesuffix(')')


def from_flat(
  flat: dict[str, np.ndarray], source: str = 'checkpoint', tower: str | None = None
) -> tuple[dict, str]:
  """A flat .npz dict -> (our tree, a description): an image-text model's towers, its image
  tower alone (`tower='img'`), or for any other file what `npz.from_flat` reads."""
  prefix = _layout_prefix(flat)
  if prefix is None:
    if tower:
      raise CheckpointError(
        f'{source}:{tower}: the file holds no image-text model (no img/ and txt/ towers);'
        f' drop ":{tower}" to read it'
      )
    return npz.from_flat(flat, source)
  img, img_note = npz.from_flat(_sub(flat, f'{prefix}img/'), f'{source}:img')
  where = f', prefix {prefix!r}' if prefix else ''
  if tower == 'img':
    left = len(flat) - len(_sub(flat, f'{prefix}img/'))
    note = f'image tower of an image-text model{where}; {_strip_npz(img_note)}'
    return img, f'npz ({note}; ignored {left} arrays of its text tower and scalars)'
  txt, txt_note = _text_tree(_sub(flat, f'{prefix}txt/'), f'{source}:txt')
  scalars = _scalars(flat, prefix, source)
  known = (f'{prefix}img/', f'{prefix}txt/', *(f'{prefix}{s}' for s in SCALARS))
  extra = sorted(k for k in flat if not k.startswith(known))
  note = f'image-text model{where}; img: {_strip_npz(img_note)}; txt: {txt_note}'
  note += '; ' + ', '.join(scalars)
  if extra:
    note += f'; ignored {len(extra)} other arrays ({", ".join(extra[:3])})'
  return {'img': img, 'txt': txt, **scalars}, f'npz ({note})'


def read(path: str | Path, tower: str | None = None, **unused: Any) -> tuple[dict, str]:
  """Reads a Google .npz checkpoint: an image-text model (or with `tower='img'` its image
  tower) or a ViT/Mixer (`npz.read`); returns (tree, description)."""
  del unused
  return from_flat(npz.read_flat(path), str(path), tower)


def image_tower(params: Mapping[str, Any], description: str) -> tuple[dict, str]:
  """The image tower of an image-text tree, for a ViT model asked for by name or config."""
  return dict(params['img']), f'{description}; its image tower taken'


def to_flat(params: Mapping[str, Any], dtype: str | None = None) -> dict[str, np.ndarray]:
  """An image-text tree -> the LiT layout (module docstring), float32 (bfloat16 widened)
  or `dtype` (`npz.cast_for_npz`)."""
  flat = {}
  for tower in TOWERS:
    flat.update({f'{tower}/{k}': v for k, v in flatten(params[tower]).items()})
  flat.update({name: params[name] for name in SCALARS if name in params})
  unknown = sorted(set(params) - {*TOWERS, *SCALARS})
  if unknown:
    raise CheckpointError(f'an image-text tree has no place for {unknown} in the LiT layout')
  out = {}
  for key, value in flat.items():
    out[key] = npz.cast_for_npz(value, dtype)
  npz.check_arrays(out, 'params')
  return out


def save_npz(
  params: Mapping[str, Any], path: str | Path, groupnorm_4d: bool = True, dtype: str | None = None
) -> None:
  """Writes `params` as an .npz, atomically: an image-text tree in the LiT layout, any other
  tree in the released ViT layout (`npz.save_npz`); `dtype` as there."""
  if not owns_tree(as_flat(params)):
    npz.save_npz(params, path, groupnorm_4d, dtype)
    return
  flat = to_flat(params, dtype)
  files.atomic_write(path, lambda f: np.savez(f, **flat))


def _add_report(report: LoadReport, part: LoadReport, tower: str) -> None:
  """`part`'s keys, prefixed with the tower, into `report`."""
  for name in ('loaded', 'fresh', 'dropped', 'missing', 'unexpected'):
    getattr(report, name).extend(f'{tower}/{k}' for k in getattr(part, name))
  report.resized.extend((f'{tower}/{k}', old, new) for k, old, new in part.resized)


def _fit_scalars(restored: Mapping[str, Any], init: Mapping[str, Any], source: str) -> dict:
  out = {}
  for name in SCALARS:
    if (name in restored) != (name in init):
      has, lacks = ('checkpoint', 'model') if name in restored else ('model', 'checkpoint')
      raise CheckpointError(
        f'{source}: the {has} has a {name!r} the {lacks} lacks: SigLIP files have the logit'
        ' bias b (bias_init), LiT files do not'
      )
    if name in init:
      out[name] = np.asarray(restored[name]).astype(init[name].dtype)
  return out


def fit_params(
  restored: Mapping[str, Any],
  config: ml_collections.ConfigDict,
  resolution: int | tuple[int, int],
  source: str = 'checkpoint',
  init: Mapping[str, Any] | None = None,
) -> tuple[dict, LoadReport]:
  """An image-text tree fitted to the model of `config` at `resolution` pixels.

  Each tower is merged as `surgery.merge_pretrained` merges a ViT, heads kept (they are the
  projections to the shared space): the image position embeddings are resized to another
  resolution, every other name and shape must match (a one-line error names the key, both
  shapes and the tower: `PATH:img` or `PATH:txt`). `init`: the model's initialised tree;
  None: its shapes, with the checkpoint's text length (the text transformer's positions;
  BERT's `pp.max_len`).
  """
  if init is None:
    init = families.param_shapes(model_from_config(config), resolution, text_length(restored))
  image_dim, text_dim = out_dims(config.out_dim)
  report = LoadReport(source=source)
  params = {}
  for tower, fields, dim in (('img', config.image, image_dim), ('txt', config.text, text_dim)):
    params[tower], part = merge_pretrained(
      restored[tower],
      init[tower],
      {**fields, 'num_classes': dim},
      keep_head=True,
      image_size=resolution if tower == 'img' else None,
      source=f'{source}:{tower}',
    )
    _add_report(report, part, tower)
  params.update(_fit_scalars(restored, init, source))
  report.loaded.extend(k for k in SCALARS if k in params)
  return params, report
