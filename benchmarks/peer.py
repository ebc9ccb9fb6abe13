"""Driver of the pure-Python peer, PyPI ``fastapi-stream-lease==0.6.3``, in its own virtualenv.

The peer has this project's import name (``fastapi_stream_lease``), so it cannot share a
process with it: ``acquire_release.py`` and ``holding.py`` start this script with
``benchmarks/.venv-peer/bin/python`` (``setup_bench_env.sh`` builds that virtualenv) and talk
to it in JSON lines (``common.Child``). What it measures is what those scripts print.

How the peer works, from its source (``fastapi_stream_lease/manager.py`` and ``lease.py``):
every acquire, renew and release is one ``EVAL`` carrying the whole script text; renewal is
one asyncio task per lease, started by ``lease.wrap()``, ``async with lease`` or
``manager.lease()`` (a bare ``acquire()`` is not renewed), renewing that one lease every
``lease_seconds / 2``; a lease found gone cancels the task that holds it, which then raises
``StreamLeaseLost``. With ``max_global=0`` the peer keeps no global pool at all, so it runs
here with ``max_global=10**9``: unlimited in effect, but counted, as this project always does.

Two modes, both against the Redis at ``--url`` (keys under ``{bench-peer}:``)::

    .venv-peer/bin/python benchmarks/peer.py cycles --url redis://127.0.0.1:6380/0
    .venv-peer/bin/python benchmarks/peer.py hold --url ... --leases 10000 --lease-seconds 2

``cycles`` replies ``hello`` (versions), then answers each ``run`` request (coroutines, repeat,
warm-up, window) with one ``common.RunResult``. ``hold`` is ``common.serve_holder``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Callable
from dataclasses import asdict

import hiredis
import redis
from redis.asyncio.connection import DefaultParser

import fastapi_stream_lease
from fastapi_stream_lease import LeaseConfig, StreamLease, StreamLeaseLost, StreamLeaseManager

from common import (
    PEER,
    PEER_DEFAULT_POOL,
    REDIS_PY_POOL_SIZE,
    Implementation,
    redis_py_client,
    reply,
    requests,
    serve_holder,
    timed_run,
)

UNLIMITED_BUT_COUNTED = 10**9


def peer_manager(
    url: str, key_prefix: str, lease_seconds: float, default_pool: bool = False
) -> StreamLeaseManager:
    """The peer's manager; ``default_pool``: its client as the peer's README builds it
    (``redis.asyncio.from_url``), else the baseline's blocking pool of 64 connections."""
    config = LeaseConfig(
        lease_seconds=lease_seconds,
        max_per_user=0,
        max_global=UNLIMITED_BUT_COUNTED,
        key_prefix=key_prefix,
    )
    client = redis.asyncio.from_url(url) if default_pool else redis_py_client(url)
    return StreamLeaseManager(redis=client, config=config)


async def release(lease: StreamLease) -> bool:
    await lease.release()  # the peer's release script does not say whether the lease was there
    return True


async def cycles(url: str, default_pool: bool) -> None:
    manager = peer_manager(url, "bench-peer", 30.0, default_pool)
    name = PEER_DEFAULT_POOL if default_pool else PEER
    # INFO goes on a connection of its own: the peer's pool may be all busy.
    stats_client = redis.asyncio.from_url(url)
    impl: Implementation[StreamLease] = Implementation(name, manager.acquire, release)
    reply(
        {
            "kind": "hello",
            "peer_version": fastapi_stream_lease.__version__,
            "redis_py": redis.__version__,
            "hiredis": hiredis.__version__,
            "redis_py_parser": DefaultParser.__name__,
            "redis_py_max_connections": REDIS_PY_POOL_SIZE,
        }
    )
    try:
        async for request in requests():
            run = await timed_run(
                impl,
                request["coroutines"],
                request["repeat"],
                request["warmup_s"],
                request["window_s"],
                manager.get_active_count,
                stats_client,
            )
            reply({"kind": "run", **asdict(run)})
    finally:
        await manager.close(drain=False)
        await manager.redis.aclose()
        await stats_client.aclose()


class PeerHolder:
    """Each lease held by ``async with lease:`` in its own task: the peer's renewal task runs
    for it, and a lease found gone cancels the task with ``StreamLeaseLost``."""

    def __init__(self, url: str, key_prefix: str, lease_seconds: float) -> None:
        self._manager = peer_manager(url, key_prefix, lease_seconds)
        self._lost = 0
        self.renew_every_s = lease_seconds / 2  # StreamLease._start_auto_renew's default

    async def warm_up(self) -> None:
        await (await self._manager.acquire("warm-up")).release()

    async def hold(
        self,
        user_id: str,
        gate: asyncio.Semaphore,
        on_acquired: Callable[[], None],
        stop: asyncio.Event,
    ) -> None:
        async with gate:
            lease = await self._manager.acquire(user_id)
        on_acquired()
        try:
            async with lease:
                await stop.wait()
        except StreamLeaseLost:
            self._lost += 1

    def lost(self) -> int:
        return self._lost

    def reclaimed(self) -> int:
        return 0  # the peer never takes a vanished lease back

    async def active_count(self) -> int:
        return await self._manager.get_active_count()

    async def close(self) -> None:
        await self._manager.close(drain=False, timeout=60.0)
        await self._manager.redis.aclose()


async def hold(
    url: str, key_prefix: str, lease_seconds: float, leases: int, acquire_concurrency: int
) -> None:
    await serve_holder(PeerHolder(url, key_prefix, lease_seconds), leases, acquire_concurrency)


def main() -> None:
    parser = argparse.ArgumentParser(description="Drives the peer (PyPI 0.6.3) for a benchmark.")
    parser.add_argument("mode", choices=["cycles", "hold"])
    parser.add_argument("--url", required=True, help="Redis URL, e.g. redis://127.0.0.1:6380/0")
    parser.add_argument("--leases", type=int, default=1000, help="hold: leases to hold")
    parser.add_argument("--lease-seconds", type=float, default=2.0, help="hold: lease duration")
    parser.add_argument("--key-prefix", default="hold-peer", help="hold: Redis key prefix")
    parser.add_argument("--acquire-concurrency", type=int, default=REDIS_PY_POOL_SIZE)
    parser.add_argument(
        "--default-pool", action="store_true", help="cycles: redis-py's default pool, as users"
    )
    args = parser.parse_args()
    if args.mode == "cycles":
        asyncio.run(cycles(args.url, args.default_pool))
    else:
        # One ERROR line per lost lease would bury the table; the losses are counted instead.
        logging.getLogger("fastapi_stream_lease").setLevel(logging.CRITICAL)
        asyncio.run(
            hold(
                args.url, args.key_prefix, args.lease_seconds, args.leases, args.acquire_concurrency
            )
        )


if __name__ == "__main__":
    main()
