# Two entry points for a fresh machine, with Python 3.11, 3.12 or 3.13:
#   make run    set up (the venv, the package installed into it), then run the main job on the
#               bundled data
#   make test   set up, then lint and run the test suite
# and the inner loop while changing code:
#   make test-fast   the suite without its `slow` tests (docs/testing.md)
# The interpreter picks the end (docs/install.md): PYTHON=python3.11 the oldest (today's pins),
# python3.12 or python3.13 the newest, each installed from its exact lock (requirements/).
# `make PYTHON=python3.13 test` builds .venv-3.13 beside python3's .venv.
# ONNX export has an environment of its own (docs/export.md):
#   make onnx-env    $(VENV)-onnx, from requirements/END-onnx.txt
#   make test-onnx   its tests (tests/test_onnx.py, marked `onnx`); `make test` runs them too
# CI (.ci/run): `make test` on the newest end, `make test-compat` on the oldest.
PYTHON ?= python3
PYTHON_VERSION := $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
ifeq ($(filter 3.11 3.12 3.13,$(PYTHON_VERSION)),)
$(error $(PYTHON) is Python "$(PYTHON_VERSION)": the project runs on 3.11, 3.12 or 3.13; name one with PYTHON=)
endif
END := $(if $(filter 3.11,$(PYTHON_VERSION)),oldest,newest)
LOCK := requirements/$(END)
VENV ?= $(if $(filter python3,$(PYTHON)),.venv,.venv-$(PYTHON_VERSION))
PY := $(VENV)/bin/python
ONNX_VENV ?= $(VENV)-onnx
ONNX_PY := $(ONNX_VENV)/bin/python

.PHONY: run test test-fast test-compat test-onnx onnx-env lint format table lock clean

# --no-compile: pip would byte-compile every file of TensorFlow, torch and the rest (about a
# minute here); Python compiles the modules it imports on their first import instead, and
# keeps them: where PYTHONDONTWRITEBYTECODE is set (container images often set it), every
# process would compile TensorFlow's and jax's sources again (a vit-predict start: 18 s
# against 6.7 s), so the recipes here run without it.
unexport PYTHONDONTWRITEBYTECODE
$(VENV)/.runtime: $(LOCK).txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --no-compile -r $(LOCK).txt
	touch $@

# The package itself, editable and without its dependencies (the lock pins those): the
# console scripts (vit-predict, ...) and `import vit_jax` work from any directory, on the
# checkout's code. Built with the venv's setuptools where it is as new as pyproject.toml asks
# (make test's, from the test lock: 4 s), else in pip's isolated build, which fetches one
# (make run's venv, whose setuptools is Python's own: 11 s).
$(VENV)/.package: $(VENV)/.runtime pyproject.toml
	$(PY) -m pip install -q --no-compile --no-deps --no-build-isolation \
	  --check-build-dependencies -e . 2>/dev/null || $(PY) -m pip install -q --no-compile --no-deps -e .
	touch $@

$(VENV)/.test: $(VENV)/.runtime $(LOCK)-test.txt
	$(PY) -m pip install -q --no-compile -r $(LOCK)-test.txt
	# The launch-script tests run shellcheck (Debian's package).
	command -v shellcheck >/dev/null || (apt-get update -qq && apt-get install -y -qq shellcheck)
	touch $@

# jax2onnx declares an orbax-checkpoint older than the runtime's: its own environment, kept
# `pip check` clean.
$(ONNX_VENV)/.onnx: $(LOCK)-onnx.txt
	$(PYTHON) -m venv $(ONNX_VENV)
	$(ONNX_PY) -m pip install -q --no-compile -r $(LOCK)-onnx.txt
	$(ONNX_PY) -m pip check
	touch $@

onnx-env: $(ONNX_VENV)/.onnx

run: $(VENV)/.package
	$(PY) -m vit_jax.main --config=configs/digits.py --workdir=runs/digits

table: $(VENV)/.runtime
	$(PY) -m vit_jax.models --xla_flops

lint: $(VENV)/.test
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: $(VENV)/.test
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

# Two workers, a test file each at a time, the costliest first (tests/conftest.py); then,
# alone, the tests that bound a wall time; then the ONNX tests in their environment.
test: lint $(VENV)/.package $(ONNX_VENV)/.onnx
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder -m 'not serial and not onnx' --durations=25
	$(PY) -m pytest -q -m serial --durations=5
	$(MAKE) test-onnx

# The inner loop: what the `slow` marker leaves (tests/conftest.py), laid out as `test`.
test-fast: $(VENV)/.test $(VENV)/.package
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder -m 'not slow and not serial and not onnx' --durations=10
	$(PY) -m pytest -q -m 'serial and not slow'

# The oldest end's share of CI (.ci/run), at most 8 minutes of wall here: the models against
# their oracles, every checkpoint format, a training run killed (SIGKILL) and resumed, export,
# and the ONNX environment.
COMPAT_TESTS := tests/test_models.py tests/test_models_vs_hf.py tests/test_big_vision_vit.py \
  tests/test_deit.py tests/test_hf_siglip.py tests/test_hf_siglip2.py tests/test_bert.py \
  tests/test_checkpoint_npz.py tests/test_checkpoint_timm.py tests/test_checkpoint_hf.py \
  tests/test_checkpoint_orbax.py tests/test_checkpoint_convert.py tests/test_checkpoint_loader.py \
  tests/test_checkpoint_catalog.py tests/test_checkpoint_surgery.py tests/test_export.py \
  tests/test_train.py::test_sigkill_at_any_moment_then_resume_is_exact
test-compat: $(VENV)/.test $(VENV)/.package
	$(PY) -m pytest -q -n 2 --dist loadfile -m 'not serial and not onnx' --durations=10 $(COMPAT_TESTS)
	$(MAKE) test-onnx

# What `make test` runs in ONNX's environment: the tests marked `onnx`, and only those.
test-onnx: $(ONNX_VENV)/.onnx
	$(ONNX_PY) -m pytest -q -m onnx tests/test_onnx.py --durations=5

# Rewrites this end's locks from pyproject.toml's ranges and requirements/*.in (run it once
# with a Python of each end).
lock:
	$(PYTHON) requirements/lock.py $(END)

clean:
	rm -rf $(VENV) $(ONNX_VENV)
