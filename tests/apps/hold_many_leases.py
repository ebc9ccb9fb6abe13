"""Takes COUNT leases of weight 1 for alice (no caps, 2 s leases), prints ``held <COUNT>``, then
holds them for a minute or until killed (test_holders). They are taken 200 at a time: a grant
whose reply takes longer than a lease (thousands queued at once on a busy machine) is reported
lost and given back (docs/design.md, I4), and the test needs them all.

Usage: hold_many_leases.py URL KEY_PREFIX COUNT
"""

import asyncio
import sys

from fastapi_stream_lease import LeaseConfig, StreamLeaseManager


async def main(url: str, key_prefix: str, count: int) -> None:
    config = LeaseConfig(max_per_user=0, max_global=0, lease_seconds=2, key_prefix=key_prefix)
    manager = StreamLeaseManager(url=url, config=config)
    leases = []
    for start in range(0, count, 200):
        batch = min(200, count - start)
        leases += await asyncio.gather(*(manager.acquire("alice") for _ in range(batch)))
    print("held", sum(not lease.lost for lease in leases), flush=True)
    await asyncio.sleep(60)


asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
