"""Waiting for a full pool: what 200 waiters cost Redis, and how fast a release admits the next.

Against one Redis server, in one run:

* ``fastapi_stream_lease``: a pool of capacity 1 held by one lease, 200 coroutines waiting in
  line (``acquire(..., wait_timeout=60)``); the line lives in Redis, a release ``PUBLISH``es a
  wake-up and only the process's earliest waiter talks to Redis;
* the baseline a user would otherwise write: 200 coroutines each retrying the same acquire
  script through redis-py every 50 ms until it succeeds (polling).

Measured: Redis commands per second while the 200 wait and nobody releases (``INFO
commandstats`` deltas over a fixed window), then the delay from a ``release()`` to the next
waiter's admission, over a chain of hand-overs (p50 and p99).

Then fair shares: 200 waiters across 10 users and 3 resources of capacity 1, user 0
arriving first with 100 of them; each admitted waiter gives its slot back at once. Measured for
the default fair order and for ``line_order="arrival"`` in the same run: commands/s while all
wait, release-to-admission p50/p99, and the fairness figure, the most served user's share of
the first 60 grants over the least served one's (1.0 is equal; "inf": a user got none).

Run it with ``bash benchmarks/run.sh`` (which builds a release wheel and starts its own Redis),
or against a server of yours: ``benchmarks/.venv/bin/python benchmarks/waiting.py --url URL``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

import redis.asyncio as aioredis

from fastapi_stream_lease import LeaseConfig, Resource, StreamLeaseManager
from fastapi_stream_lease._core import _acquire_call, _release_call, _script_source

from common import (
    RESULTS_DIR,
    command_calls,
    machine_info,
    percentile_ms,
    print_table,
    redis_py_client,
    write_json,
)
from support.urls import without_password

WAITERS = 200
HAND_OVERS = 100
POLL_EVERY_S = 0.05
USERS, RESOURCES, FIRST_GRANTS = 10, 3, 60


async def commands_per_second(client: aioredis.Redis, window_s: float) -> float:
    before, _ = await command_calls(client)
    await asyncio.sleep(window_s)
    after, _ = await command_calls(client)
    return (after - before - 2) / window_s  # the two INFO calls themselves


async def project(url: str, client: aioredis.Redis, window_s: float) -> dict[str, float]:
    config = LeaseConfig(max_per_user=0, max_global=1, key_prefix=f"wait-{uuid.uuid4().hex[:8]}")
    manager = StreamLeaseManager(url=url, config=config)
    holder = await manager.acquire("holder")
    admitted: asyncio.Queue[tuple[float, object]] = asyncio.Queue()

    async def wait(n: int) -> None:
        lease = await manager.acquire(f"waiter{n}", wait_timeout=60)
        await admitted.put((time.perf_counter(), lease))

    waiters = [asyncio.create_task(wait(n)) for n in range(WAITERS)]
    while manager.stats()["waiting"] < WAITERS:  # noqa: ASYNC110 (a local counter, no event)
        await asyncio.sleep(0.01)
    idle = await commands_per_second(client, window_s)

    delays = []
    current = holder
    for _ in range(HAND_OVERS):
        released_at = time.perf_counter()
        await current.release()
        at, current = await admitted.get()
        delays.append(at - released_at)
    await current.release()
    for task in waiters:
        task.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
    await manager.aclose()
    return summary(idle, delays)


async def polling(url: str, client: aioredis.Redis, window_s: float) -> dict[str, float]:
    """The same acquire and release scripts, retried every 50 ms by each waiter."""
    acquire = client.register_script(_script_source("acquire"))
    release = client.register_script(_script_source("release"))
    tag = f"{{poll-{uuid.uuid4().hex[:8]}}}"
    keys = [f"{tag}:global", f"{tag}:holders"]
    holder_id = 12345  # this process's, as the core picks one per manager
    stop = asyncio.Event()
    admitted: asyncio.Queue[tuple[float, str]] = asyncio.Queue()

    async def take(lease_id: str) -> bool:
        # As the core sends a lone acquire of a lease of 30 s in the pool of capacity 1 (its
        # layout from the core: `_acquire_call`).
        call_keys, call_args = _acquire_call(holder_id, 30_000, [(lease_id, 1, [(keys[0], 1)])])
        reply = await acquire(keys=call_keys, args=call_args)  # a call of one: its reply alone
        return bool(reply[0] == 1)

    async def give_back(lease_id: str) -> None:
        call_keys, call_args = _release_call(holder_id, [(lease_id, 1, [(keys[0], 1)])])
        await release(keys=call_keys, args=call_args)

    async def wait() -> None:
        lease_id = uuid.uuid4().hex
        while not stop.is_set():
            if await take(lease_id):
                await admitted.put((time.perf_counter(), lease_id))
                return
            await asyncio.sleep(POLL_EVERY_S)

    holder = uuid.uuid4().hex
    assert await take(holder)
    waiters = [asyncio.create_task(wait()) for _ in range(WAITERS)]
    await asyncio.sleep(POLL_EVERY_S * 2)
    idle = await commands_per_second(client, window_s)
    delays = []
    current = holder
    for _ in range(HAND_OVERS):
        released_at = time.perf_counter()
        await give_back(current)
        at, current = await admitted.get()
        delays.append(at - released_at)
    stop.set()
    await give_back(current)
    await asyncio.gather(*waiters, return_exceptions=True)
    await client.unlink(*keys, f"{tag}:holders:{holder_id}", f"{tag}:holders:{holder_id}:members")
    return summary(idle, delays)


async def fair_shares(
    url: str, client: aioredis.Redis, window_s: float, order: str
) -> dict[str, float]:
    """200 waiters of 10 users for 3 resources of capacity 1, user 0's 100 first."""
    config = LeaseConfig(
        max_per_user=0, max_global=0, line_order=order, key_prefix=f"fair-{uuid.uuid4().hex[:8]}"
    )
    manager = StreamLeaseManager(url=url, config=config)
    resources = [Resource(1, f"r{r}") for r in range(RESOURCES)]
    holders = [await manager.acquire(None, resources=[resource]) for resource in resources]
    admitted: asyncio.Queue[tuple[float, int, int, object]] = asyncio.Queue()

    async def wait(user: int, resource: int) -> None:
        lease = await manager.acquire(
            f"user{user}", resources=[resources[resource]], wait_timeout=120
        )
        await admitted.put((time.perf_counter(), user, resource, lease))

    arrivals = [(0, n % RESOURCES) for n in range(100)]
    # Every other user waits for every resource too.
    arrivals += [(1 + n % (USERS - 1), n // (USERS - 1) % RESOURCES) for n in range(WAITERS - 100)]
    waiters = []
    for user, resource in arrivals:
        waiters.append(asyncio.create_task(wait(user, resource)))
        await asyncio.sleep(0)  # in arrival order
    while manager.stats()["waiting"] < WAITERS:  # noqa: ASYNC110 (a local counter, no event)
        await asyncio.sleep(0.01)
    idle = await commands_per_second(client, window_s)

    released_at = {}
    for resource, holder in enumerate(holders):
        released_at[resource] = time.perf_counter()
        await holder.release()
    delays, served = [], []
    for _ in range(WAITERS):
        at, user, resource, lease = await admitted.get()
        delays.append(at - released_at[resource])
        served.append(user)
        released_at[resource] = time.perf_counter()
        await lease.release()  # type: ignore[attr-defined]
    await asyncio.gather(*waiters)
    await manager.aclose()
    shares = [served[:FIRST_GRANTS].count(user) for user in range(USERS)]
    result = summary(idle, delays)
    result["fairness_max_over_min"] = max(shares) / min(shares) if min(shares) else float("inf")
    result["user0_share_of_first_grants"] = shares[0] / FIRST_GRANTS
    return result


def summary(idle_commands_per_s: float, delays: list[float]) -> dict[str, float]:
    ordered = sorted(delays)
    return {
        "idle_commands_per_s": idle_commands_per_s,
        "hand_over_p50_ms": percentile_ms(ordered, 0.5),
        "hand_over_p99_ms": percentile_ms(ordered, 0.99),
        "hand_over_mean_ms": statistics.mean(ordered) * 1000,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--window", type=float, default=5.0, help="seconds of idle waiting")
    args = parser.parse_args()
    client = redis_py_client(args.url)
    results = {
        "fastapi_stream_lease": await project(args.url, client, args.window),
        f"redis-py polling every {POLL_EVERY_S * 1000:.0f} ms": await polling(
            args.url, client, args.window
        ),
    }
    rows = [
        [
            name,
            f"{WAITERS}",
            f"{r['idle_commands_per_s']:,.0f}",
            f"{r['hand_over_p50_ms']:.2f}",
            f"{r['hand_over_p99_ms']:.2f}",
        ]
        for name, r in results.items()
    ]
    print_table(
        ["waiters for a full pool", "waiters", "Redis commands/s", "release->admit p50 ms",
         "p99 ms"],
        rows,
        left=1,
    )
    fairness = {
        order: await fair_shares(args.url, client, args.window, order)
        for order in ("fair", "arrival")
    }
    print_table(
        ["200 waiters, 10 users, 3 resources", "Redis commands/s", "release->admit p50 ms",
         "p99 ms", "fairness (max/min share)", "user 0's share"],
        [
            [f"line_order={order!r}", f"{r['idle_commands_per_s']:,.0f}",
             f"{r['hand_over_p50_ms']:.2f}", f"{r['hand_over_p99_ms']:.2f}",
             f"{r['fairness_max_over_min']:.2f}", f"{r['user0_share_of_first_grants']:.0%}"]
            for order, r in fairness.items()
        ],
        left=1,
    )  # fmt: skip
    write_json(
        RESULTS_DIR / "waiting.json",
        {
            "machine": machine_info(),
            "url": without_password(args.url),
            "results": results,
            "fair_shares": fairness,
        },
    )
    await client.aclose()


if __name__ == "__main__":
    asyncio.run(main())
