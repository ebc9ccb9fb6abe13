"""The interpreter exits cleanly while Rust futures finish around it: no Rust thread ever takes the
GIL, so nothing can race the interpreter's finalization (the stock pyo3-async-runtimes bridge
can crash here)."""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor

from support.apps import app_command

RUNS = 200


def test_no_crash_at_exit(redis_server, key_prefix):
    def run(_: int) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            app_command("exit_with_work_in_flight", redis_server.url, key_prefix),
            capture_output=True, timeout=60,
        )

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(run, range(RUNS)))
    failures = [r for r in results if r.returncode != 0]
    assert not failures, (
        f"{len(failures)} of {RUNS} runs failed; first: rc={failures[0].returncode} "
        f"{failures[0].stderr.decode()[-2000:]}"
    )
