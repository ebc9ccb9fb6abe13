"""Exits while releases, acquires and counts are still running in Rust (test_exit).

Usage: exit_with_work_in_flight.py URL KEY_PREFIX
"""

import asyncio
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


asyncio.run(main(*sys.argv[1:3]))
