"""End to end: what a lease costs a real SSE endpoint served by uvicorn.

Three uvicorn servers (one process each, ``loop="asyncio"``, ``http="h11"``, no access log)
serve the README quickstart's endpoint, ``GET /api/chat/stream?user_id=...``, which streams 5
short ``data:`` events:

* ``lease``: as in the quickstart, ``lease = await lease_manager.acquire(user_id)`` and
  ``StreamingResponse(lease.wrap(token_generator()))``, the manager built from a
  ``redis.asyncio`` client (``max_per_user=2, max_global=500, lease_seconds=30``) on the Redis
  at ``--url``;
* ``peer``: the same quickstart, word for word, on the pure-Python peer (PyPI
  ``fastapi-stream-lease`` 0.6.3, which has the same import name and API), served from
  ``benchmarks/.venv-peer``;
* ``floor``: the same endpoint without a limiter, awaiting first one round trip of a
  one-command script through redis-py with hiredis (``return redis.call('INCR', KEYS[1])``,
  ``redis.asyncio.from_url(url)``): what any call to Redis from the request path costs;
* ``none``: the same endpoint without any limiter.

A load generator in its own process (raw asyncio sockets, HTTP/1.1 keep-alive, chunked bodies
parsed by hand so that the client stays cheap) runs N clients (1, then 32), each opening,
reading and finishing one stream after another, one user id per client, for a warm-up and a
fixed window. It counts the admitted streams (200 with all 5 events) completed in the window
and times each stream's first byte (request sent -> status line received: the acquire happens
before it) and its last byte (the release happens before it). It also reads over the window the
server process's CPU time by thread (``/proc/<pid>/task``: the event loop's thread, the Rust
core's ``stream-lease`` threads, any other) and Redis's counters (``INFO``: commands, the time
spent in script calls, its CPU), hence each per stream. The variants take turns, ``--repeats``
times each; the table gives the medians and the overhead per stream of the lease, the peer and
the floor: the difference from ``none`` in time to first byte (p50, p99), in time to last byte,
and in server CPU per stream. A second table says where the added CPU goes (the loop's thread:
Python and the framework around the call; the core's threads: the call's client side; Redis's
script time and CPU) and gives the lease's added p50 time to first byte and server CPU as
ratios to the peer's and the floor's, beside the target they are read against. At the end every
lease must be back: the global pool is checked to be empty.

Run it from the repository root with ``bash benchmarks/run.sh``, or against a Redis of your own
(keys under ``{e2e}:``)::

    benchmarks/.venv/bin/python benchmarks/end_to_end.py --url redis://127.0.0.1:6380/0

The table is printed; the raw figures go to ``benchmarks/results/end_to_end.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from fastapi_stream_lease import LeaseConfig, StreamLeaseManager, StreamLeaseRejected

from common import (
    CORE_THREAD,
    FLOOR_SCRIPT,
    PEER_PYTHON,
    RESULTS_DIR,
    Child,
    ServerProcess,
    cpu_seconds,
    machine_info,
    percentile_ms,
    print_table,
    redis_counters,
    reply,
    requests,
    script_micros,
    thread_cpu,
    write_json,
)
from support.urls import without_password

SCRIPT = Path(__file__).resolve()
DEFAULT_OUTPUT = RESULTS_DIR / "end_to_end.json"
VARIANTS = ("lease", "peer", "floor", "none")
LIMITED = ("lease", "peer", "floor")
# The peer's quickstart runs this very file in the peer's virtualenv, where fastapi_stream_lease
# is the peer.
CLIENT_LEVELS = (1, 32)
EVENTS = ("Hello", "world", "this", "is", "streamed!")
KEY_PREFIX = "e2e"
STREAM_TIMEOUT_S = 10.0
MAX_CHUNKS = 100


# ---------------------------------------------------------------------------------------------
# The server (serve mode)


async def token_generator() -> AsyncIterator[str]:
    for word in EVENTS:
        yield f"data: {word}\n\n"


def build_app(variant: str, url: str) -> FastAPI:
    """The quickstart's app (``lease``, and ``peer`` when run by the peer's Python) or the
    same endpoint with no limiter (``none``)."""
    app = FastAPI()
    if variant == "none":

        @app.get("/api/chat/stream")
        async def unlimited_stream(user_id: str = "user_123") -> StreamingResponse:
            return StreamingResponse(token_generator(), media_type="text/event-stream")

        return app
    if variant == "floor":
        floor_script = aioredis.from_url(url).register_script(FLOOR_SCRIPT)

        @app.get("/api/chat/stream")
        async def floor_stream(user_id: str = "user_123") -> StreamingResponse:
            await floor_script(keys=[f"{{{KEY_PREFIX}-floor}}:{user_id}"])
            return StreamingResponse(token_generator(), media_type="text/event-stream")

        return app

    lease_manager = StreamLeaseManager(
        redis=aioredis.from_url(url),
        config=LeaseConfig(
            max_per_user=2, max_global=500, lease_seconds=30.0, key_prefix=f"{KEY_PREFIX}-{variant}"
        ),
    )

    @app.exception_handler(StreamLeaseRejected)
    async def lease_rejected_handler(request: Request, exc: StreamLeaseRejected) -> Response:
        return exc.as_response()

    @app.get("/api/chat/stream")
    async def chat_stream(user_id: str = "user_123") -> StreamingResponse:
        lease = await lease_manager.acquire(user_id)
        return StreamingResponse(lease.wrap(token_generator()), media_type="text/event-stream")

    return app


def serve(variant: str, url: str, port: int) -> None:
    uvicorn.run(
        build_app(variant, url),
        host="127.0.0.1",
        port=port,
        loop="asyncio",
        http="h11",
        log_level="warning",
        access_log=False,
    )


# ---------------------------------------------------------------------------------------------
# The load generator (load mode)


@dataclass
class Tally:
    """What the clients of one run saw within the window."""

    admitted: int = 0
    refused: int = 0
    dropped_connections: int = 0
    ttfb_s: list[float] = field(default_factory=list)
    ttlb_s: list[float] = field(default_factory=list)


async def read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    if "content-length" in headers:
        return await reader.readexactly(int(headers["content-length"]))
    body = bytearray()
    for _chunk in range(MAX_CHUNKS):
        size = int((await reader.readline()).split(b";")[0], 16)
        if size == 0:
            await reader.readline()
            return bytes(body)
        body += await reader.readexactly(size)
        await reader.readline()
    raise RuntimeError(f"more than {MAX_CHUNKS} chunks in one response")


async def one_stream(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
) -> tuple[bool, float, float, bool]:
    """Sends ``request``, reads the whole response: (admitted, ttfb s, ttlb s, keep-alive)."""
    started = time.perf_counter()
    writer.write(request)
    status_line = await reader.readline()
    first_byte = time.perf_counter()
    if not status_line:
        raise ConnectionResetError("the server closed the connection")
    headers: dict[str, str] = {}
    for _header in range(100):
        line = (await reader.readline()).decode("latin-1").strip()
        if not line:
            break
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    body = await read_body(reader, headers)
    last_byte = time.perf_counter()
    admitted = status_line.split()[1:2] == [b"200"] and body.count(b"data: ") == len(EVENTS)
    keep_alive = headers.get("connection", "").lower() != "close"
    return admitted, first_byte - started, last_byte - started, keep_alive


async def client_loop(
    port: int, user_id: str, window_start: float, window_end: float, tally: Tally
) -> None:
    request = (
        f"GET /api/chat/stream?user_id={user_id} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        "Accept: text/event-stream\r\n\r\n"
    ).encode()
    connection: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
    try:
        while time.perf_counter() < window_end:
            if connection is None:
                connection = await asyncio.open_connection("127.0.0.1", port)
            try:
                admitted, ttfb, ttlb, keep_alive = await asyncio.wait_for(
                    one_stream(*connection, request), STREAM_TIMEOUT_S
                )
            except (ConnectionError, asyncio.IncompleteReadError):
                tally.dropped_connections += 1
                connection[1].close()
                connection = None
                continue
            if not keep_alive:
                connection[1].close()
                connection = None
            finished = time.perf_counter()
            if not window_start <= finished <= window_end:
                continue
            if not admitted:
                tally.refused += 1
                continue
            tally.admitted += 1
            tally.ttfb_s.append(ttfb)
            tally.ttlb_s.append(ttlb)
    finally:
        if connection is not None:
            connection[1].close()


THREAD_PARTS = ("loop", "core", "other")


@dataclass(frozen=True)
class Readings:
    """What the load generator reads at each edge of the window."""

    at: float
    server_cpu: float
    server_threads: dict[str, float]
    load_cpu: float
    redis: tuple[int, int, float]
    script_us: int


def server_thread_cpu(pid: int) -> dict[str, float]:
    """The server's CPU seconds so far by part: its event loop's thread (the main one, whose
    id is the process's), the core's tokio threads, any other."""
    parts = dict.fromkeys(THREAD_PARTS, 0.0)
    for tid, (name, cpu, _processor) in thread_cpu(pid).items():
        parts["loop" if tid == pid else "core" if name == CORE_THREAD else "other"] += cpu
    return parts


async def load_run(request: dict[str, Any]) -> dict[str, Any]:
    """One run: ``clients`` client loops through the warm-up and the window."""
    port, clients, server_pid = request["port"], request["clients"], request["server_pid"]
    window_start = time.perf_counter() + request["warmup_s"]
    window_end = window_start + request["window_s"]
    tally = Tally()

    stats = aioredis.from_url(request["url"])  # its own connection, outside the server's

    async def readings_at(moment: float) -> Readings:
        await asyncio.sleep(max(0.0, moment - time.perf_counter()))
        return Readings(
            at=time.perf_counter(),
            server_cpu=cpu_seconds(server_pid),
            server_threads=server_thread_cpu(server_pid),
            load_cpu=cpu_seconds(os.getpid()),
            redis=await redis_counters(stats),
            script_us=await script_micros(stats),
        )

    loops = [
        client_loop(port, f"e2e-user-{n}", window_start, window_end, tally) for n in range(clients)
    ]
    try:
        (first, last), _ = await asyncio.wait_for(
            asyncio.gather(
                asyncio.gather(readings_at(window_start), readings_at(window_end)),
                asyncio.gather(*loops),
            ),
            request["warmup_s"] + request["window_s"] + STREAM_TIMEOUT_S + 5.0,
        )
    finally:
        await stats.aclose()
    elapsed = last.at - first.at
    ttfb, ttlb = sorted(tally.ttfb_s), sorted(tally.ttlb_s)
    if not ttfb:
        raise RuntimeError(f"no stream admitted within the window on port {port}")
    server_cpu_s = last.server_cpu - first.server_cpu
    per_stream_us = 1e6 / tally.admitted
    threads = {
        part: per_stream_us * (last.server_threads[part] - first.server_threads[part])
        for part in THREAD_PARTS
    }
    return {
        "kind": "run",
        "window_s": elapsed,
        "admitted": tally.admitted,
        "refused": tally.refused,
        "dropped_connections": tally.dropped_connections,
        "streams_per_s": tally.admitted / elapsed,
        "ttfb_p50_ms": percentile_ms(ttfb, 0.50),
        "ttfb_p99_ms": percentile_ms(ttfb, 0.99),
        "ttlb_p50_ms": percentile_ms(ttlb, 0.50),
        "ttlb_p99_ms": percentile_ms(ttlb, 0.99),
        "server_cpu_pct": 100.0 * server_cpu_s / elapsed,
        "server_cpu_ms_per_stream": 1000.0 * server_cpu_s / tally.admitted,
        "load_cpu_pct": 100.0 * (last.load_cpu - first.load_cpu) / elapsed,
        **{f"{part}_thread_us_per_stream": us for part, us in threads.items()},
        "redis_commands_per_stream": (last.redis[0] - first.redis[0]) / tally.admitted,
        "redis_scripts_per_stream": (last.redis[1] - first.redis[1]) / tally.admitted,
        "redis_script_us_per_stream": per_stream_us * 1e-6 * (last.script_us - first.script_us),
        "redis_cpu_us_per_stream": per_stream_us * (last.redis[2] - first.redis[2]),
    }


async def load_generator() -> None:
    async for request in requests():
        reply(await load_run(request))


# ---------------------------------------------------------------------------------------------
# The benchmark (parent)


@dataclass(frozen=True)
class E2ERun:
    variant: str
    clients: int
    repeat: int
    window_s: float
    admitted: int
    refused: int
    dropped_connections: int
    streams_per_s: float
    ttfb_p50_ms: float
    ttfb_p99_ms: float
    ttlb_p50_ms: float
    ttlb_p99_ms: float
    server_cpu_pct: float
    server_cpu_ms_per_stream: float
    load_cpu_pct: float
    loop_thread_us_per_stream: float
    core_thread_us_per_stream: float
    other_thread_us_per_stream: float
    redis_commands_per_stream: float
    redis_scripts_per_stream: float
    redis_script_us_per_stream: float
    redis_cpu_us_per_stream: float


class Server(ServerProcess):
    """One uvicorn process serving one variant on a free port."""

    def __init__(self, variant: str, url: str) -> None:
        python = PEER_PYTHON if variant == "peer" else sys.executable
        super().__init__(variant, [str(python), str(SCRIPT), "--serve", variant, "--url", url])
        self.variant = variant

    @classmethod
    async def start(cls, variant: str, url: str) -> Server:
        server = cls(variant, url)
        await server.wait_ready()
        return server

    async def wait_ready(self) -> None:
        """Bounded: 100 tries over about 20 s, each a real stream."""
        request = f"GET /api/chat/stream HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n\r\n".encode()
        for _try in range(100):
            if not self.running():
                break
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                await asyncio.sleep(0.2)
                continue
            try:
                admitted, *_ = await asyncio.wait_for(
                    one_stream(reader, writer, request), STREAM_TIMEOUT_S
                )
            finally:
                writer.close()
            if admitted:
                return
            raise RuntimeError(f"the {self.variant} server answered its first stream wrongly")
        raise RuntimeError(f"the {self.variant} server did not come up on port {self.port}")


async def measure(
    url: str, repeats: int, warmup_s: float, window_s: float
) -> tuple[list[E2ERun], int]:
    """Every client level, the two variants taking turns; returns the runs and the leases
    left in the global pool at the end (must be 0)."""
    servers: list[Server] = []
    load = await Child.start([sys.executable, str(SCRIPT), "--load"], "load")
    client = aioredis.Redis.from_url(url, socket_timeout=10.0)
    runs: list[E2ERun] = []
    try:
        for variant in VARIANTS:
            servers.append(await Server.start(variant, url))
        for clients in CLIENT_LEVELS:
            for repeat in range(1, repeats + 1):
                order = servers if repeat % 2 else servers[::-1]
                for server in order:
                    await load.send(
                        {
                            "port": server.port,
                            "server_pid": server.process.pid,
                            "url": url,
                            "clients": clients,
                            "warmup_s": warmup_s,
                            "window_s": window_s,
                        }
                    )
                    answer = await load.receive(warmup_s + window_s + 60.0)
                    answer.pop("kind")
                    run = E2ERun(variant=server.variant, clients=clients, repeat=repeat, **answer)
                    runs.append(run)
                    print(
                        f"  {clients:>2} clients #{repeat} {run.variant:<6}"
                        f" {run.streams_per_s:>7,.0f} streams/s"
                        f"  TTFB p50 {run.ttfb_p50_ms:.3f} ms p99 {run.ttfb_p99_ms:.3f} ms"
                        f"  server CPU {run.server_cpu_ms_per_stream:.3f} ms/stream",
                        flush=True,
                    )
        left = int(await client.zcard(f"{{{KEY_PREFIX}-lease}}:global"))
    finally:
        await load.stop()
        for server in servers:
            await asyncio.to_thread(server.stop)
        await client.aclose()
    return runs, left


FIGURES = (
    "streams_per_s",
    "ttfb_p50_ms",
    "ttfb_p99_ms",
    "ttlb_p50_ms",
    "ttlb_p99_ms",
    "server_cpu_ms_per_stream",
    "server_cpu_pct",
    "load_cpu_pct",
    "loop_thread_us_per_stream",
    "core_thread_us_per_stream",
    "other_thread_us_per_stream",
    "redis_commands_per_stream",
    "redis_scripts_per_stream",
    "redis_script_us_per_stream",
    "redis_cpu_us_per_stream",
)
# The figures an overhead row gives as differences from the endpoint without a limiter.
DELTAS = (*FIGURES[1:6], *FIGURES[8:])


def summarize(runs: Sequence[E2ERun]) -> list[dict[str, Any]]:
    """Medians per client level and variant, then each limited variant's overhead per stream
    (its figures minus those of the endpoint without a limiter), then the lease's added p50
    time to first byte and server CPU against the peer's and the floor's."""
    summary: list[dict[str, Any]] = []
    for clients in CLIENT_LEVELS:
        medians = {
            variant: {
                name: statistics.median(
                    getattr(r, name) for r in runs if (r.clients, r.variant) == (clients, variant)
                )
                for name in FIGURES
            }
            for variant in VARIANTS
        }
        refused = sum(r.refused + r.dropped_connections for r in runs if r.clients == clients)
        for variant in VARIANTS:
            summary.append({"clients": clients, "variant": variant, **medians[variant]})
        added: dict[str, dict[str, float]] = {}
        for limited in LIMITED:
            added[limited] = {
                f"{name}_delta": medians[limited][name] - medians["none"][name] for name in DELTAS
            }
            summary.append(
                {
                    "clients": clients,
                    "variant": f"{limited} overhead",
                    "streams_per_s_ratio": medians[limited]["streams_per_s"]
                    / medians["none"]["streams_per_s"],
                    **added[limited],
                    "refused": refused if limited == "lease" else 0,
                }
            )
        summary.append(
            {
                "clients": clients,
                "variant": "lease against the peer and the floor",
                **{
                    f"{name}_added_{versus}": added["lease"][f"{name}_delta"]
                    / added[versus][f"{name}_delta"]
                    for name in ("ttfb_p50_ms", "server_cpu_ms_per_stream")
                    for versus in ("peer", "floor")
                },
                **{
                    f"floor_{name}_added_peer": added["floor"][f"{name}_delta"]
                    / added["peer"][f"{name}_delta"]
                    for name in ("ttfb_p50_ms", "server_cpu_ms_per_stream")
                },
            }
        )
    return summary


ENDPOINTS = {
    "lease": "quickstart (lease, Redis)",
    "peer": "the peer's quickstart",
    "floor": "floor (one script call)",
    "none": "no limiter",
}


def print_results(summary: Sequence[dict[str, Any]], left: int) -> None:
    rows: list[list[str]] = []
    for s in summary:
        if s["variant"].endswith("overhead"):
            rows.append(
                [
                    f"{s['clients']}",
                    s["variant"],
                    f"{s['streams_per_s_ratio']:.2f}x",
                    f"{s['ttfb_p50_ms_delta']:+.3f}",
                    f"{s['ttfb_p99_ms_delta']:+.3f}",
                    f"{s['ttlb_p50_ms_delta']:+.3f}",
                    f"{s['ttlb_p99_ms_delta']:+.3f}",
                    f"{s['server_cpu_ms_per_stream_delta']:+.3f}",
                    "",
                ]
            )
        elif s["variant"] in ENDPOINTS:
            rows.append(
                [
                    f"{s['clients']}",
                    ENDPOINTS[s["variant"]],
                    f"{s['streams_per_s']:,.0f}",
                    f"{s['ttfb_p50_ms']:.3f}",
                    f"{s['ttfb_p99_ms']:.3f}",
                    f"{s['ttlb_p50_ms']:.3f}",
                    f"{s['ttlb_p99_ms']:.3f}",
                    f"{s['server_cpu_ms_per_stream']:.3f}",
                    f"{s['server_cpu_pct']:.0f}% / {s['load_cpu_pct']:.0f}%",
                ]
            )
    header = ["clients", "endpoint", "streams/s", "TTFB p50", "TTFB p99", "TTLB p50", "TTLB p99"]
    print_table([*header, "server CPU/stream", "CPU server/load"], rows)
    refused = sum(s.get("refused", 0) for s in summary)
    print(
        "times in ms, medians of the runs; TTFB = request sent -> status line, TTLB = -> last"
        " byte; server CPU/stream\n= the uvicorn process's CPU ms (all threads) per admitted"
        " stream; overhead rows = lease (or peer, floor) - no limiter.\n"
        f"streams refused or cut: {refused}; leases left in the global pool at the end: {left}"
    )
    print("\nwhere the added time goes, µs per stream (overhead rows: minus no limiter)")
    where = [
        [
            f"{s['clients']}",
            s["variant"],
            f"{s['server_cpu_ms_per_stream_delta'] * 1000:+.0f}",
            f"{s['loop_thread_us_per_stream_delta']:+.0f}",
            f"{s['core_thread_us_per_stream_delta']:+.0f}",
            f"{s['other_thread_us_per_stream_delta']:+.0f}",
            f"{s['redis_scripts_per_stream_delta']:.2f}",
            f"{s['redis_commands_per_stream_delta']:.1f}",
            f"{s['redis_script_us_per_stream_delta']:.1f}",
            f"{s['redis_cpu_us_per_stream_delta']:.1f}",
        ]
        for s in summary
        if s["variant"].endswith("overhead")
    ]
    print_table(
        [
            "clients",
            "overhead",
            "server CPU",
            "loop thread",
            "core threads",
            "other",
            "scripts",
            "commands",
            "Redis script time",
            "Redis CPU",
        ],
        where,
    )
    print(
        "loop thread = Python and the framework around the call; core threads = the call's"
        " client side\n(encoding, I/O, decoding); Redis script time = INFO commandstats' µs in"
        " script calls; Redis CPU = INFO cpu."
    )
    print("\nthe lease's added time against the peer's and the floor's (targets at 1 client)")
    print_table(
        ["clients", "figure", "lease / peer", "floor / peer", "lease / floor"],
        [
            [
                f"{s['clients']}",
                label,
                f"{s[f'{name}_added_peer']:.2f}",
                f"{s[f'floor_{name}_added_peer']:.2f}",
                f"{s[f'{name}_added_floor']:.2f}",
            ]
            for s in summary
            if s["variant"] == "lease against the peer and the floor"
            for name, label in (
                ("ttfb_p50_ms", "TTFB p50 added"),
                ("server_cpu_ms_per_stream", "server CPU added"),
            )
        ],
    )
    print("target: lease / peer <= 0.5; where floor / peer > 0.5, lease / floor <= 1.2 instead.")


def main() -> None:
    parser = argparse.ArgumentParser(
        description="SSE endpoint under uvicorn: lease, peer, floor, none."
    )
    parser.add_argument("--url", help="Redis URL, e.g. redis://127.0.0.1:6380/0")
    parser.add_argument("--repeats", type=int, default=5, help="runs per variant and level")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds before each window")
    parser.add_argument("--duration", type=float, default=4.0, help="seconds of each window")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="JSON results file")
    internal = parser.add_argument_group("internal modes (started by this script)")
    internal.add_argument("--serve", choices=VARIANTS, help="run a server for this variant")
    internal.add_argument("--port", type=int, help="--serve: port to listen on")
    internal.add_argument("--load", action="store_true", help="be the load generator")
    args = parser.parse_args()

    if args.load:
        asyncio.run(load_generator())
        return
    if args.url is None:
        parser.error("--url is required")
    if args.serve:
        serve(args.serve, args.url, args.port)
        return
    if args.duration <= 0 or args.warmup < 0 or args.repeats < 1:
        parser.error("--duration must be > 0, --warmup >= 0 and --repeats >= 1")

    print(
        f"end to end against {args.url}: {args.warmup} s warm-up + {args.duration} s window,"
        f" {args.repeats} runs per variant at {' and '.join(map(str, CLIENT_LEVELS))} clients"
    )
    runs, left = asyncio.run(measure(args.url, args.repeats, args.warmup, args.duration))
    summary = summarize(runs)
    print_results(summary, left)
    write_json(
        args.output,
        {
            "machine": {**machine_info(), "uvicorn": uvicorn.__version__, "http": "h11"},
            "settings": {
                "url": without_password(args.url),
                "client_levels": list(CLIENT_LEVELS),
                "repeats": args.repeats,
                "warmup_s": args.warmup,
                "window_s": args.duration,
                "events_per_stream": len(EVENTS),
            },
            "summary": summary,
            "leases_left_in_global_pool": left,
            "runs": [asdict(r) for r in runs],
        },
    )
    print(f"raw figures: {args.output}")


if __name__ == "__main__":
    main()
