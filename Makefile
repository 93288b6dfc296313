# The two commands the README opens with. Both set up everything they need.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test setup services bench clean compose-test

$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "enginefarm needs Python 3.11 or newer")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	@touch $@

setup: $(VENV)/.installed

## Embedded farm (SQLite, local blobs, no servers): build a model for 5 targets and fetch the sm86 engine, then
## serve the dashboard on it (the address and a token are printed) until Ctrl-C.
demo: setup
	$(VENV)/bin/enginefarm demo --serve

## The full test suite against real PostgreSQL, Redis, SeaweedFS and Celery worker processes.
test: setup services
	$(PY) -m pytest -q

services:
	bash deploy/services.sh

## deploy/compose.yaml under podman: images built, the stack up, upload/build/fetch, queued tasks across a Redis crash.
compose-test: setup
	$(PY) -m pytest -q tests/deploy/test_compose.py

bench: setup services
	$(PY) bench/e2e.py --mode both
	$(PY) bench/resolve.py
	$(PY) bench/benchmark_overhead.py
	$(PY) bench/serve.py
	$(PY) bench/fleet.py
	$(PY) bench/upload.py

clean:
	rm -rf $(VENV) .pytest_cache *.egg-info
