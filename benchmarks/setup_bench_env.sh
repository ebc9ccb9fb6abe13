#!/usr/bin/env bash
# Builds fastapi-stream-lease in RELEASE mode into the benchmark's own virtualenv
# (benchmarks/.venv), leaving the developer's .venv and debug build alone.
#
# Usage (from anywhere): bash benchmarks/setup_bench_env.sh
# Cargo output goes to target/bench, the wheel to target/bench/wheels.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

venv=benchmarks/.venv
if [[ ! -x "$venv/bin/python" ]]; then
    echo "==> creating $venv"
    python3 -m venv "$venv"
fi

echo "==> installing benchmark dependencies into $venv"
"$venv/bin/pip" install --quiet \
    maturin==1.16.0 redis==8.1.0 hiredis==3.5.0 starlette==1.10.0

echo "==> building the release wheel (CARGO_TARGET_DIR=target/bench)"
rm -rf target/bench/wheels
CARGO_TARGET_DIR=target/bench "$venv/bin/maturin" build --release --locked \
    --interpreter "$venv/bin/python" -o target/bench/wheels

echo "==> installing the wheel into $venv"
"$venv/bin/pip" install --quiet --force-reinstall --no-deps target/bench/wheels/*.whl
