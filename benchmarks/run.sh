#!/usr/bin/env bash
# Every benchmark, end to end: sets up benchmarks/.venv (release wheel, matplotlib, FastAPI,
# uvicorn) and benchmarks/.venv-peer (the PyPI peer), starts a throwaway redis-server on a free
# loopback port (never 6379), runs acquire_release.py, plot.py, holding.py and end_to_end.py
# against it, and stops the server however the run ends. About 6 minutes on 2 cores once built
# (the first build of the release wheel adds a few).
#
# Usage, from the repository root: bash benchmarks/run.sh [extra acquire_release.py options]
# e.g.  bash benchmarks/run.sh --duration 5 --repeats 5
set -euo pipefail
started=$SECONDS

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

scripts/ensure-redis.sh
for tool in python3 redis-server redis-cli redis-benchmark cargo; do
    if ! command -v "$tool" >/dev/null; then
        echo "run.sh: $tool is not on PATH" >&2
        exit 1
    fi
done

bash benchmarks/setup_bench_env.sh
py=benchmarks/.venv/bin/python

workdir="$(mktemp -d)"
redis_pid=""
cleanup() {
    if [[ -n "$redis_pid" ]] && kill -0 "$redis_pid" 2>/dev/null; then
        kill "$redis_pid"
        wait "$redis_pid" 2>/dev/null || true
        echo "==> stopped redis-server (pid $redis_pid)"
    fi
    rm -rf "$workdir"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

free_port() {
    "$py" -c 'import socket
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    print(s.getsockname()[1])'
}

# Another process may grab the port between the probe and the bind: then try another one.
port=""
for _attempt in 1 2 3 4 5; do
    candidate="$(free_port)"
    [[ "$candidate" == 6379 ]] && continue
    redis-server --port "$candidate" --bind 127.0.0.1 --save '' --appendonly no \
        --dir "$workdir" --logfile "$workdir/redis.log" &
    redis_pid=$!
    for _tick in $(seq 50); do
        if ! kill -0 "$redis_pid" 2>/dev/null; then
            break
        fi
        if [[ "$(redis-cli -h 127.0.0.1 -p "$candidate" ping 2>/dev/null)" == PONG ]]; then
            port="$candidate"
            break 2
        fi
        sleep 0.1
    done
    kill "$redis_pid" 2>/dev/null || true
    wait "$redis_pid" 2>/dev/null || true
    redis_pid=""
done
if [[ -z "$port" ]]; then
    echo "run.sh: could not start redis-server on a free port; its last log:" >&2
    cat "$workdir/redis.log" >&2 || true
    exit 1
fi
echo "==> redis-server $(redis-server --version | awk '{print $3}') on 127.0.0.1:$port (pid $redis_pid)"

url="redis://127.0.0.1:$port/0"
echo
echo "==> acquire_release.py"
"$py" benchmarks/acquire_release.py --url "$url" "$@"
"$py" benchmarks/plot.py
echo
echo "==> holding.py"
"$py" benchmarks/holding.py --url "$url"
echo
echo "==> waiting.py"
"$py" benchmarks/waiting.py --url "$url"

echo "==> cluster_spread.py (its own 3-master cluster)"
"$py" benchmarks/cluster_spread.py

echo "==> end_to_end.py"
"$py" benchmarks/end_to_end.py --url "$url"
echo
echo "==> every benchmark ran in $((SECONDS - started)) s (set-up and build included)"
