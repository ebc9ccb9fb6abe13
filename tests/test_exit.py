"""The interpreter exits cleanly while Rust futures finish around it: no Rust thread ever takes the
GIL, so nothing can race the interpreter's finalization (the stock bridge crashed here)."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

RUNS = 200

SCRIPT = """
import asyncio, sys
from fastapi_stream_lease import LeaseConfig, StreamLeaseManager

async def main():
    manager = StreamLeaseManager(url=sys.argv[1], config=LeaseConfig(key_prefix=sys.argv[2],
                                 max_per_user=0, max_global=0))
    leases = await asyncio.gather(*(manager.acquire(f"u{i}") for i in range(20)))
    # Leave work in flight at exit: releases, acquires and counts still running in Rust.
    for lease in leases:
        lease.release_nowait()
    for i in range(20):
        asyncio.ensure_future(manager.acquire(f"v{i}"))
        asyncio.ensure_future(manager.get_active_count())
    await asyncio.sleep(0)

asyncio.run(main())
"""


def test_no_crash_at_exit(redis_server, key_prefix):
    def run(_: int) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [sys.executable, "-c", SCRIPT, redis_server.url, key_prefix],
            capture_output=True, timeout=60,
        )

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(run, range(RUNS)))
    failures = [r for r in results if r.returncode != 0]
    assert not failures, (
        f"{len(failures)} of {RUNS} runs failed; first: rc={failures[0].returncode} "
        f"{failures[0].stderr.decode()[-2000:]}"
    )
