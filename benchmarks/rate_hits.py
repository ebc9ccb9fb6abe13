"""Rate-limit hits per second and hit latency: this project vs. ``limits``, fastapi-limiter's
engine and a raw redis-py floor, at several concurrencies, against one Redis server in one run.

Every implementation is set up as its README shows, with limits far above what a run can reach
(nothing is refused: this measures the cost of admitting a request, not of refusing one):

* ``fastapi_stream_lease``: ``await manager.hit(user, per_minute, per_day)``, two
  ``RateLimit`` policies (the default ``sliding_window``) decided in one script call, and
  ``await manager.hit(user, per_minute)`` for the one-policy rows; ``fastapi_stream_lease
  leased units``: the same two policies with ``lease_units=True``, hits served in the process
  from units taken ahead of them;
* ``limits`` with its async Redis storage, ``limits.aio.storage.RedisStorage("async+redis://...")``
  (coredis, its default and its ``async-redis`` extra), through ``MovingWindowRateLimiter``,
  ``SlidingWindowCounterRateLimiter`` and ``FixedWindowRateLimiter``: ``await
  strategy.hit(item, namespace, user)``; two policies are two ``hit`` calls in a row (``limits``
  has no multi-limit hit, and the two are not atomic). One more row runs the sliding window
  counter on redis-py (``implementation="redispy"``, given the floor's hiredis client and
  blocking pool of 64 connections: with its own pool, redis-py 8's default of 100 connections
  that raises ``MaxConnectionsError`` when exhausted, it fails at 256 coroutines);
* fastapi-limiter 0.2: its ``RateLimiter`` dependency needs a FastAPI request (it walks
  ``request.app.routes``), so ``rate_http.py`` runs it behind uvicorn; here its engine is
  measured directly, as that dependency calls it: ``await limiter.try_acquire_async(key,
  blocking=False)`` on a pyrate-limiter ``Limiter`` over a ``RedisBucket`` (redis.asyncio, the
  pool of pyrate-limiter's README); two policies are two limiters, as fastapi-limiter's README
  stacks them. A ``Limiter`` over one bucket counts every key in that one bucket, and holds an
  asyncio lock around each acquire, so its calls go one at a time per process;
* the floor: redis-py (hiredis parser, a blocking pool of 64 connections) sending one
  ``EVALSHA`` of a two-command script (``INCRBY`` + ``PEXPIRE`` on a window's first hit) per
  hit: the least a Redis-backed limiter can do in one round trip from Python;
* the ceiling: ``redis-benchmark -c 50`` running that same script on 16 keys: what the server
  serves with next to no client cost.

A run of one implementation at one concurrency: that many coroutines hit back to back, each
cycling through 16 identities (coroutine n's k-th hit is identity (n + k) mod 16), fresh ones
for every run so that no counter carries over; a warm-up, then a window whose hits and hit
latencies are counted. ``INFO commandstats`` and ``INFO cpu`` around each run give the Redis
commands per hit (those run inside scripts included) and redis-server's CPU per hit. At 1 and
64 coroutines each implementation runs ``--repeats`` times (3), elsewhere ``--sweep-repeats``
times (1); the implementations take turns going first. The table gives the medians and the
ratios to the same-policy-count ``limits`` rows (moving window and sliding window counter, the
defaults of ``limits``' README) and to the floor; ``plot.py`` draws the sweep.

Run it from the repository root with ``bash benchmarks/run.sh``, or against a Redis of your own
(keys under ``{ratebench}:``, ``LIMITS:``, ``ratebench:`` and ``pyrate-ratebench:*``; needs
``redis-benchmark`` on PATH)::

    benchmarks/.venv/bin/python benchmarks/rate_hits.py --url redis://127.0.0.1:6380/0

The table is printed; the raw figures go to ``benchmarks/results/rate_hits.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aioredis
from limits import RateLimitItem, RateLimitItemPerDay, RateLimitItemPerMinute
from limits.aio.storage import RedisStorage
from limits.aio.strategies import (
    FixedWindowRateLimiter,
    MovingWindowRateLimiter,
    RateLimiter,
    SlidingWindowCounterRateLimiter,
)
from pyrate_limiter import Duration, Limiter, Rate, RedisBucket

from fastapi_stream_lease import LeaseConfig, RateLimit, RateLimited, StreamLeaseManager

from common import (
    PROJECT,
    REDIS_PY_POOL_SIZE,
    RESULTS_DIR,
    Sweep,
    in_turns,
    machine_info,
    percentile_ms,
    print_table,
    redis_benchmark,
    redis_counters,
    redis_py_client,
    scenario_name,
    write_json,
)
from support.urls import without_password

DEFAULT_OUTPUT = RESULTS_DIR / "rate_hits.json"
DEFAULT_CONCURRENCY = (1, 16, 64, 256)
IDENTITIES = 16
KEY_PREFIX = "ratebench"
# Far above what any run reaches: a minute of hits at 100,000/s, a day at a billion.
PER_MINUTE = 10**8
PER_DAY = 10**11
CEILING_CLIENTS = 50
CEILING_REQUESTS = 200_000

# The floor's script: a fixed-window counter in one round trip.
FLOOR_SCRIPT = """
local n = redis.call('INCRBY', KEYS[1], ARGV[1])
if n == tonumber(ARGV[1]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return n
"""

LEASED = f"{PROJECT} leased units"
LIMITS = f"limits {version('limits')}"
PYRATE = f"fastapi-limiter {version('fastapi-limiter')} / pyrate {version('pyrate-limiter')}"
FLOOR = f"redis-py {redis.__version__} EVALSHA floor"

# The rows the ratios are taken against, for each number of policies.
BASELINES = {
    2: (f"{LIMITS} moving window x2", f"{LIMITS} sliding counter x2"),
    1: (f"{LIMITS} moving window", f"{LIMITS} sliding counter"),
}


@dataclass(frozen=True)
class Hitter:
    """One way to count a request: ``await hit(identity)`` returns False when refused."""

    name: str
    policies: int
    detail: str
    hit: Callable[[str], Awaitable[bool]]


@dataclass
class Tally:
    hits: int = 0  # all of them, warm-up included (for the per-hit Redis figures)
    refused: int = 0
    in_window: int = 0
    latencies_s: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class Run:
    implementation: str
    policies: int
    coroutines: int
    repeat: int
    window_s: float
    hits: int
    hits_per_s: float
    p50_ms: float
    p99_ms: float
    refused: int
    redis_commands_per_hit: float
    script_calls_per_hit: float
    redis_cpu_us_per_hit: float


# ---------------------------------------------------------------------------------------------
# The implementations


def project_hitters(manager: StreamLeaseManager) -> list[Hitter]:
    per_minute = RateLimit("per_minute", PER_MINUTE, per=60)
    per_day = RateLimit("per_day", PER_DAY, per=86_400)
    leased = [
        RateLimit(p.name, p.limit, per=p.per, lease_units=True) for p in (per_minute, per_day)
    ]

    async def two(identity: str) -> bool:
        try:
            await manager.hit(identity, per_minute, per_day)
        except RateLimited:
            return False
        return True

    async def two_leased(identity: str) -> bool:
        try:
            await manager.hit(identity, *leased)
        except RateLimited:
            return False
        return True

    async def one(identity: str) -> bool:
        try:
            await manager.hit(identity, per_minute)
        except RateLimited:
            return False
        return True

    return [
        Hitter(PROJECT, 2, "manager.hit(user, per_minute, per_day): one script call", two),
        Hitter(
            LEASED,
            2,
            "the same two policies with lease_units=True: hits served from units held ahead",
            two_leased,
        ),
        Hitter(PROJECT, 1, "manager.hit(user, per_minute)", one),
    ]


def limits_hitters(storage: RedisStorage, redispy: RedisStorage) -> list[Hitter]:
    per_minute: RateLimitItem = RateLimitItemPerMinute(PER_MINUTE)
    per_day: RateLimitItem = RateLimitItemPerDay(PER_DAY)

    def one(strategy: RateLimiter, namespace: str) -> Callable[[str], Awaitable[bool]]:
        async def hit(identity: str) -> bool:
            return await strategy.hit(per_minute, namespace, identity)

        return hit

    def two(strategy: RateLimiter, namespace: str) -> Callable[[str], Awaitable[bool]]:
        async def hit(identity: str) -> bool:
            return await strategy.hit(per_minute, namespace, identity) and await strategy.hit(
                per_day, namespace, identity
            )

        return hit

    moving = MovingWindowRateLimiter(storage)
    sliding = SlidingWindowCounterRateLimiter(storage)
    fixed = FixedWindowRateLimiter(storage)
    sliding_redispy = SlidingWindowCounterRateLimiter(redispy)
    two_hits = "two strategy.hit() in a row, coredis"
    return [
        Hitter(f"{LIMITS} moving window x2", 2, two_hits, two(moving, "mw2")),
        Hitter(f"{LIMITS} sliding counter x2", 2, two_hits, two(sliding, "swc2")),
        Hitter(f"{LIMITS} moving window", 1, "strategy.hit(), coredis", one(moving, "mw")),
        Hitter(f"{LIMITS} sliding counter", 1, "strategy.hit(), coredis", one(sliding, "swc")),
        Hitter(f"{LIMITS} fixed window", 1, "strategy.hit(), coredis", one(fixed, "fw")),
        Hitter(
            f"{LIMITS} sliding counter, redis-py",
            1,
            'implementation="redispy"',
            one(sliding_redispy, "swcpy"),
        ),
    ]


async def pyrate_hitters(url: str, stack: AsyncExitStack) -> list[Hitter]:
    # As pyrate-limiter's README builds a RedisBucket for an asyncio client.
    pool = aioredis.ConnectionPool.from_url(url)
    client = aioredis.Redis(connection_pool=pool)
    stack.push_async_callback(client.aclose)

    async def limiter(key: str, rate: Rate) -> Limiter:
        bucket = await RedisBucket.init([rate], client, f"pyrate-{KEY_PREFIX}:{key}")
        made = Limiter(bucket)
        stack.callback(made.close)
        return made

    # Its buckets never expire: deleted at the end (runs before the client is closed).
    keys = [f"pyrate-{KEY_PREFIX}:{key}" for key in ("minute", "minute2", "day2")]
    stack.push_async_callback(client.delete, *keys)
    minute = await limiter("minute", Rate(PER_MINUTE, Duration.MINUTE))
    minute2 = await limiter("minute2", Rate(PER_MINUTE, Duration.MINUTE))
    day2 = await limiter("day2", Rate(PER_DAY, Duration.DAY))

    async def one(identity: str) -> bool:
        return await minute.try_acquire_async(identity, blocking=False)

    async def two(identity: str) -> bool:
        return await minute2.try_acquire_async(
            identity, blocking=False
        ) and await day2.try_acquire_async(identity, blocking=False)

    return [
        Hitter(f"{PYRATE} x2", 2, "2 pyrate-limiter Limiters (RedisBucket) in a row", two),
        Hitter(PYRATE, 1, "Limiter(RedisBucket).try_acquire_async(key)", one),
    ]


def floor_hitter(client: aioredis.Redis, sha: str) -> Hitter:
    async def hit(identity: str) -> bool:
        count = await client.evalsha(sha, 1, f"{KEY_PREFIX}:floor:{identity}", 1, 60_000)
        return int(count) <= PER_MINUTE

    return Hitter(FLOOR, 1, "EVALSHA INCRBY + PEXPIRE, hiredis", hit)


# ---------------------------------------------------------------------------------------------
# The timed runs


async def hit_until(
    hitter: Hitter, first: int, tag: str, window_start: float, window_end: float, tally: Tally
) -> None:
    k = first
    while time.perf_counter() < window_end:
        started = time.perf_counter()
        admitted = await hitter.hit(f"{tag}-{k % IDENTITIES}")
        finished = time.perf_counter()
        k += 1
        tally.hits += 1
        if not admitted:
            tally.refused += 1
        if window_start <= finished <= window_end:
            tally.in_window += 1
            tally.latencies_s.append(finished - started)


async def timed_run(
    hitter: Hitter,
    coroutines: int,
    repeat: int,
    tag: str,
    warmup_s: float,
    window_s: float,
    counters: aioredis.Redis,
) -> Run:
    before = await redis_counters(counters)
    tally = Tally()
    window_start = time.perf_counter() + warmup_s
    window_end = window_start + window_s
    workers = (
        hit_until(hitter, n, tag, window_start, window_end, tally) for n in range(coroutines)
    )
    await asyncio.wait_for(asyncio.gather(*workers), warmup_s + window_s + 30.0)
    after = await redis_counters(counters)
    latencies = sorted(tally.latencies_s)
    if not latencies:
        raise RuntimeError(f"{hitter.name}: no hit completed within the {window_s} s window")
    return Run(
        implementation=hitter.name,
        policies=hitter.policies,
        coroutines=coroutines,
        repeat=repeat,
        window_s=window_s,
        hits=tally.in_window,
        hits_per_s=tally.in_window / window_s,
        p50_ms=percentile_ms(latencies, 0.50),
        p99_ms=percentile_ms(latencies, 0.99),
        refused=tally.refused,
        redis_commands_per_hit=(after[0] - before[0]) / tally.hits,
        script_calls_per_hit=(after[1] - before[1]) / tally.hits,
        redis_cpu_us_per_hit=1e6 * (after[2] - before[2]) / tally.hits,
    )


async def compare(url: str, sweep: Sweep) -> tuple[list[Run], list[Hitter], str, str]:
    """Every level of the sweep, the implementations taking turns going first.

    Returns the runs, the implementations, the server's version and the floor script's SHA."""
    warmup_s, window_s = sweep.warmup_s, sweep.window_s
    async with AsyncExitStack() as stack:
        config = LeaseConfig(
            max_per_user=0,
            max_global=0,
            key_prefix=KEY_PREFIX,
            identity_secret=b"rate_hits.py benchmark secret",
        )
        manager = StreamLeaseManager(url=url, config=config)
        stack.push_async_callback(manager.aclose)
        counters = aioredis.Redis.from_url(url, socket_timeout=10.0)
        stack.push_async_callback(counters.aclose)
        floor_client = redis_py_client(url)
        stack.push_async_callback(floor_client.aclose)
        storage = RedisStorage("async+" + url)
        # The floor's kind of pool: on redis-py 8 limits' own pool (redis-py's default, 100
        # connections, not blocking) raises MaxConnectionsError beyond 100 concurrent hits.
        redispy_pool = aioredis.BlockingConnectionPool.from_url(
            url, max_connections=REDIS_PY_POOL_SIZE, timeout=10.0, socket_timeout=5.0
        )
        stack.push_async_callback(redispy_pool.aclose)
        redispy_storage = RedisStorage(
            "async+" + url, implementation="redispy", connection_pool=redispy_pool
        )
        server_version = str((await counters.info("server"))["redis_version"])
        sha = str(await floor_client.script_load(FLOOR_SCRIPT))
        hitters = [
            *project_hitters(manager),
            *limits_hitters(storage, redispy_storage),
            *(await pyrate_hitters(url, stack)),
            floor_hitter(floor_client, sha),
        ]
        for hitter in hitters:  # connections made and scripts loaded before any timing
            for n in range(IDENTITIES):
                if not await hitter.hit(f"warm-{n}"):
                    raise RuntimeError(f"{hitter.name} refused a first hit")
        runs: list[Run] = []
        serial = 0
        for coroutines in sweep.levels:
            for repeat in range(1, sweep.repeats(coroutines) + 1):
                for hitter in in_turns(hitters, repeat, step=3):
                    serial += 1
                    run = await timed_run(
                        hitter, coroutines, repeat, f"r{serial}", warmup_s, window_s, counters
                    )
                    runs.append(run)
                    print(
                        f"  {scenario_name(coroutines):<14} #{repeat} {label(hitter):<48}"
                        f" {run.hits_per_s:>8,.0f} hits/s  p50 {run.p50_ms:.3f} ms"
                        f"  p99 {run.p99_ms:.3f} ms",
                        flush=True,
                    )
        return runs, hitters, server_version, sha


def label(hitter: Hitter | Summary) -> str:
    return f"{hitter.name} ({hitter.policies})"


# ---------------------------------------------------------------------------------------------
# Reports


@dataclass(frozen=True)
class Summary:
    """Medians over the repeats of one implementation at one concurrency."""

    coroutines: int
    name: str
    policies: int
    runs: int
    hits_per_s: float
    p50_ms: float
    p99_ms: float
    refused: int
    redis_commands_per_hit: float
    redis_cpu_us_per_hit: float
    vs_limits_moving: float
    vs_limits_sliding: float
    vs_floor: float


MEDIANS = ("hits_per_s", "p50_ms", "p99_ms", "redis_commands_per_hit", "redis_cpu_us_per_hit")


def summarize(runs: Sequence[Run]) -> list[Summary]:
    """Medians per level and implementation, with the ratios to ``limits`` and the floor."""
    median: dict[tuple[int, str, int], dict[str, float]] = {}
    for key in dict.fromkeys((r.coroutines, r.implementation, r.policies) for r in runs):
        mine = [r for r in runs if (r.coroutines, r.implementation, r.policies) == key]
        median[key] = {name: statistics.median(getattr(r, name) for r in mine) for name in MEDIANS}
        median[key]["runs"] = len(mine)
        median[key]["refused"] = sum(r.refused for r in mine)

    def rate(coroutines: int, name: str, policies: int) -> float:
        return median[(coroutines, name, policies)]["hits_per_s"]

    summaries = []
    for (coroutines, name, policies), m in median.items():
        moving, sliding = BASELINES[policies]
        summaries.append(
            Summary(
                coroutines=coroutines,
                name=name,
                policies=policies,
                runs=int(m["runs"]),
                hits_per_s=m["hits_per_s"],
                p50_ms=m["p50_ms"],
                p99_ms=m["p99_ms"],
                refused=int(m["refused"]),
                redis_commands_per_hit=m["redis_commands_per_hit"],
                redis_cpu_us_per_hit=m["redis_cpu_us_per_hit"],
                vs_limits_moving=m["hits_per_s"] / rate(coroutines, moving, policies),
                vs_limits_sliding=m["hits_per_s"] / rate(coroutines, sliding, policies),
                vs_floor=m["hits_per_s"] / rate(coroutines, FLOOR, 1),
            )
        )
    summaries.sort(key=lambda s: (s.coroutines, -s.policies))
    return summaries


def ceiling(url: str, sha: str) -> dict[str, Any]:
    """redis-benchmark running the floor's script on 16 keys: the server's own limit."""
    key = f"{KEY_PREFIX}:ceiling:__rand_int__"
    command = ["-r", str(IDENTITIES), "EVALSHA", sha, "1", key, "1", "60000"]
    top = redis_benchmark(url, CEILING_CLIENTS, CEILING_REQUESTS, command)
    return {**top, "hits_per_s": top["requests_per_s"]}


def print_results(summaries: Sequence[Summary], top: dict[str, Any]) -> None:
    rows = [
        [
            scenario_name(s.coroutines),
            s.name,
            f"{s.policies}",
            f"{s.runs}",
            f"{s.hits_per_s:,.0f}",
            f"{s.p50_ms:.3f}",
            f"{s.p99_ms:.3f}",
            f"{s.redis_commands_per_hit:.1f}",
            f"{s.redis_cpu_us_per_hit:.0f}",
            f"{s.vs_limits_moving:.2f}x",
            f"{s.vs_limits_sliding:.2f}x",
            f"{s.vs_floor:.2f}x",
        ]
        for s in summaries
    ]
    p50 = "" if top["p50_ms"] is None else f"{top['p50_ms']:.3f}"
    rows.append(
        [
            "ceiling",
            f"redis-benchmark -c {CEILING_CLIENTS}, floor script",
            "1",
            "1",
            f"{top['hits_per_s']:,.0f}",
            p50,
            "",
            "",
            "",
            "",
            "",
            "",
        ]
    )
    header = ["scenario", "implementation", "policies", "runs", "hits/s", "p50 ms", "p99 ms"]
    print_table(
        [*header, "cmds/hit", "redis us/hit", "vs moving", "vs sliding", "vs floor"], rows, left=2
    )
    refused = sum(s.refused for s in summaries)
    print(
        "medians of the runs; vs moving / vs sliding = hits/s over limits' moving window /"
        " sliding window counter\n(coredis, its default) with as many policies, at the same"
        " concurrency; vs floor = over one EVALSHA of\nINCRBY + PEXPIRE from redis-py. cmds/hit ="
        " Redis commands per hit, those inside scripts included;\nredis us/hit = redis-server CPU"
        f" per hit. Hits refused in all runs: {refused}."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="Rate-limit hits/s: project vs. limits & co.")
    parser.add_argument("--url", required=True, help="Redis URL, e.g. redis://127.0.0.1:6380/0")
    Sweep.add_arguments(parser, DEFAULT_CONCURRENCY, warmup_s=0.25, window_s=1.0)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="JSON results file")
    args = parser.parse_args()
    sweep = Sweep.from_arguments(parser, args)
    print(f"rate-limit hits against {args.url}: {sweep.describe()}; {IDENTITIES} identities")
    runs, hitters, server_version, sha = asyncio.run(compare(args.url, sweep))
    summaries = summarize(runs)
    print(f"  ceiling: redis-benchmark -c {CEILING_CLIENTS} -n {CEILING_REQUESTS} ...", flush=True)
    top = ceiling(args.url, sha)
    print_results(summaries, top)
    write_json(
        args.output,
        {
            "machine": {
                **machine_info(),
                "redis_server": server_version,
                **{
                    package: version(package)
                    for package in (
                        "fastapi-stream-lease",
                        "limits",
                        "coredis",
                        "pyrate-limiter",
                        "fastapi-limiter",
                        "redis",
                        "hiredis",
                    )
                },
            },
            "settings": {
                "url": without_password(args.url),
                **sweep.settings(),
                "identities": IDENTITIES,
                "per_minute_limit": PER_MINUTE,
                "per_day_limit": PER_DAY,
                "redis_py_max_connections": REDIS_PY_POOL_SIZE,
                "floor_script": FLOOR_SCRIPT.strip(),
            },
            "implementations": [
                {"name": h.name, "policies": h.policies, "how": h.detail} for h in hitters
            ],
            "summary": [asdict(s) for s in summaries],
            "ceiling": top,
            "runs": [asdict(r) for r in runs],
        },
    )
    print(f"raw figures: {args.output}")


if __name__ == "__main__":
    main()
