# Every target sets up what it needs: a fresh clone runs `make demo` or `make test` directly.
.DEFAULT_GOAL := help
SHELL := /bin/bash

VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export VIRTUAL_ENV := $(abspath $(VENV))
export PYO3_PYTHON := $(abspath $(BIN)/python)

.PHONY: help venv build redis test chaos lint fmt demo bench clean

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

$(STAMP): requirements-dev.txt
	python3 -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements-dev.txt
	touch $(STAMP)

venv: $(STAMP) ## Create .venv with the pinned tools

build: venv ## Build the Rust core (debug) into .venv
	$(BIN)/maturin develop --quiet

redis: ## Make sure redis-server is installed (the tests start their own servers)
	@scripts/ensure-redis.sh

test: build redis ## Run every test: Rust unit tests, the protocol model, stub check, pytest on real Redis servers
	cargo test --quiet --workspace
	$(BIN)/python -m mypy.stubtest fastapi_stream_lease._core
	$(BIN)/pytest

CHAOS_MINUTES ?= 10
CHAOS_SEEDS ?= 1 2 3
chaos: build redis ## Randomized fault run, CHAOS_MINUTES (10) over CHAOS_SEEDS ("1 2 3"), Redis then cluster
	$(BIN)/python -m tests.chaos --minutes $(CHAOS_MINUTES) --seeds $(CHAOS_SEEDS)

lint: venv ## cargo fmt --check, clippy, ruff and mypy
	cargo fmt --all --check
	cargo clippy --quiet --workspace --all-targets -- -D warnings
	$(BIN)/ruff check python tests examples benchmarks
	$(BIN)/ruff format --check python
	$(BIN)/mypy

fmt: venv ## Format the Rust and Python code
	cargo fmt --all
	$(BIN)/ruff format python
	$(BIN)/ruff check --fix python tests examples benchmarks

demo: build ## Run the demos (streams, then an LLM proxy with token budgets) on the embedded backend (REDIS_URL=redis://... for Redis)
	$(BIN)/python examples/demo.py
	$(BIN)/python examples/llm_proxy.py

bench: ## Run the benchmarks (release build, own Redis) and print the table
	bash benchmarks/run.sh

clean: ## Remove build outputs and the virtualenvs
	rm -rf target $(VENV) benchmarks/.venv benchmarks/.venv-peer
