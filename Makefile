# Every target creates its own virtual environment in .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench bench-instructions clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch 2.13.0 is the CPU build (a CUDA build is several GB); install it first so the
	# extras' looser pin is already satisfied.
	$(BIN)/pip install -q "torch==2.13.0"
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/otel-tunix demo

test: $(STAMP)
	$(BIN)/ruff check otel_tunix tests bench
	$(BIN)/ruff format --check otel_tunix tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/pytest -q

bench: $(STAMP)
	$(BIN)/python bench/bench_overhead.py
	$(BIN)/python bench/bench_demo.py

bench-instructions: $(STAMP)  # needs valgrind
	$(BIN)/python bench/bench_instructions.py

clean:
	rm -rf $(VENV) otel-tunix-runs
