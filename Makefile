# The two commands the README opens with. Both set up everything they need.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The demo's own environment: what the farm runs ([all]), none of the test tooling.
DEMO_VENV ?= .venv-demo
PORT ?= 8321
NEED_PYTHON := $(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "enginefarm needs Python 3.11 or newer")'
# The demo installs the package itself (not editable: an editable install of this layout makes setuptools warn),
# so it installs again when one of the package's files changes.
PACKAGE_FILES := $(shell find enginefarm api worker storage server -type f ! -name '*.pyc' 2>/dev/null)

.PHONY: demo test test-fast setup demo-setup lint typecheck services bench clean compose-test

$(VENV)/.installed: pyproject.toml
	@$(NEED_PYTHON)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	@touch $@

setup: $(VENV)/.installed

$(DEMO_VENV)/.installed: pyproject.toml $(PACKAGE_FILES)
	@$(NEED_PYTHON)
	$(PYTHON) -m venv $(DEMO_VENV)
	$(DEMO_VENV)/bin/python -m pip install -q --upgrade pip
	$(DEMO_VENV)/bin/python -m pip install -q '.[all]'
	@touch $@

demo-setup: $(DEMO_VENV)/.installed

## Embedded farm (SQLite, local blobs, no servers): build a model for 5 targets and fetch the sm86 engine, then
## serve the dashboard on it at http://127.0.0.1:$(PORT)/ui (the address and a token are printed) until Ctrl-C.
## Its data goes when it stops; DEMO_DATA_DIR=DIR keeps it there (make demo DEMO_DATA_DIR=~/demo-farm).
## The port is checked first: a taken one is one line and exit code 2 before anything is installed or built.
demo:
	@$(PYTHON) -m server.port $(PORT)
	@$(MAKE) --no-print-directory demo-setup
	@# From the venv's folder, so that the farm runs the package as it installs, as a user's farm does.
	cd $(DEMO_VENV) && bin/enginefarm demo --serve --port $(PORT) $(if $(DEMO_DATA_DIR),--data-dir $(abspath $(DEMO_DATA_DIR)))

## The full test suite, three tiers (tests/tiers.py): unit, integration (in process, SQLite and a local store), both
## over two processes (pytest-xdist), then e2e against real PostgreSQL, Redis, SeaweedFS, Celery worker processes,
## podman and Chromium, over two processes too: a test module runs whole on one of them, and each has its own session
## farm, scratch databases and Redis db (tests/conftest.py).
test: setup services
	$(PY) -m pytest -q -n 2 tests/unit tests/integration
	$(PY) -m pytest -q -n 2 --dist loadfile --durations=25 tests/e2e

## The unit tier alone: no service, no process, no database, over two processes (well under a minute).
test-fast: setup
	$(PY) -m pytest -q -n 2 tests/unit

## ruff (lint, then the formatter's check) and mypy. .ci/run runs it before the tests; .pre-commit-config.yaml
## runs the same.
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	@$(MAKE) --no-print-directory typecheck

## mypy over the checkout's packages, as they stand: strict for the kernel, the graph and the client, plain elsewhere
## ([tool.mypy] in pyproject.toml).
typecheck: setup
	$(VENV)/bin/mypy --config-file pyproject.toml -p enginefarm -p storage -p api -p worker -p server

services:
	bash deploy/services.sh

## deploy/compose.yaml under podman: images built, the stack up, upload/build/fetch, queued tasks across a Redis crash.
compose-test: setup
	$(PY) -m pytest -q tests/e2e/deploy/test_compose.py

bench: setup services
	$(PY) bench/e2e.py --mode both
	$(PY) bench/resolve.py
	$(PY) bench/benchmark_overhead.py
	$(PY) bench/serve.py
	$(PY) bench/fleet.py
	$(PY) bench/edge.py
	$(PY) bench/upload.py

clean:
	rm -rf $(VENV) $(DEMO_VENV) .pytest_cache *.egg-info build
