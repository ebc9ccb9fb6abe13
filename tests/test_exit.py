"""The interpreter exits cleanly while Rust futures finish around it: no Rust thread ever takes the
GIL, so nothing can race the interpreter's finalization (the stock pyo3-async-runtimes bridge
can crash here)."""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor

from support.apps import app_command

# Interpreter exits in all: PARALLEL processes at once, each forking RUNS_EACH runs in turn.
PARALLEL = 4
RUNS_EACH = 50


def test_no_crash_at_exit(redis_server, key_prefix):
    def run(_: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            app_command("exit_with_work_in_flight", redis_server.url, key_prefix, str(RUNS_EACH)),
            capture_output=True, text=True, timeout=120,
        )

    with ThreadPoolExecutor(max_workers=PARALLEL) as pool:
        results = list(pool.map(run, range(PARALLEL)))
    failures = [r for r in results if r.returncode != 0]
    assert not failures, (
        f"{len(failures)} of {PARALLEL} processes saw a run fail ({RUNS_EACH} runs each); first: "
        f"rc={failures[0].returncode} {failures[0].stdout} {failures[0].stderr[-2000:]}"
    )
