#!/usr/bin/env bash
# Sets up the benchmarks' two virtualenvs, leaving the developer's .venv and debug build alone:
#
# * benchmarks/.venv: fastapi-stream-lease built in RELEASE mode, plus what the benchmarks use
#   (redis-py + hiredis, FastAPI + uvicorn for end_to_end.py, httpx + websockets for load.py's
#   clients, matplotlib for plot.py and load.py) and the
#   rate limiters that rate_hits.py and rate_http.py measure it against (limits with coredis,
#   pyrate-limiter + fastapi-limiter, slowapi), each pinned;
# * wrk, the HTTP load generator of rate_http.py, from Debian's packages when it is missing;
# * benchmarks/.venv-peer: the pure-Python peer, PyPI fastapi-stream-lease==0.6.3, which has the
#   same import name and so lives in its own virtualenv (driven by benchmarks/peer.py).
#
# Usage (from anywhere): bash benchmarks/setup_bench_env.sh
# Cargo output goes to target/bench, the wheel to target/bench/wheels.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

redis_py=(redis==8.1.0 hiredis==3.5.0)
# The rate limiters of rate_hits.py and rate_http.py. limits' async Redis storage uses coredis by
# default (its async-redis extra: coredis<6); fastapi-limiter 0.2 runs on pyrate-limiter; slowapi
# on limits' synchronous Redis storage (redis-py, above).
rate_peers=(
    "limits[async-redis]==5.8.0" coredis==5.7.0 pyrate-limiter==4.5.1 fastapi-limiter==0.2.0
    slowapi==0.1.10
)

if ! command -v wrk >/dev/null; then
    echo "==> installing wrk (Debian package) for rate_http.py"
    if [[ $(id -u) -eq 0 ]]; then sudo=(); else sudo=(sudo); fi
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq wrk >/dev/null \
        || { "${sudo[@]}" apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
            "${sudo[@]}" apt-get install -y -qq wrk >/dev/null; }
fi

venv=benchmarks/.venv
if [[ ! -x "$venv/bin/python" ]]; then
    echo "==> creating $venv"
    python3 -m venv "$venv"
fi

echo "==> installing benchmark dependencies into $venv"
"$venv/bin/pip" install --quiet \
    maturin==1.16.0 "${redis_py[@]}" starlette==1.10.0 \
    fastapi==0.165.0 uvicorn==0.54.0 matplotlib==3.11.2 opentelemetry-sdk==1.45.2 \
    httpx==0.28.1 websockets==17.4 "${rate_peers[@]}"

echo "==> building the release wheel (CARGO_TARGET_DIR=target/bench)"
rm -rf target/bench/wheels
CARGO_TARGET_DIR=target/bench "$venv/bin/maturin" build --release --locked \
    --interpreter "$venv/bin/python" -o target/bench/wheels

echo "==> installing the wheel into $venv"
"$venv/bin/pip" install --quiet --force-reinstall --no-deps target/bench/wheels/*.whl

peer=benchmarks/.venv-peer
if [[ ! -x "$peer/bin/python" ]]; then
    echo "==> creating $peer"
    python3 -m venv "$peer"
fi
echo "==> installing the peer (PyPI fastapi-stream-lease==0.6.3) into $peer"
# Starlette brings anyio, which the peer uses when present, as it is in any FastAPI app.
# FastAPI and uvicorn: end_to_end.py serves the peer's quickstart from here.
"$peer/bin/pip" install --quiet fastapi-stream-lease==0.6.3 "${redis_py[@]}" starlette==1.10.0 \
    fastapi==0.165.0 uvicorn==0.54.0
