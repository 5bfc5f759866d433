"""The programs under test: a variant's compiled inference (`apply(train=False)`) and the
trainer's own training step, their compile time and FLOPs; `Timed`, a program and its
measurements, and `Job`, one run's inputs that its programs share."""

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from jax.sharding import Mesh

from vit_jax import optim, parallel
from vit_jax.benchmark import analysis
from vit_jax.benchmark.variants import Variant, build_model
from vit_jax.data import spec as data_spec
from vit_jax.train import spec as spec_lib
from vit_jax.train import steps as train_steps


@dataclasses.dataclass
class Timed:
  """A program under test: `run()` does one step and blocks until it is done."""

  label: str
  variant: Variant | None
  mode: str
  run: Callable[[], Any]
  compile_s: float = float('nan')
  flops_per_image: float = float('nan')
  model_flops_per_image: float = float('nan')
  facts: dict[str, Any] = dataclasses.field(default_factory=dict)  # of the compiled program
  wall: list[float] = dataclasses.field(default_factory=list)
  cpu: list[float] = dataclasses.field(default_factory=list)
  faults: list[int] = dataclasses.field(default_factory=list)
  peak_bytes: int | None = None
  hlo: Callable[[], str] | None = None  # the compiled program's text, for --profile_steps
  framework: str = 'jax'  # or 'hf-pytorch', 'onnxruntime'


@dataclasses.dataclass
class Job:
  """One benchmark run's checked arguments and inputs, shared by its stages."""

  config: ml_collections.ConfigDict
  variants: list[Variant]
  num_classes: int
  images: Any  # arrays, or ShapeDtypeStructs under compile_only
  labels: Any
  inference: bool
  train: bool
  compile_only: bool
  accum_steps: int
  analytic: float  # forward FLOPs per image of `models.stats`
  log: Callable[[str], None]
  mesh: Mesh  # where the training programs run (`train_mesh`)
  sharding: str = 'replicate'  # how their state is placed on it (config.sharding's rules)

  @property
  def batch(self) -> int:
    return self.images.shape[0]

  def modes(self, variant: Variant) -> list[str]:
    """remat changes no inference program: inference is measured once per layout."""
    infer = self.inference and variant.remat == self.variants[0].remat
    return (['inference'] if infer else []) + (['train'] if self.train else [])


def applied(model: Any) -> Callable:
  return lambda p, x: model.apply({'params': p}, x, train=False)


def compile_inference(
  model: Any, params: Any, images: jax.Array
) -> tuple[Callable, float, float, Any]:
  """(compiled apply, compile seconds, flops per image, `analysis.compiled_facts`)."""
  f = jax.jit(applied(model))
  start = time.perf_counter()
  lowered = f.lower(params, images)
  compiled = lowered.compile()
  compile_s = time.perf_counter() - start
  flops = analysis.flops(lowered) / images.shape[0]
  return compiled, compile_s, flops, analysis.compiled_facts(compiled)


# The training step timed is the trainer's own (vit_jax.train.steps) with the run spec's
# default recipe: softmax cross-entropy, clipping at global norm 1, SGD with momentum 0.9, the
# warmup-cosine schedule of this many steps, per-example dropout keys where the model drops out.
SCHEDULE_STEPS = 10_000


def trainer(model: Any, batch: int, accum_steps: int = 1, optimizer: str = 'sgd', pack: tuple = ()):
  """(optimizer, step fn): `vit_jax.train.steps.make_train_step` of the default run spec's
  classification, with `accum_steps` micro-batches and `optimizer` ('sgd' with momentum, the
  default recipe, or 'adam', the pretraining one); step(state, {'image', 'label'}) ->
  (state, metrics). `pack`: (tokens, images) of packed NaFlex rows, whose batch also holds
  'slots'."""
  from vit_jax.tasks import classification

  pp = data_spec.Pp(pack_tokens=pack[0], pack_images=pack[1]) if pack else data_spec.Pp()
  data = spec_lib.Data(batch=batch, num_classes=model.num_classes, pp=pp)
  step = spec_lib.Step(accum_steps=accum_steps)
  run = spec_lib.RunSpec(data=data, step=step, optim=optim.Optim(optimizer=optimizer))
  tx, schedule = optim.for_training(run.optim, SCHEDULE_STEPS)
  task = classification.Task(run, model)
  return tx, train_steps.make_train_step(task, tx, schedule, run)


def train_state(params: Any, tx: Any) -> dict[str, Any]:
  return {
    'params': params,
    'opt_state': tx.init(params),
    'step': jnp.zeros((), jnp.int32),
    'rng': jax.random.key_data(jax.random.key(1)),
  }


def abstract(tree: Any) -> Any:
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def train_mesh(spec: str | None = None) -> Mesh:
  """The training step's mesh: `spec` (the form of config.mesh, e.g. 'data:-1,model:2') over
  this process's devices, or one device (None: the benchmark's default)."""
  if spec is None:
    return parallel.create_mesh(jax.local_devices()[:1])
  try:
    return parallel.create_mesh(jax.local_devices(), spec)
  except ValueError as e:  # named as the benchmark's flag
    raise ValueError(str(e).replace('config.mesh', '--mesh')) from None


def lower_train(
  model: Any,
  params: Any,
  images: Any,
  labels: Any,
  accum_steps: int,
  mesh: Mesh | None = None,
  sharding: str = 'replicate',
  optimizer: str = 'sgd',
):
  """(optimizer, the lowered training step: the trainer's with `optimizer`, compiled as it
  compiles it, on `mesh` (default one device) with the state placed by `sharding`); arrays may
  be abstract."""
  tx, step = trainer(model, images.shape[0], accum_steps, optimizer)
  mesh = train_mesh() if mesh is None else mesh
  state = jax.eval_shape(lambda p: train_state(p, tx), abstract(params))
  shardings = parallel.state_shardings(state, mesh, sharding)  # as the trainer places it
  f = train_steps.compile_train_step(step, shardings, parallel.batch_sharding(mesh), mesh)
  return tx, f.lower(state, {'image': abstract(images), 'label': abstract(labels)})


def compile_train(
  model: Any,
  params: Any,
  images: Any,
  labels: Any,
  accum_steps: int = 1,
  mesh: Mesh | None = None,
  sharding: str = 'replicate',
) -> tuple[Any, float, float, dict[str, Any]]:
  """(compiled step, compile seconds, flops per image, `analysis.compiled_facts`) of the
  training step on `mesh` (`lower_train`); arrays may be abstract. The FLOPs are the whole
  program's (XLA counts the program before it is split over the devices), the facts one
  device's."""
  start = time.perf_counter()
  _, lowered = lower_train(model, params, images, labels, accum_steps, mesh, sharding)
  compiled = lowered.compile()
  compile_s = time.perf_counter() - start
  flops = analysis.flops(lowered) / images.shape[0]
  return compiled, compile_s, flops, analysis.compiled_facts(compiled)


def train_program(
  model: Any,
  params: Any,
  images: jax.Array,
  labels: jax.Array,
  state: dict | None = None,
  accum_steps: int = 1,
  mesh: Mesh | None = None,
  sharding: str = 'replicate',
):
  """(run, compile seconds, flops per image, `analysis.compiled_facts`, the compiled
  program's text); `run` steps `state` in place, on `mesh` (`compile_train`).

  Programs may share one `state` (the train state, donated and replaced at every step):
  they run one after another, and a large model is then held once, not once per variant.
  """
  compiled, compile_s, flops, facts = compile_train(
    model, params, images, labels, accum_steps, mesh, sharding
  )
  state_shardings, batch_shardings = compiled.input_shardings[0]
  state = {} if state is None else state
  if not state:  # placed where the step takes it; a copy of `params`, since it is donated
    tx, _ = trainer(model, images.shape[0], accum_steps)
    init = jax.jit(lambda p: train_state(p, tx), out_shardings=state_shardings)
    state['train'] = init(params)
  batch = jax.device_put({'image': images, 'label': labels}, batch_shardings)

  def run():
    state['train'], metrics = compiled(state['train'], batch)
    return metrics['loss']

  return run, compile_s, flops, facts, compiled.as_text


def flops_reference(variant: Variant) -> Variant:
  """The variant whose program XLA's cost analysis counts in full: unrolled (a scanned body
  is counted once), no rematerialisation (recomputation is no useful work) and explicit
  attention (a cuDNN attention kernel is a custom call that the analysis counts as 0 FLOPs).
  """
  return dataclasses.replace(variant, remat='none', layers='unrolled', attention='xla')


def model_flops(job: 'Job', variant: Variant, mode: str, params: Any) -> float:
  """FLOPs per image of `flops_reference(variant)`'s program: the model FLOPs."""
  model = build_model(job.config, job.num_classes, flops_reference(variant))
  shapes, images = abstract(params), job.images
  if mode == 'inference':
    lowered = jax.jit(lambda p, x: model.apply({'params': p}, x, train=False)).lower(shapes, images)
  else:
    lowered = lower_train(
      model, shapes, images, job.labels, job.accum_steps, job.mesh, job.sharding
    )[1]
  return analysis.flops(lowered) / images.shape[0]
