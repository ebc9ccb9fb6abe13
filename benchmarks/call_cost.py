"""Where one call's time goes: what one call into the core costs, in latency and in CPU, at 1
coroutine and at 64, in a bare asyncio loop and inside a running uvicorn app, beside the
pure-Python peer and a floor.

The operations, timed call by call (``time.perf_counter()`` around each await), one user id
per coroutine:

* ``hop``: ``await manager._core.answer_estimate("bench-model", None)``, no Redis I/O: once a
  warm-up call has read the model's figure the core answers from its cache (read again at most
  every 10 s), so this is the crossing alone, Python -> the core's tokio thread -> the event
  loop. Its Redis commands per call (about 0) are printed;
* ``hit``: ``await manager.hit(user, RateLimit("bench", 10**9, per="day"))``;
* ``acquire + release``: ``lease = await manager.acquire(user); await lease.release()``,
  ``LeaseConfig(max_per_user=2, max_global=500)`` (the defaults);
* ``slabs acquire + release``: the same with ``lease_global_slots=True`` (the global pool's
  slots taken in slabs: after the first, each cycle starts on a slot of a slab held here, and
  the user's pool is in a tag of its own);
* ``peer acquire + release``: the same on the peer (PyPI ``fastapi-stream-lease==0.6.3``, same
  import name and caps), built as its README does (``redis.asyncio.from_url(url)``): this file
  run with ``--peer`` by ``benchmarks/.venv-peer/bin/python``;
* ``floor``: redis-py with hiredis, ``await client.evalsha(sha, 1, key)`` of ``return
  redis.call('INCR', KEYS[1])``, ``client = redis.asyncio.from_url(url)``.

In two settings, a process per setting and library: ``bare``, ``asyncio.run`` (asyncio's
default loop) in a child process driven in JSON lines; ``app``, one uvicorn worker with its
defaults (``loop="auto"`` takes uvloop where installed: the loop that ran is printed), the
manager built by the FastAPI app's lifespan, ``GET /measure?op=hit&calls=5000&coroutines=1``
running the calls in the request's handler and answering with its own measurements.

A measurement runs a tenth of its calls untimed, then ``--calls`` (``hop``: 10 times as many)
split among the coroutines, and reads around them: calls/s, p50, p99; the process's CPU per
call (``time.process_time()``) split by thread (``/proc/self/task``): the loop's, the core's
tokio threads (``stream-lease``), others; and per call Redis's script calls, its commands
(those run inside scripts included: ``INFO commandstats``) and its CPU (``INFO cpu``). The
variants take turns (``common.in_turns``), ``--repeats`` times; the tables give medians, then,
at one coroutine, hit and acquire + release minus hop (the Redis round trip and the Python
around the call), and ratios to the peer and the floor. Keys go under a fresh prefix per run
and process (``{callcost-<run>-...}:``), deleted at the end, once every global pool is empty.

Run it from the repository root (1 to 3 minutes on 2 cores; without ``--url`` it starts a
throwaway redis-server on a free loopback port)::

    benchmarks/.venv/bin/python benchmarks/call_cost.py [--url redis://127.0.0.1:6380/0]

The tables are printed; the raw figures go to ``benchmarks/results/call_cost.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib.metadata
import itertools
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from common import (
    CORE_THREAD,
    FLOOR_SCRIPT,
    PEER_PYTHON,
    RESULTS_DIR,
    Child,
    ServerProcess,
    concurrency_list,
    delete_keys,
    in_turns,
    machine_info,
    percentile_ms,
    print_table,
    redis_counters,
    reply,
    requests,
    thread_cpu,
    write_json,
)
from support.redis_servers import RedisServer
from support.urls import without_password

SCRIPT = Path(__file__).resolve()
OPS = ("hop", "hit", "acquire + release", "slabs acquire + release", "peer acquire + release",
       "floor")
HOP, HIT, CYCLE, SLABS_CYCLE, PEER_CYCLE, FLOOR = OPS
SETTINGS = ("bare", "app")
HOP_FACTOR = 10
MODEL = "bench-model"
SECRET = "call-cost-benchmark-secret"
CLIENT_TIMEOUT_S = 300.0
# The main table's columns: heading, figure (the median of the runs'), format.
COLUMNS = (
    ("calls/s", "calls_per_s", "{:,.0f}"),
    ("p50", "p50_us", "{:.0f}"),
    ("p99", "p99_us", "{:.0f}"),
    ("CPU", "cpu_us", "{:.1f}"),
    ("loop thr", "loop_us", "{:.1f}"),
    ("core thr", "core_us", "{:.1f}"),
    ("other", "other_us", "{:.1f}"),
    ("scripts", "redis_scripts", "{:.3f}"),
    ("commands", "redis_commands", "{:.3f}"),
    ("Redis CPU", "redis_cpu_us", "{:.1f}"),
    ("same CPU", "same_cpu", "{}"),  # a count of runs, not a median
)
# Where the time goes at one coroutine: these figures of hit and acquire + release minus hop's.
MINUS_HOP = ("p50_us", "cpu_us", "loop_us", "core_us")
RATIOS = ("cycles_vs_peer", "cpu_vs_peer", "p50_vs_floor")
NOTES = """µs per call. CPU = the process's (time.process_time()), split by thread
(/proc/self/task): loop thr, core thr (the tokio threads, 'stream-lease'), other. scripts =
FCALL, EVALSHA, EVAL per call; commands = every command per call, those scripts run included
(INFO commandstats). same CPU = runs whose loop and core threads last ran on one CPU (a
crossing between two CPUs wakes the other one: dearer).
hop's Redis commands per call (its figure is read again at most every 10 s): {hops}."""
WHERE = """
where the time goes at 1 coroutine, µs per call: the operation minus hop (the crossing)
= the Redis round trip + the Python around the call"""


# ---------------------------------------------------------------------------------------------
# The measuring side: a bare child or a uvicorn app, in either virtualenv


async def build_ops(url: str, prefix: str, peer: bool) -> tuple[Any, Any]:
    """What this process answers the parent (``hello``; ``left``, the leases in its global
    pool; an operation's measurement), and its clean-up."""

    async def cycle(user: str, on: Any = None) -> None:
        lease = await (on or manager).acquire(user)
        await lease.release()

    if peer:  # fastapi_stream_lease is the peer here, 0.6.3
        from fastapi_stream_lease import LeaseConfig, StreamLeaseManager

        config = LeaseConfig(max_per_user=2, max_global=500, key_prefix=prefix)
        manager: Any = StreamLeaseManager(aioredis.from_url(url), config)
        client = manager.redis
        calls = {PEER_CYCLE: lambda w: functools.partial(cycle, f"user-{w}")}
    else:
        from fastapi_stream_lease import LeaseConfig, RateLimit, StreamLeaseManager

        config = LeaseConfig(
            max_per_user=2, max_global=500, key_prefix=prefix, identity_secret=SECRET
        )
        manager = StreamLeaseManager(url=url, config=config)
        slabs = StreamLeaseManager(url=url, config=LeaseConfig(
            max_per_user=2, max_global=500, key_prefix=f"{prefix}-slabs", identity_secret=SECRET,
            lease_global_slots=True))
        rate = RateLimit("bench", 10**9, per="day")
        client = aioredis.from_url(url)
        sha = await client.script_load(FLOOR_SCRIPT)
        await manager._core.answer_estimate(MODEL, None)  # reads the figure, cached from now on
        calls = {
            HOP: lambda w: functools.partial(manager._core.answer_estimate, MODEL, None),
            HIT: lambda w: functools.partial(manager.hit, f"user-{w}", rate),
            CYCLE: lambda w: functools.partial(cycle, f"user-{w}"),
            SLABS_CYCLE: lambda w: functools.partial(cycle, f"user-{w}", slabs),
            FLOOR: lambda w: functools.partial(client.evalsha, sha, 1, f"{{{prefix}}}:floor:{w}"),
        }

    async def answer(request: dict[str, Any]) -> dict[str, Any]:
        if request["op"] == "hello":
            return hello()
        if request["op"] == "left":
            return {"left": await manager.get_active_count()}
        call_of = calls[request["op"]]
        return await measure(call_of, int(request["calls"]), int(request["coroutines"]), url)

    async def close() -> None:
        await (manager.close(drain=False) if peer else manager.aclose())
        if not peer:
            await slabs.aclose()
        await client.aclose()

    return answer, close


def loop_name() -> str:
    module = type(asyncio.get_running_loop()).__module__
    return module.split(".")[0] if module.startswith(("uvloop", "asyncio")) else module


def hello() -> dict[str, Any]:
    """The loop this process runs and the versions of what it measures."""
    names = ("fastapi-stream-lease", "redis", "hiredis", "uvicorn", "uvloop", "fastapi")
    installed = {d.metadata["Name"].lower(): d.version for d in importlib.metadata.distributions()}
    versions = {name: installed.get(name) for name in names}
    return {"loop": loop_name(), "versions": versions}


async def measure(call_of: Callable[[int], Any], calls: int, coroutines: int, url: str) -> dict:
    """``calls`` calls split among ``coroutines``, after a tenth as many untimed."""
    each = max(1, calls // coroutines)
    durations: list[float] = []

    async def worker(w: int, count: int, timed: bool) -> None:
        call = call_of(w)
        for _ in range(count):
            started = time.perf_counter()
            await call()
            if timed:
                durations.append(time.perf_counter() - started)

    await asyncio.gather(*(worker(w, max(1, each // 10), False) for w in range(coroutines)))
    loop_thread = threading.get_native_id()
    async with aioredis.from_url(url) as stats:  # its own connection, outside the timing
        commands, scripts, redis_cpu = await redis_counters(stats)
        threads = thread_cpu()
        process, wall = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker(w, each, True) for w in range(coroutines)))
        wall, process = time.perf_counter() - wall, time.process_time() - process
        split = {"loop": 0.0, "core": 0.0, "other": 0.0}
        on: dict[str, set[int]] = {"loop": set(), "core": set(), "other": set()}
        for tid, (name, cpu, processor) in thread_cpu().items():
            part = "loop" if tid == loop_thread else "core" if name == CORE_THREAD else "other"
            split[part] += cpu - threads.get(tid, (name, 0.0, 0))[1]
            on[part].add(processor)
        commands_after, scripts_after, redis_cpu_after = await redis_counters(stats)
    n = each * coroutines
    durations.sort()
    return {
        "loop": loop_name(),
        "calls": n,
        "calls_per_s": n / wall,
        "p50_us": 1e3 * percentile_ms(durations, 0.50),
        "p99_us": 1e3 * percentile_ms(durations, 0.99),
        "cpu_us": 1e6 * process / n,
        **{f"{part}_us": 1e6 * seconds / n for part, seconds in split.items()},
        "redis_scripts": (scripts_after - scripts) / n,
        "redis_commands": (commands_after - commands) / n,
        "redis_cpu_us": 1e6 * (redis_cpu_after - redis_cpu) / n,
        # Where the loop's thread and the core's last ran: a crossing between two CPUs costs
        # a wake-up of the other one, far dearer than a switch on one.
        "loop_cpu": min(on["loop"]),
        "core_cpus": sorted(on["core"]),
    }


async def bare_child(url: str, prefix: str, peer: bool) -> None:
    answer, close = await build_ops(url, prefix, peer)
    try:
        async for request in requests():
            reply(await answer(request))
    finally:
        await close()


def serve_app(url: str, prefix: str, peer: bool, port: int) -> None:
    """The app: the lifespan builds the manager; ``GET /measure?op=...`` runs in a request."""
    import uvicorn
    from fastapi import FastAPI

    built: list[Any] = []

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        built[:] = await build_ops(url, prefix, peer)
        try:
            yield
        finally:
            await built[1]()

    app = FastAPI(lifespan=lifespan)

    @app.get("/measure")
    async def measure_endpoint(op: str, calls: int = 0, coroutines: int = 1) -> dict:
        return dict(await built[0]({"op": op, "calls": calls, "coroutines": coroutines}))

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


# ---------------------------------------------------------------------------------------------
# The benchmark (parent): starts the processes, takes the turns, reports


class Measurer:
    """One setting of one library: a bare child (JSON lines) or a uvicorn app (HTTP)."""

    def __init__(self, setting: str, peer: bool, url: str, prefix: str) -> None:
        self.setting, self.prefix = setting, prefix
        python = str(PEER_PYTHON if peer else sys.executable)
        self.argv = [python, str(SCRIPT), "--role", setting, "--url", url, "--prefix", prefix]
        self.argv += ["--peer"] if peer else []
        self.child: Child | None = None
        self.server: ServerProcess | None = None
        self.hello: dict[str, Any] = {}

    async def start(self, http: Any) -> None:
        import httpx

        self.http = http
        if self.setting == "bare":
            self.child = await Child.start(self.argv, self.prefix)
        else:
            self.server = ServerProcess(self.prefix, self.argv)
        for _try in range(150):  # about 30 s for the app to listen
            try:
                self.hello = await self.ask("hello")
                return
            except httpx.TransportError:
                await asyncio.sleep(0.2)
        raise RuntimeError(f"the app {self.prefix} did not come up")

    async def ask(self, op: str, **params: Any) -> dict[str, Any]:
        if self.child is not None:
            await self.child.send({"op": op, **params})
            return await self.child.receive(CLIENT_TIMEOUT_S)
        assert self.server is not None
        url = f"http://127.0.0.1:{self.server.port}/measure"
        answer = await self.http.get(url, params={"op": op, **params}, timeout=CLIENT_TIMEOUT_S)
        answer.raise_for_status()
        return dict(answer.json())

    async def stop(self) -> None:
        if self.child is not None:
            await self.child.stop()
        if self.server is not None:
            await asyncio.to_thread(self.server.stop)


async def measure_all(args: argparse.Namespace, url: str) -> dict[str, Any]:
    import httpx

    run_id = uuid.uuid4().hex[:8]
    measurers = {
        (setting, peer): Measurer(setting, peer, url, f"callcost-{run_id}-{setting}-{who}")
        for setting in SETTINGS
        for peer, who in ((False, "lib"), (True, "peer"))
    }
    variants = list(itertools.product(SETTINGS, OPS))
    runs: list[dict[str, Any]] = []
    async with httpx.AsyncClient() as http:
        try:
            await asyncio.gather(*(m.start(http) for m in measurers.values()))
            for repeat, coroutines in itertools.product(
                range(1, args.repeats + 1), args.coroutines
            ):
                for setting, op in in_turns(variants, repeat, step=3):
                    calls = args.calls * (HOP_FACTOR if op == HOP else 1)
                    asked = {"calls": calls, "coroutines": coroutines}
                    run = await measurers[setting, op == PEER_CYCLE].ask(op, **asked)
                    runs.append(run | asked | {"op": op, "setting": setting, "repeat": repeat})
                    print(
                        f"  #{repeat} {coroutines:>3} {setting:<4} {op:<22}"
                        f" {run['calls_per_s']:>9,.0f}/s  p50 {run['p50_us']:>6.0f} µs"
                        f"  CPU {run['cpu_us']:>5.0f} µs  Redis {run['redis_cpu_us']:>5.1f} µs"
                        f"  CPUs: loop {run['loop_cpu']}, core {run['core_cpus']}",
                        flush=True,
                    )
            left = {m.prefix: (await m.ask("left"))["left"] for m in measurers.values()}
        finally:
            for m in measurers.values():
                await m.stop()
    async with aioredis.from_url(url) as client:
        version = (await client.info("server"))["redis_version"]
        for m in measurers.values():
            await delete_keys(client, m.prefix)
            await delete_keys(client, f"{m.prefix}-slabs")
    hellos = {f"{s} {'peer' if p else 'lib'}": m.hello for (s, p), m in measurers.items()}
    return {"runs": runs, "leases_left": left, "processes": hellos, "redis": version}


def summarize(runs: list[dict[str, Any]], levels: list[int]) -> list[dict[str, Any]]:
    """Medians per concurrency, setting and operation."""
    summary = []
    for key in itertools.product(levels, SETTINGS, OPS):
        mine = [r for r in runs if (r["coroutines"], r["setting"], r["op"]) == key]
        medians = {k: statistics.median(r[k] for r in mine) for _, k, _ in COLUMNS[:-1]}
        named = dict(zip(("coroutines", "setting", "op"), key, strict=True))
        same = (
            sum(r["loop_cpu"] in r["core_cpus"] for r in mine)
            if key[2] in (HOP, HIT, CYCLE)
            else "-"
        )
        first = {"loop": mine[0]["loop"], "calls": mine[0]["calls"], "same_cpu": same}
        summary.append(named | first | medians)
    return summary


def derive(summary: list[dict[str, Any]], levels: list[int]) -> dict[str, list[dict[str, Any]]]:
    """At one coroutine, hit and acquire + release minus hop; at each level, this library's
    acquire + release against the peer's (cycles/s, CPU) and against the floor (p50)."""
    at = {(s["coroutines"], s["setting"], s["op"]): s for s in summary}
    minus_hop = []
    for setting, op in itertools.product(SETTINGS, (HIT, CYCLE)) if 1 in levels else ():
        mine, hop = at[1, setting, op], at[1, setting, HOP]
        figures = {f"{k}_minus_hop": mine[k] - hop[k] for k in MINUS_HOP}
        figures["redis_cpu_us"] = mine["redis_cpu_us"]
        minus_hop.append({"setting": setting, "op": op, **figures})
    ratios = []
    for c, setting in itertools.product(levels, SETTINGS):
        mine, peer, floor = (at[c, setting, op] for op in (CYCLE, PEER_CYCLE, FLOOR))
        figures = {"cycles_vs_peer": mine["calls_per_s"] / peer["calls_per_s"]}
        figures.update(cpu_vs_peer=mine["cpu_us"] / peer["cpu_us"])
        figures.update(p50_vs_floor=mine["p50_us"] / floor["p50_us"])
        ratios.append({"setting": setting, "coroutines": c, **figures})
    return {"minus_hop": minus_hop, "ratios": ratios}


def table(records: list[dict[str, Any]], labels: list[str], columns: Any) -> None:
    """Prints the ``labels`` fields of ``records``, then ``columns`` (heading, field, format)."""
    rows = [[str(r[k]) for k in labels] + [f.format(r[k]) for _, k, f in columns] for r in records]
    print_table([*labels, *(heading for heading, _, _ in columns)], rows, len(labels))


def report(
    summary: list[dict[str, Any]], derived: dict[str, Any], args: argparse.Namespace
) -> None:
    print(f"\nmedians of {args.repeats} runs of {args.calls} calls ({HOP}: {HOP_FACTOR}x)")
    table(summary, ["setting", "loop", "op", "coroutines"], COLUMNS)
    hops = [f"{s['setting']} {s['coroutines']}: {s['redis_commands']:.4f}" for s in summary]
    hops = [text for text, s in zip(hops, summary, strict=True) if s["op"] == HOP]
    print(NOTES.format(hops=", ".join(hops)))
    if derived["minus_hop"]:
        print(WHERE)
        minus = [
            (f"{h} - hop", f"{k}_minus_hop", "{:+.1f}") for h, k, _ in COLUMNS if k in MINUS_HOP
        ]
        table(
            derived["minus_hop"],
            ["setting", "op"],
            [*minus, ("Redis CPU", "redis_cpu_us", "{:.1f}")],
        )
    print("\nacquire + release: this library / the peer (cycles/s, CPU), / the floor (p50)")
    table(derived["ratios"], ["setting", "coroutines"], [(k, k, "{:.2f}x") for k in RATIOS])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="Redis URL (default: a throwaway redis-server)")
    parser.add_argument("--calls", type=int, default=5000, help="calls per measurement")
    parser.add_argument("--repeats", type=int, default=3, help="runs per variant")
    parser.add_argument("--coroutines", type=concurrency_list, default=[1, 64], help="e.g. 1,64")
    output = RESULTS_DIR / "call_cost.json"
    parser.add_argument("--output", type=Path, default=output, help="JSON results file")
    internal = parser.add_argument_group("internal modes (started by this script)")
    internal.add_argument("--role", choices=SETTINGS, help="measure in this setting")
    internal.add_argument("--peer", action="store_true", help="--role: the peer's operation")
    internal.add_argument("--prefix", help="--role: the Redis key prefix")
    internal.add_argument("--port", type=int, help="--role app: port to listen on")
    args = parser.parse_args()
    if args.role == "bare":
        asyncio.run(bare_child(args.url, args.prefix, args.peer))
        return
    if args.role == "app":
        serve_app(args.url, args.prefix, args.peer, args.port)
        return
    if args.calls < 1 or args.repeats < 1:
        parser.error("--calls and --repeats must be >= 1")

    started = time.perf_counter()
    server = None if args.url else RedisServer().start()
    url = args.url or server.url
    levels = ",".join(map(str, args.coroutines))
    print(f"call cost against {without_password(url)}: {args.repeats} runs, {levels} coroutines")
    try:
        measured = asyncio.run(measure_all(args, url))
    finally:
        if server is not None:
            server.cleanup()
    summary = summarize(measured["runs"], args.coroutines)
    derived = derive(summary, args.coroutines)
    report(summary, derived, args)
    left = measured.pop("leases_left")
    print(f"leases left in the global pools at the end: {left}")
    settings = {"url": without_password(url), "calls": args.calls, "hop_factor": HOP_FACTOR}
    settings.update(repeats=args.repeats, coroutines=args.coroutines, redis=measured.pop("redis"))
    machine = machine_info() | {"event_loop": "bare: asyncio's; app: see processes"}
    results = {"machine": machine, "settings": settings, "summary": summary, "derived": derived}
    write_json(args.output, results | {"leases_left_in_global_pools": left} | measured)
    print(f"raw figures: {args.output} ({time.perf_counter() - started:.0f} s)")
    if any(left.values()):
        sys.exit("leases were left in a global pool")


if __name__ == "__main__":
    main()
