"""`vit-export` (vit_jax/export): tiny models of every family exported, then run back where
this project cannot be imported: the StableHLO with JAX alone (no vit_jax, no flax), the
SavedModel with TensorFlow alone (no JAX), each against the model in this process at several
batch sizes. Where TensorFlow cannot run what this jax writes (jax 0.12 or newer), the
SavedModel is one warning line instead and not written."""

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from absl import flags

import vit_jax
from tests.conftest import dot_types, randomize
from tests.text_vocabs import SP_EOS, SP_ID, SP_UNK, word_model
from vit_jax import checkpoint, families
from vit_jax.cli import export as export_cli
from vit_jax.export import export_model, functions, saved_model
from vit_jax.models import get_config, model_from_config

BATCHES = (1, 3, 8)
# The fresh interpreters compile each artifact at each batch size: quickly, not for speed.
FAST_COMPILE = '--xla_backend_optimization_level=0'
SIZE = 16
VOCAB = 50
LEN = 8
TINY_ENCODER = {'num_layers': 1, 'mlp_dim': 32, 'num_heads': 2}
TINY_TEXT = {'width': 16, 'num_layers': 1, 'num_heads': 2, 'mlp_dim': 32, 'vocab_size': VOCAB}
# The library's rule (docs/export.md, Across jax versions): at the newest end no SavedModel.
WRITES_SAVED_MODEL = saved_model.tensorflow_runs_this_jax()

# Run first in a fresh interpreter: any import of these packages fails, as where they are
# not installed.
BLOCKER = textwrap.dedent("""
  import importlib.abc, sys
  BLOCKED = set(sys.argv[1].split(','))
  class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
      if name.split('.')[0] in BLOCKED:
        raise ImportError(f'{name} is blocked in this test')
  sys.meta_path.insert(0, Blocker())
""")
STABLEHLO_CHECK = BLOCKER + textwrap.dedent("""
  import json, numpy as np
  from jax import export
  for case in json.loads(sys.argv[2]):
    data = np.load(case['data'])
    exp = export.deserialize(open(case['artifact'], 'rb').read())
    for i in range(len(data.files) // 2):
      got = np.asarray(exp.call(data[f'x{i}']))
      atol = case.get('atol', 1e-6)
      np.testing.assert_allclose(got, data[f'y{i}'], rtol=0, atol=atol, err_msg=case['artifact'])
  print('ok')
""")
SAVED_MODEL_CHECK = BLOCKER + textwrap.dedent("""
  import json, numpy as np, tensorflow as tf
  for case in json.loads(sys.argv[2]):
    data = np.load(case['data'])
    fn = tf.saved_model.load(case['artifact']).signatures[case['signature']]
    for i in range(len(data.files) // 2):
      (got,) = fn(tf.constant(data[f'x{i}'])).values()
      np.testing.assert_allclose(got.numpy(), data[f'y{i}'], rtol=0, atol=1e-5)
  print('ok')
""")


def _vit(**fields):
  config = get_config('ViT-B_16')
  config.update({'patches': {'size': (4, 4)}, 'hidden_size': 16, 'num_classes': 5, **fields})
  config.transformer.update(TINY_ENCODER)
  config.representation_size = None
  return config


def _mixer():
  config = get_config('Mixer-S_16')
  config.update({'patches': {'size': (4, 4)}, 'hidden_dim': 16, 'num_blocks': 1})
  config.update({'tokens_mlp_dim': 8, 'channels_mlp_dim': 32, 'num_classes': 5})
  return config


def _siglip(naflex: bool):
  config = get_config('SigLIP2-B16-naflex' if naflex else 'SigLIP-B16-224')
  if naflex:
    config.image.update({'patch_size': 4, 'hidden_size': 16, 'posemb_grid': 4})
  else:
    config.image.update({'patches': {'size': (4, 4)}, 'hidden_size': 16})
    config.pp.size = SIZE
  config.image.transformer.update(TINY_ENCODER)
  config.text.update(TINY_TEXT)
  config.out_dim = (None, 16)
  config.pp.max_len = LEN
  return config


MODELS = {
  'vit': _vit(),
  'deit': _vit(distilled=True),
  'mixer': _mixer(),
  'siglip': _siglip(naflex=False),
  'naflex': _siglip(naflex=True),
}


def _patch_sequences(rng, batch: int, slots: int, patch: int = 4) -> np.ndarray:
  """Packed NaFlex inputs: image i a (rows, cols) grid of patches, the other slots padding."""
  x = np.zeros((batch, slots, patch * patch * 3 + 3), np.float32)
  for i in range(batch):
    rows, cols = [(2, 3), (3, 2), (1, 4)][i % 3]
    n = rows * cols
    x[i, :n, :-3] = rng.uniform(-1, 1, (n, patch * patch * 3))
    x[i, :n, -3] = 1
    x[i, :n, -2], x[i, :n, -1] = np.divmod(np.arange(n), cols)
  return x


def _inputs(function, rng, batch: int) -> np.ndarray:
  if function.input_name == 'tokens':
    return rng.integers(1, VOCAB, (batch, LEN)).astype(np.int32)
  if function.input_name == 'patches':
    return _patch_sequences(rng, batch, slots=12)
  return rng.uniform(-1, 1, (batch, *function.shape[1:])).astype(np.float32)


def _save(config, path) -> None:
  model = model_from_config(config)
  params = randomize(families.param_shapes(model, SIZE, LEN))
  checkpoint.save_npz(params, path)


def _expected(function, rng) -> dict[str, np.ndarray]:
  """Inputs at every batch size and the model's outputs in this process: one compiled call
  at the largest batch, the smaller batches its first rows (a NaFlex batch pads fewer slots)."""
  jitted = jax.jit(function.fn)
  x = _inputs(function, rng, max(BATCHES))
  y = np.asarray(jitted(x))
  arrays = {}
  for i, batch in enumerate(BATCHES):
    arrays[f'x{i}'], arrays[f'y{i}'] = x[:batch], y[:batch]
    if function.input_name == 'patches' and batch < max(BATCHES):
      arrays[f'x{i}'] = x[:batch, : 6 + 2 * i]  # a shorter sequence n: every image fits
  return arrays


def _check_blocked(script: str, blocked: str, cases: list, cwd) -> subprocess.Popen:
  """`script` started in a fresh interpreter where `blocked` packages cannot be imported."""
  env = {k: v for k, v in os.environ.items() if k not in ('PYTHONPATH', 'XLA_FLAGS')}
  return subprocess.Popen(
    [sys.executable, '-c', script, blocked, json.dumps(cases)],
    cwd=cwd,
    env={**env, 'JAX_PLATFORMS': 'cpu', 'CUDA_VISIBLE_DEVICES': '', 'XLA_FLAGS': FAST_COMPILE},
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )


def _passed(proc: subprocess.Popen) -> None:
  out, err = proc.communicate(timeout=300)
  assert proc.returncode == 0 and out.strip() == 'ok', err[-3000:]


def _bfloat16_vit(root, outs) -> dict[str, str | int]:
  """The tiny ViT exported again in bfloat16 (StableHLO), and its check case: the bfloat16
  model's outputs in this process at each batch size, on the float32 case's inputs. The
  artifact is the program this process compiles, run on the same machine: the same bits
  (tolerance 0), where one bfloat16 rounding apart would be 1e-3 or more."""
  src = str(root / 'vit.npz')
  outs['vit_bf16'] = out = root / 'vit_bf16_out'
  export_model(src, out, formats=('stablehlo',), dtype='bfloat16')
  (function,) = functions(checkpoint.fit(src), 'bfloat16')
  jitted, arrays = jax.jit(function.fn), {}
  with np.load(root / 'vit_model.npz') as float32:
    for i in range(len(BATCHES)):
      arrays[f'x{i}'] = float32[f'x{i}']
      arrays[f'y{i}'] = np.asarray(jitted(arrays[f'x{i}']))  # each batch size compiled
  np.savez(root / 'vit_bf16_model.npz', **arrays)
  return {
    'artifact': str(out / 'model.stablehlo'),
    'data': str(root / 'vit_bf16_model.npz'),
    'atol': 0,
  }


@pytest.fixture(scope='module')
def exported(tmp_path_factory):
  """Each tiny model saved and exported, and the two checks in fresh interpreters started on
  them at once (they run side by side): (out dirs by model, StableHLO check, SavedModel
  check: None where no SavedModel is written)."""
  root = tmp_path_factory.mktemp('export')
  rng = np.random.default_rng(0)
  outs, stablehlo, saved = {}, [], []
  for name, config in MODELS.items():
    src = root / f'{name}.npz'
    _save(config, src)
    outs[name] = out = root / f'{name}_out'
    if name == 'siglip':  # the command, its vocabulary not beside it; naflex's found nowhere
      (root / 'elsewhere').mkdir()
      (root / 'elsewhere' / 'words.model').write_bytes(word_model())
      assert _command(src, out, f'--vocab={root / "elsewhere" / "words.model"}') == 0
    else:
      export_model(str(src), out)
    for function in functions(checkpoint.fit(str(src))):
      data = str(root / f'{name}_{function.name}.npz')
      np.savez(data, **_expected(function, rng))
      stablehlo.append({'artifact': str(out / f'{function.name}.stablehlo'), 'data': data})
      saved.append({'artifact': str(out / 'saved_model'), 'signature': function.name, 'data': data})
  stablehlo.append(_bfloat16_vit(root, outs))
  checks = (
    _check_blocked(STABLEHLO_CHECK, 'vit_jax,flax', stablehlo, root),
    _check_blocked(SAVED_MODEL_CHECK, 'vit_jax,flax,jax,jaxlib', saved, root)
    if WRITES_SAVED_MODEL
    else None,
  )
  yield outs, *checks
  for proc in checks:
    if proc is not None:
      proc.kill()


def test_stablehlo_runs_with_jax_alone_and_equals_the_model(exported):
  """Every function (vit, deit, mixer; siglip's and naflex's image and text) at batch 1, 3
  and 8, with jax alone; the ViT exported in bfloat16 too, bit for bit."""
  _passed(exported[1])


def test_bfloat16_export_computes_in_bfloat16(exported):
  """`--dtype=bfloat16`: export.json says so, every matmul of the StableHLO takes bfloat16
  operands, and its logits move off the float32 model's by more than float32 rounding (the
  check above holds them to the bfloat16 model's in this process, bit for bit)."""
  out = exported[0]['vit_bf16']
  assert json.loads((out / 'export.json').read_text())['dtype'] == 'bfloat16'
  artifact = jax.export.deserialize((out / 'model.stablehlo').read_bytes())
  types = dot_types(artifact.mlir_module())
  assert len(types) >= 6 and {t[:2] for t in types} == {('bf16', 'bf16')}
  with (
    np.load(out.parent / 'vit_bf16_model.npz') as bf16,
    np.load(out.parent / 'vit_model.npz') as f32,
  ):
    assert 1e-4 < np.abs(bf16['y2'] - f32['y2']).max() < 0.05


@pytest.mark.skipif(not WRITES_SAVED_MODEL, reason="TensorFlow cannot run this jax's StableHLO")
def test_saved_model_runs_with_tensorflow_alone_and_equals_the_model(exported):
  _passed(exported[2])


@pytest.mark.skipif(WRITES_SAVED_MODEL, reason="TensorFlow runs this jax's StableHLO")
def test_where_tensorflow_cannot_run_this_jax_the_saved_model_is_one_line(
  exported, tmp_path, capsys
):
  """jax 0.12 or newer: every export skips the SavedModel with one line naming this jax and
  the oldest end, writes no saved_model/, and lists it in no format; asked for alone, it is
  one line and nothing written."""
  for name in MODELS:  # each exported with the default formats
    out = exported[0][name]
    meta = json.loads((out / 'export.json').read_text())
    assert 'saved_model' not in meta['formats'] and not (out / 'saved_model').exists(), name
    (line,) = [s for s in meta['skipped'] if s.startswith('saved_model: not written')]
    assert f'jax {jax.__version__}' in line and 'with jax 0.10 (Python 3.11' in line
    assert 'Across jax versions' in line and '\n' not in line
  src = tmp_path / 'vit.npz'
  src.write_bytes(b'')  # there: the request is refused before it is read
  status, _, err = _cli(capsys, src, tmp_path / 'out', '--formats=saved_model')
  assert status == 1 and err.count('\n') == 1
  assert err.startswith('error: ') and 'nothing to write: saved_model: not written' in err
  assert 'write SavedModels with jax 0.10' in err
  assert list(tmp_path.iterdir()) == [src]


def test_export_json_says_how_to_feed_each_model(exported):
  meta = {n: json.loads((out / 'export.json').read_text()) for n, out in exported[0].items()}
  vit = meta['vit']
  assert (vit['family'], vit['dtype'], vit['formats']) == (
    'vit',
    'float32',
    ['stablehlo', 'saved_model'] if WRITES_SAVED_MODEL else ['stablehlo'],
  )
  assert vit['jax'] == jax.__version__  # the writer's: another jax may not read its StableHLO
  assert vit['functions']['model']['input'] == {
    'name': 'images',
    'shape': ['b', SIZE, SIZE, 3],
    'dtype': 'float32',
  }
  assert vit['functions']['model']['output'] == {
    'name': 'logits',
    'shape': ['b', 5],
    'dtype': 'float32',
  }
  assert vit['preprocessing']['kind'] == 'resize' and vit['preprocessing']['size'] == [SIZE, SIZE]
  assert (vit['preprocessing']['offset'], vit['preprocessing']['scale']) == (127.5, 127.5)
  assert not vit['preprocessing']['round_to_uint8']  # the LiT towers' images: uint8 first
  assert meta['siglip']['preprocessing']['round_to_uint8']
  assert meta['deit']['kind'] == 'DeiT (distilled)'
  siglip = meta['siglip']
  tokenizer = dict(siglip['text']['tokenizer'])
  pp = tokenizer.pop('pp')  # the model's own settings, which the tokenizer resolver reads
  assert tokenizer == {
    'name': 'sentencepiece',
    'max_len': LEN,
    'options': {'eos': 'sticky', 'pad_value': 1, 'lower': True},
    'vocab': 'vocab.model',
  }
  assert (pp['tokenizer_name'], pp['max_len']) == ('sentencepiece', LEN)
  assert (exported[0]['siglip'] / 'vocab.model').read_bytes() == word_model()  # --vocab's
  # The exported model tokenizes as the word model does: lower-cased, `</s>`, padding 1.
  texts = ['A cat sat', 'zürich dog']
  want = [
    [SP_ID['a'], SP_ID['cat'], SP_ID['sat'], SP_EOS, 1, 1, 1, 1],
    [SP_ID['zürich'], SP_UNK, SP_EOS, 1, 1, 1, 1, 1],
  ]
  np.testing.assert_array_equal(vit_jax.load(str(exported[0]['siglip'])).tokenizer(texts), want)
  assert siglip['text']['t'] > 0
  assert isinstance(siglip['text']['b'], float)
  assert siglip['functions']['text']['input']['shape'] == ['b', LEN]
  naflex = meta['naflex']['functions']['image']
  assert naflex['input'] == {'name': 'patches', 'shape': ['b', 'n', 51], 'dtype': 'float32'}
  naflex_pp = meta['naflex']['preprocessing']
  assert (naflex_pp['kind'], naflex_pp['patch_size'], naflex_pp['size']) == ('patches', 4, None)
  # No vocabulary found: none named, and the warning names each place looked and the flag.
  root = exported[0]['naflex'].parent
  assert meta['naflex']['text']['tokenizer']['vocab'] is None
  assert len(meta['naflex']['skipped']) == 1 + (not WRITES_SAVED_MODEL)  # and the SavedModel's
  assert meta['naflex']['skipped'][-1:] == [
    'exported without a tokenizer: no tokenizer vocabulary beside the checkpoint: expected'
    f' {root / "naflex.model"} or {root / "spiece.model"} (a sentencepiece vocabulary); give it'
    ' with --vocab=FILE'
  ]


def _command(*argv) -> int:
  """`vit-export ARGV`'s exit status, run in this process."""
  flag_values = flags.FlagValues()
  export_cli.define_flags(flag_values)
  args = flag_values(['vit-export', *map(str, argv)])[1:]
  return export_cli.run(args, flag_values, command='vit-export ' + ' '.join(map(str, argv)))


def _cli(capsys, *argv):
  status = _command(*argv)
  out, err = capsys.readouterr()
  return status, out, err


def test_command_writes_the_directory_or_one_line_and_nothing(tmp_path, capsys):
  src = tmp_path / 'vit.npz'
  _save(MODELS['vit'], src)
  out = tmp_path / 'out'
  status, stdout, err = _cli(capsys, src, out, '--formats=stablehlo,onnx', '--dtype=bfloat16')
  assert status == 0, err
  assert sorted(p.name for p in out.iterdir()) == ['export.json', 'model.stablehlo']
  meta = json.loads((out / 'export.json').read_text())
  assert (meta['dtype'], meta['formats']) == ('bfloat16', ['stablehlo'])
  assert meta['command'].startswith('vit-export ') and 'onnx' in meta['skipped'][0]
  assert err.count('\n') == 1 and 'onnx' in err and 'logits' in stdout
  status, _, err = _cli(capsys, tmp_path / 'missing.npz', tmp_path / 'out2')
  assert status == 1 and err.startswith('error: ') and err.count('\n') == 1
  assert not (tmp_path / 'out2').exists()
  assert sorted(p.name for p in tmp_path.iterdir()) == ['out', 'vit.npz']  # no temp left
  status, _, err = _cli(capsys, src, out)  # OUT exists: untouched
  assert status == 1 and 'exists' in err
  status, _, err = _cli(capsys, src, tmp_path / 'o3', '--formats=tflite')
  assert status == 2 and err.count('\n') == 1


@pytest.mark.slow
def test_vit_b16_exported_by_the_command_runs_alone_and_equals_the_model(tmp_path):
  """ViT-B/16 at 224 px (86M random weights at ViT's init scale) exported by `python -m
  vit_jax.export`: the StableHLO with jax alone (1e-6) and the SavedModel with TensorFlow
  alone (1e-5; where this jax writes one) give the logits of the registry's model applied in
  this process, at batch 1, 3 and 8. The command runs apart (its 7 GB of export are gone
  before the checks start) while this process computes the logits."""
  model = model_from_config(get_config('ViT-B_16'), num_classes=1000)
  params = randomize(families.param_shapes(model, 224), seed=1, scale=0.02)
  src, out = tmp_path / 'vit_b16.npz', tmp_path / 'out'
  checkpoint.save_npz(params, src)
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu', 'CUDA_VISIBLE_DEVICES': ''}
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  command = [sys.executable, '-m', 'vit_jax.export', str(src), str(out)]
  export = subprocess.Popen(command, cwd=repo, env=env, stderr=subprocess.PIPE, text=True)
  # Once at batch 8, the parameters as arguments (as constants XLA compiles 2.4 CPU-s longer);
  # the smaller batches its first rows: a ViT treats each image alone.
  apply = jax.jit(lambda p, x: model.apply({'params': p}, x, train=False))
  x = np.random.default_rng(0).uniform(-1, 1, (max(BATCHES), 224, 224, 3)).astype(np.float32)
  y = np.asarray(apply(params, x))
  assert y.std() > 0.01  # so that 1e-6 is a relative 1e-4 or finer
  data = str(tmp_path / 'data.npz')
  arrays = {f'x{i}': x[:batch] for i, batch in enumerate(BATCHES)}
  np.savez(data, **arrays, **{f'y{i}': y[:batch] for i, batch in enumerate(BATCHES)})
  del params
  _, err = export.communicate(timeout=600)
  assert export.returncode == 0, err[-3000:]
  meta = json.loads((out / 'export.json').read_text())['functions']['model']
  assert meta['input']['shape'] == ['b', 224, 224, 3] and meta['output']['shape'] == ['b', 1000]
  stablehlo = [{'artifact': str(out / 'model.stablehlo'), 'data': data}]
  saved = [{'artifact': str(out / 'saved_model'), 'signature': 'model', 'data': data}]
  checks = [_check_blocked(STABLEHLO_CHECK, 'vit_jax,flax', stablehlo, tmp_path)]
  if WRITES_SAVED_MODEL:
    checks.append(_check_blocked(SAVED_MODEL_CHECK, 'vit_jax,flax,jax,jaxlib', saved, tmp_path))
  try:
    for proc in checks:
      _passed(proc)
  finally:
    for proc in (export, *checks):
      proc.kill()


# The other end of the supported range (docs/export.md, Across jax versions): its interpreter,
# named by this variable, else found where the Makefile makes the environments.
OTHER_END = 'VIT_JAX_OTHER_END_PYTHON'
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Run by the other end: the tiny ViT exported there with the model's outputs there, and the
# artifact this end wrote read there.
ACROSS = textwrap.dedent("""
  import sys
  import numpy as np
  from tests.test_export import exported_with_outputs, read_across
  src, theirs, ours, result = sys.argv[1:]
  x = np.load(result + '.x.npy')
  np.savez(result, written=exported_with_outputs(src, theirs, x), **read_across(ours, x))
""")


def _other_end_python() -> str | None:
  """$VIT_JAX_OTHER_END_PYTHON, else the repository's venv of the other end (the Makefile's
  names): .venv-3.11 or .venv from Python 3.12 and 3.13, .venv-3.13 or .venv-3.12 from 3.11;
  None where there is none."""
  if os.environ.get(OTHER_END):
    return os.environ[OTHER_END]
  newer = sys.version_info >= (3, 12)
  names = ('.venv-3.11', '.venv') if newer else ('.venv-3.13', '.venv-3.12')
  found = [os.path.join(REPO, name, 'bin', 'python') for name in names]
  return next((p for p in found if os.path.exists(p)), None)


def exported_with_outputs(src: str, out: str, x: np.ndarray) -> np.ndarray:
  """`src` exported to `out` (StableHLO) by this jax, and the model's outputs on `x` here."""
  export_model(src, out, formats=('stablehlo',))
  (function,) = functions(checkpoint.fit(src))
  return np.asarray(jax.jit(function.fn)(x))


def read_across(out: str, x: np.ndarray) -> dict[str, np.ndarray]:
  """What this jax makes of the artifact in `out` on `x`: `jax` (its version), `alone` (jax
  alone's outputs, absent where jax cannot run it), `loaded` (`vit_jax.load`'s logits) or
  `error` (its message)."""
  got = {'jax': np.array(jax.__version__)}
  try:
    blob = pathlib.Path(out, 'model.stablehlo').read_bytes()
    exported = jax.export.deserialize(bytearray(blob))
    got['alone'] = np.asarray(exported.call(x))
  except jax.errors.JaxRuntimeError:
    pass
  try:
    got['loaded'] = vit_jax.load(out).logits(x)
  except ValueError as e:
    got['error'] = np.array(str(e))
  return got


def _version(v) -> tuple[int, ...]:
  return tuple(int(part) for part in str(v).split('.'))


def _check_direction(writer: str, written: np.ndarray, read: dict[str, np.ndarray]) -> None:
  """`read` (read_across's, by the reader's jax) of what jax `writer` wrote with outputs
  `written`: the same outputs, or, where jax alone cannot run it, `vit_jax.load`'s one line
  naming both versions. Another XLA compiles it: 1e-6, not bit for bit."""
  reader = str(read['jax'])
  if 'alone' in read:
    np.testing.assert_allclose(read['alone'], written, rtol=0, atol=1e-6)
    np.testing.assert_allclose(read['loaded'], written, rtol=0, atol=1e-6)
    return
  assert 'loaded' not in read, f'jax {reader} alone cannot run it, vit_jax.load did'
  error = str(read['error'])
  assert '\n' not in error
  assert f'written by jax {writer}, whose StableHLO jax {reader} cannot read' in error
  assert f'export it again with jax {reader}, or load it with jax {writer} or newer' in error


@pytest.mark.slow
def test_stablehlo_across_jax_versions(tmp_path):
  """The tiny ViT exported by this end's jax and by the other end's, each read by the other:
  the writer's outputs, or (where jax alone cannot run it) `vit_jax.load`'s one line. The
  newer jax reads the older's artifact: jax's 6-month backward compatibility."""
  other = _other_end_python()
  if other is None:
    pytest.skip(f'no other end: set {OTHER_END} to its Python (the other of .venv, .venv-3.13)')
  src, ours, theirs, result = (str(tmp_path / n) for n in ('vit.npz', 'ours', 'theirs', 'r'))
  _save(MODELS['vit'], src)
  x = np.random.default_rng(0).uniform(-1, 1, (3, SIZE, SIZE, 3)).astype(np.float32)
  np.save(result + '.x.npy', x)
  written_here = exported_with_outputs(src, ours, x)
  env = {k: v for k, v in os.environ.items() if k not in ('PYTHONPATH', 'XLA_FLAGS')}
  env.update(JAX_PLATFORMS='cpu', CUDA_VISIBLE_DEVICES='')
  command = [other, '-c', ACROSS, src, theirs, ours, result]
  proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  there = dict(np.load(result + '.npz'))
  if str(there['jax']) == jax.__version__:
    pytest.skip(f'{other} has this jax, {jax.__version__}: not the other end')
  here = read_across(theirs, x)
  _check_direction(jax.__version__, written_here, there)
  _check_direction(str(there['jax']), there['written'], here)
  newer_reads = there if _version(there['jax']) > _version(jax.__version__) else here
  assert 'alone' in newer_reads, 'the newer jax cannot read the older jax artifact'
