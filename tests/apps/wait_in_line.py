"""Waits in line for the one global slot, printing ``waiting`` then ``admitted``, holds it for
HOLD_SECONDS and releases it (test_waiting).

Usage: wait_in_line.py URL KEY_PREFIX USER_ID HOLD_SECONDS
"""

import asyncio
import sys

from fastapi_stream_lease import LeaseConfig, StreamLeaseManager


async def main(url: str, key_prefix: str, user_id: str, hold_seconds: str) -> None:
    config = LeaseConfig(max_per_user=0, max_global=1, key_prefix=key_prefix)
    manager = StreamLeaseManager(url=url, config=config)
    print("waiting", flush=True)
    lease = await manager.acquire(user_id, wait_timeout=60)
    print("admitted", flush=True)
    await asyncio.sleep(float(hold_seconds))
    await lease.release()
    await manager.aclose()


asyncio.run(main(*sys.argv[1:5]))
