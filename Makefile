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

# The tests also cover the integrations: transformers (the hf extra) and timm. timm requires
# torchvision, whose only wheel for the CPU torch pin is a CUDA build that replaces torch, so
# timm comes without dependencies (its others arrive with transformers); the tests import it
# with a placeholder for the torchvision names its vision transformers never call.
$(VENV)/.installed-dev: $(VENV)/.installed-base
	$(PY) -m pip install -q -e ".[dev,viz,hf]"
	$(PY) -m pip install -q --no-deps "timm>=1.0"
	touch $@

# The main job: attention vs 2 Laplacian heads vs 2 heat heads on the `chars` task, 3 seeds
# (about 80 s on 2 idle CPU cores, 3 min on busy ones; see docs/reproducing.md). One thread: fastest
# for this small model and immune to oversubscription. The report folder is printed at the end.
demo: $(VENV)/.installed-base
	$(VENV)/bin/heatformer compare --preset demo --threads 1
	@echo "teaching pages (pictures + interactive, offline): $(VENV)/bin/heatformer demo --out heatformer-demo"

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check src tests benchmarks examples
	$(VENV)/bin/ruff format --check src tests benchmarks examples

typecheck: $(VENV)/.installed-dev
	$(VENV)/bin/mypy src/heatformer

pytest: $(VENV)/.installed-dev
	$(PY) -m pytest -q -m "not slow"

# The documentation site: figures from docs/gen_figures.py (a mkdocs hook), then a strict build.
docs: $(VENV)/.installed-dev
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

test: lint typecheck pytest docs

bench: $(VENV)/.installed-dev
	$(PY) benchmarks/bench_graph_ops.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info
