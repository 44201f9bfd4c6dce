# Every target creates its own virtual environment in .venv on first use.
PY ?= python3
TORCH_INDEX ?=
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench bench-instructions clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, so that the extras' looser pin is already satisfied. On Linux PyPI's
	# torch wheel is the CUDA build (several GB); for the CPU build (enough for the demo):
	#   make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu
	$(BIN)/pip install -q "torch==2.13.0" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
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
