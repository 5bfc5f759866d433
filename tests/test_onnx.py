"""ONNX export (vit_jax/export/onnx.py). The tests marked `onnx` run in ONNX's own environment
(requirements/oldest-onnx.txt or newest-onnx.txt; `make test-onnx`, which `make test` runs):
tiny models of every family written by `vit-export`, then run under onnxruntime in a fresh
interpreter where jax, flax and this project cannot be imported, against the model in this
process. The others run in the main
environment: what it says where jax2onnx is missing, and the two environments' pins."""

import json
import re
import textwrap
from pathlib import Path

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
  _passed,
  _save,
)
from vit_jax import checkpoint
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


def test_without_jax2onnx_onnx_is_one_line_naming_the_make_target(tmp_path, capsys, monkeypatch):
  monkeypatch.setattr(export_lib.onnx, 'available', lambda: False)
  assert export_lib.default_formats() == ['stablehlo', 'saved_model']
  status, _, err = _cli(capsys, tmp_path / 'vit.npz', tmp_path / 'out', '--formats=onnx')
  assert status == 1 and err.count('\n') == 1 and '`make onnx-env`' in err
  assert list(tmp_path.iterdir()) == []
  monkeypatch.setattr(export_lib.onnx, 'available', lambda: True)
  assert export_lib.default_formats() == ['stablehlo', 'saved_model', 'onnx']


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
