"""The evaluators' interface as the loop runs it: an evaluator added to the registry is built
from the run, called at its interval over the parameters and their Polyak average, and its
metrics land in metrics.jsonl and the result; config.json holds the resolved spec."""

import dataclasses
import json
import math
import os

import jax
import numpy as np
import pytest
from conftest import TINY

from configs import digits as digits_config
from vit_jax import rundir, train
from vit_jax.evals import common, registry
from vit_jax.evals import spec as evals_spec
from vit_jax.reproduce import report, sweep
from vit_jax.train import spec

pytestmark = pytest.mark.slow

# 0.2 epochs of digits' 1437 training images in batches of 64.
EPOCHS, TRAIN_IMAGES, BATCH = 0.2, 1437, 64


@dataclasses.dataclass(frozen=True)
class _FakeSettings:
  datasets: tuple = ()


class _Sums(common.Evaluator):
  """The sum of every parameter (in float64, on the host), and the number of leaves."""

  fixed = frozenset({'leaves'})

  def __init__(self, context: common.Context, name: str, instance):
    super().__init__(every=instance.every)
    self.prefix = f'{name}/'
    self.context, self.settings = context, instance.settings
    self.calls = 0

  def run(self, params):
    self.calls += 1
    leaves = jax.tree.leaves(jax.device_get(params))
    return {'sum': _total(params), 'leaves': len(leaves)}


def _total(params) -> float:
  return float(sum(np.sum(np.asarray(x, np.float64)) for x in jax.tree.leaves(params)))


@pytest.fixture(scope='module')
def fake_run(tmp_path_factory):
  """A 5-step tiny digits run (`total_epochs`) with a Polyak average and the fake evaluator."""
  built = []

  def build(context, name, instance):
    built.append(_Sums(context, name, instance))
    return built[-1]

  with pytest.MonkeyPatch.context() as patch:
    patch.setitem(registry.TYPES, 'fake', build)  # a new type: its evaluator and settings
    patch.setitem(evals_spec.TYPES, 'fake', _FakeSettings)
    config = spec.with_overrides(
      digits_config.get_config(),
      {**TINY, 'total_epochs': EPOCHS, 'polyak_decay': 0.9, 'batch': BATCH},
    )
    config.evals = {'fake': {'type': 'fake', 'every': 2, 'datasets': ('digits',)}}
    workdir = str(tmp_path_factory.mktemp('fake_run'))
    result = train.train_and_evaluate(config, workdir, devices=jax.devices()[:1])
  (evaluator,) = built
  return workdir, result, evaluator


def test_a_registered_evaluator_runs_at_its_interval_on_the_parameters_and_the_average(fake_run):
  workdir, result, evaluator = fake_run
  assert result['status'] == 'done' and result['step'] == 5
  assert evaluator.context.data.num_classes == 10  # built from the resolved spec
  lines = [m for m in rundir.read_metrics(workdir) if 'fake/sum' in m]
  assert [m['step'] for m in lines] == [2, 4, 5]  # every 2 steps, and at the last one
  assert evaluator.calls == 6  # each time on the parameters, then on their average
  leaves = len(jax.tree.leaves(result['params']))
  for m in lines:
    assert m['fake/leaves'] == leaves and 'polyak/fake/leaves' not in m  # fixed: once
  last = lines[-1]
  assert last['fake/sum'] == _total(result['params'])
  assert last['polyak/fake/sum'] == _total(result['polyak'])
  assert last['fake/sum'] != last['polyak/fake/sum']
  # One line a step: at the last step with the test split's metrics, which the result and
  # the run directory's last evaluation hold beside the fake ones.
  assert 'accuracy_test' in last and 'polyak/accuracy_test' in last
  assert rundir.last_evaluation(workdir) == last
  for key in ('fake/sum', 'polyak/fake/sum', 'accuracy_test', 'num_test'):
    assert result[key] == last[key]


def test_config_json_holds_the_resolved_spec(fake_run, monkeypatch):
  workdir, _, _ = fake_run
  monkeypatch.setitem(evals_spec.TYPES, 'fake', _FakeSettings)  # config.evals names it
  with open(os.path.join(workdir, 'config.json')) as f:
    written = json.load(f)
  steps = math.ceil(EPOCHS * TRAIN_IMAGES / BATCH)  # 5
  assert (written['total_steps'], written['total_epochs']) == (steps, EPOCHS)
  assert written['num_classes'] == 10  # 0 in the config: the digits' ten
  assert written['evals'] == {'fake': {'type': 'fake', 'every': 2, 'datasets': ['digits']}}
  assert written['_resolved']['total_steps'] == steps and written['_resolved']['num_classes'] == 10
  # The keys read back into the same spec: the run resolved once, written as it ran.
  keys = {k: v for k, v in written.items() if k != '_resolved'}
  reread = json.loads(json.dumps(spec.to_dict(spec.from_config(keys))))
  assert reread == keys
  # The readers of run directories take it.
  assert rundir.total_steps(written) == steps
  assert sweep.run_result(workdir)['total_steps'] == steps
  run = report.read_run(workdir)
  assert (run.total_steps, run.step, run.dataset) == (steps, steps, 'digits')
