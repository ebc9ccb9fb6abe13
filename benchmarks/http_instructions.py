"""Instructions per HTTP request: the endpoints of ``rate_http.py``, each served by one uvicorn
worker (h11) under valgrind's callgrind, counted over a fixed number of requests.

Throughput on a shared machine drifts by several points between runs of the same endpoint
(``rate_http.py`` reports each turn's spread); instructions do not. Each server starts under
callgrind, takes ``--warm-up`` requests, has its counters zeroed (``callgrind_control -z``),
serves ``--requests`` requests over ``--connections`` keep-alive connections (``X-User`` round
robin over ``--users`` users, as wrk sends them in ``rate_http.py``), and dumps its counters
(``callgrind_control -d``): all its threads' instructions, divided by the requests. The table
gives each endpoint's count, its difference from the plain endpoint's, and the Redis script
calls per request (``INFO commandstats``) made while it was counted.

Under callgrind a server runs about 50 times slower, so each user's hits come that much slower:
with ``lease_units=True`` the slabs, sized for a user's hits over 100 ms, shrink until most hits
make the round trip a server at full speed makes for a few in a hundred. The leased endpoints'
counts are upper bounds; their script calls per request say how far they are from it. The other
endpoints make the same calls at any speed.

Usage, from the repository root (needs valgrind)::

    benchmarks/.venv/bin/python benchmarks/http_instructions.py --url redis://127.0.0.1:6380/0 \\
        --variants plain,plain-headers,fastapi_stream_lease-middleware

The table is printed; the raw figures go to ``benchmarks/results/http_instructions.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis
from rate_http import USERS, VARIANTS, Server

from common import RESULTS_DIR, machine_info, print_table, write_json

DEFAULT_OUTPUT = RESULTS_DIR / "http_instructions.json"
#: Tries at a first answer (about 0.2 s each) a server under callgrind has to start.
START_TRIES = 900


class CountedServer(Server):
    """A ``rate_http.py`` server under callgrind, its counters written to ``out``."""

    def __init__(self, variant: str, url: str, prefix: str, out: Path) -> None:
        callgrind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--quiet"]
        super().__init__(variant, url, prefix, freeze_heap=False, under=callgrind)
        self.out = out

    def command(self, what: str) -> None:
        """``callgrind_control -z`` (zero) or ``-d`` (dump) for this server."""
        subprocess.run(
            ["callgrind_control", what, str(self.process.pid)],
            capture_output=True,
            check=True,
            timeout=60,
        )


async def _requests(port: int, requests: int, connections: int, users: int) -> None:
    """``requests`` GETs of ``/`` over ``connections`` keep-alive connections; each answer read
    whole and checked to be a 200."""

    async def one_connection(count: int, first_user: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for n in range(count):
                user = (first_user + n) % users
                writer.write(
                    f"GET / HTTP/1.1\r\nHost: bench\r\nX-User: user-{user}\r\n\r\n".encode()
                )
                head = await reader.readuntil(b"\r\n\r\n")
                if not head.startswith(b"HTTP/1.1 200"):
                    raise RuntimeError(f"answered {head.splitlines()[0]!r}")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                await reader.readexactly(length)
        finally:
            writer.close()

    each, rest = divmod(requests, connections)
    await asyncio.gather(*(one_connection(each + (k < rest), k) for k in range(connections)))


def script_calls(client: redis.Redis) -> int:
    stats: dict[str, Any] = client.info("commandstats")
    return sum(
        v["calls"]
        for k, v in stats.items()
        if k in ("cmdstat_fcall", "cmdstat_evalsha", "cmdstat_eval")
    )


def count(args: argparse.Namespace, variant: str, scratch: Path) -> dict[str, Any]:
    """One endpoint's instructions and script calls per request."""
    out = scratch / variant
    prefix = f"httpinstr-{uuid.uuid4().hex[:8]}"
    server = CountedServer(variant, args.url, prefix, out)
    client = redis.Redis.from_url(args.url)
    try:
        server.wait_ready(tries=START_TRIES)
        asyncio.run(_requests(server.port, args.warm_up, args.connections, args.users))
        server.command("-z")
        calls_before = script_calls(client)
        asyncio.run(_requests(server.port, args.requests, args.connections, args.users))
        calls = script_calls(client) - calls_before
        server.command("-d")
        dump = Path(f"{out}.1")
        for _try in range(300):
            if dump.exists() and "summary:" in dump.read_text():
                break
            time.sleep(0.1)
        summary = next(
            int(line.split()[1])
            for line in dump.read_text().splitlines()
            if line.startswith("summary:")
        )
    finally:
        server.stop()
        client.close()
    return {
        "variant": variant,
        "instructions_per_request": summary // args.requests,
        "script_calls_per_request": calls / args.requests,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="Instructions per HTTP request, by endpoint.")
    parser.add_argument("--url", required=True, help="Redis URL, e.g. redis://127.0.0.1:6380/0")
    parser.add_argument(
        "--variants",
        default="plain,plain-headers,fastapi_stream_lease-middleware-leased",
        help=f"comma-separated endpoints (plain always runs; from {','.join(VARIANTS)})",
    )
    parser.add_argument("--requests", type=int, default=2000, help="requests counted")
    parser.add_argument("--warm-up", type=int, default=400, help="requests before counting")
    parser.add_argument("--connections", type=int, default=8, help="keep-alive connections")
    parser.add_argument("--users", type=int, default=USERS, help="X-User values, round robin")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="JSON results file")
    args = parser.parse_args()
    variants = ["plain", *(v for v in args.variants.split(",") if v and v != "plain")]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown --variants {', '.join(unknown)}: choose from {', '.join(VARIANTS)}")
    if args.requests < 1 or args.connections < 1 or args.users < 1 or args.warm_up < 0:
        parser.error("--requests, --connections and --users must be >= 1, --warm-up >= 0")
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            parser.error(f"{tool} is not on PATH: install valgrind")
    with tempfile.TemporaryDirectory() as scratch:
        results = [count(args, variant, Path(scratch)) for variant in variants]
    plain = results[0]["instructions_per_request"]
    rows = [
        [
            r["variant"],
            f"{r['instructions_per_request']:,}",
            "" if r is results[0] else f"{r['instructions_per_request'] - plain:+,}",
            ""
            if r is results[0]
            else f"{100 * (r['instructions_per_request'] / plain - 1):+.1f} %",
            f"{r['script_calls_per_request']:.3f}",
        ]
        for r in results
    ]
    header = ["endpoint", "instructions/request", "against plain", "", "script calls/request"]
    print_table(header, rows, left=1)
    print(
        f"one uvicorn worker (h11) under callgrind, all threads; {args.requests} requests after"
        f" {args.warm_up}, {args.connections} connections, {args.users} users"
    )
    settings = {**vars(args), "output": str(args.output)}
    write_json(args.output, {"machine": machine_info(), "settings": settings, "results": results})


if __name__ == "__main__":
    main()
