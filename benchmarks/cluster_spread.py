"""How one manager's work spreads over a 3-master Redis Cluster, with and without a global pool.

The pools of one atomic acquire must share a slot. With the global pool (the default) every key
of a manager shares the ``{key_prefix}`` hash tag, so one shard serves every acquire; with
``global_pool=False`` each user's pool has a tag of its own and users spread across shards.

Starts its own 3-master cluster on free loopback ports (``support.redis_servers.RedisCluster``,
as the tests do), runs the same acquire + release cycles for 300 users under each layout, and
prints the keys held and the commands run on each shard (``INFO commandstats``).
Run it with ``bash benchmarks/run.sh``, or alone:
``benchmarks/.venv/bin/python benchmarks/cluster_spread.py``.
"""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from fastapi_stream_lease import LeaseConfig, StreamLeaseManager

from common import RESULTS_DIR, command_calls, machine_info, print_table, write_json
from support.redis_servers import RedisCluster

USERS = 300
CYCLES_PER_USER = 20


async def count_keys(shard: aioredis.Redis, prefix: str) -> int:
    return len([key async for key in shard.scan_iter(match=f"{{{prefix}*", count=1000)])


async def run_layout(cluster: RedisCluster, global_pool: bool) -> dict[str, list[int]]:
    prefix = f"spread-{'global' if global_pool else 'users'}"
    config = LeaseConfig(key_prefix=prefix, max_per_user=0, global_pool=global_pool,
                         **({"max_global": 0} if global_pool else {}))
    manager = StreamLeaseManager(url=cluster.url, config=config)
    shards = [aioredis.Redis(port=node.port) for node in cluster.nodes]
    before = [(await command_calls(s))[0] for s in shards]

    async def cycles(user: int) -> list[object]:
        held = []
        for _ in range(CYCLES_PER_USER - 1):
            await (await manager.acquire(f"user{user}")).release()
        held.append(await manager.acquire(f"user{user}"))  # one lease per user stays held
        return held

    held = await asyncio.gather(*(cycles(u) for u in range(USERS)))
    keys = [await count_keys(shard, prefix) for shard in shards]
    after = [(await command_calls(s))[0] for s in shards]
    del held
    await manager.aclose()
    for shard in shards:
        await shard.aclose()
    return {"keys": keys, "commands": [a - b for a, b in zip(after, before, strict=True)]}


async def main() -> None:
    cluster = RedisCluster().start()
    try:
        results = {
            "global pool (default)": await run_layout(cluster, global_pool=True),
            "global_pool=False": await run_layout(cluster, global_pool=False),
        }
    finally:
        cluster.cleanup()
    rows = [
        [layout, *(f"{k:,} / {c:,}" for k, c in zip(r["keys"], r["commands"], strict=True))]
        for layout, r in results.items()
    ]
    print(f"\n{USERS} users x {CYCLES_PER_USER} acquire + release cycles, one lease each left held")
    print_table(["layout", "shard 1 keys / commands", "shard 2", "shard 3"], rows, left=1)
    write_json(RESULTS_DIR / "cluster_spread.json", {"machine": machine_info(), "results": results})


if __name__ == "__main__":
    asyncio.run(main())
