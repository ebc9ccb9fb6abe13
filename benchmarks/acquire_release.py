"""Acquire+release cycles per second and acquire latency: this project vs. the pure-Python peer
vs. plain redis-py running this project's scripts, at several concurrencies.

Measured against one Redis server, in one run:

* ``fastapi_stream_lease``: ``lease = await manager.acquire(user_id); await lease.release()`` on
  a ``StreamLeaseManager`` with unlimited pools (``max_per_user=0, max_global=0``);
* ``redis-py``: ``redis.asyncio`` (hiredis parser, blocking pool of 64 connections) replaying
  the Rust core's own FCALL calls of ``src/lua/acquire.lua`` and ``release.lua``: read once
  with ``redis-cli MONITOR`` while the core acquires and releases one lease, then sent with
  another user's pool key and a fresh lease id (same scripts, KEYS and ARGV, whatever their
  layout);
* the peer, PyPI ``fastapi-stream-lease==0.6.3`` (pure Python, same import name), in its own
  virtualenv and process (``peer.py``), with the same kind of redis-py client:
  ``lease = await manager.acquire(user_id); await lease.release()``, ``max_per_user=0`` and a
  global cap too large to reach (with ``max_global=0`` it would keep no global pool at all);
* the ceiling: ``redis-benchmark -c 50 -n 200000 EVALSHA <sha of 'return 1'> 0``, the server's
  rate of script calls with next to no client cost. A cycle is two script calls, so half of it
  is the cycles/s ceiling.

Concurrency levels (``--concurrency``, default 1, 4, 16, 64, 256): that many coroutines cycling
back to back, one user id each. A run warms up, then counts the cycles that complete within a
fixed window and the latency of the acquires that complete within it. At 1 and 64 coroutines
each implementation runs ``--repeats`` times (3), elsewhere ``--sweep-repeats`` times (1); the
implementations take turns going first so that noise hits all of them. The table gives the
medians of the runs and the ratios to redis-py and to the peer; ``plot.py`` draws the sweep.

Run it from the repository root with ``bash benchmarks/run.sh``: that builds a release wheel
into ``benchmarks/.venv``, the peer's ``benchmarks/.venv-peer``, and starts a throwaway
``redis-server``. Against a server of your own (it writes keys under ``{bench}:`` and
``{bench-peer}:``, briefly runs MONITOR, and needs ``redis-cli`` and ``redis-benchmark`` on
PATH)::

    benchmarks/.venv/bin/python benchmarks/acquire_release.py --url redis://127.0.0.1:6380/0

The table is printed; the raw figures go to ``benchmarks/results/acquire_release.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import math
import re
import statistics
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import hiredis
import redis
import redis.asyncio as aioredis
from redis.asyncio.connection import DefaultParser

import fastapi_stream_lease
from fastapi_stream_lease import Lease, LeaseConfig, StreamLeaseManager

from common import (
    BENCH_DIR,
    PEER,
    PEER_DEFAULT_POOL,
    PEER_PYTHON,
    PROJECT,
    REDIS_PY_POOL_SIZE,
    RESULTS_DIR,
    Child,
    Implementation,
    RunResult,
    Sweep,
    in_turns,
    machine_info,
    print_table,
    redis_benchmark,
    redis_py_client,
    scenario_name,
    script_sha,
    timed_run,
    write_json,
)
from support.urls import without_password

DEFAULT_OUTPUT = RESULTS_DIR / "acquire_release.json"
KEY_PREFIX = "bench"
PROBE_USER = "bench-probe"
DEFAULT_CONCURRENCY = (1, 4, 16, 64, 256)
REDIS_PY = f"redis-py {redis.__version__}, same scripts"
CEILING_CLIENTS = 50
CEILING_REQUESTS = 200_000

Runner = Callable[[int, int], Awaitable[RunResult]]


@dataclass(frozen=True)
class CoreCalls:
    """What the Rust core sent for one acquire and one release of ``PROBE_USER``."""

    acquire: list[str]  # FCALL's words after the command name: function, numkeys, KEYS, ARGV
    release: list[str]
    lease_id: str


async def capture_core_calls(url: str, manager: StreamLeaseManager) -> CoreCalls:
    """The FCALL calls of ``src/lua/acquire.lua`` and ``release.lua`` (functions of the core's
    library) that the Rust core makes for one acquire and one release, read with ``redis-cli
    MONITOR``."""
    # A line can be long: on a server that has not seen the core yet, MONITOR shows the
    # FUNCTION LOAD of its whole library (over asyncio's default limit of 64 KiB per line).
    monitor = await asyncio.create_subprocess_exec(
        "redis-cli", "-u", url, "MONITOR", stdout=asyncio.subprocess.PIPE, limit=2**22
    )
    assert monitor.stdout is not None
    try:
        await asyncio.wait_for(monitor.stdout.readline(), 10.0)  # OK: monitoring from now on
        lease = await manager.acquire(PROBE_USER)
        await lease.release()
        calls: dict[str, list[str]] = {}
        for _line in range(1000):
            line = await asyncio.wait_for(monitor.stdout.readline(), 10.0)
            words = re.findall(r'"((?:[^"\\]|\\.)*)"', line.decode())
            script = words[1].rsplit("_", 1)[-1] if words[:1] == ["FCALL"] else None
            if script in ("acquire", "release") and lease.lease_id in words:
                calls[script] = words[1:]
                if len(calls) == 2:
                    return CoreCalls(calls["acquire"], calls["release"], lease.lease_id)
        raise RuntimeError("MONITOR did not show the core's acquire and release")
    except asyncio.TimeoutError:
        raise RuntimeError(
            "MONITOR showed no FCALL of the core's acquire and release:"
            " rebuild with bash benchmarks/setup_bench_env.sh"
        ) from None
    finally:
        monitor.terminate()
        await monitor.wait()


class ScriptCall:
    """One FCALL of the core, replayed with another user's pool and another lease id."""

    def __init__(self, words: Sequence[str], probe_user_key: str, probe_lease_id: str) -> None:
        self.function, numkeys = words[0], int(words[1])
        self.keys, self.args = list(words[2 : 2 + numkeys]), list(words[2 + numkeys :])
        if probe_user_key not in self.keys or probe_lease_id not in self.args:
            raise RuntimeError(
                f"the core's script call {list(words)[:8]}... does not name the pool key"
                f" {probe_user_key!r}: update RedisPyLeases.user_key to the core's key layout"
            )
        self._probe_user_key, self._probe_lease_id = probe_user_key, probe_lease_id

    async def send(self, client: aioredis.Redis, user_key: str, lease_id: str) -> Any:
        """FCALL with the probe's user key and lease id replaced by these."""
        swap = {self._probe_user_key: user_key, self._probe_lease_id: lease_id}
        words = [swap.get(word, word) for word in self.keys + self.args]
        return await client.fcall(self.function, len(self.keys), *words)


class RedisPyLeases:
    """The Rust core's own acquire and release script calls, replayed from redis-py.

    The calls are read once with MONITOR (:func:`capture_core_calls`): same script SHA, same
    KEYS and ARGV, with the per-user pool key and the lease id replaced. So redis-py makes
    Redis do exactly the core's work, whatever the scripts' argument layout is.
    """

    def __init__(self, client: aioredis.Redis, key_prefix: str, captured: CoreCalls) -> None:
        self._client = client
        self._tag = f"{{{key_prefix}}}"
        probe_key = self.user_key(PROBE_USER)
        self._acquire = ScriptCall(captured.acquire, probe_key, captured.lease_id)
        self._release = ScriptCall(captured.release, probe_key, captured.lease_id)

    def user_key(self, user_id: str) -> str:
        """The per-user pool key (HMAC-SHA256 with an empty key, 128 bits in hex)."""
        digest = hmac.new(b"", user_id.encode(), hashlib.sha256).hexdigest()[:32]
        return f"{self._tag}:user:{digest}"

    async def acquire(self, user_id: str) -> tuple[str, str]:
        lease = (self.user_key(user_id), uuid.uuid4().hex)
        (reply,) = await self._acquire.send(self._client, *lease)  # a batch of one
        if reply[0] != 1:
            raise RuntimeError(f"acquire.lua refused a lease in unlimited pools: {reply!r}")
        return lease

    async def release(self, lease: tuple[str, str]) -> bool:
        return await self._release.send(self._client, *lease) == [1]  # one flag per lease

    async def left_in_global_pool(self) -> int:
        return int(await self._client.zcard(f"{self._tag}:global"))


class PeerRuns:
    """The peer's runs, made by ``peer.py cycles`` in the peer's virtualenv."""

    def __init__(self, child: Child, hello: dict[str, Any]) -> None:
        self._child = child
        self.hello = hello

    @classmethod
    async def start(cls, url: str, default_pool: bool) -> PeerRuns:
        argv = [str(PEER_PYTHON), str(BENCH_DIR / "peer.py"), "cycles", "--url", url]
        child = await Child.start(argv + ["--default-pool"] * default_pool, PEER)
        return cls(child, await child.receive())

    async def run(
        self, coroutines: int, repeat: int, warmup_s: float, window_s: float
    ) -> RunResult:
        await self._child.send(
            {"coroutines": coroutines, "repeat": repeat, "warmup_s": warmup_s, "window_s": window_s}
        )
        answer = await self._child.receive(warmup_s + window_s + 60.0)
        answer.pop("kind")
        return RunResult(**answer)

    async def stop(self) -> None:
        await self._child.stop()


@dataclass(frozen=True)
class Summary:
    """Medians over the repeats of one implementation at one concurrency."""

    scenario: str
    coroutines: int
    implementation: str
    runs: int
    cycles_per_s: float
    p50_ms: float
    p99_ms: float
    ratio_vs_redis_py: float
    ratio_vs_peer: float
    redis_us_per_cycle: float | None  # Redis time in script calls per cycle


async def compare(url: str, sweep: Sweep) -> tuple[list[RunResult], str, dict[str, Any]]:
    """Every level of the sweep, the implementations taking turns going first.

    Returns the runs, the server's version and the peer's versions.
    """
    warmup_s, window_s = sweep.warmup_s, sweep.window_s
    config = LeaseConfig(max_per_user=0, max_global=0, key_prefix=KEY_PREFIX)
    manager = StreamLeaseManager(url=url, config=config)
    client = redis_py_client(url)
    # INFO goes on a connection of its own: the baseline's pool is all busy at 64 coroutines.
    stats_client = aioredis.from_url(url)
    peer = await PeerRuns.start(url, default_pool=False)
    peer_as_users = await PeerRuns.start(url, default_pool=True)
    try:
        server_version = str((await client.info("server"))["redis_version"])
        captured = await capture_core_calls(url, manager)
        redis_py = RedisPyLeases(client, config.key_prefix, captured)
        project_impl: Implementation[Lease] = Implementation(
            PROJECT, manager.acquire, Lease.release
        )
        redis_py_impl: Implementation[tuple[str, str]] = Implementation(
            REDIS_PY, redis_py.acquire, redis_py.release
        )

        def local(impl: Implementation[Any], count_left: Callable[[], Awaitable[int]]) -> Runner:
            return lambda coroutines, repeat: timed_run(
                impl, coroutines, repeat, warmup_s, window_s, count_left, stats_client
            )

        async def project_left() -> int:
            left = await manager.get_active_count()
            if left:
                print(f"  {PROJECT} left {left} lease(s) in the pool; stats {manager.stats()}")
            return left

        runners: list[tuple[str, Runner]] = [
            (PROJECT, local(project_impl, project_left)),
            (REDIS_PY, local(redis_py_impl, redis_py.left_in_global_pool)),
            (PEER, lambda level, repeat: peer.run(level, repeat, warmup_s, window_s)),
            (
                PEER_DEFAULT_POOL,
                lambda level, repeat: peer_as_users.run(level, repeat, warmup_s, window_s),
            ),
        ]
        runs: list[RunResult] = []
        failed: set[str] = set()
        for coroutines in sweep.levels:
            for repeat in range(1, sweep.repeats(coroutines) + 1):
                for name, runner in in_turns(runners, repeat):
                    if name in failed:
                        continue
                    try:
                        run = await runner(coroutines, repeat)
                    except RuntimeError as error:
                        # The peer with redis-py's default pool gives up at 256 coroutines
                        # ("Too many connections"): said here, left out from then on.
                        level = scenario_name(coroutines)
                        print(f"  {level:<14} #{repeat} {name}: FAILED, {error}")
                        failed.add(name)
                        continue
                    runs.append(run)
                    print(
                        f"  {run.scenario:<14} #{repeat} {run.implementation:<32}"
                        f" {run.cycles_per_s:>10,.0f} cycles/s"
                        f"  p50 {run.p50_ms:.3f} ms  p99 {run.p99_ms:.3f} ms"
                        f"  redis {run.redis_us_per_cycle or 0:.1f} µs/cycle",
                        flush=True,
                    )
        return runs, server_version, peer.hello
    finally:
        await peer.stop()
        await peer_as_users.stop()
        await manager.aclose()
        await client.aclose()
        await stats_client.aclose()


def summarize(runs: Sequence[RunResult]) -> list[Summary]:
    """Medians per level and implementation, with the cycles/s ratios to redis-py and the peer."""
    medians: dict[tuple[int, str], tuple[int, float, float, float, float | None]] = {}
    for key in dict.fromkeys((r.coroutines, r.implementation) for r in runs):
        mine = [r for r in runs if (r.coroutines, r.implementation) == key]
        redis_us = [r.redis_us_per_cycle for r in mine if r.redis_us_per_cycle is not None]
        medians[key] = (
            len(mine),
            statistics.median(r.cycles_per_s for r in mine),
            statistics.median(r.p50_ms for r in mine),
            statistics.median(r.p99_ms for r in mine),
            statistics.median(redis_us) if redis_us else None,
        )
    return [
        Summary(
            scenario=scenario_name(coroutines),
            coroutines=coroutines,
            implementation=impl,
            runs=count,
            cycles_per_s=rate,
            p50_ms=p50,
            p99_ms=p99,
            ratio_vs_redis_py=rate / medians[(coroutines, REDIS_PY)][1],
            ratio_vs_peer=rate / medians.get((coroutines, PEER_DEFAULT_POOL), (0, math.nan))[1],
            redis_us_per_cycle=redis_us,
        )
        for (coroutines, impl), (count, rate, p50, p99, redis_us) in medians.items()
    ]


def ceiling(url: str) -> dict[str, Any]:
    """redis-benchmark EVALSHA of a trivial script: the server-side limit on script calls."""
    sha = script_sha(url, "return 1")
    top = redis_benchmark(url, CEILING_CLIENTS, CEILING_REQUESTS, ["EVALSHA", sha, "0"])
    return {**top, "cycles_per_s_ceiling": top["requests_per_s"] / 2}


def print_results(summaries: Sequence[Summary], top: dict[str, Any]) -> None:
    rows = [
        [
            s.scenario,
            s.implementation,
            f"{s.runs}",
            f"{s.cycles_per_s:,.0f}",
            f"{s.p50_ms:.3f}",
            f"{s.p99_ms:.3f}",
            f"{s.ratio_vs_redis_py:.2f}x",
            "n/a" if math.isnan(s.ratio_vs_peer) else f"{s.ratio_vs_peer:.2f}x",
            "" if s.redis_us_per_cycle is None else f"{s.redis_us_per_cycle:.1f}",
        ]
        for s in summaries
    ]
    p50 = "" if top["p50_ms"] is None else f"{top['p50_ms']:.3f}"
    rows.append(
        [
            "ceiling",
            f"redis-benchmark -c {CEILING_CLIENTS} (/2)",
            "1",
            f"{top['cycles_per_s_ceiling']:,.0f}",
            p50,
            "",
            "",
            "",
            "",
        ]
    )
    header = ["scenario", "implementation", "runs", "cycles/s", "p50 ms", "p99 ms"]
    print_table([*header, "vs redis-py", "vs peer", "Redis µs/cycle"], rows)
    print(
        "vs redis-py / vs peer = cycles/s over theirs at the same concurrency; medians of the"
        " runs; p50/p99 are of\nacquire alone; Redis µs/cycle = time in script calls per"
        " acquire + release (INFO commandstats)."
        f" ceiling: EVALSHA 'return 1' at {top['requests_per_s']:,.0f} requests/s"
        f" = {top['cycles_per_s_ceiling']:,.0f} cycles/s (2 script calls per cycle)."
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description="Acquire+release cycles/s and acquire latency: project vs. peer vs. redis-py."
    )
    parser.add_argument("--url", required=True, help="Redis URL, e.g. redis://127.0.0.1:6380/0")
    Sweep.add_arguments(parser, DEFAULT_CONCURRENCY, warmup_s=0.5, window_s=3.0)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="JSON results file")
    args = parser.parse_args()
    sweep = Sweep.from_arguments(parser, args)
    if not PEER_PYTHON.exists():
        parser.error(f"{PEER_PYTHON} is missing: run bash benchmarks/setup_bench_env.sh")
    print(f"acquire+release against {args.url}: {sweep.describe()}")
    runs, server_version, peer_versions = asyncio.run(compare(args.url, sweep))
    summaries = summarize(runs)
    print(f"  ceiling: redis-benchmark -c {CEILING_CLIENTS} -n {CEILING_REQUESTS} ...", flush=True)
    top = ceiling(args.url)
    print_results(summaries, top)

    for r in runs:
        if r.failed_releases or r.left_in_global_pool:
            print(
                f"WARNING {r.scenario} #{r.repeat} {r.implementation}: {r.failed_releases}"
                f" releases found no lease, {r.left_in_global_pool} leases left in the global pool"
            )

    peer_versions.pop("kind")
    write_json(
        args.output,
        {
            "machine": {
                **machine_info(),
                "redis_server": server_version,
                "redis_py": redis.__version__,
                "hiredis": hiredis.__version__,
                "redis_py_parser": DefaultParser.__name__,
                "fastapi_stream_lease": fastapi_stream_lease.__version__,
                "fastapi_stream_lease_installed_at": str(
                    Path(fastapi_stream_lease.__file__).parent
                ),
                "peer": peer_versions,
            },
            "settings": {
                "url": without_password(args.url),
                **sweep.settings(),
                "key_prefix": KEY_PREFIX,
                "redis_py_max_connections": REDIS_PY_POOL_SIZE,
            },
            "summary": [asdict(s) for s in summaries],
            "ceiling": top,
            "runs": [asdict(r) for r in runs],
        },
    )
    print(f"raw figures: {args.output}")


if __name__ == "__main__":
    main()
