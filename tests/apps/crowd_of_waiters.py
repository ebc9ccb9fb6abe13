"""100 waiters for 3 global slots, each holding its slot briefly; prints ``done`` when all have
had their turn (test_waiting).

Usage: crowd_of_waiters.py URL KEY_PREFIX NAME
"""

import asyncio
import sys

from fastapi_stream_lease import LeaseConfig, StreamLeaseManager


async def main(url: str, key_prefix: str, name: str) -> None:
    config = LeaseConfig(max_per_user=0, max_global=3, key_prefix=key_prefix)
    manager = StreamLeaseManager(url=url, config=config)

    async def one(i: int) -> None:
        lease = await manager.acquire(f"{name}-{i}", wait_timeout=120)
        await asyncio.sleep(0.005)
        await lease.release()

    await asyncio.gather(*(one(i) for i in range(100)))
    print("done", flush=True)
    await manager.aclose()


asyncio.run(main(*sys.argv[1:4]))
