"""Every benchmark against one throwaway Redis: what ``bash benchmarks/run.sh`` runs once the
virtualenvs are set up.

Starts a redis-server on a free loopback port (never 6379, ``support.redis_servers``, as the
tests do), runs acquire_release.py (with this script's arguments), plot.py, core_threads.py,
holding.py, waiting.py, cluster_spread.py (on a cluster of its own), redis_instructions.py (on a
server of its own, under callgrind), end_to_end.py, call_cost.py, then the rate limits'
rate_hits.py, plot.py again, rate_http.py and app_in_process.py, the token budgets'
token_budgets.py and the cost of OpenTelemetry (telemetry_cost.py) in turn, and stops the
server however the run ends. (The rate limits and budgets come last: the keys they leave behind
expire in the server's background, which must not weigh on holding.py's figures.)

Usage, from the repository root, once ``benchmarks/setup_bench_env.sh`` has run::

    benchmarks/.venv/bin/python benchmarks/run_all.py [extra acquire_release.py options]
"""

from __future__ import annotations

import signal
import subprocess
import sys

from common import BENCH_DIR
from support.redis_servers import RedisServer, server_version


def run(script: str, *args: str) -> None:
    print(f"\n==> {script}", flush=True)
    done = subprocess.run([sys.executable, str(BENCH_DIR / script), *args])
    if done.returncode != 0:
        sys.exit(f"run_all.py: {script} exited with status {done.returncode}")


def main() -> None:
    # A SIGTERM ends the run as Ctrl-C does: through the clean-up below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    server = RedisServer().start()
    try:
        print(f"==> {server_version()} on 127.0.0.1:{server.port}", flush=True)
        run("acquire_release.py", "--url", server.url, *sys.argv[1:])
        run("plot.py", "--figure", "cycles")
        run("core_threads.py", "--url", server.url)
        run("holding.py", "--url", server.url)
        run("waiting.py", "--url", server.url)
        run("cluster_spread.py")
        run("redis_instructions.py")  # a server of its own, under callgrind
        run("end_to_end.py", "--url", server.url)
        run("call_cost.py", "--url", server.url)
        run("rate_hits.py", "--url", server.url)
        run("plot.py", "--figure", "rates")
        run("rate_http.py", "--url", server.url)
        run("app_in_process.py", "--url", server.url)
        run("token_budgets.py", "--url", server.url)
        run("telemetry_cost.py", "--url", server.url)
    finally:
        server.cleanup()
        print("==> stopped the server", flush=True)


if __name__ == "__main__":
    main()
