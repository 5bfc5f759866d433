"""ONNX export (vit_jax/export/onnx.py). The tests marked `onnx` run in ONNX's own environment
(requirements/oldest-onnx.txt or newest-onnx.txt; `make test-onnx`, which `make test` runs):
tiny models of every family written by `vit-export`, then run under onnxruntime in a fresh
interpreter where jax, flax and this project cannot be imported, against the model in this
process. The others run in the main
environment: what it says where jax2onnx is missing, and the two environments' pins."""

import importlib.metadata
import json
import re
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest
from absl import flags

from tests.test_export import (
  BLOCKER,
  MODELS,
  TINY_ENCODER,
  _check_blocked,
  _cli,
  _expected,
  _inputs,
  _passed,
  _save,
)
from vit_jax import benchmark, checkpoint
from vit_jax import export as export_lib
from vit_jax.cli import export as export_cli
from vit_jax.export import functions
from vit_jax.models import get_config

ROOT = Path(__file__).parent.parent
ONNX_CHECK = BLOCKER + textwrap.dedent("""
  import json, numpy as np, onnxruntime as ort
  for case in json.loads(sys.argv[2]):
    data = np.load(case['data'])
    session = ort.InferenceSession(case['artifact'], providers=['CPUExecutionProvider'])
    (x,), (y,) = session.get_inputs(), session.get_outputs()
    assert [x.name, x.shape, y.name, y.shape] == case['io'], (case['artifact'], x, y)
    for i in range(len(data.files) // 2):
      (got,) = session.run(None, {x.name: data[f'x{i}']})
      np.testing.assert_allclose(got, data[f'y{i}'], rtol=0, atol=1e-5, err_msg=case['artifact'])
  print('ok')
""")
# The int8 files against the float32 model: each output's cosine to the model's at least 0.99.
# int8 per-channel weights are off by at most half a step, max|w| / 254 per output channel,
# uint8 activations likewise per tensor: for weights of ViT's initialisation a relative error of
# about 1% per matmul, a few % through the network, a cosine above 0.999; 0.99 leaves room
# for ~14% and fails where a layer's scales go wrong (a swapped zero point: cosine near 0).
INT8_COSINE = 0.99
INT8_CHECK = BLOCKER + textwrap.dedent("""
  import json, numpy as np, onnxruntime as ort
  for case in json.loads(sys.argv[2]):
    data = np.load(case['data'])
    session = ort.InferenceSession(case['artifact'], providers=['CPUExecutionProvider'])
    (x,), (y,) = session.get_inputs(), session.get_outputs()
    assert [x.name, x.shape, y.name, y.shape] == case['io'], (case['artifact'], x, y)
    (got,) = session.run(None, {x.name: data['x']})
    want = data['y'].astype(np.float64)
    cosine = (got * want).sum(-1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(want, axis=-1)
    assert cosine.min() >= case['cosine'], (case['artifact'], cosine)
  print('ok')
""")
# The tiny classifier of the benchmark's own weights (variants.init_params): ViT-Ti/16, one
# block, 32 px (4 patches), 10 classes; 0.6M parameters, 99% of them in matmul and conv kernels.
BENCH_MODEL = ('ViT-Ti_16', {'transformer': {'num_layers': 1}}, 10, 32)


def _hybrid():
  """A ResNet stem of one stage (weight-standardised convs, GroupNorm), /4: 4x4 tokens."""
  config = get_config('R26+ViT-S_32')
  config.resnet.num_layers = (1,)
  config.update({'hidden_size': 16, 'num_classes': 5})
  config.transformer.update(TINY_ENCODER)
  return config


def _export(argv) -> None:
  """`vit-export ARGV` in this process."""
  flag_values = flags.FlagValues()
  export_cli.define_flags(flag_values)
  args = flag_values(['vit-export', *map(str, argv)])[1:]
  assert export_cli.run(args, flag_values) == 0


@pytest.fixture(scope='module')
def exported(tmp_path_factory):
  """Each tiny model saved and written by the command (the ViT with no flag, the others with
  --formats=onnx), and the onnxruntime check started on them in a fresh interpreter: (out
  dirs by model, the check)."""
  root = tmp_path_factory.mktemp('onnx')
  rng = np.random.default_rng(0)
  outs, cases = {}, []
  for name, config in {**MODELS, 'hybrid': _hybrid()}.items():
    src = root / f'{name}.npz'
    _save(config, src)
    outs[name] = out = root / f'{name}_out'
    _export([src, out] if name == 'vit' else [src, out, '--formats=onnx'])
    meta = json.loads((out / 'export.json').read_text())
    for function in functions(checkpoint.fit(str(src))):
      entry = meta['functions'][function.name]
      data = str(root / f'{name}_{function.name}.npz')
      np.savez(data, **_expected(function, rng))
      io = [entry['input']['name'], entry['input']['shape']]
      io += [entry['output']['name'], entry['output']['shape']]
      cases.append({'artifact': str(out / entry['onnx']), 'data': data, 'io': io})
  check = _check_blocked(ONNX_CHECK, 'vit_jax,flax,jax,jaxlib', cases, root)
  yield outs, check
  check.kill()


@pytest.mark.onnx
def test_onnx_runs_with_onnxruntime_alone_and_equals_the_model(exported):
  """Every function (vit, deit, mixer, hybrid; siglip's and naflex's image and text) at batch
  1, 3 and 8 (naflex at sequence lengths 6, 8 and 12), its inputs and outputs as export.json
  names them."""
  _passed(exported[1])


@pytest.mark.onnx
def test_the_default_here_is_stablehlo_and_onnx_and_one_line_for_the_saved_model(exported):
  outs = exported[0]
  vit = json.loads((outs['vit'] / 'export.json').read_text())
  assert vit['formats'] == ['stablehlo', 'onnx']
  assert vit['skipped'] == [export_lib.saved_model.UNAVAILABLE]
  assert vit['functions']['model']['onnx'] == 'model.onnx'
  assert vit['functions']['model']['saved_model_signature'] is None
  files = {name: sorted(p.name for p in out.iterdir()) for name, out in outs.items()}
  assert files['vit'] == ['export.json', 'model.onnx', 'model.stablehlo']
  for name in ('deit', 'mixer', 'hybrid'):
    assert files[name] == ['export.json', 'model.onnx']
  assert files['naflex'] == files['siglip'] == ['export.json', 'image.onnx', 'text.onnx']


@pytest.mark.onnx
def test_bfloat16_onnx_is_one_line_and_nothing_written(tmp_path, capsys):
  out = tmp_path / 'out'
  status, _, err = _cli(capsys, tmp_path / 'vit.npz', out, '--formats=onnx', '--dtype=bfloat16')
  assert status == 1 and err.count('\n') == 1 and 'bfloat16' in err
  assert list(tmp_path.iterdir()) == []  # checked before the checkpoint is read


def test_without_jax2onnx_onnx_and_int8_are_one_line_naming_make(tmp_path, capsys, monkeypatch):
  monkeypatch.setattr(export_lib.onnx, 'available', lambda: False)
  assert export_lib.default_formats() == ['stablehlo', 'saved_model']
  src = tmp_path / 'vit.npz'
  src.write_bytes(b'')  # there: the formats are refused before it is read
  for formats in ('onnx', 'onnx_int8'):
    status, _, err = _cli(capsys, src, tmp_path / 'out', f'--formats={formats}')
    assert status == 1 and err.count('\n') == 1 and '`make onnx-env`' in err
    assert f'{formats}: not written' in err
    assert list(tmp_path.iterdir()) == [src]
  monkeypatch.setattr(export_lib.onnx, 'available', lambda: True)
  assert export_lib.default_formats() == ['stablehlo', 'saved_model', 'onnx']


def _blocky(rng, batch: int, size: int) -> np.ndarray:
  """Images more like photographs than noise: 4x4 blocks of one colour each, upscaled, as
  the bundled 8x8 digits are."""
  small = rng.uniform(-1, 1, (batch, size // 4, size // 4, 3))
  return np.repeat(np.repeat(small, 4, axis=1), 4, axis=2).astype(np.float32)


def _int8_case(out, entry, function, rng, root) -> dict:
  """The int8 file of `function` and its float32 model's outputs in this process: 8 random
  inputs (images: 4 of noise, 4 blocky)."""
  if function.input_name == 'images':
    size = function.shape[1]
    x = np.concatenate([_inputs(function, rng, 4), _blocky(rng, 4, size)])
  else:
    x = _inputs(function, rng, 8)
  data = str(root / f'{out.name}_{function.name}_int8.npz')
  np.savez(data, x=x, y=np.asarray(jax.jit(function.fn)(x)))
  io = [entry['input']['name'], entry['input']['shape']]
  io += [entry['output']['name'], entry['output']['shape']]
  return {'artifact': str(out / entry['onnx_int8']), 'data': data, 'io': io, 'cosine': INT8_COSINE}


@pytest.fixture(scope='module')
def int8(tmp_path_factory):
  """The benchmark's tiny classifier written with --formats=onnx_int8 and the tiny SigLIP with
  --formats=onnx,onnx_int8, and their int8 check started in a fresh interpreter: (out dirs,
  the check)."""
  root = tmp_path_factory.mktemp('int8')
  rng = np.random.default_rng(1)
  name, overrides, classes, size = BENCH_MODEL
  benchmark.save_params(root / 'ti.npz', benchmark.model_config(name, overrides), classes, size)
  _save(MODELS['siglip'], root / 'siglip.npz')
  outs, cases = {'ti': root / 'ti_out', 'siglip': root / 'siglip_out'}, []
  _export([root / 'ti.npz', outs['ti'], '--formats=onnx_int8'])
  _export([root / 'siglip.npz', outs['siglip'], '--formats=onnx,onnx_int8'])
  for name, out in outs.items():
    meta = json.loads((out / 'export.json').read_text())
    for function in functions(checkpoint.fit(str(root / f'{name}.npz'))):
      cases.append(_int8_case(out, meta['functions'][function.name], function, rng, root))
  check = _check_blocked(INT8_CHECK, 'vit_jax,flax,jax,jaxlib', cases, root)
  yield outs, check
  check.kill()


@pytest.mark.onnx
def test_int8_runs_with_onnxruntime_alone_near_the_float32_model(int8):
  """The classifier's logits and SigLIP's image and text embeddings, cosine >= 0.99."""
  _passed(int8[1])


def _bytes(out: Path, name: str) -> int:
  return sum(p.stat().st_size for p in out.iterdir() if p.name.startswith(name))


@pytest.mark.onnx
def test_int8_is_a_quarter_of_the_float32_file_and_export_json_says_how(int8):
  outs = int8[0]
  meta = json.loads((outs['ti'] / 'export.json').read_text())
  assert meta['formats'] == ['onnx', 'onnx_int8']  # the float32 file it quantizes too
  assert meta['functions']['model']['onnx_int8'] == 'model.int8.onnx'
  assert meta['onnx_int8']['tool'] == 'onnxruntime.quantization.quantize_dynamic'
  assert meta['onnx_int8']['onnxruntime'] == importlib.metadata.version('onnxruntime')
  # A byte per weight of the kernels (99% of the parameters) where float32 has 4; the rest,
  # each output channel's scale and zero point and the graph stay: above 1/4, below 0.3.
  ratio = _bytes(outs['ti'], 'model.int8.onnx') / _bytes(outs['ti'], 'model.onnx')
  assert 0.25 < ratio < 0.3
  siglip = json.loads((outs['siglip'] / 'export.json').read_text())['functions']
  assert [siglip[f]['onnx_int8'] for f in ('image', 'text')] == [
    'image.int8.onnx',
    'text.int8.onnx',
  ]


@pytest.mark.onnx
def test_int8_in_bfloat16_is_one_line_and_nothing_written(tmp_path, capsys):
  src = tmp_path / 'vit.npz'
  src.write_bytes(b'')  # there: the request is refused before it is read
  status, _, err = _cli(capsys, src, tmp_path / 'out', '--formats=onnx_int8', '--dtype=bfloat16')
  assert status == 1 and err.count('\n') == 1, err
  assert 'onnx_int8: not written for --dtype=bfloat16' in err
  assert list(tmp_path.iterdir()) == [src]


@pytest.mark.onnx
def test_benchmark_times_the_onnx_files_beside_ours(int8):
  name, overrides, classes, size = BENCH_MODEL
  result = benchmark.run_benchmark(
    name, batch=2, resolution=size, num_classes=classes, model_overrides=overrides,
    onnx=str(int8[0]['ti']), rounds=1, steps=1, probe_sizes=(128,),
  )  # fmt: skip
  rows = {r['program']: r for r in result['rows']}
  assert {'ORT float32', 'ORT int8'} <= rows.keys()
  assert rows['ORT int8']['framework'] == 'onnxruntime' and rows['ORT int8']['img_per_s'] > 0
  agree = result['onnx_agreement']
  assert agree['ORT float32']['max_abs_logit_error'] < 1e-5  # the same model (to 1e-5 above)
  assert agree['ORT int8']['min_cosine'] >= INT8_COSINE


def test_benchmark_onnx_errors_are_one_line_before_compiling(tmp_path, monkeypatch):
  """A directory of another resolution, and onnxruntime missing: each one line naming the fix."""
  name, overrides, classes, size = BENCH_MODEL
  run = lambda onnx: benchmark.run_benchmark(
    name, batch=2, resolution=size, num_classes=classes, model_overrides=overrides, onnx=onnx
  )
  for res in (size, 64):
    model = {'input': {'name': 'images', 'shape': ['b', res, res, 3]}, 'onnx': 'model.onnx'}
    model['output'] = {'name': 'logits', 'shape': ['b', classes]}
    (tmp_path / str(res)).mkdir()
    (tmp_path / str(res) / 'export.json').write_text(json.dumps({'functions': {'model': model}}))
  pytest.importorskip('onnxruntime')
  with pytest.raises(ValueError, match=r'takes \[64, 64, 3\] .* \[32, 32, 3\].*--save_params'):
    run(str(tmp_path / '64'))
  monkeypatch.setitem(sys.modules, 'onnxruntime', None)  # as where it is not installed
  with pytest.raises(ValueError, match=r'^--onnx needs onnxruntime: pip install onnxruntime=='):
    run(str(tmp_path / str(size)))


def _pins(lock: str) -> dict[str, str]:
  """{name: version} of requirements/LOCK.txt, names normalised as pip compares them."""
  lines = (ROOT / 'requirements' / f'{lock}.txt').read_text().splitlines()
  pins = (m.groups() for line in lines if (m := re.match(r'([\w.-]+)==(\S+)$', line)))
  return {re.sub(r'[-_.]+', '-', name).lower(): version for name, version in pins}


@pytest.mark.parametrize('end', ['oldest', 'newest'])
def test_the_onnx_environment_pins_the_oldest_ends_versions_but_orbax(end):
  """On either end's Python: jax2onnx 0.17.1 fails on jax 0.12 (requirements/lock.py).
  onnxruntime is in both at one version: what it writes here, the main environment runs."""
  onnx, main = _pins(f'{end}-onnx'), _pins('oldest')
  main.update(_pins('oldest-test'))
  assert {'jax2onnx', 'onnx', 'onnx-ir'} <= onnx.keys() - main.keys()
  assert {'jax', 'jaxlib', 'flax', 'orbax-checkpoint', 'onnxruntime'} <= onnx.keys() & main.keys()
  differ = [k for k in sorted(onnx.keys() & main.keys()) if onnx[k] != main[k]]
  assert differ == ['orbax-checkpoint']
  assert 'tensorflow-cpu' in main and 'tensorflow-cpu' not in onnx
