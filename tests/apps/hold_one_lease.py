"""Takes alice's one slot (2 s leases), prints ``held <lease id>``, then holds it for a minute
or until killed (test_leases).

Usage: hold_one_lease.py URL KEY_PREFIX
"""

import asyncio
import sys

from fastapi_stream_lease import LeaseConfig, StreamLeaseManager


async def main(url: str, key_prefix: str) -> None:
    config = LeaseConfig(max_per_user=1, lease_seconds=2, key_prefix=key_prefix)
    manager = StreamLeaseManager(url=url, config=config)
    lease = await manager.acquire("alice")
    print("held", lease.lease_id, flush=True)
    await asyncio.sleep(60)


asyncio.run(main(*sys.argv[1:3]))
