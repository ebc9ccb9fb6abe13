"""Acquire+release cycles per second and acquire latency: fastapi_stream_lease vs. plain redis-py.

Measured against one Redis server, in one run:

* ``fastapi_stream_lease``: ``lease = await manager.acquire(user_id); await lease.release()`` on
  a ``StreamLeaseManager`` with unlimited pools (``max_per_user=0, max_global=0``);
* ``redis-py``: ``redis.asyncio`` (hiredis parser, pool of 64 connections) running the project's
  own ``src/lua/acquire.lua`` and ``src/lua/release.lua`` by EVALSHA, with the KEYS and ARGV the
  Rust core sends (same keys, same identity digest, same lease duration);
* the ceiling: ``redis-benchmark -c 50 -n 200000 EVALSHA <sha of 'return 1'> 0``, the server's
  rate of script calls with next to no client cost. A cycle is two script calls, so half of it
  is the cycles/s ceiling.

Scenarios: one coroutine cycling back to back, and 64 coroutines (one user id each). A run warms
up, then counts the cycles that complete within a fixed window and the latency of the acquires
that complete within it. Runs are repeated, alternating the two implementations so that noise
hits both; the table gives the medians of the runs and the ratio project / redis-py.

Run it from the repository root with ``bash benchmarks/run.sh``: that builds a release wheel
into ``benchmarks/.venv`` and starts a throwaway ``redis-server``. Against a server of your own
(it writes keys under ``{bench}:`` and needs ``redis-cli`` and ``redis-benchmark`` on PATH)::

    benchmarks/.venv/bin/python benchmarks/acquire_release.py --url redis://127.0.0.1:6380/0

The table is printed; the raw figures go to ``benchmarks/results/acquire_release.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import json
import math
import os
import platform
import re
import statistics
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar
from urllib.parse import urlsplit

import hiredis
import redis
import redis.asyncio as aioredis
from redis.asyncio.connection import DefaultParser

import fastapi_stream_lease
from fastapi_stream_lease import Lease, LeaseConfig, StreamLeaseManager

REPO = Path(__file__).resolve().parent.parent
LUA_DIR = REPO / "src" / "lua"
DEFAULT_OUTPUT = REPO / "benchmarks" / "results" / "acquire_release.json"
KEY_PREFIX = "bench"
SCENARIOS = (1, 64)
PROJECT = "fastapi_stream_lease"
REDIS_PY = f"redis-py {redis.__version__}"
CEILING_CLIENTS = 50
CEILING_REQUESTS = 200_000
SUBPROCESS_TIMEOUT_S = 120.0

H = TypeVar("H")


@dataclass(frozen=True)
class Implementation(Generic[H]):
    """One way to take a lease and give it back: ``await release(await acquire(user_id))``."""

    name: str
    acquire: Callable[[str], Awaitable[H]]
    release: Callable[[H], Awaitable[bool]]


class RedisPyLeases:
    """The project's Lua scripts called straight from redis-py, shaped as the Rust core calls them.

    acquire: KEYS = [user pool, global pool], ARGV = [lease id, ttl ms, weight 1, 0, 0 (no caps)];
    release: same KEYS, ARGV = [lease id, weight 1, 2 pools, KEYS index 1, KEYS index 2].
    """

    def __init__(self, client: aioredis.Redis, key_prefix: str, ttl_ms: int) -> None:
        self._acquire = client.register_script((LUA_DIR / "acquire.lua").read_text())
        self._release = client.register_script((LUA_DIR / "release.lua").read_text())
        self._tag = f"{{{key_prefix}}}"
        self._ttl_ms = ttl_ms

    @property
    def global_key(self) -> str:
        return f"{self._tag}:global"

    def pool_keys(self, user_id: str) -> list[str]:
        """The per-user and global pool keys (HMAC-SHA256 with an empty key, 128 bits in hex)."""
        digest = hmac.new(b"", user_id.encode(), hashlib.sha256).hexdigest()[:32]
        return [f"{self._tag}:user:{digest}", self.global_key]

    async def acquire(self, user_id: str) -> tuple[str, list[str]]:
        keys = self.pool_keys(user_id)
        lease_id = uuid.uuid4().hex
        reply = await self._acquire(keys=keys, args=[lease_id, self._ttl_ms, 1, 0, 0])
        if reply[0] != 1:
            raise RuntimeError(f"acquire.lua refused a lease in unlimited pools: {reply!r}")
        return lease_id, keys

    async def release(self, lease: tuple[str, list[str]]) -> bool:
        lease_id, keys = lease
        return bool(await self._release(keys=keys, args=[lease_id, 1, 2, 1, 2]) == 1)


@dataclass
class WorkerTally:
    """What one coroutine did during a run."""

    cycles_in_window: int = 0
    failed_releases: int = 0
    acquire_latencies_s: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class RunResult:
    """One timed run of one implementation in one scenario."""

    scenario: str
    implementation: str
    repeat: int
    coroutines: int
    window_s: float
    cycles: int
    cycles_per_s: float
    p50_ms: float
    p99_ms: float
    acquires_timed: int
    failed_releases: int
    left_in_global_pool: int


@dataclass(frozen=True)
class Summary:
    """Medians over the repeats of one implementation in one scenario."""

    scenario: str
    implementation: str
    cycles_per_s: float
    p50_ms: float
    p99_ms: float
    ratio_vs_redis_py: float


def scenario_name(coroutines: int) -> str:
    return "1 coroutine" if coroutines == 1 else f"{coroutines} coroutines"


def percentile_ms(sorted_s: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of sorted durations in seconds, in milliseconds."""
    index = min(len(sorted_s) - 1, max(0, math.ceil(fraction * len(sorted_s)) - 1))
    return sorted_s[index] * 1000.0


async def cycle_until(
    impl: Implementation[Any], user_id: str, window_start: float, window_end: float
) -> WorkerTally:
    """Acquire+release back to back until ``window_end``; tallies what falls in the window."""
    tally = WorkerTally()
    while time.perf_counter() < window_end:
        started = time.perf_counter()
        handle = await impl.acquire(user_id)
        acquired = time.perf_counter()
        released = await impl.release(handle)
        finished = time.perf_counter()
        if not released:
            tally.failed_releases += 1
        if window_start <= acquired <= window_end:
            tally.acquire_latencies_s.append(acquired - started)
        if window_start <= finished <= window_end:
            tally.cycles_in_window += 1
    return tally


async def timed_run(
    impl: Implementation[Any],
    coroutines: int,
    repeat: int,
    warmup_s: float,
    window_s: float,
    client: aioredis.Redis,
    global_key: str,
) -> RunResult:
    """Runs ``coroutines`` workers (one user id each) through the warm-up and the window."""
    window_start = time.perf_counter() + warmup_s
    window_end = window_start + window_s
    workers = (
        cycle_until(impl, f"bench-user-{n}", window_start, window_end) for n in range(coroutines)
    )
    # Every call is bounded (redis_timeout, socket_timeout); this bounds the run as a whole.
    tallies = await asyncio.wait_for(asyncio.gather(*workers), warmup_s + window_s + 15.0)
    latencies = sorted(s for t in tallies for s in t.acquire_latencies_s)
    if not latencies:
        raise RuntimeError(f"{impl.name}: no acquire completed within the {window_s} s window")
    cycles = sum(t.cycles_in_window for t in tallies)
    return RunResult(
        scenario=scenario_name(coroutines),
        implementation=impl.name,
        repeat=repeat,
        coroutines=coroutines,
        window_s=window_s,
        cycles=cycles,
        cycles_per_s=cycles / window_s,
        p50_ms=percentile_ms(latencies, 0.50),
        p99_ms=percentile_ms(latencies, 0.99),
        acquires_timed=len(latencies),
        failed_releases=sum(t.failed_releases for t in tallies),
        left_in_global_pool=int(await client.zcard(global_key)),
    )


async def compare(
    url: str, warmup_s: float, window_s: float, repeats: int
) -> tuple[list[RunResult], str]:
    """Every scenario, ``repeats`` times, alternating which implementation goes first.

    Returns the runs and the server's version.
    """
    config = LeaseConfig(max_per_user=0, max_global=0, key_prefix=KEY_PREFIX)
    manager = StreamLeaseManager(url=url, config=config)
    client = aioredis.Redis.from_url(url, max_connections=max(SCENARIOS), socket_timeout=5.0)
    try:
        server_version = str((await client.info("server"))["redis_version"])
        redis_py = RedisPyLeases(client, config.key_prefix, round(config.lease_seconds * 1000))
        project_impl: Implementation[Lease] = Implementation(
            PROJECT, manager.acquire, Lease.release
        )
        redis_py_impl: Implementation[tuple[str, list[str]]] = Implementation(
            REDIS_PY, redis_py.acquire, redis_py.release
        )
        runs: list[RunResult] = []
        for coroutines in SCENARIOS:
            for repeat in range(1, repeats + 1):
                order: list[Implementation[Any]] = [project_impl, redis_py_impl]
                if repeat % 2 == 0:
                    order.reverse()
                for impl in order:
                    run = await timed_run(
                        impl, coroutines, repeat, warmup_s, window_s, client, redis_py.global_key
                    )
                    runs.append(run)
                    print(
                        f"  {run.scenario:<14} #{repeat} {run.implementation:<22}"
                        f" {run.cycles_per_s:>10,.0f} cycles/s"
                        f"  p50 {run.p50_ms:.3f} ms  p99 {run.p99_ms:.3f} ms",
                        flush=True,
                    )
        return runs, server_version
    finally:
        await manager.aclose()
        await client.aclose()


def summarize(runs: Sequence[RunResult]) -> list[Summary]:
    """Medians per scenario and implementation, with the project / redis-py cycles/s ratio."""
    medians: dict[tuple[str, str], tuple[float, float, float]] = {}
    for key in dict.fromkeys((r.scenario, r.implementation) for r in runs):
        mine = [r for r in runs if (r.scenario, r.implementation) == key]
        medians[key] = (
            statistics.median(r.cycles_per_s for r in mine),
            statistics.median(r.p50_ms for r in mine),
            statistics.median(r.p99_ms for r in mine),
        )
    return [
        Summary(
            scenario=scenario,
            implementation=impl,
            cycles_per_s=rate,
            p50_ms=p50,
            p99_ms=p99,
            ratio_vs_redis_py=rate / medians[(scenario, REDIS_PY)][0],
        )
        for (scenario, impl), (rate, p50, p99) in medians.items()
    ]


def ceiling(url: str) -> dict[str, Any]:
    """redis-benchmark EVALSHA of a trivial script: the server-side limit on script calls."""
    parts = urlsplit(url)
    target = ["-h", parts.hostname or "127.0.0.1", "-p", str(parts.port or 6379)]
    sha = subprocess.run(
        ["redis-cli", *target, "SCRIPT", "LOAD", "return 1"],
        capture_output=True,
        text=True,
        check=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    ).stdout.strip()
    command = [
        "redis-benchmark",
        *target,
        "-c",
        str(CEILING_CLIENTS),
        "-n",
        str(CEILING_REQUESTS),
        "-q",
        "EVALSHA",
        sha,
        "0",
    ]
    output = subprocess.run(
        command, capture_output=True, text=True, check=True, timeout=SUBPROCESS_TIMEOUT_S
    ).stdout
    found = re.findall(r"([\d.]+) requests per second(?:, p50=([\d.]+) msec)?", output)
    if not found:
        raise RuntimeError(f"cannot read redis-benchmark's output: {output!r}")
    requests_per_s, p50 = found[-1]
    return {
        "command": " ".join(command),
        "requests_per_s": float(requests_per_s),
        "cycles_per_s_ceiling": float(requests_per_s) / 2,
        "p50_ms": float(p50) if p50 else None,
        "output": output.splitlines()[-1] if output else "",
    }


def cpu_model() -> str:
    try:
        with Path("/proc/cpuinfo").open(encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info(server_version: str) -> dict[str, Any]:
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "event_loop": "asyncio (default loop, no uvloop)",
        "redis_server": server_version,
        "redis_py": redis.__version__,
        "hiredis": hiredis.__version__,
        "redis_py_parser": DefaultParser.__name__,
        "fastapi_stream_lease": fastapi_stream_lease.__version__,
        "fastapi_stream_lease_installed_at": str(Path(fastapi_stream_lease.__file__).parent),
    }


def print_table(summaries: Sequence[Summary], top: dict[str, Any]) -> None:
    header = (
        f"{'scenario':<16}{'implementation':<34}{'cycles/s':>12}"
        f"{'p50 ms':>10}{'p99 ms':>10}{'ratio':>9}"
    )
    print()
    print(header)
    print("-" * len(header))
    for s in summaries:
        print(
            f"{s.scenario:<16}{s.implementation:<34}{s.cycles_per_s:>12,.0f}"
            f"{s.p50_ms:>10.3f}{s.p99_ms:>10.3f}{s.ratio_vs_redis_py:>8.2f}x"
        )
    p50 = "" if top["p50_ms"] is None else f"{top['p50_ms']:>10.3f}"
    print(
        f"{'ceiling':<16}{f'redis-benchmark -c {CEILING_CLIENTS} (/2)':<34}"
        f"{top['cycles_per_s_ceiling']:>12,.0f}{p50}"
    )
    print("-" * len(header))
    print(
        "ratio = cycles/s / redis-py's in the same scenario; medians of the runs; p50/p99 are of"
        " acquire alone.\n"
        f"ceiling: EVALSHA 'return 1' at {top['requests_per_s']:,.0f} requests/s"
        f" = {top['cycles_per_s_ceiling']:,.0f} cycles/s ceiling (2 script calls per cycle)."
    )


def without_password(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname}:{parts.port}"
    return parts._replace(netloc=netloc).geturl()


def write_json(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    partial.replace(path)


def main() -> None:
    parser = argparse.ArgumentParser(
        description="Acquire+release cycles/s and acquire latency: project vs. redis-py."
    )
    parser.add_argument("--url", required=True, help="Redis URL, e.g. redis://127.0.0.1:6380/0")
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds before each window")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds of each window")
    parser.add_argument("--repeats", type=int, default=3, help="runs per scenario and library")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="JSON results file")
    args = parser.parse_args()
    if args.duration <= 0 or args.warmup < 0 or args.repeats < 1:
        parser.error("--duration must be > 0, --warmup >= 0 and --repeats >= 1")

    print(
        f"acquire+release against {args.url}: {args.warmup} s warm-up + {args.duration} s window,"
        f" {args.repeats} runs per scenario and implementation"
    )
    runs, server_version = asyncio.run(compare(args.url, args.warmup, args.duration, args.repeats))
    summaries = summarize(runs)
    print(f"  ceiling: redis-benchmark -c {CEILING_CLIENTS} -n {CEILING_REQUESTS} ...", flush=True)
    top = ceiling(args.url)
    print_table(summaries, top)

    anomalies = [r for r in runs if r.failed_releases or r.left_in_global_pool]
    for r in anomalies:
        print(
            f"WARNING {r.scenario} #{r.repeat} {r.implementation}: {r.failed_releases} releases"
            f" found no lease, {r.left_in_global_pool} leases left in the global pool"
        )

    write_json(
        args.output,
        {
            "machine": machine_info(server_version),
            "settings": {
                "url": without_password(args.url),
                "warmup_s": args.warmup,
                "window_s": args.duration,
                "repeats": args.repeats,
                "key_prefix": KEY_PREFIX,
                "redis_py_max_connections": max(SCENARIOS),
            },
            "summary": [asdict(s) for s in summaries],
            "ceiling": top,
            "runs": [asdict(r) for r in runs],
        },
    )
    print(f"raw figures: {args.output}")


if __name__ == "__main__":
    main()
