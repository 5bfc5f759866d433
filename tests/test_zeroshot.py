"""Zero-shot classification: class embeddings and accuracy against the numpy equations of the
towers (tests/numpy_models.py) on a tiny LiT file in the released layout, the evaluator on
digits over 8 devices, the prompt data, and the command line with its one-line errors."""

from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import randomize
from numpy_models import l2_normalize, text_transformer, vit

from vit_jax import checkpoint, parallel, text
from vit_jax import data as data_lib
from vit_jax.data import spec as data_spec
from vit_jax.evals import common, prompts, zeroshot
from vit_jax.evals import spec as evals_spec
from vit_jax.models import get_config, model_from_config, stats

DATA = Path(__file__).parent / 'data'
SP_MODEL = DATA / 'sp_unigram.model'  # 818 pieces, </s> = 1
SIZE, LEN = 32, 16


def tiny_lit_config():
  """LiT-L16S with tiny towers: a 32 px image tower, a 32-wide text transformer, head 32."""
  config = get_config('LiT-L16S')
  config.image.update({'patches': {'size': (8, 8)}, 'hidden_size': 32})
  config.image.transformer.update({'num_layers': 1, 'mlp_dim': 64, 'num_heads': 4})
  config.text.update({'width': 32, 'num_layers': 1, 'num_heads': 4, 'mlp_dim': 64})
  config.text.vocab_size = 818
  config.out_dim = (None, 32)  # the image tower has no head: its width
  config.pp.size = SIZE
  return config


def write_lit_file(directory: Path, name='LiT-L16S', seed=0) -> Path:
  """A tiny LiT file in the released layout (`img/`, `txt/`, `t`) and its `.model` beside it."""
  model = model_from_config(tiny_lit_config())
  params = randomize(stats.param_shapes(model, SIZE, LEN), seed=seed)
  params['t'] = np.array([2.0], np.float32)
  path = directory / f'{name}.npz'
  checkpoint.save_npz(params, path)
  (directory / f'{name}.model').write_bytes(SP_MODEL.read_bytes())
  return path


@pytest.fixture(scope='module')
def lit(tmp_path_factory):
  path = write_lit_file(tmp_path_factory.mktemp('lit'))
  with np.load(path) as f:
    flat = {k: np.float64(f[k]) for k in f.files}
  return path, flat, checkpoint.fit(path)


def _tower(flat, prefix):
  return {k.removeprefix(prefix): v for k, v in flat.items() if k.startswith(prefix)}


def numpy_class_embeddings(flat, tokenizer, names, templates):
  """Each class's prompts through the numpy text transformer, averaged, normalised."""
  rows = []
  for name in names:
    tokens = tokenizer([t.format(name) for t in templates])
    rows.append(l2_normalize(text_transformer(_tower(flat, 'txt/'), tokens)).mean(0))
  return l2_normalize(np.stack(rows))


CLASSES = ['cat', 'dog', 'sail boat', 'tree', 'car']
TEMPLATES = ['a photo of a {}', 'a drawing of the {}', '{}']


def test_class_embeddings_and_accuracy_equal_the_numpy_equations(lit):
  _, flat, fitted = lit
  tokenizer = text.get_tokenizer('sentencepiece', SP_MODEL, LEN)
  model = fitted.model()
  # batch 4 over 15 prompts: three full batches and a padded one
  zcls = zeroshot.class_embeddings(model, fitted.params, tokenizer, CLASSES, TEMPLATES, 4)
  want = numpy_class_embeddings(flat, tokenizer, CLASSES, TEMPLATES)
  assert zcls.shape == (5, 32)
  np.testing.assert_allclose(zcls, want, atol=1e-5, rtol=0)
  images = np.random.default_rng(1).uniform(-1, 1, (40, SIZE, SIZE, 3)).astype(np.float32)
  zimg = np.asarray(model.apply({'params': fitted.params}, images=images)[0])
  np.testing.assert_allclose(zimg, l2_normalize(vit(_tower(flat, 'img/'), images)), atol=1e-5)
  scores = np.exp(2.0) * l2_normalize(vit(_tower(flat, 'img/'), images)) @ want.T
  labels = np.argsort(-scores, axis=1)[:, 1]  # a label the top class gets for some images only
  labels[::3] = np.argmax(scores, axis=1)[::3]
  expected = np.mean(np.argmax(scores, axis=1) == labels)
  assert 0 < expected < 1
  assert zeroshot.accuracy(zimg, labels, zcls) == expected
  probs = np.exp(scores - scores.max(1, keepdims=True))
  np.testing.assert_allclose(
    zeroshot.probabilities(zimg, zcls, np.exp(2.0)), probs / probs.sum(1, keepdims=True), atol=1e-5
  )
  sigmoid = 1 / (1 + np.exp(-(scores - 10.0)))
  np.testing.assert_allclose(
    zeroshot.probabilities(zimg, zcls, np.exp(2.0), -10.0), sigmoid, rtol=1e-4, atol=1e-7
  )


def _context(model, vocab, templates):
  evals = evals_spec.Evals(
    zeroshot_every=1,
    zeroshot=evals_spec.Zeroshot(datasets=('digits',), templates=templates, vocab=str(vocab)),
  )
  data = data_spec.Data(dataset='digits', num_classes=10, pp=data_spec.Pp(crop=SIZE), batch_eval=64)
  mesh = parallel.create_mesh()
  return common.Context(evals, data, model, mesh, data_lib.get_source('digits'))


def test_evaluator_on_digits_equals_the_numpy_equations(lit):
  """`zeroshot/digits` on 8 devices: the digits' test split embedded by the numpy ViT, class
  names '0'..'9' in the templates, top-1 against the labels."""
  path, flat, fitted = lit
  templates = ('a photo of the number {}', 'a digit {}')
  context = _context(fitted.model(), path.with_suffix('.model'), templates)
  assert evals_spec.Zeroshot().templates == ('clip_best',)
  evaluator = zeroshot.build(context)
  shardings = parallel.tree_shardings(fitted.params, context.mesh)
  got = common.evaluate(evaluator, {'': jax.device_put(fitted.params, shardings)})
  assert list(got) == ['zeroshot/digits']

  ds = data_lib.eval_dataset(context.source, 'test', context.data, local_batch=360)
  batch = next(ds.as_numpy_iterator())
  assert batch['mask'].sum() == 360
  tokenizer = text.get_tokenizer('sentencepiece', SP_MODEL, LEN)
  zcls = numpy_class_embeddings(flat, tokenizer, [str(i) for i in range(10)], templates)
  zimg = l2_normalize(vit(_tower(flat, 'img/'), batch['image'].astype(np.float64)))
  expected = np.mean(np.argmax(zimg @ zcls.T, axis=1) == batch['label'])
  assert got['zeroshot/digits'] == pytest.approx(expected, abs=1e-12)


def test_evaluator_config_errors_are_one_line(lit):
  path, _, fitted = lit
  bad = [
    ({'zeroshot_every': 10}, 'zeroshot.datasets is empty'),
    ({'zeroshot_every': -1}, 'zeroshot_every=-1'),
    ({'zeroshot': {'datasets': (('digits', 'test', 'x'),)}}, 'a pair'),
  ]
  for overrides, match in bad:
    kwargs = {k: v for k, v in overrides.items() if k != 'zeroshot'}
    section = evals_spec.Zeroshot(**overrides.get('zeroshot', {}))
    with pytest.raises(ValueError, match=match):
      evals_spec.check(evals_spec.Evals(zeroshot=section, **kwargs))
  context = _context(fitted.model(), '', ('{}',))
  with pytest.raises(ValueError, match=r'zeroshot\.vocab is empty'):
    zeroshot.build(context)
  context = _context(fitted.model(), path.with_name('missing.model'), ('{}',))
  with pytest.raises(ValueError, match=r'missing\.model: no such vocabulary file'):
    zeroshot.build(context)


def test_prompt_data_is_clips():
  """CLIP's 80 ImageNet templates and 1,000 curated class names, canonicalised as big_vision."""
  clip = prompts.templates('clip', canonical=False)
  assert len(clip) == len(set(clip)) == 80 and all('{}' in t for t in clip)
  assert clip[0] == 'a bad photo of a {}.' and clip[-1] == 'a tattoo of the {}.'
  assert prompts.templates('clip_paper', canonical=False) == [*clip, '{}']
  assert len(prompts.templates('clip_best')) == 8
  assert prompts.templates(['class_name_only', 'itap of a {}.']) == ['{}', 'itap of a {}']
  names = prompts.class_names('imagenet2012', [])
  assert len(names) == 1000 and names[:2] == ['tench', 'goldfish']
  assert prompts.canonicalize("Jack-o'-lantern,  Great_White", keep=',') == (
    'jackolantern, great white'
  )
  assert prompts.class_names('cifar10', ['Air_plane']) == ['air plane']
  with pytest.raises(ValueError, match="'no placeholder': not a set"):
    prompts.templates(['no placeholder'])
