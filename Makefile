# Every target creates the virtual environment .venv on first use and installs what it needs:
# `make demo` the `demo` extra (torch, rich, orjson), `make test` every extra and the test
# tools. The installs are layered (stamps), so `make test` after `make demo` adds the rest.
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
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: demo test lint bench bench-instructions clean

$(BASE_STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, so that the extras' looser pin is already satisfied.
	$(BIN)/pip install -q "$(TORCH)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	touch $@

$(DEMO_STAMP): $(BASE_STAMP)
	$(BIN)/pip install -q -e ".[demo]"
	touch $@

$(DEV_STAMP): $(DEMO_STAMP)
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

demo: $(DEMO_STAMP)
	$(BIN)/otel-tunix demo

test: $(DEV_STAMP)
	$(BIN)/ruff check otel_tunix tests bench
	$(BIN)/ruff format --check otel_tunix tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/pytest -q

bench: $(DEV_STAMP)
	$(BIN)/python bench/bench_overhead.py
	$(BIN)/python bench/bench_demo.py

bench-instructions: $(DEV_STAMP)  # needs valgrind
	$(BIN)/python bench/bench_instructions.py

clean:
	rm -rf $(VENV) otel-tunix-runs
