# Two entry points for a fresh machine (Python 3.11):
#   make run    set up, then run the main job on the bundled data
#   make test   set up, then lint and run the test suite (what CI runs)
# and the inner loop while changing code:
#   make test-fast   the suite without its `slow` tests (docs/testing.md)
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: run test test-fast lint format table clean

# --no-compile: pip would byte-compile every file of TensorFlow, torch and the rest (about a
# minute here); Python compiles the modules it imports on their first import instead.
$(VENV)/.runtime: requirements.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --no-compile -r requirements.txt
	touch $@

$(VENV)/.test: $(VENV)/.runtime requirements-test.txt
	$(PY) -m pip install -q --no-compile -r requirements-test.txt
	# The launch-script tests run shellcheck (Debian's package).
	command -v shellcheck >/dev/null || (apt-get update -qq && apt-get install -y -qq shellcheck)
	touch $@

run: $(VENV)/.runtime
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
# alone, the tests that bound a wall time.
test: lint
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder -m 'not serial' --durations=25
	$(PY) -m pytest -q -m serial --durations=5

# The inner loop: what the `slow` marker leaves (tests/conftest.py), laid out as `test`.
test-fast: $(VENV)/.test
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder -m 'not slow and not serial' --durations=10
	$(PY) -m pytest -q -m 'serial and not slow'

clean:
	rm -rf $(VENV)
