"""Exits while releases, acquires and counts are still running in Rust (test_exit), RUNS times:
each run is an interpreter forked from this one once it has imported the package (as
``gunicorn --preload`` forks its workers), so a run costs its work and its exit, not the imports.
Each run exits through the interpreter's own finalization; one that does not exit with status 0
is named on stdout, and this process then exits with status 1.

Usage: exit_with_work_in_flight.py URL KEY_PREFIX RUNS
"""

import asyncio
import os
import sys

from fastapi_stream_lease import LeaseConfig, StreamLeaseManager


async def main(url: str, key_prefix: str) -> None:
    manager = StreamLeaseManager(
        url=url, config=LeaseConfig(key_prefix=key_prefix, max_per_user=0, max_global=0)
    )
    leases = await asyncio.gather(*(manager.acquire(f"u{i}") for i in range(20)))
    # Leave work in flight at exit: releases, acquires and counts still running in Rust.
    for lease in leases:
        lease.release_nowait()
    for i in range(20):
        asyncio.ensure_future(manager.acquire(f"v{i}"))  # noqa: RUF006 (left running at exit)
        asyncio.ensure_future(manager.get_active_count())  # noqa: RUF006
    await asyncio.sleep(0)


url, key_prefix, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
failed = 0
for run in range(runs):
    pid = os.fork()
    if pid == 0:
        asyncio.run(main(url, key_prefix))
        sys.exit(0)  # the interpreter finalizes as it would at the end of a script
    status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if status != 0:
        failed += 1
        print(f"run {run} exited with status {status}", flush=True)
sys.exit(1 if failed else 0)
