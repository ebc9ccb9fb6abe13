"""The cost of HOLDING many leases at once in one process: Redis traffic, CPU, memory, losses.

For each library and each size N, a fresh child process acquires N leases (``lease_seconds=2``,
no caps, one user id per lease, at most 64 acquires in flight) and holds each one in its own
asyncio task, as N open streams would. Once every lease is held and one more second has passed,
this script measures a window (10 s by default):

* Redis commands per second: the delta of ``INFO commandstats``, both the script calls (the
  round trips that carry the leases: FCALL for this project, EVAL for the peer) and all
  commands, which include the ZSCORE/ZADD/... that those scripts run inside Redis;
* the Redis server's CPU (``INFO cpu``, user + system) as a percentage of one core;
* the holder's CPU: user + system seconds of the child (all its threads, ``/proc/<pid>/stat``)
  over the window's wall time, as a percentage of one core;
* resident memory per lease: (RSS after acquiring - RSS before) / N, where "before" already
  counts the N parked tasks, so the figure is the leases' own cost;
* lost leases: ``manager.stats()["lost"]`` for this project, plus ``["reclaimed"]``: leases
  that a renewal found already expired in Redis and took back (the pools had room), which were
  missing from the pool for a while all the same; ``StreamLeaseLost`` raised in the holding
  tasks for the peer; and the global pool's own count at the end, which must be N.

This project keeps every held lease alive from one loop per manager, every
``lease_seconds / 3``: one keep-alive script call per round extends the process's holder entry,
which all its leases in the hash tag share (a renewal costs the same for 10 or 100,000 leases);
the peer (PyPI ``fastapi-stream-lease==0.6.3``, driven by ``peer.py`` in ``benchmarks/.venv-peer``)
runs one renewal task per lease, every ``lease_seconds / 2``, one EVAL each. The project runs
N = 1,000, 10,000 and 100,000; the peer starts at 1,000 and stops growing at the first size that
loses a lease or fails to acquire all within the time limit (60 s).

Run it from the repository root with ``bash benchmarks/run.sh``, or against a Redis of your own
(it writes keys under ``{hold-*}`` and deletes them afterwards)::

    benchmarks/.venv/bin/python benchmarks/holding.py --url redis://127.0.0.1:6380/0

The table is printed; the raw figures go to ``benchmarks/results/holding.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from fastapi_stream_lease import Lease, LeaseConfig, StreamLeaseManager

from common import (
    BENCH_DIR,
    PEER,
    PEER_PYTHON,
    PROJECT,
    RESULTS_DIR,
    Child,
    command_calls,
    cpu_seconds,
    delete_keys,
    machine_info,
    print_table,
    redis_cpu_seconds,
    serve_holder,
    write_json,
)
from support.urls import without_password

DEFAULT_OUTPUT = RESULTS_DIR / "holding.json"
PROJECT_SIZES = (1_000, 10_000, 100_000)
PEER_SIZES = (1_000, 10_000, 100_000)
LEASE_SECONDS = 2.0
ACQUIRE_CONCURRENCY = 64


class ProjectHolder:
    """This project's side of ``common.serve_holder``: the manager renews what it holds."""

    def __init__(self, url: str, key_prefix: str, lease_seconds: float) -> None:
        config = LeaseConfig(
            lease_seconds=lease_seconds, max_per_user=0, max_global=0, key_prefix=key_prefix
        )
        self._manager = StreamLeaseManager(url=url, config=config)
        self._held: list[Lease] = []
        self.renew_every_s = config.renew_every

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
            self._held.append(await self._manager.acquire(user_id))
        on_acquired()
        await stop.wait()

    def lost(self) -> int:
        return int(self._manager.stats()["lost"])

    def reclaimed(self) -> int:
        return int(self._manager.stats()["reclaimed"])

    async def active_count(self) -> int:
        return await self._manager.get_active_count()

    async def close(self) -> None:
        await self._manager.aclose()


@dataclass(frozen=True)
class Sample:
    """Counters read at one end of the window."""

    at: float
    commands: int
    script_calls: int
    redis_cpu_s: float
    holder_cpu_s: float


@dataclass(frozen=True)
class HoldResult:
    """One library holding one number of leases."""

    implementation: str
    leases: int
    renew_every_s: float
    completed: bool
    note: str
    acquire_s: float | None = None
    window_s: float | None = None
    script_calls_per_s: float | None = None
    commands_per_s: float | None = None
    redis_cpu_pct: float | None = None
    holder_cpu_pct: float | None = None
    rss_per_lease_bytes: float | None = None
    lost: int | None = None
    reclaimed: int | None = None
    active_at_end: int | None = None
    first_error: str | None = None


async def sample(client: aioredis.Redis, holder_pid: int) -> Sample:
    commands, script_calls = await command_calls(client)
    return Sample(
        at=time.perf_counter(),
        commands=commands,
        script_calls=script_calls,
        redis_cpu_s=await redis_cpu_seconds(client),
        holder_cpu_s=cpu_seconds(holder_pid),
    )


async def hold_one_size(
    implementation: str,
    argv: Sequence[str],
    leases: int,
    client: aioredis.Redis,
    window_s: float,
    limit_s: float,
) -> HoldResult:
    """Starts the holding child, measures the window, checks the pool, stops the child."""
    child = await Child.start(argv, f"{implementation} holding {leases:,}")
    try:
        try:
            held = await child.receive(limit_s)
        except TimeoutError:
            child.kill()
            return HoldResult(
                implementation, leases, 0.0, False, f"acquiring took over {limit_s:.0f} s"
            )
        renew_every_s = float(held["renew_every_s"])
        if held["failed"]:
            error = str(held["first_error"])
            note = f"{held['failed']:,} acquires failed ({error.split('(')[0]})"
            return HoldResult(implementation, leases, renew_every_s, False, note, first_error=error)
        first = await sample(client, child.pid)  # one second after the last acquire
        await asyncio.sleep(window_s)
        last = await sample(client, child.pid)
        await child.send({"kind": "stop"})
        done = await child.receive()
        elapsed = last.at - first.at
        lost, reclaimed, active = int(done["lost"]), int(done["reclaimed"]), int(done["active"])
        note = "" if (lost, reclaimed, active) == (0, 0, leases) else "lease(s) expired in Redis"
        return HoldResult(
            implementation=implementation,
            leases=leases,
            renew_every_s=renew_every_s,
            completed=not note,
            note=note,
            acquire_s=float(held["acquire_s"]),
            window_s=elapsed,
            script_calls_per_s=(last.script_calls - first.script_calls) / elapsed,
            commands_per_s=(last.commands - first.commands) / elapsed,
            redis_cpu_pct=100.0 * (last.redis_cpu_s - first.redis_cpu_s) / elapsed,
            holder_cpu_pct=100.0 * (last.holder_cpu_s - first.holder_cpu_s) / elapsed,
            rss_per_lease_bytes=(held["rss_after"] - held["rss_before"]) / leases,
            lost=lost,
            reclaimed=reclaimed,
            active_at_end=active,
        )
    finally:
        await child.stop()
        await delete_keys(client, prefix_of(implementation, leases))


def prefix_of(implementation: str, leases: int) -> str:
    return f"hold-{'peer' if implementation == PEER else 'project'}-{leases}"


def child_argv(implementation: str, url: str, leases: int) -> list[str]:
    common_args = [
        "--url",
        url,
        "--leases",
        str(leases),
        "--key-prefix",
        prefix_of(implementation, leases),
        "--lease-seconds",
        str(LEASE_SECONDS),
        "--acquire-concurrency",
        str(ACQUIRE_CONCURRENCY),
    ]
    if implementation == PEER:
        return [str(PEER_PYTHON), str(BENCH_DIR / "peer.py"), "hold", *common_args]
    return [sys.executable, str(Path(__file__).resolve()), "--child", *common_args]


async def measure(url: str, window_s: float, limit_s: float) -> list[HoldResult]:
    client = aioredis.Redis.from_url(url, socket_timeout=10.0)
    results: list[HoldResult] = []
    try:
        for implementation, sizes in ((PROJECT, PROJECT_SIZES), (PEER, PEER_SIZES)):
            for leases in sizes:
                print(f"  {implementation}: holding {leases:,} leases ...", flush=True)
                argv = child_argv(implementation, url, leases)
                result = await hold_one_size(
                    implementation, argv, leases, client, window_s, limit_s
                )
                results.append(result)
                if not result.completed:
                    print(f"    {result.note}", flush=True)
                    if implementation == PEER:
                        break
    finally:
        await client.aclose()
    return results


def print_results(results: Sequence[HoldResult]) -> None:
    def figure(value: float | None, template: str) -> str:
        return "-" if value is None else template.format(value)

    header = [
        "library",
        "leases",
        "renew every",
        "acquire",
        "script calls/s",
        "commands/s",
        "redis CPU",
        "holder CPU",
        "RSS/lease",
        "lost",
        "reclaimed",
        "in pool",
        "note",
    ]
    rows = [
        [
            r.implementation,
            f"{r.leases:,}",
            figure(r.renew_every_s or None, "{:.2f} s"),
            figure(r.acquire_s, "{:.1f} s"),
            figure(r.script_calls_per_s, "{:,.0f}"),
            figure(r.commands_per_s, "{:,.0f}"),
            figure(r.redis_cpu_pct, "{:.1f}%"),
            figure(r.holder_cpu_pct, "{:.1f}%"),
            figure(r.rss_per_lease_bytes, "{:,.0f} B"),
            figure(r.lost, "{:,}"),
            figure(r.reclaimed, "{:,}"),
            figure(r.active_at_end, "{:,}"),
            r.note,
        ]
        for r in results
    ]
    print_table(header, rows)
    print(
        "commands/s counts every command Redis ran, including those run inside the scripts;"
        " CPU is % of one core\nover the window; RSS/lease = (RSS after acquiring - RSS before)"
        " / leases, each lease held by a parked task\nin both cases (the tasks are in 'before')."
    )
    by_key = {(r.implementation, r.leases): r for r in results}
    print_marginal_rss(by_key)
    for leases in PEER_SIZES:
        mine, peer = by_key.get((PROJECT, leases)), by_key.get((PEER, leases))
        if not (mine and peer and mine.script_calls_per_s and mine.commands_per_s):
            continue
        if peer.script_calls_per_s is None or peer.commands_per_s is None:
            continue
        caveat = "" if mine.completed and peer.completed else " (a lease was lost: see the table)"
        print(
            f"at {leases:,} leases the peer sends"
            f" {peer.script_calls_per_s / mine.script_calls_per_s:,.0f}x this project's script"
            f" calls/s and makes Redis run {peer.commands_per_s / mine.commands_per_s:.2f}x its"
            f" commands/s{caveat}"
        )


def print_marginal_rss(by_key: dict[tuple[str, int], HoldResult]) -> None:
    """RSS per lease between the two largest sizes each library held: what one more lease
    costs, without the fixed costs (allocator pages, tables) that weigh on the smaller size."""
    for implementation in (PROJECT, PEER):
        sizes = sorted(
            (r.leases, r.rss_per_lease_bytes * r.leases)
            for (name, _), r in by_key.items()
            if name == implementation and r.completed and r.rss_per_lease_bytes is not None
        )
        if len(sizes) < 2:
            continue
        (small, small_rss), (large, large_rss) = sizes[-2:]
        print(
            f"{implementation}: RSS per lease from {small:,} to {large:,} leases:"
            f" {(large_rss - small_rss) / (large - small):,.0f} B"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description="Cost of holding N leases: Redis commands/s, CPU, memory, losses."
    )
    parser.add_argument("--url", required=True, help="Redis URL, e.g. redis://127.0.0.1:6380/0")
    parser.add_argument("--window", type=float, default=10.0, help="seconds measured per size")
    parser.add_argument("--limit", type=float, default=60.0, help="max seconds to acquire a size")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="JSON results file")
    child = parser.add_argument_group("child mode (started by this script)")
    child.add_argument("--child", action="store_true", help="hold leases, answer on stdout")
    child.add_argument("--leases", type=int, default=1000)
    child.add_argument("--key-prefix", default="hold-project")
    child.add_argument("--lease-seconds", type=float, default=LEASE_SECONDS)
    child.add_argument("--acquire-concurrency", type=int, default=ACQUIRE_CONCURRENCY)
    args = parser.parse_args()

    if args.child:
        holder = ProjectHolder(args.url, args.key_prefix, args.lease_seconds)
        asyncio.run(serve_holder(holder, args.leases, args.acquire_concurrency))
        return
    if not PEER_PYTHON.exists():
        parser.error(f"{PEER_PYTHON} is missing: run bash benchmarks/setup_bench_env.sh")
    if args.window <= 0 or args.limit <= 0:
        parser.error("--window and --limit must be > 0")

    print(
        f"holding leases against {args.url}: lease_seconds={LEASE_SECONDS},"
        f" {args.window} s window per size, {args.limit} s limit to acquire"
    )
    results = asyncio.run(measure(args.url, args.window, args.limit))
    print_results(results)
    report: dict[str, Any] = {
        "machine": machine_info(),
        "settings": {
            "url": without_password(args.url),
            "lease_seconds": LEASE_SECONDS,
            "window_s": args.window,
            "acquire_limit_s": args.limit,
            "acquire_concurrency": ACQUIRE_CONCURRENCY,
        },
        "results": [asdict(r) for r in results],
    }
    write_json(args.output, report)
    print(f"raw figures: {args.output}")


if __name__ == "__main__":
    main()
