# Two commands do all set-up on a fresh machine:
#   make demo   -- creates .venv if missing, installs heatformer, runs the main job
#   make test   -- creates .venv if missing, installs the dev extras, runs ruff, mypy and pytest
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch (an unpinned torch pulls a multi-GB CUDA build); override for CUDA.
TORCH_SPEC ?= torch==2.13.0

.PHONY: demo test lint typecheck pytest bench docs clean

$(VENV)/.installed-base: setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[viz]"
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed-base
	$(PY) -m pip install -q -e ".[dev,viz]"
	touch $@

demo: $(VENV)/.installed-base
	$(VENV)/bin/heatformer demo-ops

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check src tests benchmarks examples
	$(VENV)/bin/ruff format --check src tests benchmarks examples

typecheck: $(VENV)/.installed-dev
	$(VENV)/bin/mypy src/heatformer

pytest: $(VENV)/.installed-dev
	$(PY) -m pytest -q -m "not slow"

test: lint typecheck pytest

bench: $(VENV)/.installed-dev
	$(PY) benchmarks/bench_graph_ops.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info
