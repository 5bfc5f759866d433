"""The converter command line: what it prints, what it writes, and its exit codes."""

import json
import subprocess
import sys

import chex
import jax
import numpy as np
import pytest
import scipy.ndimage
from absl import flags

from vit_jax import checkpoint, families
from vit_jax.checkpoint import class_names
from vit_jax.cli import convert
from vit_jax.models import get_model

POSEMB = 'Transformer/posembed_input/pos_embedding'


@pytest.fixture
def testing_npz(tmp_path, random_params):
  """A checkpoint of the registered 'testing' architecture (hidden 10, patch 16) at 32 px."""
  model = get_model('testing', num_classes=7)
  params = random_params(families.param_shapes(model, 32))
  checkpoint.save_npz(params, tmp_path / 'testing.npz')
  return tmp_path / 'testing.npz', model, params


def _run(capsys, *argv):
  """The command line in this process: its flags parsed on their own FlagValues, then run."""
  flag_values = flags.FlagValues()
  convert.define_flags(flag_values)
  args = flag_values(['convert', *(str(a) for a in argv)])[1:]
  status = convert.run(args, flag_values)
  out, err = capsys.readouterr()
  return status, out, err


def _npz(path):
  with np.load(path, allow_pickle=False) as f:
    return {k: f[k] for k in f.files}


def test_npz_to_hf_to_npz(tmp_path, capsys, testing_npz):
  src, model, params = testing_npz
  status, out, err = _run(capsys, src, tmp_path / 'hf', '--to=hf')
  assert status == 0, err
  read, wrote = out.splitlines()[:2]
  assert read.startswith(f'read {src}: npz (vit_jax, pre-Linen names)')
  assert '24 arrays, 8,547 parameters; model testing' in read and 'head 7 classes' in read
  assert wrote.startswith(f'wrote {tmp_path / "hf"}: hf (ViTForImageClassification')
  assert 'gelu_pytorch_tanh' in wrote

  import torch  # the oracle is a test requirement (requirements/test.in)
  import transformers

  hf = transformers.ViTForImageClassification.from_pretrained(tmp_path / 'hf').eval()
  images = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype(np.float32)
  ours = np.asarray(model.apply({'params': params}, images, train=False))
  with torch.no_grad():
    theirs = hf(pixel_values=torch.from_numpy(images.transpose(0, 3, 1, 2).copy())).logits.numpy()
  np.testing.assert_allclose(theirs, ours, atol=1e-5, rtol=0)

  status, out, err = _run(capsys, tmp_path / 'hf', tmp_path / 'back.npz', '--to=npz')
  assert status == 0, err
  assert 'hf (model.safetensors, 24 tensors, 4.x names, ViTForImageClassification' in out
  before, after = _npz(src), _npz(tmp_path / 'back.npz')
  assert sorted(before) == sorted(after)
  for key in before:
    np.testing.assert_array_equal(after[key], before[key], err_msg=key)


def test_hf_to_npz_to_hf_keeps_the_gelu_the_epsilon_and_the_class_names(tmp_path, capsys, caplog):
  """What the .npz's shapes cannot hold goes in FILE.json beside it, which fit and the way
  back read (at 21178fb: gelu_pytorch_tanh, 1e-6 and LABEL_0.. came back)."""
  import transformers  # the oracle is a test requirement (requirements/test.in)

  names = [f'digit{i}' for i in range(3)]
  config = transformers.ViTConfig(
    hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
    image_size=8, patch_size=4, hidden_act='gelu', layer_norm_eps=1e-12,
    id2label=dict(enumerate(names)), label2id={n: i for i, n in enumerate(names)},
  )  # fmt: skip
  transformers.ViTForImageClassification(config).save_pretrained(tmp_path / 'hf')
  status, out, err = _run(capsys, tmp_path / 'hf', tmp_path / 'digits.npz', '--to=npz')
  assert status == 0, err
  assert f'wrote {tmp_path / "digits.json"}' in out.splitlines()
  side = json.loads((tmp_path / 'digits.json').read_text())
  assert side == {
    'model': {'gelu_approximate': False, 'layer_norm_epsilon': 1e-12},
    'class_names': names,
  }
  fitted = checkpoint.fit(tmp_path / 'digits.npz')
  assert (fitted.config.gelu_approximate, fitted.config.layer_norm_epsilon) == (False, 1e-12)

  status, out, err = _run(capsys, tmp_path / 'digits.npz', tmp_path / 'back', '--to=hf')
  assert status == 0, err
  back = json.loads((tmp_path / 'back' / 'config.json').read_text())
  assert (back['hidden_act'], back['layer_norm_eps']) == ('gelu', 1e-12)
  assert back['id2label'] == {str(i): name for i, name in enumerate(names)}
  # timm keeps the GELU and the names, and has no place for the epsilon: one line says so.
  with caplog.at_level('WARNING'):
    status, _, err = _run(capsys, tmp_path / 'digits.npz', tmp_path / 'timm', '--to=timm')
  assert status == 0, err
  assert [r.getMessage() for r in caplog.records] == [
    "timm's config.json has no place for the model's LayerNorm epsilon 1e-12: timm computes"
    " the export with 1e-6, so its logits differ slightly from the model's"
  ]
  assert class_names.beside(tmp_path / 'timm', 3) == (names, str(tmp_path / 'timm/config.json'))


def test_resolution_resizes_the_position_embeddings(tmp_path, capsys, testing_npz):
  src, _, params = testing_npz
  status, out, _ = _run(capsys, src, tmp_path / 'r.npz', '--to=npz', '--resolution=64')
  assert status == 0
  assert f'  resized {POSEMB}: (1, 5, 10) -> (1, 17, 10)' in out.splitlines()
  assert 'at 64 px' in out
  posemb = np.asarray(params['Transformer']['posembed_input']['pos_embedding'])
  grid = scipy.ndimage.zoom(posemb[0, 1:].reshape(2, 2, 10), (2, 2, 1), order=1)
  expected = np.concatenate([posemb[:, :1], grid.reshape(1, 16, 10)], axis=1)
  np.testing.assert_array_equal(_npz(tmp_path / 'r.npz')[POSEMB], expected)


def test_num_classes_replaces_or_drops_the_head(tmp_path, capsys, testing_npz):
  src, _, _ = testing_npz
  status, out, _ = _run(capsys, src, tmp_path / 'k3.npz', '--to=npz', '--num_classes=3')
  assert status == 0 and '  dropped head/kernel (replaced by a fresh zero head)' in out
  written = _npz(tmp_path / 'k3.npz')
  assert written['head/kernel'].shape == (10, 3) and not written['head/kernel'].any()

  status, out, _ = _run(capsys, src, tmp_path / 'k0.npz', '--to=npz', '--num_classes=0')
  assert status == 0 and '  dropped head/bias' in out
  assert not any(k.startswith('head/') for k in _npz(tmp_path / 'k0.npz'))


def test_in21k_checkpoint_exports_as_vitmodel_with_pooler(tmp_path, capsys, random_params):
  model = get_model('testing', num_classes=21843, representation_size=10)
  checkpoint.save_npz(random_params(families.param_shapes(model, 32)), tmp_path / 'in21k.npz')
  status, _, err = _run(capsys, tmp_path / 'in21k.npz', tmp_path / 'hf', '--to=hf')
  assert status == 1 and 'both pre_logits' in err and '--num_classes=0' in err
  assert not (tmp_path / 'hf').exists()
  status, out, _ = _run(
    capsys, tmp_path / 'in21k.npz', tmp_path / 'hf', '--to=hf', '--num_classes=0'
  )
  assert status == 0 and 'hf (ViTModel' in out
  config = json.loads((tmp_path / 'hf' / 'config.json').read_text())
  assert config['architectures'] == ['ViTModel'] and 'id2label' not in config
  assert 'pre_logits' in checkpoint.load(tmp_path / 'hf')


def test_hybrid_converts_to_npz_at_another_resolution(tmp_path, capsys, random_params):
  model = get_model(
    'R+ViT-Ti_16',
    num_classes=3,
    hidden_size=16,
    transformer={'num_layers': 1, 'num_heads': 2, 'mlp_dim': 32},
  )
  checkpoint.save_npz(random_params(families.param_shapes(model, 64)), tmp_path / 'r.npz')
  status, out, err = _run(
    capsys, tmp_path / 'r.npz', tmp_path / 'r96.npz', '--to=npz', '--resolution=96'
  )
  assert status == 0, err
  assert '64 px' in out.splitlines()[0] and f'resized {POSEMB}: (1, 5, 16) -> (1, 10, 16)' in out
  assert _npz(tmp_path / 'r96.npz')['gn_root/scale'].shape == (1, 1, 1, 64)
  status, _, err = _run(capsys, tmp_path / 'r.npz', tmp_path / 'hf', '--to=hf')
  assert status == 1 and 'hybrid' in err and not (tmp_path / 'hf').exists()


@pytest.mark.parametrize(
  ('extra', 'message'),
  [
    (
      ['--model=ViT-Ti_16'],
      '--model ViT-Ti_16 does not fit the checkpoint, which holds testing (hidden_size 10,'
      ' 1 layers, 2 heads, mlp_dim 10, patch 16x16, classifier token)',
    ),
    (['--model=ViT-B16'], "Unknown model 'ViT-B16'. Did you mean: ViT-B_16"),
    (['--num_classes=-1'], 'must be >= 0'),
    (['--resolution=40'], '--resolution 40 is not a positive multiple of the patch stride 16'),
  ],
)
def test_failures_exit_1_with_one_line_and_write_nothing(
  tmp_path, capsys, testing_npz, extra, message
):
  src, _, _ = testing_npz
  status, _, err = _run(capsys, src, tmp_path / 'out.npz', '--to=npz', *extra)
  assert status == 1
  assert err.startswith('error: ') and err.count('\n') == 1 and message in err
  assert not (tmp_path / 'out.npz').exists()


def test_bad_sources_exit_1(tmp_path, capsys, testing_npz):
  src, _, _ = testing_npz
  status, _, err = _run(capsys, tmp_path / 'absent.npz', tmp_path / 'o.npz', '--to=npz')
  assert status == 1 and 'no such file' in err
  data = src.read_bytes()
  (tmp_path / 'cut.npz').write_bytes(data[:100])
  status, _, err = _run(capsys, tmp_path / 'cut.npz', src, '--to=npz')
  assert status == 1 and 'truncated' in err and err.count('\n') == 1
  assert src.read_bytes() == data  # the destination is untouched


def test_usage_errors_exit_2(capsys):
  status, _, err = _run(capsys, 'only_src')
  assert status == 2 and 'SRC, DST and --to are required' in err
  with pytest.raises(flags.IllegalFlagValueError, match=r'one of <npz\|hf\|timm>'):
    _run(capsys, 'a', 'b', '--to=onnx')


def test_list_shows_the_catalogue(capsys):
  status, out, _ = _run(capsys, '--list', 'B_16')
  assert status == 0
  lines = out.splitlines()
  assert lines[0].split()[:6] == ['name', 'model', 'res', 'classes', 'pre_logits', 'size']
  row = next(line for line in lines if line.startswith('imagenet21k/ViT-B_16 '))
  assert row.split()[1:6] == ['ViT-B_16', '224', '21843', 'yes', '393.69']
  assert row.endswith('https://storage.googleapis.com/vit_models/imagenet21k/ViT-B_16.npz')
  assert _run(capsys, '--list', 'no-such-model')[0] == 1


@pytest.mark.slow
def test_the_module_runs_and_exits_with_its_status(tmp_path, testing_npz):
  src, _, _ = testing_npz
  ok = subprocess.run(
    [sys.executable, '-m', 'vit_jax.convert', str(src), str(tmp_path / 'o.npz'), '--to=npz'],
    capture_output=True,
    text=True,
    check=False,
  )
  assert ok.returncode == 0, ok.stderr
  assert ok.stdout.startswith('read ') and (tmp_path / 'o.npz').exists()
  bad = subprocess.run(
    [sys.executable, '-m', 'vit_jax.convert', str(tmp_path / 'nope'), 'x.npz', '--to=npz'],
    capture_output=True,
    text=True,
    check=False,
  )
  assert bad.returncode == 1 and bad.stderr.strip().startswith('error: ')
  assert len(bad.stderr.strip().splitlines()) == 1


def test_keys_of_a_conversion_are_exactly_the_models(tmp_path, capsys, testing_npz):
  src, model, _ = testing_npz
  _run(capsys, src, tmp_path / 'o.npz', '--to=npz', '--model=testing')
  loaded = checkpoint.load(tmp_path / 'o.npz')
  chex.assert_trees_all_equal_shapes_and_dtypes(loaded, families.param_shapes(model, 32))
  assert jax.tree.leaves(loaded)  # not empty
