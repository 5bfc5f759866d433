# Two entry points for a fresh machine (Python 3.11):
#   make run    set up, then run the main job on the bundled data
#   make test   set up, then lint and run the test suite
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: run test lint format table clean

$(VENV)/.runtime: requirements.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt
	touch $@

$(VENV)/.test: $(VENV)/.runtime requirements-test.txt
	$(PY) -m pip install -q -r requirements-test.txt
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

test: lint
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV)
