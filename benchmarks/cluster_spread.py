"""How one manager's work spreads over a 3-master Redis Cluster, with and without a global pool.

The pools of one atomic acquire must share a slot. With the global pool (the default) every key
of a manager shares the ``{key_prefix}`` hash tag, so one shard serves every acquire; with
``global_pool=False`` each user's pool has a tag of its own and users spread across shards; with
``lease_global_slots=True`` the users spread too, and the global pool's shard serves only the
slabs each process takes of its slots (the cap exact: 3 managers share it here).

Starts its own 3-master cluster on free loopback ports (``support.redis_servers.RedisCluster``,
as the tests do), runs the same acquire + release cycles for 300 users under each layout, and
prints the keys held and the commands run on each shard (``INFO commandstats``). Then wake-ups:
a waiter in one manager, a release in another, 20 hand-overs, on the cluster
(sharded ``SPUBLISH``/``SSUBSCRIBE``) and, as the baseline in the same run, on a standalone
server (``PUBLISH``/``SUBSCRIBE``): release-to-admission p50 and max.
Run it with ``bash benchmarks/run.sh``, or alone:
``benchmarks/.venv/bin/python benchmarks/cluster_spread.py``.
"""

from __future__ import annotations

import asyncio
import time

import redis.asyncio as aioredis

from fastapi_stream_lease import LeaseConfig, StreamLeaseManager

from common import RESULTS_DIR, command_calls, machine_info, percentile_ms, print_table, write_json
from support.redis_servers import RedisCluster, RedisServer

USERS = 300
CYCLES_PER_USER = 20
#: Managers (processes, as the workers of an app) sharing the cap.
MANAGERS = 3
#: The layouts compared: the default, no global pool, and the global pool's slots leased (a cap
#: every user fits under, as the others' unlimited one).
LAYOUTS = {
    "global pool (default)": {"max_global": 0},
    "global_pool=False": {"global_pool": False},
    "lease_global_slots=True": {"max_global": 1000, "lease_global_slots": True},
}
HAND_OVERS = 20


async def count_keys(shard: aioredis.Redis, prefix: str) -> int:
    return len([key async for key in shard.scan_iter(match=f"{{{prefix}*", count=1000)])


async def run_layout(cluster: RedisCluster, layout: dict[str, object]) -> dict[str, list[int]]:
    prefix = "spread-" + "-".join(f"{k}={v}" for k, v in layout.items())
    config = LeaseConfig(key_prefix=prefix, max_per_user=0, **layout)
    managers = [StreamLeaseManager(url=cluster.url, config=config) for _ in range(MANAGERS)]
    shards = [aioredis.Redis(port=node.port) for node in cluster.nodes]
    before = [(await command_calls(s))[0] for s in shards]

    async def cycles(user: int) -> list[object]:
        manager = managers[user % MANAGERS]
        held = []
        for _ in range(CYCLES_PER_USER - 1):
            await (await manager.acquire(f"user{user}")).release()
        held.append(await manager.acquire(f"user{user}"))  # one lease per user stays held
        return held

    held = await asyncio.gather(*(cycles(u) for u in range(USERS)))
    keys = [await count_keys(shard, prefix) for shard in shards]
    after = [(await command_calls(s))[0] for s in shards]
    del held
    for manager in managers:
        await manager.aclose()
    for shard in shards:
        await shard.aclose()
    return {"keys": keys, "commands": [a - b for a, b in zip(after, before, strict=True)]}


async def wake_ups(url: str) -> list[float]:
    """Release-to-admission delays (s) of a waiter in the other of two managers."""
    config = LeaseConfig(key_prefix="wake", max_per_user=0, max_global=1)
    managers = [StreamLeaseManager(url=url, config=config) for _ in range(2)]
    held, owner = await managers[0].acquire("first"), 0
    delays = []
    for n in range(HAND_OVERS):
        other = managers[1 - owner]
        waiting = asyncio.create_task(other.acquire(f"w{n}", wait_timeout=30))
        while other.stats()["waiting"] < 1:  # noqa: ASYNC110 (a local counter, no event)
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.05)  # its first call answered: it waits for a wake-up
        released_at = time.perf_counter()
        await held.release()
        held, owner = await waiting, 1 - owner
        delays.append(time.perf_counter() - released_at)
    await held.release()
    for manager in managers:
        await manager.aclose()
    return sorted(delays)


async def main() -> None:
    cluster, server = RedisCluster().start(), RedisServer().start()
    try:
        results = {name: await run_layout(cluster, layout) for name, layout in LAYOUTS.items()}
        wakes = {
            "cluster (SPUBLISH / SSUBSCRIBE)": await wake_ups(cluster.url),
            "standalone (PUBLISH / SUBSCRIBE)": await wake_ups(server.url),
        }
    finally:
        cluster.cleanup()
        server.cleanup()
    rows = [
        [
            layout,
            *(f"{k:,} / {c:,}" for k, c in zip(r["keys"], r["commands"], strict=True)),
            f"{max(r['commands']) / (sum(r['commands']) / len(r['commands'])):.2f}",
        ]
        for layout, r in results.items()
    ]
    print(f"\n{USERS} users x {CYCLES_PER_USER} acquire + release cycles over {MANAGERS} managers,"
          " one lease each left held")
    print_table(["layout", "shard 1 keys / commands", "shard 2", "shard 3", "busiest / mean"],
                rows, left=1)
    print(f"\na waiter in one manager, a release in another, {HAND_OVERS} hand-overs")
    rows = [
        [name, f"{percentile_ms(delays, 0.5):.2f}", f"{delays[-1] * 1000:.2f}"]
        for name, delays in wakes.items()
    ]
    print_table(["deployment", "release->admit p50 ms", "max ms"], rows, left=1)
    write_json(
        RESULTS_DIR / "cluster_spread.json",
        {"machine": machine_info(), "results": results, "wake_ups_s": wakes},
    )


if __name__ == "__main__":
    asyncio.run(main())
