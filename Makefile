# Two commands do all set-up on a fresh machine:
#   make demo   -- creates .venv if missing, installs heatformer, runs the main job
#   make test   -- creates .venv if missing, installs the dev extras, runs ruff, mypy and pytest
#   make test-oldest -- the tests again, in .venv-oldest, on the oldest versions setup.cfg declares
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch (an unpinned torch pulls a multi-GB CUDA build); override for CUDA.
TORCH_SPEC ?= torch==2.13.0

.PHONY: demo test test-oldest lint typecheck pytest browser-notice chromium bench gpu-check docs \
	clean

$(VENV)/.installed-base: setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[lab]"
	touch $@

# The tests also cover the integrations: transformers (the hf extra) and timm. timm requires
# torchvision, whose only wheel for the CPU torch pin is a CUDA build that replaces torch, so
# timm comes without dependencies (its others with the timm extra), as docs/integrations/timm.md
# says; heatformer.integrations.timm.import_timm() imports it with a placeholder for the
# torchvision names its vision transformers never call.
$(VENV)/.installed-dev: $(VENV)/.installed-base
	$(PY) -m pip install -q -e ".[dev,lab,viz,pyg,hf,timm]"
	$(PY) -m pip install -q --no-deps "timm>=1.0.9"
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

# The run ends with what it skipped, one line per reason (conftest.py: CUDA tests without a GPU,
# the browser test without Chromium, ...). The tests run in parallel (pytest-xdist): one worker
# per core, at most 4, each on one torch thread (tests/conftest.py); the tests that launch a
# group of 2-4 processes take turns (tests/conftest.py: one_launch_at_a_time).
# PYTEST_WORKERS=0 runs them in this process.
PYTEST_WORKERS ?= auto
PYTEST_PARALLEL := -n $(PYTEST_WORKERS) --maxprocesses 4
pytest: $(VENV)/.installed-dev browser-notice
	$(PY) -m pytest -q -m "not slow" $(PYTEST_PARALLEL)

# Headless Chromium renders the teaching demo's interactive page in tests/viz/test_demo_browser.py,
# which skips without it: `make test` says so, and `make chromium` installs Debian's package
# (apt-get; through sudo when not root), as CI (.ci/run) does.
CHROMIUM ?= $(shell command -v chromium || command -v chromium-browser)

browser-notice:
	@test -n "$(CHROMIUM)" || echo "make: no Chromium on PATH, so tests/viz/test_demo_browser.py \
	skips (the interactive demo page is not rendered); 'make chromium' installs it \
	(apt-get install chromium)" >&2

chromium:
	@if [ -n "$(CHROMIUM)" ]; then echo "make chromium: $(CHROMIUM) is installed"; \
	elif command -v apt-get >/dev/null 2>&1 && \
		{ [ "$$(id -u)" -eq 0 ] || command -v sudo >/dev/null 2>&1; }; then \
		as_root=$$([ "$$(id -u)" -eq 0 ] || echo sudo); \
		$$as_root apt-get update -qq >/dev/null && \
		$$as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else echo "make chromium: no apt-get (or neither root nor sudo) here; install Chromium \
	with your package manager" >&2; exit 1; fi

# The documentation site: figures from docs/gen_figures.py (a mkdocs hook), then a strict build.
# Not --quiet: it drops warnings below the level --strict counts, so a warning (griffe's, on a
# docstring) passed unseen where the same build without it aborts.
docs: $(VENV)/.installed-dev
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

test: lint typecheck pytest docs

# The oldest versions setup.cfg declares, pinned exactly by .ci/oldest.txt (pip constraints),
# on the oldest Python it declares, in their own venv: the same tests, so that a declared
# version is a tested one. torch from the package index at these versions is a CUDA build
# (several GB with its nvidia libraries; it runs on CPU). timm comes without dependencies, as
# in .venv.
# The oldest Python: python3.10 on the PATH or pyenv's 3.10; else python3, with a notice.
OLDEST_PYTHON ?= $(shell for v in "" "$$(pyenv latest 3.10 2>/dev/null)"; do PYENV_VERSION=$$v \
	python3.10 -c 'import sys; print(sys.executable)' 2>/dev/null && break; done || echo python3)
OLDEST_VENV ?= .venv-oldest
OLDEST_PY := $(OLDEST_VENV)/bin/python
OLDEST_PINS := .ci/oldest.txt

$(OLDEST_VENV)/.installed: setup.cfg pyproject.toml $(OLDEST_PINS)
	test -x $(OLDEST_PY) || $(OLDEST_PYTHON) -m venv $(OLDEST_VENV)
	@$(OLDEST_PY) -c 'import sys; v = sys.version_info[:2]; v == (3, 10) or print("test-oldest: \
	no Python 3.10 here (the oldest setup.cfg declares): Python %d.%d instead" % v)'
	$(OLDEST_PY) -m pip install -q --upgrade pip
	$(OLDEST_PY) -m pip install -q -c $(OLDEST_PINS) -e ".[dev,lab,viz,pyg,hf,timm]"
	$(OLDEST_PY) -m pip install -q -c $(OLDEST_PINS) --no-deps timm
	touch $@

test-oldest: $(OLDEST_VENV)/.installed browser-notice
	$(OLDEST_PY) -m pytest -q -m "not slow" $(PYTEST_PARALLEL)

bench: $(VENV)/.installed-dev
	$(PY) benchmarks/bench_graph_ops.py

# The prepared GPU check (benchmarks/gpu_check.py): `pytest -m cuda -x` and the GPU benchmarks in
# at most 8 minutes, with no download; one JSON + one Markdown table in gpu-check/. It needs a CUDA
# build of torch in the venv: on a fresh machine `make gpu-check TORCH_SPEC=torch`. Without a GPU
# it refuses (exit 2); `$(PY) benchmarks/gpu_check.py --dry-run` rehearses it on the CPU.
gpu-check: $(VENV)/.installed-dev
	$(PY) benchmarks/gpu_check.py

clean:
	rm -rf $(VENV) $(OLDEST_VENV) build dist src/*.egg-info
