# Two entry points for a fresh machine (Python 3.11):
#   make run    set up (the venv, the package installed into it), then run the main job on the
#               bundled data
#   make test   set up, then lint and run the test suite (what CI runs)
# and the inner loop while changing code:
#   make test-fast   the suite without its `slow` tests (docs/testing.md)
# ONNX export has an environment of its own (docs/export.md):
#   make onnx-env    .venv-onnx, from requirements-onnx.txt
#   make test-onnx   its tests (tests/test_onnx.py, marked `onnx`); `make test` runs them too
VENV ?= .venv
PY := $(VENV)/bin/python
ONNX_VENV ?= .venv-onnx
ONNX_PY := $(ONNX_VENV)/bin/python

.PHONY: run test test-fast test-onnx onnx-env lint format table clean

# --no-compile: pip would byte-compile every file of TensorFlow, torch and the rest (about a
# minute here); Python compiles the modules it imports on their first import instead.
$(VENV)/.runtime: requirements.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --no-compile -r requirements.txt
	touch $@

# The package itself, editable and without its dependencies (requirements.txt pins those): the
# console scripts (vit-predict, ...) and `import vit_jax` work from any directory, on the
# checkout's code. Built with the venv's setuptools where it is as new as pyproject.toml asks
# (make test's, requirements-test.txt: 4 s), else in pip's isolated build, which fetches one
# (make run's venv, whose setuptools is Python's own: 11 s).
$(VENV)/.package: $(VENV)/.runtime pyproject.toml
	$(PY) -m pip install -q --no-compile --no-deps --no-build-isolation \
	  --check-build-dependencies -e . 2>/dev/null || $(PY) -m pip install -q --no-compile --no-deps -e .
	touch $@

$(VENV)/.test: $(VENV)/.runtime requirements-test.txt
	$(PY) -m pip install -q --no-compile -r requirements-test.txt
	# The launch-script tests run shellcheck (Debian's package).
	command -v shellcheck >/dev/null || (apt-get update -qq && apt-get install -y -qq shellcheck)
	touch $@

# jax2onnx declares an orbax-checkpoint older than requirements.txt's: its own environment,
# kept `pip check` clean.
$(ONNX_VENV)/.onnx: requirements-onnx.txt
	python3 -m venv $(ONNX_VENV)
	$(ONNX_PY) -m pip install -q --no-compile -r requirements-onnx.txt
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

# What `make test` runs in ONNX's environment: the tests marked `onnx`, and only those.
test-onnx: $(ONNX_VENV)/.onnx
	$(ONNX_PY) -m pytest -q -m onnx tests/test_onnx.py --durations=5

clean:
	rm -rf $(VENV) $(ONNX_VENV)
