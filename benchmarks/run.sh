#!/usr/bin/env bash
# Every benchmark, end to end: sets up benchmarks/.venv (release wheel, matplotlib, FastAPI,
# uvicorn) and benchmarks/.venv-peer (the PyPI peer), then runs run_all.py, which starts a
# throwaway redis-server on a free loopback port (never 6379), runs every benchmark against it,
# and stops the server however the run ends. About 6 minutes on 2 cores once built (the first
# build of the release wheel adds a few).
#
# Usage, from the repository root: bash benchmarks/run.sh [extra acquire_release.py options]
# e.g.  bash benchmarks/run.sh --duration 5 --repeats 5
set -euo pipefail
started=$SECONDS

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

scripts/ensure-redis.sh
# redis_instructions.py counts redis-server's instructions under valgrind; it skips without it.
command -v valgrind >/dev/null || scripts/apt-install.sh valgrind || true
for tool in python3 redis-server redis-cli redis-benchmark cargo; do
    if ! command -v "$tool" >/dev/null; then
        echo "run.sh: $tool is not on PATH" >&2
        exit 1
    fi
done

bash benchmarks/setup_bench_env.sh
py=benchmarks/.venv/bin/python

"$py" benchmarks/run_all.py "$@"
echo "==> every benchmark ran in $((SECONDS - started)) s (set-up and build included)"
