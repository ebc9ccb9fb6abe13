"""Takes alice's one slot (2 s leases), prints ``held <lease id>``, then holds it for a minute
or until killed (test_leases). With ``budget``, the stream also reserves 1,000 tokens of a
10,000-token minute budget and streams 300 of them first (test_budgets).

Usage: hold_one_lease.py URL KEY_PREFIX [budget]
"""

import asyncio
import sys

from fastapi_stream_lease import LeaseConfig, RateLimit, StreamLeaseManager

BUDGET = RateLimit("tokens_per_minute", 10_000, per=60, unit="tokens")


async def main(url: str, key_prefix: str, budget: bool) -> None:
    config = LeaseConfig(max_per_user=1, lease_seconds=2, key_prefix=key_prefix)
    manager = StreamLeaseManager(url=url, config=config)
    if budget:
        lease = await manager.acquire("alice", budgets=[BUDGET], reserve=1_000)
        for _ in range(60):
            lease.consume(5)
    else:
        lease = await manager.acquire("alice")
    print("held", lease.lease_id, flush=True)
    await asyncio.sleep(60)


asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3:] == ["budget"]))
