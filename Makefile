# Every target creates the virtual environment .venv on first use and installs what it needs:
# `make demo` the `demo` extra (torch and its integration, rich, orjson), `make demo-otlp` the
# `otlp` extra beside it, `make test` every extra and the test tools. The installs are layered
# (stamps), so `make test` after `make demo` adds the rest. `otel-tunix` is then
# .venv/bin/otel-tunix (`source .venv/bin/activate` puts it on the PATH).
PY ?= python3
# PyPI's torch wheel for Linux is the CUDA build (several GB). Without nvidia-smi the CPU
# build is taken from PyTorch's index (enough for the demo); set TORCH_INDEX to choose:
#   make demo TORCH_INDEX=                                        (PyPI's wheel)
#   make demo TORCH_INDEX=https://download.pytorch.org/whl/cu128  (a CUDA build)
TORCH_INDEX ?= $(if $(shell command -v nvidia-smi),,https://download.pytorch.org/whl/cpu)
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
BASE_STAMP := $(VENV)/.installed-torch
DEMO_STAMP := $(VENV)/.installed-demo
OTLP_STAMP := $(VENV)/.installed-otlp
DEV_STAMP := $(VENV)/.installed-dev
# Where `make demo-otlp` sends the demo (deploy/docker-compose.yaml's collector).
OTLP_ENDPOINT ?= http://localhost:4317
# The interpreters `make test-pythons` runs the core tests with (pyenv's, by default).
PYTHONS ?= $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3 $(HOME)/.pyenv/versions/3.13*/bin/python3)
# The core's tests: they need no framework extra (the package declares Python 3.11+).
CORE_TESTS ?= tests/test_accounting.py tests/test_tracing.py tests/test_settings.py \
	tests/test_json_lines.py tests/test_ids.py tests/test_readme.py tests/test_shortcuts.py

.PHONY: demo demo-otlp test test-pythons lint bench bench-instructions clean

$(BASE_STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, so that the extras' looser pin is already satisfied.
	$(BIN)/pip install -q "$(TORCH)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	touch $@

$(DEMO_STAMP): $(BASE_STAMP)
	$(BIN)/pip install -q -e ".[demo]"
	touch $@

$(OTLP_STAMP): $(DEMO_STAMP)
	$(BIN)/pip install -q -e ".[demo,otlp]"
	touch $@

$(DEV_STAMP): $(DEMO_STAMP)
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

demo: $(DEMO_STAMP)
	$(BIN)/otel-tunix demo

# The demo, sent to a collector as well (Jaeger: docs/local-stack.md): the demo extra and
# the otlp extra, a few MB more than `make demo`, far less than `make test`.
demo-otlp: $(OTLP_STAMP)
	OTEL_EXPORTER_OTLP_ENDPOINT=$(OTLP_ENDPOINT) $(BIN)/otel-tunix demo

test: $(DEV_STAMP)
	$(BIN)/ruff check otel_tunix tests bench
	$(BIN)/ruff format --check otel_tunix tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/pytest -q

# The core tests (no framework extra needed) on each Python of PYTHONS, each in a venv of
# its own under .venv-pythons/ (not part of `make test`).
test-pythons:
	@test -n "$(PYTHONS)" || { echo "no Python 3.12 / 3.13 found: set PYTHONS=..."; exit 2; }
	set -e; for py in $(PYTHONS); do \
	  v=.venv-pythons/$$($$py -c 'import sys; print("py%d.%d" % sys.version_info[:2])'); \
	  test -x $$v/bin/pytest || { $$py -m venv $$v && $$v/bin/pip install -q -e ".[otlp,cli]" pytest pytest-timeout; }; \
	  echo "== $$($$v/bin/python -V)"; \
	  $$v/bin/pytest -q -p no:cacheprovider $(CORE_TESTS); \
	done

bench: $(DEV_STAMP)
	$(BIN)/python bench/bench_overhead.py
	$(BIN)/python bench/bench_demo.py

bench-instructions: $(DEV_STAMP)  # needs valgrind
	$(BIN)/python bench/bench_instructions.py

clean:
	rm -rf $(VENV) .venv-pythons otel-tunix-runs
