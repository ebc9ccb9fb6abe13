"""Takes COUNT leases of weight 1 for alice (no caps, 1 s leases), prints ``held <COUNT>``, then
holds them for a minute or until killed (test_holders).

Usage: hold_many_leases.py URL KEY_PREFIX COUNT
"""

import asyncio
import sys

from fastapi_stream_lease import LeaseConfig, StreamLeaseManager


async def main(url: str, key_prefix: str, count: int) -> None:
    config = LeaseConfig(max_per_user=0, max_global=0, lease_seconds=1, key_prefix=key_prefix)
    manager = StreamLeaseManager(url=url, config=config)
    leases = await asyncio.gather(*(manager.acquire("alice") for _ in range(count)))
    print("held", len(leases), flush=True)
    await asyncio.sleep(60)


asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
