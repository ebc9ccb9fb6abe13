"""Token budgets: what counting a stream's tokens costs Redis, and how far a budget
overshoots against the gateways' charge-after-the-end counter, against one Redis server.

**Redis calls.** 1,000 concurrent streams in one process, one user each, with two token budgets
(a minute and a day, far above what a run uses: nothing is refused or cut), each reserving the
default (``reserve=TOP_UP_INCREMENT``, 256 tokens) so that the top-ups carry the stream. Every
stream counts per chunk, ``lease.wrap(chunks, tokens=lambda _: n)``, 150 chunks at 50 chunks/s
(5 chunks every 0.1 s, the streams' ticks spread over the tick; an upstream that goes on at its
pace while ``wrap`` waits for a top-up, so a late stream catches up in a burst): 4 tokens per
chunk, then 10x the tokens (40 per chunk). The streams are acquired together, start together
once all are held, and end together (each waits after its last chunk for the others), which
splits a run into three phases read from ``INFO commandstats`` (script calls: ``EVALSHA`` and
``EVAL``; commands: all, those run inside scripts included, the ``INFO`` readings left out):

* admission: the acquires, whose script reserves the tokens with the slot;
* streaming: the top-ups, all due streams of the process in one script call per round (500 per
  call at most), and the keep-alive (every ``lease_seconds / 3`` = 10 s): the Redis calls per
  second per process while 1,000 streams run, the figure that says whether counting scales;
* end: the releases and the settlements (one settle call per stream; one more, a refund, for
  each stream released while a top-up of its was in flight).

It reports the script calls and commands per stream and per 1,000,000 tokens streamed, the
streaming phase's calls per second, the process's and redis-server's CPU while streaming, and
how long the 150 chunks took (3 s at the upstream's pace; more when ``wrap`` waited for top-ups).
At the end every user's minute budget must show exactly the tokens its stream counted. Medians
of ``--repeats`` runs (3), the two token rates taking turns.

**Overshoot.** 64 concurrent clients of one user against a 10,000-token minute budget, each
opening streams of 1,500 tokens (chunks of 5 tokens every 10 ms, 3 s) one after the other, and
retrying every 50 ms when refused, until a 4 s deadline (a stream started before it runs to its
end):

* the gateways' way, the baseline: redis-py ``GET`` of a counter before each stream, refused
  when it is at or above the limit, and ``INCRBY`` of the stream's tokens when it has finished;
* this project: ``manager.acquire(user, budgets=[budget], reserve=..., on_budget=...)`` and
  ``lease.wrap(chunks, tokens=...)``, reserving 256 tokens (the default; top-ups do the rest) or
  the whole 1,500, under ``on_budget="cut"`` (the default) and ``"finish"``.

It reports the tokens the streams actually streamed in the window against the budget, the
overshoot, what Redis charged, and, under ``"cut"``, the bound the README states: the budget
plus one top-up increment (256 tokens) per concurrent stream. ``"finish"`` has no such bound by
design: a stream admitted finishes, and its overage is charged to the window.

**Nested levels.** ``--admissions`` (2,000) admissions per run, 64 at a time, each reserving
from the user's budget and 0, 2 or 4 more budget levels paired with identities every user
shares (``budgets=[per_user, (team_budget, team_id), ...]``, 1, 3 and 5 levels; 1 is the
single-budget figure), all held until every admission is in, then released: the Redis
commands, script calls, wall time and Redis CPU per admission, the acquires' median latency,
and the commands of the releases and settlements per stream.

**Answer sizes.** ``--admissions`` streams per run that each stream a 300-token answer within
a 1,000-token reservation and end on their own, once without ``model=`` and once with it (its
settlement counts the answer in the model's histogram of answer sizes, two commands inside the
same script call): the commands and script calls of the releases and settlements per stream.

Run it from the repository root with ``bash benchmarks/run.sh``, or alone against a Redis of
your own (keys under ``{budgetbench-*}`` and ``budgetbench-*``, deleted at the end)::

    benchmarks/.venv/bin/python benchmarks/token_budgets.py --url redis://127.0.0.1:6380/0

The tables are printed; the raw figures go to ``benchmarks/results/token_budgets.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aioredis

from fastapi_stream_lease import (
    TOP_UP_INCREMENT,
    BudgetExhausted,
    LeaseConfig,
    RateLimit,
    RateLimited,
    StreamLeaseManager,
)
from fastapi_stream_lease.manager import OnBudget

from common import (
    PROJECT,
    RESULTS_DIR,
    cpu_seconds,
    delete_keys,
    machine_info,
    print_table,
    redis_counters,
    redis_py_client,
    write_json,
)
from support.urls import without_password

DEFAULT_OUTPUT = RESULTS_DIR / "token_budgets.json"
SECRET = b"token_budgets.py benchmark secret"
CHUNK_TEXT = "tok"

# Redis calls: 1,000 streams of 150 chunks at 50 chunks/s, 4 tokens per chunk and 10x that.
STREAMS = 1_000
CHUNKS = 150
CHUNKS_PER_TICK = 5
TICK_S = 0.1
TOKENS_PER_CHUNK = (4, 40)
# Far above what a run uses: no stream is refused or cut.
PER_MINUTE = RateLimit("tokens_per_minute", 10**9, per=60, unit="tokens")
PER_DAY = RateLimit("tokens_per_day", 10**11, per=86_400, unit="tokens")
PHASE_LIMIT_S = 60.0
# Nested levels: admissions per run with 1 (the single budget), 3 and 5 budget levels.
LEVELS = (1, 3, 5)
LEVEL_ADMISSIONS = 2_000
LEVEL_CONCURRENCY = 64

# Overshoot: 64 clients of one user, 10,000 tokens a minute, streams of 1,500 tokens.
CLIENTS = 64
BUDGET_TOKENS = 10_000
STREAM_TOKENS = 1_500
OVERSHOOT_CHUNK = 5
OVERSHOOT_TICK_S = 0.01
DEADLINE_S = 4.0
RETRY_S = 0.05
BASELINE = f"charge after the end (redis-py {redis.__version__} GET + INCRBY)"
# (reserve, on_budget) of this project's runs.
OURS: tuple[tuple[int, OnBudget], ...] = (
    (TOP_UP_INCREMENT, "cut"),
    (STREAM_TOKENS, "cut"),
    (TOP_UP_INCREMENT, "finish"),
    (STREAM_TOKENS, "finish"),
)


async def paced(chunks: int, per_tick: int, tick_s: float, started: float) -> AsyncIterator[str]:
    """``chunks`` chunks, ``per_tick`` every ``tick_s`` from ``started``, on that schedule
    whatever the consumer does (an upstream that goes on producing: a late consumer catches up
    in a burst)."""
    sent = 0
    ticks = 0
    while sent < chunks:
        ticks += 1
        delay = started + ticks * tick_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        for _ in range(min(per_tick, chunks - sent)):
            sent += 1
            yield CHUNK_TEXT


# ---------------------------------------------------------------------------------------------
# Redis calls per stream and per 1,000,000 tokens


@dataclass(frozen=True)
class Phase:
    """One phase of a run: ``INFO`` deltas and the process's CPU."""

    seconds: float
    script_calls: int
    commands: int
    redis_cpu_s: float
    process_cpu_s: float


@dataclass(frozen=True)
class CostRun:
    tokens_per_chunk: int
    repeat: int
    streams: int
    tokens: int
    admission: Phase
    streaming: Phase
    end: Phase
    stream_s_p50: float
    stream_s_max: float
    charged_as_counted: int
    lost: int


@dataclass
class Reading:
    at: float
    commands: int
    script_calls: int
    redis_cpu_s: float
    process_cpu_s: float

    @classmethod
    async def take(cls, client: aioredis.Redis) -> Reading:
        commands, script_calls, redis_cpu_s = await redis_counters(client)
        return cls(
            time.perf_counter(), commands, script_calls, redis_cpu_s, cpu_seconds(os.getpid())
        )

    def until(self, later: Reading) -> Phase:
        return Phase(
            seconds=later.at - self.at,
            script_calls=later.script_calls - self.script_calls,
            commands=later.commands - self.commands,
            redis_cpu_s=later.redis_cpu_s - self.redis_cpu_s,
            process_cpu_s=later.process_cpu_s - self.process_cpu_s,
        )


async def settled(manager: StreamLeaseManager, client: aioredis.Redis) -> Reading:
    """The reading once every stream is settled and Redis has gone quiet (the settlements run in
    the background after the releases): two readings 0.1 s apart with no script call between."""
    last = await Reading.take(client)
    for _ in range(int(PHASE_LIMIT_S / 0.1)):
        await asyncio.sleep(0.1)
        reading = await Reading.take(client)
        stats = manager.stats()
        if reading.script_calls == last.script_calls and not (
            stats["budget_streams"] or stats["unsettled"]
        ):
            return last
        last = reading
    raise RuntimeError("the settlements did not end within the time limit")


async def cost_run(
    manager: StreamLeaseManager,
    client: aioredis.Redis,
    tokens_per_chunk: int,
    repeat: int,
    streams: int,
) -> CostRun:
    """``streams`` streams acquired together, streamed together, ended together."""
    tag = uuid.uuid4().hex[:8]
    users = [f"cost-{tag}-{n}" for n in range(streams)]
    all_held, go, all_streamed, finish = (asyncio.Event() for _ in range(4))
    tally = {"held": 0, "streamed": 0}
    durations: list[float] = []
    go_at: list[float] = []

    def count(what: str, event: asyncio.Event) -> None:
        tally[what] += 1
        if tally[what] == streams:
            event.set()

    async def chunks(started: float) -> AsyncIterator[str]:
        async for chunk in paced(CHUNKS, CHUNKS_PER_TICK, TICK_S, started):
            yield chunk
        await finish.wait()

    async def one(n: int) -> int:
        lease = await manager.acquire(users[n], budgets=[PER_MINUTE, PER_DAY])
        count("held", all_held)
        await go.wait()
        started = go_at[0] + TICK_S * (n % 100) / 100  # ticks spread over the tick
        received = 0
        async for _ in lease.wrap(chunks(started), tokens=lambda _: tokens_per_chunk):
            received += 1
            if received == CHUNKS:
                durations.append(time.perf_counter() - started)
                count("streamed", all_streamed)
        return received * tokens_per_chunk

    first = await Reading.take(client)
    tasks = [asyncio.create_task(one(n)) for n in range(streams)]
    try:
        await asyncio.wait_for(all_held.wait(), PHASE_LIMIT_S)
        held = await Reading.take(client)
        go_at.append(time.perf_counter())
        go.set()
        await asyncio.wait_for(all_streamed.wait(), PHASE_LIMIT_S)
        streamed = await Reading.take(client)
        finish.set()
        counted = await asyncio.wait_for(asyncio.gather(*tasks), PHASE_LIMIT_S)
    finally:
        finish.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    last = await settled(manager, client)
    used = await asyncio.gather(*(manager.usage(user, PER_MINUTE) for user in users))
    charged_as_counted = sum(
        u[PER_MINUTE.name].used == tokens for u, tokens in zip(used, counted, strict=True)
    )
    ordered = sorted(durations)
    return CostRun(
        tokens_per_chunk=tokens_per_chunk,
        repeat=repeat,
        streams=streams,
        tokens=sum(counted),
        admission=first.until(held),
        streaming=held.until(streamed),
        end=streamed.until(last),
        stream_s_p50=statistics.median(ordered),
        stream_s_max=ordered[-1],
        charged_as_counted=charged_as_counted,
        lost=int(manager.stats()["lost"]),
    )


@dataclass(frozen=True)
class CostSummary:
    """Medians over the repeats at one token rate."""

    tokens_per_chunk: int
    runs: int
    streams: int
    tokens_per_stream: float
    stream_s_p50: float
    stream_s_max: float
    tokens_per_s_per_stream: float
    script_calls_per_stream: float
    commands_per_stream: float
    script_calls_per_million_tokens: float
    commands_per_million_tokens: float
    admission_script_calls: float
    streaming_s: float
    streaming_script_calls: float
    streaming_script_calls_per_s: float
    streaming_commands_per_s: float
    streaming_process_cpu_pct: float
    streaming_redis_cpu_pct: float
    end_script_calls: float
    end_script_calls_max: int
    charged_as_counted: int
    lost: int


def summarize_costs(runs: Sequence[CostRun]) -> list[CostSummary]:
    summaries = []
    for tokens_per_chunk in dict.fromkeys(r.tokens_per_chunk for r in runs):
        mine = [r for r in runs if r.tokens_per_chunk == tokens_per_chunk]

        def median(figure: Any, of: Sequence[CostRun] = mine) -> float:
            return float(statistics.median(figure(r) for r in of))

        def script_calls(r: CostRun) -> int:
            return r.admission.script_calls + r.streaming.script_calls + r.end.script_calls

        def commands(r: CostRun) -> int:
            return r.admission.commands + r.streaming.commands + r.end.commands

        summaries.append(
            CostSummary(
                tokens_per_chunk=tokens_per_chunk,
                runs=len(mine),
                streams=mine[0].streams,
                tokens_per_stream=median(lambda r: r.tokens / r.streams),
                stream_s_p50=median(lambda r: r.stream_s_p50),
                stream_s_max=median(lambda r: r.stream_s_max),
                tokens_per_s_per_stream=median(lambda r: r.tokens / r.streams / r.stream_s_p50),
                script_calls_per_stream=median(lambda r: script_calls(r) / r.streams),
                commands_per_stream=median(lambda r: commands(r) / r.streams),
                script_calls_per_million_tokens=median(lambda r: 1e6 * script_calls(r) / r.tokens),
                commands_per_million_tokens=median(lambda r: 1e6 * commands(r) / r.tokens),
                admission_script_calls=median(lambda r: r.admission.script_calls),
                streaming_s=median(lambda r: r.streaming.seconds),
                streaming_script_calls=median(lambda r: r.streaming.script_calls),
                streaming_script_calls_per_s=median(
                    lambda r: r.streaming.script_calls / r.streaming.seconds
                ),
                streaming_commands_per_s=median(
                    lambda r: r.streaming.commands / r.streaming.seconds
                ),
                streaming_process_cpu_pct=median(
                    lambda r: 100 * r.streaming.process_cpu_s / r.streaming.seconds
                ),
                streaming_redis_cpu_pct=median(
                    lambda r: 100 * r.streaming.redis_cpu_s / r.streaming.seconds
                ),
                end_script_calls=median(lambda r: r.end.script_calls),
                end_script_calls_max=max(r.end.script_calls for r in mine),
                charged_as_counted=min(r.charged_as_counted for r in mine),
                lost=sum(r.lost for r in mine),
            )
        )
    return summaries


async def quiet(client: aioredis.Redis) -> Reading:
    """The reading once Redis has gone quiet: two readings 0.3 s apart with no script call
    between."""
    last = await Reading.take(client)
    for _ in range(int(PHASE_LIMIT_S / 0.3)):
        await asyncio.sleep(0.3)
        reading = await Reading.take(client)
        if reading.script_calls == last.script_calls:
            return last
        last = reading
    raise RuntimeError("Redis did not go quiet within the time limit")


def uncapped_manager(url: str, key_prefix: str) -> StreamLeaseManager:
    """A manager whose streams no slot cap refuses: only the budgets count."""
    config = LeaseConfig(
        max_per_user=0, max_global=0, key_prefix=key_prefix, identity_secret=SECRET
    )
    return StreamLeaseManager(url=url, config=config)


async def measure_costs(
    url: str, client: aioredis.Redis, key_prefix: str, repeats: int, streams: int
) -> list[CostRun]:
    manager = uncapped_manager(url, key_prefix)
    try:
        # Connected, every script loaded (acquire, top-up, settle, release) before any reading:
        # one stream past its reservation, so that it waits for a top-up.
        lease = await manager.acquire("warm-up", budgets=[PER_MINUTE, PER_DAY], reserve=1)
        async for _ in lease.wrap(paced(3, 1, 0.0, 0.0), tokens=lambda _: TOP_UP_INCREMENT):
            pass
        await settled(manager, client)
        runs = []
        for repeat in range(1, repeats + 1):
            order = TOKENS_PER_CHUNK if repeat % 2 else TOKENS_PER_CHUNK[::-1]
            for tokens_per_chunk in order:
                run = await cost_run(manager, client, tokens_per_chunk, repeat, streams)
                runs.append(run)
                print(
                    f"  {run.streams:,} streams x {CHUNKS} chunks of {tokens_per_chunk} tokens"
                    f" #{repeat}: {run.streaming.script_calls} script calls in"
                    f" {run.streaming.seconds:.2f} s of streaming"
                    f" ({run.streaming.script_calls / run.streaming.seconds:.1f}/s),"
                    f" {run.admission.script_calls} to admit, {run.end.script_calls} to end;"
                    f" streams took {run.stream_s_p50:.2f} s (p50)",
                    flush=True,
                )
        return runs
    finally:
        await manager.aclose()


def print_costs(summaries: Sequence[CostSummary]) -> None:
    rows = [
        [
            f"{s.tokens_per_chunk} tokens/chunk",
            f"{s.streams:,} x {s.tokens_per_stream:,.0f}",
            f"{s.runs}",
            f"{s.stream_s_p50:.2f} / {s.stream_s_max:.2f}",
            f"{s.tokens_per_s_per_stream:,.0f}",
            f"{s.script_calls_per_stream:.3f}",
            f"{s.commands_per_stream:.1f}",
            f"{s.script_calls_per_million_tokens:,.0f}",
            f"{s.commands_per_million_tokens:,.0f}",
            f"{s.streaming_script_calls_per_s:.1f}",
            f"{s.streaming_commands_per_s:,.0f}",
            f"{s.streaming_process_cpu_pct:.0f} %",
            f"{s.streaming_redis_cpu_pct:.1f} %",
        ]
        for s in summaries
    ]
    header = ["tokens", "streams x tokens", "runs", "stream s p50/max", "tok/s/stream"]
    print_table(
        [
            *header,
            "calls/stream",
            "cmds/stream",
            "calls/1M tok",
            "cmds/1M tok",
            "calls/s streaming",
            "cmds/s streaming",
            "process CPU",
            "redis CPU",
        ],
        rows,
        left=2,
    )
    for s in summaries:
        print(
            f"{s.tokens_per_chunk} tokens/chunk: {s.admission_script_calls:,.0f} script calls to"
            f" admit, {s.streaming_script_calls:,.0f} in {s.streaming_s:.2f} s of streaming,"
            f" {s.end_script_calls:,.0f} to release and settle (at most {s.end_script_calls_max:,}"
            " in a run); every user charged exactly what"
            f" its stream counted: {s.charged_as_counted:,} of {s.streams:,} (worst run);"
            f" leases lost: {s.lost}"
        )
    print(
        f"medians of the runs. One process, {PROJECT}; calls = script calls (EVALSHA, EVAL),"
        " cmds = every command Redis ran,\nthose inside scripts included; calls/s and cmds/s"
        " streaming: while all the streams run (top-ups and keep-alive);\nCPU: % of one core"
        f" while streaming. The upstream's pace: {CHUNKS} chunks in"
        f" {CHUNKS * TICK_S / CHUNKS_PER_TICK:.1f} s."
    )


# ---------------------------------------------------------------------------------------------
# Overshoot at 64 concurrent streams


@dataclass
class Window:
    """What one approach's 64 clients did until the deadline."""

    approach: str
    reserve: int | None
    on_budget: str | None
    started: int = 0
    completed: int = 0
    cut: int = 0
    refused: int = 0
    streamed: int = 0
    open_now: int = 0
    most_open: int = 0
    charged: int = 0
    script_calls: int = 0
    commands: int = 0
    seconds: float = 0.0
    stream_tokens: list[int] = field(default_factory=list)

    def opened(self) -> None:
        self.started += 1
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)


async def overshoot_window(
    window: Window,
    client: aioredis.Redis,
    run_stream: Any,
) -> Window:
    """``CLIENTS`` clients each running ``run_stream(deadline)`` until the deadline."""
    before = await redis_counters(client)
    started = time.perf_counter()
    deadline = started + DEADLINE_S

    async def client_loop() -> None:
        while time.perf_counter() < deadline:
            if not await run_stream():
                await asyncio.sleep(RETRY_S)

    await asyncio.wait_for(
        asyncio.gather(*(client_loop() for _ in range(CLIENTS))), DEADLINE_S + PHASE_LIMIT_S
    )
    window.seconds = time.perf_counter() - started
    after = await redis_counters(client)
    window.script_calls, window.commands = after[1] - before[1], after[0] - before[0]
    return window


def stream_chunks() -> AsyncIterator[str]:
    return paced(STREAM_TOKENS // OVERSHOOT_CHUNK, 1, OVERSHOOT_TICK_S, time.perf_counter())


async def charge_after_the_end(client: aioredis.Redis, counters: aioredis.Redis) -> Window:
    key = f"budgetbench-{uuid.uuid4().hex[:8]}:tokens_per_minute"
    window = Window(BASELINE, None, None)

    async def run_stream() -> bool:
        if int(await client.get(key) or 0) >= BUDGET_TOKENS:
            window.refused += 1
            return False
        window.opened()
        tokens = 0
        try:
            async for _ in stream_chunks():
                tokens += OVERSHOOT_CHUNK
                window.streamed += OVERSHOOT_CHUNK
        finally:
            window.open_now -= 1
        if await client.incrby(key, tokens) == tokens:
            await client.expire(key, 60)
        window.completed += 1
        window.stream_tokens.append(tokens)
        return True

    await overshoot_window(window, counters, run_stream)
    window.charged = int(await client.get(key) or 0)
    await client.unlink(key)
    return window


async def ours(
    manager: StreamLeaseManager, counters: aioredis.Redis, reserve: int, on_budget: OnBudget
) -> Window:
    user = f"overshoot-{uuid.uuid4().hex[:8]}"
    budget = RateLimit("tokens_per_minute", BUDGET_TOKENS, per=60, unit="tokens")
    window = Window(PROJECT, reserve, on_budget)

    async def run_stream() -> bool:
        try:
            lease = await manager.acquire(
                user, budgets=[budget], reserve=reserve, on_budget=on_budget
            )
        except RateLimited:
            window.refused += 1
            return False
        window.opened()
        tokens = 0
        try:
            async for _ in lease.wrap(stream_chunks(), tokens=lambda _: OVERSHOOT_CHUNK):
                tokens += OVERSHOOT_CHUNK
                window.streamed += OVERSHOOT_CHUNK
            window.completed += 1
        except BudgetExhausted:
            window.cut += 1
        finally:
            window.open_now -= 1
            window.stream_tokens.append(tokens)
        return True

    await overshoot_window(window, counters, run_stream)
    for _ in range(int(PHASE_LIMIT_S / 0.05)):  # the settlements run after the releases
        stats = manager.stats()
        if not (stats["budget_streams"] or stats["unsettled"] or stats["held"]):
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.1)
    window.charged = (await manager.usage(user, budget))[budget.name].used
    return window


async def measure_overshoot(url: str, counters: aioredis.Redis, key_prefix: str) -> list[Window]:
    client = redis_py_client(url)
    manager = uncapped_manager(url, key_prefix)
    try:
        windows = [await charge_after_the_end(client, counters)]
        print(f"  {describe(windows[-1])}", flush=True)
        for reserve, on_budget in OURS:
            windows.append(await ours(manager, counters, reserve, on_budget))
            print(f"  {describe(windows[-1])}", flush=True)
        return windows
    finally:
        await manager.aclose()
        await client.aclose()


def describe(w: Window) -> str:
    how = "" if w.reserve is None else f", reserve {w.reserve:,}, on_budget={w.on_budget!r}"
    return (
        f"{w.approach}{how}: {w.streamed:,} tokens streamed ({w.started} streams, {w.completed}"
        f" completed, {w.cut} cut, at most {w.most_open} at once), {w.charged:,} charged"
    )


def bound_of(w: Window) -> int | None:
    """The README's bound (``on_budget="cut"``): the budget plus one increment per stream."""
    if w.on_budget != "cut":
        return None
    return BUDGET_TOKENS + TOP_UP_INCREMENT * w.most_open


def print_overshoot(windows: Sequence[Window]) -> list[str]:
    """Prints the table; returns the runs that broke the bound."""
    rows = []
    broken = []
    for w in windows:
        over = w.streamed - BUDGET_TOKENS
        bound = bound_of(w)
        if bound is None:
            verdict = "no bound (finish)" if w.on_budget == "finish" else "none"
        elif w.streamed <= bound:
            verdict = f"<= {bound:,}: yes"
        else:
            verdict = f"<= {bound:,}: NO"
            broken.append(describe(w))
        rows.append(
            [
                w.approach if w.reserve is None else f"{PROJECT}, on_budget={w.on_budget!r}",
                "-" if w.reserve is None else f"{w.reserve:,}",
                f"{w.started}",
                f"{w.completed} / {w.cut}",
                f"{w.most_open}",
                f"{w.streamed:,}",
                f"{w.charged:,}",
                f"{max(over, 0):,}",
                f"{100 * max(over, 0) / BUDGET_TOKENS:.1f} %",
                verdict,
                f"{w.commands if w.reserve is None else w.script_calls:,}",
            ]
        )
    print_table(
        [
            "approach",
            "reserve",
            "streams",
            "done / cut",
            "max open",
            "tokens streamed",
            "charged",
            "overshoot",
            "overshoot %",
            "within budget + 256 x open",
            "Redis calls",
        ],
        rows,
        left=1,
    )
    print(
        f"{CLIENTS} clients of one user against a {BUDGET_TOKENS:,}-token minute budget, streams"
        f" of {STREAM_TOKENS:,} tokens ({OVERSHOOT_CHUNK} per chunk every"
        f" {OVERSHOOT_TICK_S * 1000:.0f} ms), a refused start\ntried again after"
        f" {RETRY_S * 1000:.0f} ms, until a {DEADLINE_S:.0f} s deadline. tokens streamed: the"
        " streams' own counts; charged: what Redis holds\nafterwards; Redis calls: GET + INCRBY +"
        " EXPIRE for the baseline, script calls (acquires, refusals included,\ntop-ups,"
        " settlements, releases) for this project."
    )
    return broken


# ---------------------------------------------------------------------------------------------
# Nested levels: what each budget level (a team's, a key's, ...) adds to an admission


@dataclass(frozen=True)
class LevelRun:
    """``admissions`` streams admitted and released with ``levels`` token budgets each: the
    user's, then levels paired with identities of their own, shared by every user."""

    levels: int
    repeat: int
    admissions: int
    admission: Phase
    end: Phase
    acquire_ms_p50: float


def level_budgets(levels: int, tag: str) -> list[RateLimit | tuple[RateLimit, str]]:
    """The user's budget, then ``levels - 1`` levels each counting one shared identity."""
    own: list[RateLimit | tuple[RateLimit, str]] = [PER_MINUTE]
    shared = [
        (RateLimit(f"level{n}_tokens", 10**11, per=60, unit="tokens"), f"level{n}-{tag}")
        for n in range(1, levels)
    ]
    return own + shared


async def level_run(
    manager: StreamLeaseManager, client: aioredis.Redis, levels: int, repeat: int, admissions: int
) -> LevelRun:
    """``admissions`` acquires with ``levels`` budgets, ``LEVEL_CONCURRENCY`` at a time, every
    lease held until all are in; then every release, and its settlement."""
    tag = uuid.uuid4().hex[:8]
    budgets = level_budgets(levels, tag)
    gate = asyncio.Semaphore(LEVEL_CONCURRENCY)
    latencies: list[float] = []

    async def admit(n: int) -> Any:
        async with gate:
            started = time.perf_counter()
            lease = await manager.acquire(f"level-{tag}-{n}", budgets=budgets)
            latencies.append(time.perf_counter() - started)
            return lease

    first = await Reading.take(client)
    leases = await asyncio.gather(*(admit(n) for n in range(admissions)))
    held = await Reading.take(client)
    await asyncio.gather(*(lease.release() for lease in leases))
    last = await settled(manager, client)
    return LevelRun(
        levels=levels,
        repeat=repeat,
        admissions=admissions,
        admission=first.until(held),
        end=held.until(last),
        acquire_ms_p50=1000 * statistics.median(latencies),
    )


async def measure_levels(
    url: str, client: aioredis.Redis, key_prefix: str, repeats: int, admissions: int
) -> list[LevelRun]:
    manager = uncapped_manager(url, key_prefix)
    try:
        await level_run(manager, client, max(LEVELS), 0, 1)  # connected, scripts loaded
        runs = []
        for repeat in range(repeats):
            for levels in LEVELS:
                runs.append(await level_run(manager, client, levels, repeat, admissions))
        return runs
    finally:
        await manager.aclose()


def print_levels(runs: Sequence[LevelRun]) -> list[dict[str, float]]:
    """The medians per level count, printed and returned."""
    summaries = []
    for levels in LEVELS:
        mine = [r for r in runs if r.levels == levels]

        def median(figure: Any, of: Sequence[LevelRun] = mine) -> float:
            return float(statistics.median(figure(r) for r in of))

        summaries.append(
            {
                "levels": levels,
                "admission_commands": median(lambda r: r.admission.commands / r.admissions),
                "admission_script_calls": median(
                    lambda r: r.admission.script_calls / r.admissions
                ),
                "admission_us": median(lambda r: 1e6 * r.admission.seconds / r.admissions),
                "admission_redis_cpu_us": median(
                    lambda r: 1e6 * r.admission.redis_cpu_s / r.admissions
                ),
                "acquire_ms_p50": median(lambda r: r.acquire_ms_p50),
                "end_commands": median(lambda r: r.end.commands / r.admissions),
            }
        )
    print_table(
        [
            "budget levels",
            "commands / admission",
            "script calls / admission",
            "µs / admission",
            "Redis CPU µs / admission",
            "acquire p50 ms",
            "commands / release + settlement",
        ],
        [
            [
                f"{s['levels']}" + (" (single budget)" if s["levels"] == 1 else ""),
                f"{s['admission_commands']:.1f}",
                f"{s['admission_script_calls']:.2f}",
                f"{s['admission_us']:.0f}",
                f"{s['admission_redis_cpu_us']:.1f}",
                f"{s['acquire_ms_p50']:.2f}",
                f"{s['end_commands']:.1f}",
            ]
            for s in summaries
        ],
        left=1,
    )
    print(
        f"Nested levels: {runs[0].admissions:,} admissions per run, {LEVEL_CONCURRENCY} at a"
        " time, each with the user's budget and 0, 2 or 4 more levels counting identities\nshared"
        " by every user (a team's, a key's...), all in one script call; µs / admission: the"
        " phase's wall time over its admissions. Medians of the runs."
    )
    return summaries


# ---------------------------------------------------------------------------------------------
# Answer sizes: what counting a settled answer in its model's histogram adds to a settlement

ANSWER_TOKENS = 300
ANSWER_RESERVE = 1_000
ANSWER_MODEL = "bench-model"


@dataclass(frozen=True)
class AnswerRun:
    """``admissions`` streams of one answer each, settled with (``model``) or without their
    answer counted."""

    model: str | None
    repeat: int
    admissions: int
    end: Phase


async def answer_run(
    manager: StreamLeaseManager,
    client: aioredis.Redis,
    model: str | None,
    repeat: int,
    admissions: int,
) -> AnswerRun:
    """``admissions`` streams, ``LEVEL_CONCURRENCY`` at a time, each counting an answer of
    ``ANSWER_TOKENS`` within its reservation and released; then every settlement."""
    tag = uuid.uuid4().hex[:8]
    gate = asyncio.Semaphore(LEVEL_CONCURRENCY)
    sized: dict[str, Any] = (
        {"reserve": (0, ANSWER_RESERVE)}
        if model is None
        else {"reserve": "auto", "model": model, "max_tokens": ANSWER_RESERVE}
    )

    async def admit(n: int) -> Any:
        async with gate:
            lease = await manager.acquire(f"answer-{tag}-{n}", budgets=[PER_MINUTE], **sized)
            lease.consume(ANSWER_TOKENS)
            return lease

    leases = await asyncio.gather(*(admit(n) for n in range(admissions)))
    held = await quiet(client)  # the top-ups that move the streamed tokens are done
    await asyncio.gather(*(lease.release() for lease in leases))
    last = await settled(manager, client)
    return AnswerRun(model=model, repeat=repeat, admissions=admissions, end=held.until(last))


async def measure_answers(
    url: str, client: aioredis.Redis, key_prefix: str, repeats: int, admissions: int
) -> list[AnswerRun]:
    manager = uncapped_manager(url, key_prefix)
    try:
        await answer_run(manager, client, ANSWER_MODEL, 0, 1)  # connected, scripts loaded
        runs = []
        for repeat in range(repeats):
            for model in (None, ANSWER_MODEL):
                runs.append(await answer_run(manager, client, model, repeat, admissions))
        return runs
    finally:
        await manager.aclose()


def print_answers(runs: Sequence[AnswerRun]) -> list[dict[str, Any]]:
    """The medians without and with the answer counted, printed and returned."""
    summaries = []
    for model in (None, ANSWER_MODEL):
        mine = [r for r in runs if r.model == model]
        summaries.append(
            {
                "model": model,
                "end_commands": statistics.median(r.end.commands / r.admissions for r in mine),
                "end_script_calls": statistics.median(
                    r.end.script_calls / r.admissions for r in mine
                ),
            }
        )
    print_table(
        ["settlement", "commands / release + settlement", "script calls / release + settlement"],
        [
            [
                "without model=" if s["model"] is None else "with model= (answer counted)",
                f"{s['end_commands']:.1f}",
                f"{s['end_script_calls']:.2f}",
            ]
            for s in summaries
        ],
        left=1,
    )
    print(
        f"Answer sizes: {runs[0].admissions:,} streams per run, each a {ANSWER_TOKENS}-token"
        f" answer within a {ANSWER_RESERVE:,}-token reservation, ended on its own. Medians."
    )
    return summaries


# ---------------------------------------------------------------------------------------------


async def measure(url: str, repeats: int, streams: int, admissions: int) -> dict[str, Any]:
    counters = aioredis.Redis.from_url(url, socket_timeout=10.0)
    prefix = f"budgetbench-{uuid.uuid4().hex[:8]}"
    try:
        server_version = str((await counters.info("server"))["redis_version"])
        print(f"Redis calls: {streams:,} concurrent streams, {repeats} runs per token rate")
        cost_runs = await measure_costs(url, counters, f"{prefix}-cost", repeats, streams)
        print(f"overshoot: {CLIENTS} clients against {BUDGET_TOKENS:,} tokens a minute")
        windows = await measure_overshoot(url, counters, f"{prefix}-over")
        print(f"nested levels: {admissions:,} admissions per run with {LEVELS} budget levels")
        level_runs = await measure_levels(url, counters, f"{prefix}-levels", repeats, admissions)
        print(f"answer sizes: {admissions:,} streams per run, without and with model=")
        answer_runs = await measure_answers(
            url, counters, f"{prefix}-answers", repeats, admissions
        )
    finally:
        for name in ("cost", "over", "levels", "answers"):
            await delete_keys(counters, f"{prefix}-{name}")
        await counters.aclose()
    return {
        "redis_server": server_version,
        "cost_runs": cost_runs,
        "windows": windows,
        "level_runs": level_runs,
        "answer_runs": answer_runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", required=True, help="Redis URL, e.g. redis://127.0.0.1:6380/0")
    parser.add_argument("--repeats", type=int, default=3, help="runs per token rate")
    parser.add_argument("--streams", type=int, default=STREAMS, help="concurrent streams")
    parser.add_argument(
        "--admissions", type=int, default=LEVEL_ADMISSIONS, help="admissions per nested-level run"
    )
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="JSON results file")
    args = parser.parse_args()
    if args.repeats < 1 or args.streams < 1 or args.admissions < 1:
        parser.error("--repeats, --streams and --admissions must be >= 1")
    measured = asyncio.run(measure(args.url, args.repeats, args.streams, args.admissions))
    summaries = summarize_costs(measured["cost_runs"])
    print_costs(summaries)
    broken = print_overshoot(measured["windows"])
    level_summaries = print_levels(measured["level_runs"])
    answer_summaries = print_answers(measured["answer_runs"])
    write_json(
        args.output,
        {
            "machine": {
                **machine_info(),
                "redis_server": measured["redis_server"],
                **{package: version(package) for package in ("fastapi-stream-lease", "redis")},
            },
            "settings": {
                "url": without_password(args.url),
                "streams": args.streams,
                "chunks_per_stream": CHUNKS,
                "chunks_per_s": CHUNKS_PER_TICK / TICK_S,
                "tokens_per_chunk": TOKENS_PER_CHUNK,
                "reserve": TOP_UP_INCREMENT,
                "budgets": [
                    {"name": b.name, "limit": b.limit, "per": b.per} for b in (PER_MINUTE, PER_DAY)
                ],
                "repeats": args.repeats,
                "top_up_increment": TOP_UP_INCREMENT,
                "levels": {
                    "levels": LEVELS,
                    "admissions": args.admissions,
                    "concurrency": LEVEL_CONCURRENCY,
                },
                "overshoot": {
                    "clients": CLIENTS,
                    "budget_tokens": BUDGET_TOKENS,
                    "stream_tokens": STREAM_TOKENS,
                    "chunk_tokens": OVERSHOOT_CHUNK,
                    "tick_s": OVERSHOOT_TICK_S,
                    "deadline_s": DEADLINE_S,
                    "retry_s": RETRY_S,
                },
            },
            "summary": [asdict(s) for s in summaries],
            "runs": [asdict(r) for r in measured["cost_runs"]],
            "overshoot": [{**asdict(w), "bound": bound_of(w)} for w in measured["windows"]],
            "levels": level_summaries,
            "level_runs": [asdict(r) for r in measured["level_runs"]],
            "answers": answer_summaries,
            "answer_runs": [asdict(r) for r in measured["answer_runs"]],
        },
    )
    print(f"raw figures: {args.output}")
    if broken:
        raise SystemExit(
            "token_budgets.py: the streamed tokens broke the README's bound (budget + one top-up"
            " increment per concurrent stream):\n  " + "\n  ".join(broken)
        )


if __name__ == "__main__":
    main()
