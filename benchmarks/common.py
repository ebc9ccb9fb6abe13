"""What the benchmark scripts share.

This module imports only the standard library and redis-py, because it also runs inside the
peer's virtualenv (``benchmarks/.venv-peer``, PyPI ``fastapi-stream-lease==0.6.3``), whose
package has the same import name as this project's. Importing it puts ``tests/`` on the path, so
that the benchmarks import the tests' ``support`` package (free ports, redis-server processes,
URL redaction) rather than copies of it. It holds:

* the timed acquire+release loop (:func:`timed_run`) that every implementation goes through;
* concurrency sweeps: the levels, how many runs at each, implementations taking turns
  (:class:`Sweep`, :func:`in_turns`), and the server's own ceiling (:func:`redis_benchmark`);
* the JSON-lines protocol between a benchmark and its child processes (:class:`Child` on
  the parent's side, :func:`reply` and :func:`requests` on the child's);
* a server process of a benchmark's own on a free port (:class:`ServerProcess`);
* the lease-holding child (:func:`serve_holder`) that ``holding.py`` drives for both libraries;
* readers of the Redis server's counters (``INFO commandstats``, ``INFO cpu``) and the clean-up
  of a run's keys;
* readers of a process's CPU time and resident memory (``/proc``), and the reports.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
import os
import platform
import re
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar
from urllib.parse import urlsplit

import redis.asyncio as aioredis

BENCH_DIR = Path(__file__).resolve().parent
# After the script's own folder: tests/support is imported as `support`, as the tests do.
sys.path.insert(1, str(BENCH_DIR.parent / "tests"))
from support.ports import free_port  # noqa: E402  (after the path it is found on)

RESULTS_DIR = BENCH_DIR / "results"
PEER_PYTHON = BENCH_DIR / ".venv-peer" / "bin" / "python"
PEER = "peer fastapi-stream-lease 0.6.3"
# The peer as its README builds it: redis.asyncio.from_url(url), redis-py's default pool (a
# connection per concurrent call, no limit); PEER itself gets the blocking pool of 64 that the
# redis-py baseline has.
PEER_DEFAULT_POOL = f"{PEER}, default pool"
PROJECT = "fastapi_stream_lease"
# Every redis-py client here (the same-scripts baseline and the peer's) has this many
# connections; a caller beyond it waits for a free one instead of failing.
REDIS_PY_POOL_SIZE = 64
# How long a child process may stay silent before the benchmark gives up on it.
CHILD_TIMEOUT_S = 120.0

H = TypeVar("H")

# The benchmarks hash made-up user ids; the library's advice to set identity_secret is not news.
warnings.filterwarnings("ignore", message="no identity_secret")


# ---------------------------------------------------------------------------------------------
# The acquire+release loop


@dataclass(frozen=True)
class Implementation(Generic[H]):
    """One way to take a lease and give it back: ``await release(await acquire(user_id))``."""

    name: str
    acquire: Callable[[str], Awaitable[H]]
    release: Callable[[H], Awaitable[bool]]


@dataclass
class WorkerTally:
    """What one coroutine did during a run."""

    cycles_in_window: int = 0
    failed_releases: int = 0
    acquire_latencies_s: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class RunResult:
    """One timed run of one implementation at one concurrency."""

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
    # Redis time in script calls per cycle (INFO commandstats), where the run could read it.
    redis_us_per_cycle: float | None = None


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
    count_left: Callable[[], Awaitable[int]],
    server: aioredis.Redis | None = None,
) -> RunResult:
    """Runs ``coroutines`` workers (one user id each) through the warm-up and the window.

    ``count_left`` tells, after the run, how many leases are still in the global pool; with
    ``server``, the Redis time spent in script calls during the window is read too.
    """
    window_start = time.perf_counter() + warmup_s
    window_end = window_start + window_s
    workers = (
        cycle_until(impl, f"bench-user-{n}", window_start, window_end) for n in range(coroutines)
    )
    script_time = asyncio.ensure_future(script_micros_between(server, window_start, window_end))
    # Every call is bounded (redis_timeout, socket_timeout); this bounds the run as a whole.
    tallies = await asyncio.wait_for(asyncio.gather(*workers), warmup_s + window_s + 15.0)
    micros = await script_time
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
        left_in_global_pool=await count_left(),
        redis_us_per_cycle=None if micros is None or not cycles else micros / cycles,
    )


async def script_micros_between(
    server: aioredis.Redis | None, start: float, end: float
) -> float | None:
    """The µs Redis spent in script calls between two ``time.perf_counter()`` instants."""
    if server is None:
        return None
    await asyncio.sleep(max(0.0, start - time.perf_counter()))
    before = await script_micros(server)
    await asyncio.sleep(max(0.0, end - time.perf_counter()))
    return await script_micros(server) - before


async def script_micros(client: aioredis.Redis) -> int:
    """µs the server has spent in script calls so far (``INFO commandstats``; the commands a
    script runs are inside its call's time)."""
    stats = await client.info("commandstats")
    return sum(int(v["usec"]) for k, v in stats.items() if k in SCRIPT_COMMANDS)


SCRIPT_COMMANDS = frozenset(
    f"cmdstat_{name}" for name in ("eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro")
)


async def command_calls(client: aioredis.Redis) -> tuple[int, int]:
    """(all commands, script calls) the server has run so far (``INFO commandstats``)."""
    stats = await client.info("commandstats")
    commands = sum(int(v["calls"]) for v in stats.values())
    scripts = sum(int(v["calls"]) for k, v in stats.items() if k in SCRIPT_COMMANDS)
    return commands, scripts


async def redis_cpu_seconds(client: aioredis.Redis) -> float:
    """User + system CPU seconds redis-server has used so far (``INFO cpu``)."""
    cpu = await client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


async def redis_counters(client: aioredis.Redis) -> tuple[int, int, float]:
    """(commands, script calls, CPU seconds) of the server so far, the ``INFO`` calls that
    read them left out of the commands: deltas of two readings are the work measured."""
    stats = await client.info("commandstats")
    commands = sum(int(v["calls"]) for k, v in stats.items() if not k.startswith("cmdstat_info"))
    scripts = sum(int(v["calls"]) for k, v in stats.items() if k in SCRIPT_COMMANDS)
    return commands, scripts, await redis_cpu_seconds(client)


async def delete_keys(client: aioredis.Redis, key_prefix: str) -> None:
    """Deletes the keys a run left under ``{key_prefix}:`` and, where users have tags of their
    own (``global_pool=False``, ``lease_global_slots=True``), ``{key_prefix:<digest>}:``
    (bounded: at most 10,000 SCAN steps per pattern)."""
    for pattern in (f"{{{key_prefix}}}:*", f"{{{key_prefix}:*"):
        cursor = 0
        for _step in range(10_000):
            cursor, keys = await client.scan(cursor, match=pattern, count=10_000)
            if keys:
                await client.unlink(*keys)
            if cursor == 0:
                break


def redis_py_client(url: str) -> aioredis.Redis:
    """A redis.asyncio client (hiredis parser when installed) with a blocking pool of
    :data:`REDIS_PY_POOL_SIZE` connections: the baseline's and the peer's client."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=REDIS_PY_POOL_SIZE, timeout=10.0, socket_timeout=5.0
    )
    return aioredis.Redis.from_pool(pool)


# ---------------------------------------------------------------------------------------------
# Concurrency sweeps

# The levels a sweep reports first: one caller at a time, and the loaded figure.
HEADLINE = (1, 64)


def concurrency_list(text: str) -> list[int]:
    """``--concurrency``'s value: comma-separated coroutine counts."""
    levels = [int(part) for part in text.split(",") if part.strip()]
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError("give coroutine counts >= 1, e.g. 1,16,64,256")
    return levels


@dataclass(frozen=True)
class Sweep:
    """Every level of ``--concurrency``, ``--repeats`` runs at the headline levels and
    ``--sweep-repeats`` at the others, each a warm-up then a timed window."""

    levels: list[int]
    warmup_s: float
    window_s: float
    headline_repeats: int
    sweep_repeats: int

    @staticmethod
    def add_arguments(
        parser: argparse.ArgumentParser, levels: Sequence[int], warmup_s: float, window_s: float
    ) -> None:
        parser.add_argument(
            "--concurrency",
            type=concurrency_list,
            default=list(levels),
            help=f"comma-separated coroutine counts (default {','.join(map(str, levels))})",
        )
        parser.add_argument("--warmup", type=float, default=warmup_s, help="warm-up seconds")
        parser.add_argument("--duration", type=float, default=window_s, help="window seconds")
        parser.add_argument("--repeats", type=int, default=3, help="runs at 1 and 64 coroutines")
        parser.add_argument("--sweep-repeats", type=int, default=1, help="runs at other levels")

    @classmethod
    def from_arguments(cls, parser: argparse.ArgumentParser, args: argparse.Namespace) -> Sweep:
        if args.duration <= 0 or args.warmup < 0 or min(args.repeats, args.sweep_repeats) < 1:
            parser.error("--duration must be > 0, --warmup >= 0 and the repeats >= 1")
        return cls(args.concurrency, args.warmup, args.duration, args.repeats, args.sweep_repeats)

    def repeats(self, coroutines: int) -> int:
        return self.headline_repeats if coroutines in HEADLINE else self.sweep_repeats

    def describe(self) -> str:
        return (
            f"{self.warmup_s} s warm-up + {self.window_s} s window; {self.headline_repeats} runs"
            f" at {' and '.join(map(str, HEADLINE))} coroutines, {self.sweep_repeats} at the"
            " other levels"
        )

    def settings(self) -> dict[str, Any]:
        """The sweep as the JSON results record it."""
        return {
            "concurrency": self.levels,
            "warmup_s": self.warmup_s,
            "window_s": self.window_s,
            "repeats_at": {str(level): self.repeats(level) for level in self.levels},
        }


T = TypeVar("T")


def in_turns(items: Sequence[T], repeat: int, step: int = 1) -> list[T]:
    """``items`` rotated for run ``repeat`` (from 1), so that each goes first in turn and the
    machine's noise hits all of them alike."""
    turn = (repeat - 1) * step % len(items)
    return [*items[turn:], *items[:turn]]


def redis_benchmark(
    url: str, clients: int, requests: int, command: Sequence[str]
) -> dict[str, Any]:
    """``redis-benchmark -c clients -n requests -q <command>`` against ``url``'s server: the
    rate it serves with next to no client cost. Returns the command, requests/s and p50."""
    parts = urlsplit(url)
    target = ["-h", parts.hostname or "127.0.0.1", "-p", str(parts.port or 6379)]
    argv = ["redis-benchmark", *target, "-c", str(clients), "-n", str(requests), "-q", *command]
    output = subprocess.run(
        argv, capture_output=True, text=True, check=True, timeout=CHILD_TIMEOUT_S
    ).stdout
    found = re.findall(r"([\d.]+) requests per second(?:, p50=([\d.]+) msec)?", output)
    if not found:
        raise RuntimeError(f"cannot read redis-benchmark's output: {output!r}")
    requests_per_s, p50 = found[-1]
    return {
        "command": " ".join(argv),
        "requests_per_s": float(requests_per_s),
        "p50_ms": float(p50) if p50 else None,
        "output": output.splitlines()[-1] if output else "",
    }


def script_sha(url: str, script: str) -> str:
    """Loads ``script`` with ``redis-cli SCRIPT LOAD`` and returns its SHA."""
    parts = urlsplit(url)
    target = ["-h", parts.hostname or "127.0.0.1", "-p", str(parts.port or 6379)]
    return subprocess.run(
        ["redis-cli", *target, "SCRIPT", "LOAD", script],
        capture_output=True,
        text=True,
        check=True,
        timeout=CHILD_TIMEOUT_S,
    ).stdout.strip()


# ---------------------------------------------------------------------------------------------
# Child processes: one JSON object per line, requests on stdin, replies on stdout


class Child:
    """The parent's side of a child process (its stderr goes to the parent's stderr)."""

    def __init__(self, process: asyncio.subprocess.Process, label: str) -> None:
        self._process = process
        self.label = label

    @classmethod
    async def start(cls, argv: Sequence[str], label: str) -> Child:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=1 << 24,
        )
        return cls(process, label)

    @property
    def pid(self) -> int:
        return self._process.pid

    async def send(self, message: dict[str, Any]) -> None:
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps(message).encode() + b"\n")
        await self._process.stdin.drain()

    async def receive(self, timeout_s: float = CHILD_TIMEOUT_S) -> dict[str, Any]:
        """The child's next reply; raises if it exits or stays silent for ``timeout_s``."""
        assert self._process.stdout is not None
        try:
            line = await asyncio.wait_for(self._process.stdout.readline(), timeout_s)
        except asyncio.TimeoutError:
            raise TimeoutError(f"{self.label}: no reply within {timeout_s:.0f} s") from None
        if not line:
            code = await asyncio.wait_for(self._process.wait(), 10.0)
            raise RuntimeError(f"{self.label} exited with status {code} (its stderr is above)")
        message: dict[str, Any] = json.loads(line)
        return message

    async def stop(self, timeout_s: float = 60.0) -> int:
        """Closes its stdin (the signal to finish), waits for it, kills it if it lingers."""
        if self._process.stdin is not None and not self._process.stdin.is_closing():
            self._process.stdin.close()
        try:
            return await asyncio.wait_for(self._process.wait(), timeout_s)
        except asyncio.TimeoutError:
            self._process.kill()
            return await self._process.wait()

    def kill(self) -> None:
        if self._process.returncode is None:
            self._process.kill()


def reply(message: dict[str, Any]) -> None:
    """Child side: sends one reply to the parent."""
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


async def requests() -> AsyncIterator[dict[str, Any]]:
    """Child side: the parent's requests, until it closes our stdin."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 24)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        request: dict[str, Any] = json.loads(line)
        yield request


# ---------------------------------------------------------------------------------------------
# Holding many leases at once (holding.py runs this in a fresh child per size and library)


class Holder(Protocol):
    """One library's way of holding leases, each in its own task as a stream would."""

    renew_every_s: float

    async def warm_up(self) -> None:
        """Connects and loads the scripts (one acquire + release)."""

    async def hold(
        self,
        user_id: str,
        gate: asyncio.Semaphore,
        on_acquired: Callable[[], None],
        stop: asyncio.Event,
    ) -> None:
        """Acquires under ``gate``, calls ``on_acquired``, holds the lease until ``stop``."""

    def lost(self) -> int:
        """Leases this process has found lost so far."""

    def reclaimed(self) -> int:
        """Leases found expired in Redis by a renewal and taken back (so not counted lost)."""

    async def active_count(self) -> int:
        """Unexpired leases in the global pool, by the library's own count."""

    async def close(self) -> None:
        """Releases what is still held."""


async def serve_holder(holder: Holder, leases: int, acquire_concurrency: int) -> None:
    """The holding child: ``leases`` tasks each acquire a lease (at most ``acquire_concurrency``
    acquires in flight) and hold it until the parent asks to stop.

    Replies ``held`` one second after every acquire has settled (with the resident memory
    before and then: "before" already counts the parked tasks, so the difference is the leases'
    own cost, read once the acquires' short-lived memory has been given back), then, on the
    parent's ``stop`` request, ``done`` with the lost and active counts.
    """
    await holder.warm_up()
    start, stop, settled = asyncio.Event(), asyncio.Event(), asyncio.Event()
    gate = asyncio.Semaphore(acquire_concurrency)
    tally = {"acquired": 0, "failed": 0}
    first_error: list[str] = []

    def count(outcome: str) -> None:
        tally[outcome] += 1
        if tally["acquired"] + tally["failed"] >= leases:
            settled.set()

    async def one(n: int) -> None:
        # The holding coroutine (its frame, the user id, the callback) exists before "before",
        # so the difference counts the lease, not the harness.
        holding = holder.hold(f"hold-user-{n}", gate, functools.partial(count, "acquired"), stop)
        await start.wait()
        try:
            await holding
        except Exception as error:
            first_error.append(repr(error))
            count("failed")

    tasks = [asyncio.create_task(one(n)) for n in range(leases)]
    await asyncio.sleep(0.1)  # every task parked on `start`
    rss_before = rss_bytes(os.getpid())
    started = time.perf_counter()
    start.set()
    await settled.wait()
    acquire_s = time.perf_counter() - started
    await asyncio.sleep(1.0)
    reply(
        {
            "kind": "held",
            "renew_every_s": holder.renew_every_s,
            "acquired": tally["acquired"],
            "failed": tally["failed"],
            "first_error": first_error[0] if first_error else None,
            "acquire_s": acquire_s,
            "rss_before": rss_before,
            "rss_after": rss_bytes(os.getpid()),
        }
    )
    async for request in requests():
        if request["kind"] == "stop":
            active = await holder.active_count()
            reply(
                {
                    "kind": "done",
                    "lost": holder.lost(),
                    "reclaimed": holder.reclaimed(),
                    "active": active,
                }
            )
            break
    await holder.close()
    stop.set()
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 120.0)


# ---------------------------------------------------------------------------------------------
# Processes


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (all its threads), from ``/proc/<pid>/stat``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


# The Rust core's tokio threads are named so (``src/runtime.rs``).
CORE_THREAD = "stream-lease"
SCHEDSTAT = Path("/proc/self/schedstat").exists()
# The floor of a call to Redis: one round trip of a one-command script (redis-py, hiredis).
FLOOR_SCRIPT = "return redis.call('INCR', KEYS[1])"


def thread_cpu(pid: int | str = "self") -> dict[int, tuple[str, float, int]]:
    """Each thread of process ``pid``: its name, CPU seconds so far (``schedstat``'s on-CPU ns
    where the kernel counts them, else ``stat``'s utime + stime ticks), the CPU it last ran on."""
    found: dict[int, tuple[str, float, int]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            ns = int((task / "schedstat").read_text().split()[0]) if SCHEDSTAT else 0
        except OSError:  # the thread ended meanwhile
            continue
        ticks = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        found[int(task.name)] = (name, ns / 1e9 if ns else ticks, int(fields[36]))
    return found


def rss_bytes(pid: int) -> int:
    """Resident set size of process ``pid``, from ``/proc/<pid>/status``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS in /proc/{pid}/status")


class ServerProcess:
    """A benchmark's server in a process of its own, on a free loopback port (``--port``)."""

    def __init__(self, name: str, argv: Sequence[str]) -> None:
        self.name = name
        self.port = free_port()
        self.process = subprocess.Popen([*argv, "--port", str(self.port)], stdin=subprocess.DEVNULL)

    def running(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 15 s."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15.0)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


# ---------------------------------------------------------------------------------------------
# Reports


def cpu_model() -> str:
    try:
        with Path("/proc/cpuinfo").open(encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info() -> dict[str, Any]:
    """What the figures were measured on."""
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": cpu_model(),
        "loadavg_at_start": Path("/proc/loadavg").read_text().split()[:3],
        "platform": platform.platform(),
        "python": platform.python_version(),
        "event_loop": "asyncio (default loop, no uvloop)",
    }


def write_json(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    partial.replace(path)


def print_table(header: Sequence[str], rows: Sequence[Sequence[str]], left: int = 2) -> None:
    """Prints a table; the first ``left`` columns are left-aligned, the others right-aligned."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            cell.ljust(width) if n < left else cell.rjust(width)
            for n, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    print()
    print(line(header))
    print("-" * len(line(header)))
    for row in rows:
        print(line(row))
    print("-" * len(line(header)))
