"""Shared test set-up: 8 simulated CPU devices, random weights for oracle comparisons, the
comparison of trained parameters between runs that differ only in summation order, and a
console script run in this process (`command`)."""

import contextlib
import hashlib
import io
import os
import re
import subprocess
from pathlib import Path

# Before jax is imported anywhere: 8 CPU devices so sharding tests can build real meshes.
os.environ['XLA_FLAGS'] = (
  os.environ.get('XLA_FLAGS', '') + ' --xla_force_host_platform_device_count=8'
).strip()
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

import jax
import numpy as np
import pytest

from vit_jax import compilation_cache
from vit_jax.torch_compat import allow_torchvision_import

# The oracles transformers and timm import torchvision, whose PyPI build needs this beside the
# CPU torch.
allow_torchvision_import()


# The costliest files, in descending order of their measured seconds (docs/testing.md). The
# workers of `make test` take whole files in collection order (`--dist loadfile
# --no-loadscope-reorder`), so these go first and the short files fill the end.
LONGEST_FIRST = (
  'test_train.py',
  'test_multihost.py',
  'test_benchmark.py',
  'test_lit.py',
  'test_steps.py',
  'test_notebook.py',
  'test_models.py',
  'test_reproduce_vtab.py',
  'test_cloud_paths.py',
  'test_checkpoint_faults.py',
)


def pytest_collection_modifyitems(items):
  rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest in order


def randomize(params, seed: int = 0, scale: float = 0.2):
  """Every leaf replaced by N(0, scale) noise (float32), so no weight is left at a zero init."""
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda x: (scale * rng.standard_normal(x.shape)).astype(np.float32), params)


def big_vision_siglip(params) -> dict:
  """Our image-text tree in big_vision's two-tower .npz layout, as its SigLIP files are: a
  `params/` prefix, both towers' blocks scan-stacked (`encoderblock/...`, layer first), the
  image position embedding at the tower's top level (`img/pos_embedding`), t and b."""
  from vit_jax.flat import flatten

  flat, stacked = {}, {}
  for key, value in flatten(params).items():
    key = key.replace('Transformer/posembed_input/pos_embedding', 'pos_embedding')
    if m := re.match(r'^(.*/encoderblock)_(\d+)/(.*)$', key):
      stacked.setdefault(f'{m.group(1)}/{m.group(3)}', {})[int(m.group(2))] = value
    else:
      flat[key] = value
  for key, layers in stacked.items():
    flat[key] = np.stack([layers[i] for i in range(len(layers))])
  return {f'params/{k}': np.float32(v) for k, v in flat.items()}


# A tiny ViT on configs/digits.py and a short run of it, as dotted config overrides (also
# `--config.KEY=VALUE` flags of subprocess runs).
TINY = {
  'model.hidden_size': 32,
  'model.patches.size': (2, 2),
  'model.transformer.num_layers': 1,
  'model.transformer.mlp_dim': 64,
  'model.transformer.num_heads': 2,
  'pp.crop': 8,
  'batch': 32,
  'batch_eval': 360,
  'warmup_steps': 2,
  'total_steps': 6,
  'progress_every': 1,
  'eval_every': 3,
  'checkpoint_every': 3,
}


def process_env(devices: int) -> dict[str, str]:
  """The environment of a child jax process (a launch script's) on `devices` simulated CPU
  devices: this one's, less the coordinator settings of any run around it."""
  from vit_jax import distributed

  env = dict(os.environ)
  env.update(
    XLA_FLAGS=f'--xla_force_host_platform_device_count={devices}',
    JAX_PLATFORMS='cpu',
    TF_CPP_MIN_LOG_LEVEL='3',
    PYTHONUNBUFFERED='1',
  )
  for key in (distributed.ENV_ADDRESS, distributed.ENV_NUM_PROCESSES, distributed.ENV_PROCESS_ID):
    env.pop(key, None)
  return env


def tiny_config(**overrides):
  """configs/digits.py with TINY and `overrides` (keyword names use '__' for '.')."""
  from configs import digits
  from vit_jax.train.spec import with_overrides

  dotted = {**TINY, **{k.replace('__', '.'): v for k, v in overrides.items()}}
  return with_overrides(digits.get_config(), dotted)


@pytest.fixture(scope='session')
def reference_run(tmp_path_factory):
  """The uninterrupted TINY run on all 8 devices, read by tests of several files: (workdir,
  result). Its 2-step profile changes no number."""
  from vit_jax import train

  workdir = str(tmp_path_factory.mktemp('reference'))
  return workdir, train.train_and_evaluate(tiny_config(profile_steps=2), workdir)


# Small ViTs for the model and checkpoint tests (fields over a registry config): every part
# there (several heads and blocks), each compiled in about a second.
# SMALL at 32 px is a 4x4 grid of 8x8 patches; NARROW keeps the registry config's patches.
SMALL = {
  'hidden_size': 32,
  'patches': {'size': (8, 8)},
  'transformer': {'num_layers': 2, 'num_heads': 4, 'mlp_dim': 64},
}
NARROW = {'hidden_size': 16, 'transformer': {'num_layers': 3, 'num_heads': 2, 'mlp_dim': 32}}


# A distillation teacher unlike the TINY student: 4x4 patches at 16 px, so it sees the 8-px
# batch resized.
TEACHER = {
  'patches': {'size': (4, 4)},
  'hidden_size': 16,
  'transformer': {'num_layers': 1, 'mlp_dim': 32, 'num_heads': 2},
  'classifier': 'gap',
  'representation_size': None,
  'resnet': None,
}


def write_teacher(path, classes: int = 10, seed: int = 3) -> str:
  """An npz of TEACHER with random weights, whose logits prefer different classes."""
  from vit_jax import families
  from vit_jax.checkpoint import save_npz
  from vit_jax.models import model_from_config

  shapes = families.param_shapes(model_from_config(TEACHER, num_classes=classes), 16)
  params = randomize(shapes, seed=seed, scale=0.5)
  params['head']['bias'] *= 0  # else the bias decides: pooled features vary little
  save_npz(params, path)
  return str(path)


def train_error(config, tmp_path, match: str) -> None:
  """Training `config` stops with a one-line ValueError matching `match`, before it writes
  or computes anything."""
  from vit_jax import train

  with pytest.raises(ValueError, match=match) as info:
    train.train_and_evaluate(config, str(tmp_path / 'run'))
  assert '\n' not in str(info.value)
  assert not os.path.exists(tmp_path / 'run')


def dot_types(hlo_text: str) -> list[tuple[str, str, str]]:
  """(lhs, rhs, result) element types of every dot_general in StableHLO text (a symbolic
  dimension reads '?')."""
  dims = r'(?:(?:\d+|\?)x)*'
  types = rf'\(tensor<{dims}(\w+)>, tensor<{dims}(\w+)>\) -> tensor<{dims}(\w+)>'
  return re.findall(r'stablehlo\.dot_general.*?:\s*' + types, hlo_text)


# absltest defines it when chex is imported, as vit-embed and vit-benchmark import it.
LIBRARY_FLAG = 'test_srcdir'


@pytest.fixture
def command(monkeypatch, capsys):
  """`command(entry, *args)` runs `entry`'s console script in this process: its `run_cli()`
  on a fresh FLAGS (with absl's --verbosity and a library's flag in it), absl's `app.run`
  reduced to parsing and `main`. Returns (exit status, stdout, stderr)."""
  import importlib
  import sys

  from absl import app, flags

  from vit_jax import cli, hugepages

  def run(entry: cli.EntryPoint, *args: str) -> tuple[int, str, str]:
    program_flags = flags.FlagValues()
    flags.DEFINE_string(LIBRARY_FLAG, '', "absltest's", flag_values=program_flags)
    flags.DEFINE_integer('verbosity', -1, "absl.logging's", flag_values=program_flags)
    monkeypatch.setattr(flags, 'FLAGS', program_flags)
    monkeypatch.setattr(sys, 'argv', [entry.script, *args])
    monkeypatch.setattr(sys.modules['__main__'], '__spec__', None)  # not `python -m`
    monkeypatch.setattr(hugepages, 'reexec_with_huge_pages', lambda: None)
    monkeypatch.setattr(
      app, 'run', lambda main, flags_parser: sys.exit(main(flags_parser(sys.argv)))
    )
    with pytest.raises(SystemExit) as exit:
      importlib.import_module(cli.entry_point(entry.script).cli).run_cli()  # the script's
    out, err = capsys.readouterr()
    return exit.value.code, out, err

  return run


@pytest.fixture
def random_params():
  return randomize


# The attention key bias has a zero gradient (softmax ignores a per-query constant), so Adam
# steps it by normalised rounding noise, which differs with any change of summation order.
# It cannot change any output; it is checked for staying at the noise level instead.
ZERO_GRADIENT = re.compile(r'MultiHeadDotProductAttention_0/key/bias$')


def assert_trained_params_close(a: dict, b: dict, atol: float) -> None:
  """Flat {path: array} trees of two training runs: equal to `atol`, zero-gradient leaves aside."""
  assert a.keys() == b.keys() and len(a) > 15  # whole models (a one-block ViT-22B-style: 18)
  for k in a:
    if ZERO_GRADIENT.search(k):
      assert np.abs(a[k]).max() < 1e-3 and np.abs(b[k]).max() < 1e-3, k  # noise, not signal
    else:
      np.testing.assert_allclose(a[k], b[k], atol=atol, rtol=0, err_msg=k)


def assert_run_reads_back(workdir, final_params, tmp_path) -> None:
  """A run directory reads back to the run's final parameters, bit for bit, through
  `checkpoint.fit` and through `convert` to .npz and `fit` of that file (of the same
  architecture)."""
  import jax

  from vit_jax import checkpoint
  from vit_jax.cli import convert

  want = checkpoint.flatten(jax.tree.map(np.asarray, jax.device_get(final_params)))
  fitted = checkpoint.fit(workdir)
  converted = str(tmp_path / 'converted.npz')
  convert.convert(str(workdir), converted, to='npz', out=lambda line: None)
  again = checkpoint.fit(converted)
  assert checkpoint.tree.architecture(again.config) == checkpoint.tree.architecture(fitted.config)
  for got in (checkpoint.flatten(fitted.params), checkpoint.flatten(again.params)):
    assert got.keys() == want.keys()
    for k in want:
      np.testing.assert_array_equal(got[k], want[k], err_msg=k)


@contextlib.contextmanager
def full_tmpfs(mount, size: str = '8m'):
  """A tmpfs of `size` at the new folder `mount` (skips the test where mounting is not
  allowed); the call it yields, `fill()`, fills it with another file but for 200 KiB, less
  than a checkpoint step of the tiny runs (400-980 KiB on 8 devices, varying with orbax's
  write timing, so a tmpfs sized in steps is not a reliable full disk). Lazily unmounted."""
  os.mkdir(mount)
  if subprocess.run(['mount', '-t', 'tmpfs', '-o', f'size={size}', 'tmpfs', str(mount)]).returncode:
    pytest.skip('this machine does not allow mounting a tmpfs')

  def fill():
    disk = os.statvfs(mount)
    with open(os.path.join(mount, 'filler'), 'wb') as filler:
      os.posix_fallocate(filler.fileno(), 0, disk.f_bavail * disk.f_frsize - 200 * 1024)

  try:
    yield fill
  finally:
    subprocess.run(['umount', '-l', str(mount)])


def digest(folder) -> str:
  """A SHA-256 of every file's name and bytes under `folder`: equal when nothing changed."""
  h = hashlib.sha256()
  for root, _, names in sorted(os.walk(folder)):
    for name in sorted(names):
      h.update(name.encode())
      with open(os.path.join(root, name), 'rb') as f:
        h.update(f.read())
  return h.hexdigest()


# One persistent XLA cache kept between runs, outside the checkout: the commands' own folder
# (vit_jax.compilation_cache: keying, pruning), so tests that compile the same programs (the tiny
# runs, their resumes, and every program of the previous run) compile once, and subprocesses
# (`python -m vit_jax.main ...`, the notebook's kernel) inherit it through the environment.
# VIT_JAX_TEST_CACHE=PATH moves it; =off gives each run an empty one under pytest's temporary
# directory. The folder is cut to its cap once, at the start of a session (docs/testing.md).
CACHE_ENV = 'VIT_JAX_TEST_CACHE'
_CACHE_SETTINGS = {
  'jax_persistent_cache_min_compile_time_secs': 0,
  'jax_persistent_cache_min_entry_size_bytes': 0,
}


def kept_cache_dir() -> Path | None:
  """The folder the XLA cache keeps between runs: $VIT_JAX_TEST_CACHE, else vit_jax/xla under
  $XDG_CACHE_HOME or ~/.cache; None under VIT_JAX_TEST_CACHE=off."""
  return compilation_cache.folder(os.environ.get(CACHE_ENV))


def pytest_configure(config):
  # In every process before its tests; the prune once a session, in the process that starts
  # xdist's workers (theirs have `workerinput`), before they read the folder.
  directory = kept_cache_dir()
  if directory is None:
    return
  try:
    directory.mkdir(parents=True, exist_ok=True)
  except OSError as error:
    raise pytest.UsageError(
      f'cannot make the XLA cache folder {directory} ({error.strerror}): '
      f'set {CACHE_ENV} to a writable folder, or to off'
    ) from None
  if not hasattr(config, 'workerinput'):
    compilation_cache.prune(directory)


@pytest.fixture(scope='session', autouse=True)
def session_compilation_cache(tmp_path_factory):
  directory = kept_cache_dir()
  if directory is None:
    directory = tmp_path_factory.getbasetemp()
    if os.environ.get('PYTEST_XDIST_WORKER'):
      directory = directory.parent  # every worker's basetemp is <session>/popen-gwN: share it
    directory = directory / 'xla_cache'
    directory.mkdir(exist_ok=True)
  settings = {'jax_compilation_cache_dir': str(directory), **_CACHE_SETTINGS}
  for name, value in settings.items():
    os.environ[name.upper()] = str(value)
    jax.config.update(name, value)
  yield directory


# Image folders for the input pipeline's tests: readable images, and files no decoder reads.
UNREADABLE = ('truncated.jpg', 'empty.jpg', 'notes.jpg')


def jpeg_bytes(rng: np.random.Generator, h: int, w: int, **kwargs) -> bytes:
  """A JPEG of random pixels (`kwargs`: Pillow's JPEG options)."""
  from PIL import Image

  out = io.BytesIO()
  Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(
    out, 'JPEG', quality=90, **kwargs
  )
  return out.getvalue()


def unreadable_files() -> dict[str, bytes]:
  """A JPEG cut in half, an empty file and a text file, each named .jpg."""
  whole = jpeg_bytes(np.random.default_rng(1), 64, 48)
  contents = (whole[: len(whole) // 2], b'', b'these are not the pixels you are looking for\n')
  return dict(zip(UNREADABLE, contents, strict=True))


def write_image_folder(root, counts: dict[str, int], bad=None, bad_split: str = 'train') -> str:
  """root/<split>/<class>/: `counts[split]` images over classes a, b, c (12x10 JPEGs, every
  fourth a 9x11 PNG), and the `bad` files ({name: bytes}) in `bad_split`/a."""
  from PIL import Image

  rng = np.random.default_rng(0)
  for split, n in counts.items():
    for i in range(n):
      folder = os.path.join(root, split, 'abc'[i % 3])
      os.makedirs(folder, exist_ok=True)
      if i % 4 == 3:
        Image.fromarray(rng.integers(0, 255, (9, 11, 3), np.uint8)).save(f'{folder}/{i:03d}.png')
      else:
        with open(f'{folder}/{i:03d}.jpg', 'wb') as f:
          f.write(jpeg_bytes(rng, 12, 10))
  os.makedirs(os.path.join(root, bad_split, 'a'), exist_ok=True)
  for name, content in (bad or {}).items():
    with open(os.path.join(root, bad_split, 'a', name), 'wb') as f:
      f.write(content)
  return str(root)
