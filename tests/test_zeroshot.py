"""Zero-shot classification: class embeddings and accuracy against the numpy equations of the
towers (tests/numpy_models.py) on a tiny LiT file in the released layout, the evaluator on
digits over 8 devices, the prompt data, and the command line with its one-line errors."""

import json
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import randomize
from numpy_models import l2_normalize, text_transformer, vit
from PIL import Image

import vit_jax
from vit_jax import checkpoint, families, parallel, text
from vit_jax import data as data_lib
from vit_jax.cli import zeroshot as zeroshot_cli
from vit_jax.data import spec as data_spec
from vit_jax.evals import common, prompts, zeroshot
from vit_jax.evals import spec as evals_spec
from vit_jax.inference import zeroshot as inference_zeroshot
from vit_jax.models import get_config, model_from_config

DATA = Path(__file__).parent / 'data'
SP_MODEL = DATA / 'sp_unigram.model'  # 818 pieces, </s> = 1
SIZE, LEN = 32, 16
VOCAB_LINES = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', 'a', 'the', 'cat', 'dog', '##s', 'photo', 'of']


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
  params = randomize(families.param_shapes(model, SIZE, LEN), seed=seed)
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
  embed = jax.jit(lambda p, x: model.apply({'params': p}, images=x)[0])  # one compile, not per op
  zimg = np.asarray(embed(fitted.params, images))
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


def _instance(context):
  """The evaluator the flat keys make: ('zeroshot', its Instance)."""
  return 'zeroshot', evals_spec.instances(context.evals)['zeroshot']


def test_evaluator_on_digits_equals_the_numpy_equations(lit):
  """`zeroshot/digits` on 8 devices: the digits' test split embedded by the numpy ViT, class
  names '0'..'9' in the templates, top-1 against the labels."""
  path, flat, fitted = lit
  templates = ('a photo of the number {}', 'a digit {}')
  context = _context(fitted.model(), path.with_suffix('.model'), templates)
  assert evals_spec.Zeroshot().templates == ('clip_best',)
  evaluator = zeroshot.build(context, *_instance(context))
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
    zeroshot.build(context, *_instance(context))
  context = _context(fitted.model(), path.with_name('missing.model'), ('{}',))
  with pytest.raises(ValueError, match=r'missing\.model: no such vocabulary file'):
    zeroshot.build(context, *_instance(context))


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


# ----------------------------------------------------------------------------------------
# The command line.
# ----------------------------------------------------------------------------------------


def _write_images(directory: Path, n: int, seed=0) -> list[Path]:
  """PNGs at the model's size, so the resize is the identity and the preprocessing is
  x / 255 * 2 - 1 exactly."""
  rng = np.random.default_rng(seed)
  directory.mkdir(parents=True, exist_ok=True)
  paths = []
  for i in range(n):
    paths.append(directory / f'{i}.png')
    Image.fromarray(rng.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)).save(paths[-1])
  return paths


def _numpy_scores(flat, paths, names, templates):
  tokenizer = text.get_tokenizer('sentencepiece', SP_MODEL, LEN)
  zcls = numpy_class_embeddings(flat, tokenizer, names, templates)
  pixels = np.stack([np.asarray(Image.open(p), np.float64) / 255 * 2 - 1 for p in paths])
  return np.exp(2.0) * l2_normalize(vit(_tower(flat, 'img/'), pixels)) @ zcls.T


@pytest.mark.slow
def test_command_prints_classes_and_probabilities_of_the_numpy_towers(lit, tmp_path):
  """`python -m vit_jax.zeroshot` on a released-layout file with its `.model` beside it:
  each image's classes and LiT probabilities (softmax of exp(t) cos), an unreadable image a
  one-line error while the others are still classified."""
  path, flat, _ = lit
  images = _write_images(tmp_path / 'images', 3)
  (tmp_path / 'broken.jpg').write_bytes(b'not an image')
  args = [f'--checkpoint={path}', '--classes=cat,dog,boat', '--templates=a photo of a {};{}']
  args += ['--json', '--top_k=3', f'--cache_dir={tmp_path / "cache"}']
  run = subprocess.run(
    [
      sys.executable,
      '-m',
      'vit_jax.zeroshot',
      *args,
      *map(str, images),
      str(tmp_path / 'broken.jpg'),
    ],
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert run.returncode == 1, run.stderr
  errors = [line for line in run.stderr.splitlines() if line.startswith('error:')]
  broken = tmp_path / 'broken.jpg'
  assert errors == [
    f'error: {broken}: cannot read image (cannot identify image file {str(broken)!r})'
  ]
  out = json.loads(run.stdout)
  assert out['probabilities'] == 'softmax' and out['classes'] == 3
  scores = _numpy_scores(flat, images, ['cat', 'dog', 'boat'], ['a photo of a {}', '{}'])
  probs = np.exp(scores - scores.max(1, keepdims=True))
  probs /= probs.sum(1, keepdims=True)
  for row, want in zip(out['predictions'], probs, strict=True):
    order = np.argsort(-want)
    assert [c['class'] for c in row['top_k']] == [['cat', 'dog', 'boat'][i] for i in order]
    np.testing.assert_allclose([c['probability'] for c in row['top_k']], want[order], atol=1e-5)


def test_command_accuracy_on_an_image_folder_and_the_cache(lit, tmp_path, capsys):
  """--dataset=FOLDER: top-1 over its test split equals the numpy towers'; a second run reads
  the class embeddings from the cache and prints the same."""
  path, flat, _ = lit
  names = ['apple', 'bridge', 'cloud']
  paths = [p for i, c in enumerate(names) for p in _write_images(tmp_path / 'd/test' / c, 6, i)]
  for c in names:  # the classes are the training split's folders
    (tmp_path / 'd/train' / c).mkdir(parents=True)
  options = {'json': True, 'cache_dir': str(tmp_path / 'cache')}
  folder = str(tmp_path / 'd')
  assert zeroshot_cli.run(str(path), [], templates='{}', dataset=folder, options=options) == 0
  first = json.loads(capsys.readouterr().out)
  scores = _numpy_scores(flat, paths, names, ['{}'])
  labels = np.repeat(np.arange(3), 6)
  assert first['count'] == 18
  assert first['accuracy'] == pytest.approx(np.mean(np.argmax(scores, 1) == labels), abs=1e-12)
  options |= {'json': False, 'progress': True}  # as at a terminal: what it does, on stderr
  assert zeroshot_cli.run(str(path), [], templates='{}', dataset=folder, options=options) == 0
  second, notes = capsys.readouterr()
  assert notes.splitlines() == [
    f'Reading {path} ...',
    'Embedding 3 classes x 1 templates (or reading the cache) ...',
    f"Classifying split 'test' of {folder} ...",
  ]
  assert '(class embeddings from the cache)' in second
  assert f'zero-shot top-1 {first["accuracy"]:.4f} on 18 images' in second


def test_command_errors_are_one_line(lit, tmp_path, capsys):
  path, _, fitted = lit
  image = str(_write_images(tmp_path / 'images', 1)[0])
  alone = tmp_path / 'alone' / 'LiT-L16S.npz'  # no vocabulary beside it
  alone.parent.mkdir()
  alone.write_bytes(path.read_bytes())
  vit_file = tmp_path / 'vit.npz'
  checkpoint.save_npz(fitted.params['img'], vit_file)
  no_cache = {'cache_dir': ''}
  cases = [
    (
      str(alone),
      {},
      'no tokenizer vocabulary beside the checkpoint: expected'
      f' {alone.with_suffix(".model")} or {alone.parent / "spiece.model"} (a sentencepiece'
      ' vocabulary); give it with --vocab=FILE',
    ),
    (str(path), {'vocab': str(DATA / 'bert_vocab.txt')}, 'not a sentencepiece model'),
    (
      str(path),
      {'vocab': str(DATA / 'sp_bpe.model')},
      '1200 pieces, but the text tower embeds 818',
    ),
    (str(vit_file), {}, 'not an image-text (LiT, SigLIP) checkpoint'),
  ]
  for ckpt_path, options, message in cases:  # runtime errors: 1, as the other commands
    assert zeroshot_cli.run(ckpt_path, [image], classes='a,b', options=options | no_cache) == 1
    err = capsys.readouterr().err
    assert err.count('\n') == 1 and message in err, err
  status = zeroshot_cli.run(str(path), [], dataset='no_such_dataset_xyz', options=no_cache)
  err = capsys.readouterr().err
  assert status == 1 and err.count('\n') == 1 and 'no_such_dataset_xyz' in err, err
  for images, kwargs in (([], {}), ([image], {'dataset': 'digits'}), ([image], {})):  # usage: 2
    assert zeroshot_cli.run(str(path), images, options=no_cache, **kwargs) == 2
    err = capsys.readouterr().err
    assert err.startswith('error: ') and err.count('\n') == 1, err


def test_a_vocabulary_is_looked_for_where_the_missing_line_says(tmp_path):
  """A file's: FILE.model, then its folder's Hugging Face file of the tokenizer (a SigLIP
  folder's model.safetensors: spiece.model; Gemma's tokenizer.model; a BERT vocabulary has
  none); the first that exists is used, a given one wins, and the line names each place."""
  weights = tmp_path / 'model.safetensors'
  places = [f'{weights}.model', str(tmp_path / 'spiece.model')]
  assert checkpoint.two_towers.missing_vocab(weights, 'sentencepiece') == (
    f'no tokenizer vocabulary beside the checkpoint: expected {places[0]} or {places[1]} (a'
    ' sentencepiece vocabulary); give it with --vocab=FILE'
  )
  assert checkpoint.two_towers.vocab_places(weights, 'gemma')[1] == str(
    tmp_path / 'tokenizer.model'
  )
  assert checkpoint.two_towers.vocab_places(tmp_path / 'x.npz', 'bert') == [str(tmp_path / 'x.txt')]
  for place in reversed(places):
    Path(place).write_bytes(b'')
    assert checkpoint.two_towers.uses(weights, 'sentencepiece').vocab == place
  assert checkpoint.two_towers.uses(weights, 'sentencepiece', 'given.model').vocab == 'given.model'


def test_report_puts_a_zero_shot_run_beside_the_lit_model_card(tmp_path):
  """`--out` writes a run folder; `vit_jax.reproduce report` puts its zero-shot top-1 beside
  the model card's (LiT-B16B_2 CIFAR-100: 79.0%), named after the released file."""
  from vit_jax.reproduce import report

  directory = tmp_path / 'released'
  directory.mkdir()
  path = write_lit_file(directory, 'LiT-B16B_2')
  loaded = vit_jax.load(str(path))
  result = {'dataset': 'cifar100', 'split': 'test', 'accuracy': 0.7512, 'count': 10_000}
  inference_zeroshot.write_run(str(tmp_path / 'runs/b16b2_c100'), loaded, result)
  rows, _, text = report.report([str(tmp_path / 'runs')])
  assert len(rows) == 1
  row = rows[0]
  assert (row.model, row.pretrain, row.dataset) == (
    'LiT-B16B_2',
    'cc12m+yfcc100m',
    'zeroshot/cifar100',
  )
  assert (row.ours, row.source, row.paper) == (pytest.approx(75.12), 'LiT model card', 79.0)
  assert row.note == 'not like for like: ours 32 px; paper 224 px'  # the tiny towers' size
  assert '| LiT-B16B_2 | cc12m+yfcc100m | CIFAR-100 zero-shot |' in text


def test_command_on_a_siglip_tree_gives_sigmoid_probabilities(tmp_path, capsys):
  """A file with SigLIP's bias `b`: the tokenizer takes big_vision's options (sticky </s>,
  padding 1, lower case) and each class's probability is sigmoid(exp(t) cos + b)."""
  config = tiny_lit_config()
  config.bias_init, config.temperature_init = -10.0, 10.0
  model = model_from_config(config)
  params = randomize(families.param_shapes(model, SIZE, LEN), seed=3)
  params['t'], params['b'] = np.array([1.5], np.float32), np.array([-2.0], np.float32)
  path = tmp_path / 'siglip.npz'
  checkpoint.save_npz(params, path)
  images = _write_images(tmp_path / 'images', 2, seed=5)
  options = {'vocab': str(SP_MODEL), 'json': True, 'cache_dir': '', 'canonicalize': False}
  status = zeroshot_cli.run(str(path), list(map(str, images)), 'Cat,Dog', '{}', options=options)
  assert status == 0
  out = json.loads(capsys.readouterr().out)
  assert out['probabilities'] == 'sigmoid'
  with np.load(path) as f:
    flat = {k: np.float64(f[k]) for k in f.files}
  options = {'eos': 'sticky', 'pad_value': 1, 'lower': True}  # SigLIP's, from the file's `b`
  tokenizer = text.get_tokenizer('sentencepiece', SP_MODEL, LEN, **options)
  assert (tokenizer(['Cat']) != text.get_tokenizer('sentencepiece', SP_MODEL, LEN)(['Cat'])).any()
  zcls = numpy_class_embeddings(flat, tokenizer, ['Cat', 'Dog'], ['{}'])
  pixels = np.stack([np.asarray(Image.open(p), np.float64) / 255 * 2 - 1 for p in images])
  cos = l2_normalize(vit(_tower(flat, 'img/'), pixels)) @ zcls.T
  want = 1 / (1 + np.exp(-(np.exp(1.5) * cos - 2.0)))
  for row, probs in zip(out['predictions'], want, strict=True):
    got = {c['class']: c['probability'] for c in row['top_k']}
    np.testing.assert_allclose([got['Cat'], got['Dog']], probs, atol=1e-5)


def test_a_sigmoid_bias_beside_a_bert_tower_keeps_berts_tokenizer(tmp_path, capsys):
  """A file with a BERT text tower and SigLIP's bias `b` (a LiT trained with the sigmoid
  loss): `b` makes the probabilities sigmoid, and the texts go through BERT's WordPiece as
  they are (at a24f8ac SigLIP's options reached BertTokenizer: a TypeError)."""
  config = get_config('LiT-B16B')
  config.image.update({'patches': {'size': (8, 8)}, 'hidden_size': 32})
  config.image.transformer.update({'num_layers': 1, 'mlp_dim': 64, 'num_heads': 4})
  config.text.update({'hidden_size': 32, 'num_layers': 1, 'num_heads': 2, 'mlp_dim': 64})
  config.text.vocab_size, config.out_dim, config.pp.size = len(VOCAB_LINES), (16, 16), SIZE
  params = randomize(families.param_shapes(model_from_config(config), SIZE, LEN), seed=4)
  params['t'], params['b'] = np.array([1.0], np.float32), np.array([-2.0], np.float32)
  path = tmp_path / 'lit_sigmoid.npz'
  checkpoint.save_npz(params, path)
  vocab = tmp_path / 'vocab.txt'
  vocab.write_text('\n'.join(VOCAB_LINES) + '\n')
  loaded = vit_jax.load(str(path), vocab=str(vocab))
  want = text.get_tokenizer('bert', vocab, 16)(['A Cat', 'the DOG'])
  np.testing.assert_array_equal(loaded.tokenizer(['A Cat', 'the DOG']), want)
  # Names the vocabulary does not know are one [UNK]: such classes cannot be told apart.
  names = ['zebra', 'cat', 'lion', 'okapi', 'dog']
  alike = inference_zeroshot.tokenized_alike(loaded, names, ['a photo of a {}', '{}'])
  assert alike == [('zebra', 'lion'), ('zebra', 'okapi')]
  images = _write_images(tmp_path / 'images', 1, seed=6)
  options = {'vocab': str(vocab), 'json': True, 'cache_dir': '', 'canonicalize': False}
  assert zeroshot_cli.run(str(path), [str(images[0])], 'cat,dog', '{}', options=options) == 0
  assert json.loads(capsys.readouterr().out)['probabilities'] == 'sigmoid'


def test_command_retrieval_over_a_captions_file(lit, tmp_path, capsys):
  """--captions: recall@k of the model's embeddings equals `recalls` on the numpy towers'
  embeddings (recalls itself is checked against a loop in test_retrieval.py)."""
  from vit_jax.evals import retrieval

  path, flat, _ = lit
  images = _write_images(tmp_path / 'pairs', 4, seed=7)
  captions = ['a red cat', 'a cat on a mat', 'the dog', 'a boat at sea', 'two trees', 'a tree']
  owners = [0, 0, 1, 2, 3, 3]
  lines = [f'pairs/{images[o].name}\t{c}' for o, c in zip(owners, captions, strict=True)]
  (tmp_path / 'captions.tsv').write_text('\n'.join(lines) + '\n')
  options = {'captions': str(tmp_path / 'captions.tsv'), 'json': True}
  assert zeroshot_cli.run(str(path), [], options=options) == 0
  got = json.loads(capsys.readouterr().out)
  tokenizer = text.get_tokenizer('sentencepiece', SP_MODEL, LEN)
  ztxt = l2_normalize(text_transformer(_tower(flat, 'txt/'), tokenizer(captions)))
  pixels = np.stack([np.asarray(Image.open(p), np.float64) / 255 * 2 - 1 for p in images])
  zimg = l2_normalize(vit(_tower(flat, 'img/'), pixels))
  want = retrieval.recalls(zimg, ztxt, owners)
  assert {k: got[k] for k in want} == want
  (tmp_path / 'bad.tsv').write_text('no tab here\n')
  assert zeroshot_cli.run(str(path), [], options={'captions': str(tmp_path / 'bad.tsv')}) == 1
  assert capsys.readouterr().err == f'error: {tmp_path / "bad.tsv"}:1: expected IMAGE<TAB>CAPTION\n'
