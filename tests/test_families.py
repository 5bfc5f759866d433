"""The model families' declared interface (vit_jax/families/__init__.py): every registered
family has every member of `Interface`, with its parameters."""

import inspect
import types

import ml_collections
import pytest

from vit_jax import families
from vit_jax.families import vit

CALLABLES = [m for m in families.REQUIRED + families.OPTIONAL if m != 'MODULE'] + ['kind']
FLAGS = {'name': str, 'image_text': bool, 'writes': tuple, 'pre_logits': bool, 'npz_layout': str}


def _parameters(function) -> list[tuple]:
  """(name, kind, default) of each parameter: what a caller may pass."""
  return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


def test_the_interface_declares_every_member_once():
  declared = {n for n in vars(families.Interface) if not n.startswith('_')}
  declared |= set(families.Interface.__annotations__)
  assert declared == {*families.REQUIRED, *families.OPTIONAL, 'kind', *FLAGS}
  assert not set(families.REQUIRED) & set(families.OPTIONAL)


@pytest.mark.parametrize('family', families.FAMILIES, ids=lambda f: f.name)
def test_every_family_has_every_member_with_its_parameters(family):
  assert isinstance(family, families.Interface)
  for flag, kind in FLAGS.items():
    assert isinstance(getattr(family, flag), kind), flag
  assert isinstance(family.MODULE, type) and issubclass(family.MODULE, families.nn.Module)
  for member in CALLABLES:
    function = getattr(family, member)
    assert callable(function), member
    # The declaration's parameters but `self`.
    assert _parameters(function) == _parameters(getattr(families.Interface, member))[1:], member


def test_a_family_module_without_a_required_member_is_refused():
  partial = types.ModuleType('partial')
  for member in families.REQUIRED:
    setattr(partial, member, getattr(vit, member))
  families.Family('partial', partial)  # all of them: accepted, the optional ones defaulted
  del partial.token_grid
  with pytest.raises(TypeError, match='lacks token_grid'):
    families.Family('partial', partial)


def test_a_naflex_tree_is_the_naflex_familys_and_a_vit_tree_the_vits():
  """NaFlex is tried before the ViT, whose `embedding/kernel` it shares (2-D, not a conv)."""
  from conftest import SMALL

  from vit_jax.models import get_config, model_from_config

  vit_model = model_from_config({**get_config('ViT-B_16').to_dict(), **SMALL})
  assert families.of_tree(families.param_shapes(vit_model, 32)).name == 'vit'
  naflex = {**get_config('SigLIP2-B16-naflex').image.to_dict(), **SMALL, 'patch_size': 8}
  del naflex['patches']
  naflex_model = model_from_config(naflex, num_classes=10)
  shapes = families.param_shapes(naflex_model)
  assert families.of_tree(shapes).name == 'naflex' == families.of_module(naflex_model).name
  assert families.infer_config(shapes).num_classes == 10


def _naflex_digits(**pp) -> ml_collections.ConfigDict:
  """configs/digits.py on a small NaFlex classifier (patches of 2), `pp` set."""
  from configs import digits

  config = ml_collections.ConfigDict(digits.get_config().to_dict())
  config.model = {
    'patch_size': 2, 'hidden_size': 16, 'classifier': 'map', 'posemb_grid': 4,
    'transformer': {'num_layers': 1, 'mlp_dim': 32, 'num_heads': 2},
  }  # fmt: skip
  config.pp.update(pp)
  return config


def test_a_runs_patch_sequences_take_the_models_patch_and_an_old_pp_patch_size_is_ignored():
  """`config.pp.max_patches` is the run's (0: the model's own); the patch is the model's (an
  earlier config's `pp.patch_size` is accepted and dropped). A square-image model refuses
  patch sequences in one line."""
  from configs import digits
  from vit_jax.train import spec

  run = spec.from_config(_naflex_digits(max_patches=16, patch_size=2))  # an earlier key
  assert 'patch_size' not in spec.to_dict(run)['pp']
  fields, pp = run.model.constructor_fields(), run.data.pp
  images = families.run_preprocessing(fields, pp.crop, pp.max_patches)
  assert (images.kind, images.patch_size, images.max_patches) == ('patches', 2, 16)
  assert families.run_preprocessing(fields, pp.crop, 0).max_patches == 256  # the model's own
  vit_config = ml_collections.ConfigDict(digits.get_config().to_dict())
  vit_config.pp.max_patches = 16
  with pytest.raises(ValueError, match=r'max_patches=16: patch sequences, but this model takes'):
    spec.from_config(vit_config)


def test_mixup_and_cutmix_refuse_patch_sequences():
  from vit_jax.train import spec

  config = _naflex_digits(max_patches=16)
  config.mixup = 0.2
  with pytest.raises(ValueError, match=r'mixup=0\.2, config\.cutmix=0\.0: they mix pixel'):
    spec.from_config(config)
