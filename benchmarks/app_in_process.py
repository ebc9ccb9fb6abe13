"""What the rate-limit forms cost a FastAPI app, without an HTTP server in the way: the app's
ASGI callable driven in-process by concurrent requests, each thread's CPU per request.

An HTTP benchmark (``rate_http.py``) mixes the forms' cost with the server's parsing and the
load generator sharing the machine; here the app is called directly, as a server would call it,
so what is left is the app's own work and the core's. Variants (``GET /`` answering
``{"msg": "Hello World"}``):

* ``plain``: no limiter;
* ``empty-dependency``: ``dependencies=[Depends(nothing)]``, an async ``nothing(request)``;
* ``dependency``: two policies through ``Depends(manager.rate_limit(per_minute, per_day,
  key=user))`` and ``install_exception_handler(app)`` (its ``RateLimitHeaders`` and
  ``StreamEndMiddleware``), as ``rate_http.py`` serves it;
* ``middleware``: the same two policies through ``RateLimitMiddleware``;
* ``dependency-leased``, ``middleware-leased``: the same, both policies ``lease_units=True``.

``user`` is the ``X-User`` header, one user per coroutine. Each variant runs in a process of its
own (a manager per process, as a worker has), warms up, then serves ``--requests`` requests split
among ``--coroutines`` coroutines; the variants take turns, ``--repeats`` times. Measured: the
wall time per request and the CPU per request of the event loop's thread and of the core's
threads (``stream-lease``), from ``/proc/self/task/*/schedstat``. The table gives the medians.

``--instructions`` counts instead of timing: each variant's process runs twice under valgrind's
callgrind (``--separate-threads=yes``), serving 400 and then 1,600 requests after the same
warm-up, and the difference divided by 1,200 is one request's instructions on the event loop's
thread and on every other thread (the core's). Instructions do not drift with the shared
machine's speed, so a change to the forms' Python or to a call into the core shows in one run.
Under valgrind SHA-256 runs without the CPU's SHA instructions, so the identity's HMAC counts
dearer than it runs (about 17k instructions a hit, 300 ns natively). Needs valgrind.

``--package-dir DIR`` runs every variant with the ``fastapi_stream_lease`` package found in
``DIR`` (prepended to ``PYTHONPATH``): a copy of another build's installed package, to compare
two builds in turns on the same machine.

Usage, from the repository root::

    benchmarks/.venv/bin/python benchmarks/app_in_process.py --url redis://127.0.0.1:6380/0

The table is printed; the raw figures go to ``benchmarks/results/app_in_process.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Request

from fastapi_stream_lease import (
    LeaseConfig,
    RateLimit,
    RateLimitMiddleware,
    StreamLeaseManager,
    install_exception_handler,
)

from common import RESULTS_DIR, in_turns, machine_info, print_table, write_json

VARIANTS = (
    "plain",
    "empty-dependency",
    "dependency",
    "middleware",
    "dependency-leased",
    "middleware-leased",
)
DEFAULT_OUTPUT = RESULTS_DIR / "app_in_process.json"


def build_app(variant: str, url: str, prefix: str) -> FastAPI:
    def user(request: Request) -> str:
        return request.headers.get("x-user", "anonymous")

    async def nothing(request: Request) -> None:
        return None

    app = FastAPI()
    dependencies = [Depends(nothing)] if variant == "empty-dependency" else []
    if variant.startswith(("dependency", "middleware")):
        config = LeaseConfig(key_prefix=prefix, identity_secret=b"app_in_process.py secret")
        manager = StreamLeaseManager(url=url, config=config)
        lease_units = variant.endswith("-leased")
        policies = (
            RateLimit("per_minute", 10**8, per=60, lease_units=lease_units),
            RateLimit("per_day", 10**11, per=86_400, lease_units=lease_units),
        )
        if variant.startswith("dependency"):
            dependencies = [Depends(manager.rate_limit(*policies, key=user))]
        else:
            app.add_middleware(
                RateLimitMiddleware, manager=manager, routes={"/": policies}, key=user
            )
        install_exception_handler(app)

    @app.get("/", dependencies=dependencies)
    async def hello() -> dict[str, str]:
        return {"msg": "Hello World"}

    return app


def thread_cpu_ns() -> dict[str, int]:
    """CPU nanoseconds of this process's threads, summed by thread name; the main thread (the
    event loop's) as ``loop`` (under valgrind it is not named ``python``)."""
    totals: dict[str, int] = {}
    for tid in os.listdir("/proc/self/task"):
        task = Path("/proc/self/task", tid)
        name = "loop" if int(tid) == os.getpid() else (task / "comm").read_text().strip()
        totals[name] = totals.get(name, 0) + int((task / "schedstat").read_text().split()[0])
    return totals


async def serve(app: FastAPI, requests: int, coroutines: int) -> dict[str, float]:
    """``requests`` requests split among ``coroutines``; the measurement, per request."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": "/",
        "raw_path": b"/",
        "root_path": "",
        "query_string": b"",
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 5000),
    }

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def client(user: int, count: int) -> None:
        statuses: list[int] = []

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                statuses.append(message["status"])

        headers = [(b"x-user", f"user-{user}".encode())]
        for _ in range(count):
            await app({**scope, "headers": headers}, receive, send)
        if any(status != 200 for status in statuses):
            raise RuntimeError(f"non-200 answers: {sorted(set(statuses))}")

    await asyncio.gather(*(client(user, 200 // coroutines + 1) for user in range(coroutines)))
    loop = asyncio.get_running_loop()
    before, started = thread_cpu_ns(), loop.time()
    await asyncio.gather(*(client(user, requests // coroutines) for user in range(coroutines)))
    elapsed, after = loop.time() - started, thread_cpu_ns()
    served = requests // coroutines * coroutines
    core = sum(after[n] - before.get(n, 0) for n in after if n == "stream-lease")
    return {
        "wall_us": elapsed / served * 1e6,
        "loop_us": (after["loop"] - before["loop"]) / served / 1e3,
        "core_us": core / served / 1e3,
    }


def child(
    args: argparse.Namespace, variant: str, prefix: str, requests: int
) -> tuple[list[str], dict[str, str]]:
    """The command and environment of a process serving ``variant``."""
    env = dict(os.environ)
    if args.package_dir:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [args.package_dir, env.get("PYTHONPATH")]))
    command = [sys.executable, "-W", "ignore", __file__, "--serve", variant, "--url", args.url]
    command += ["--prefix", prefix, "--requests", str(requests)]
    command += ["--coroutines", str(args.coroutines)]
    return command, env


def run_variant(args: argparse.Namespace, variant: str, prefix: str) -> dict[str, float]:
    command, env = child(args, variant, prefix, args.requests)
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


#: The two runs of ``--instructions``: their difference is what these requests cost.
FEWER, MORE = 400, 1600


def counted(args: argparse.Namespace, variant: str, prefix: str, scratch: Path) -> dict[str, int]:
    """One request's instructions (callgrind) on the loop's thread and on the others."""
    totals = {}
    for requests in (FEWER, MORE):
        out = scratch / f"{variant}.{requests}"
        command, env = child(args, variant, prefix, requests)
        callgrind = ["valgrind", "--tool=callgrind", "--separate-threads=yes"]
        callgrind.append(f"--callgrind-out-file={out}")
        subprocess.run(callgrind + command, env=env, capture_output=True, check=True)
        threads = {"loop": 0, "core": 0}
        for part in scratch.glob(f"{out.name}-*"):
            lines = part.read_text().splitlines()
            total = next(int(line.split()[1]) for line in lines if line.startswith("summary:"))
            threads["loop" if part.name.endswith("-01") else "core"] += total
        totals[requests] = threads
    return {t: (totals[MORE][t] - totals[FEWER][t]) // (MORE - FEWER) for t in ("loop", "core")}


def count_instructions(args: argparse.Namespace, prefix: str) -> None:
    with tempfile.TemporaryDirectory(prefix="app-in-process-") as scratch:
        figures = {variant: counted(args, variant, prefix, Path(scratch)) for variant in VARIANTS}
    plain = sum(figures["plain"].values())
    rows = [
        [variant, f"{f['loop']:,}", f"{f['core']:,}", f"{sum(f.values()) - plain:+,}"]
        for variant, f in figures.items()
    ]
    print_table(["variant", "loop thread", "core threads", "against plain"], rows, left=1)
    print(
        f"instructions per request (callgrind: {MORE} requests less {FEWER}, by"
        f" {args.coroutines} coroutines)"
        + (f"; package from {args.package_dir}" if args.package_dir else "")
    )
    settings = {**vars(args), "output": str(args.output)}
    write_json(
        args.output,
        {"machine": machine_info(), "settings": settings, "instructions_per_request": figures},
    )
    print(f"raw figures: {args.output}")


def main() -> None:
    parser = argparse.ArgumentParser(description="The rate-limit forms' cost, in-process.")
    parser.add_argument("--url", required=True, help="Redis URL, e.g. redis://127.0.0.1:6380/0")
    parser.add_argument("--requests", type=int, default=8000, help="requests per run")
    parser.add_argument("--coroutines", type=int, default=64, help="concurrent requests")
    parser.add_argument("--repeats", type=int, default=3, help="runs per variant")
    parser.add_argument("--package-dir", help="a fastapi_stream_lease package's parent directory")
    parser.add_argument(
        "--instructions", action="store_true", help="count instructions (callgrind), not time"
    )
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="JSON results file")
    parser.add_argument("--serve", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--prefix", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.requests < args.coroutines or args.coroutines < 1 or args.repeats < 1:
        parser.error("--coroutines and --repeats must be >= 1, --requests >= --coroutines")
    if args.serve:
        app = build_app(args.serve, args.url, args.prefix)
        print(json.dumps(asyncio.run(serve(app, args.requests, args.coroutines))))
        return

    prefix = f"inproc-{uuid.uuid4().hex[:8]}"
    if args.instructions:
        if not shutil.which("valgrind"):
            parser.error("--instructions needs valgrind (scripts/apt-install.sh valgrind)")
        count_instructions(args, prefix)
        return
    runs: dict[str, list[dict[str, float]]] = {variant: [] for variant in VARIANTS}
    for repeat in range(1, args.repeats + 1):
        for variant in in_turns(VARIANTS, repeat):
            runs[variant].append(run_variant(args, variant, prefix))
    figures = ("wall_us", "loop_us", "core_us")
    medians = {v: {f: statistics.median(r[f] for r in runs[v]) for f in figures} for v in VARIANTS}
    rows = [
        [variant, *(f"{medians[variant][figure]:.1f}" for figure in figures)]
        for variant in VARIANTS
    ]
    print_table(["variant", "wall us/req", "loop us/req", "core us/req"], rows, left=1)
    print(
        f"{args.requests} requests by {args.coroutines} coroutines, medians of {args.repeats} runs"
        + (f"; package from {args.package_dir}" if args.package_dir else "")
    )
    write_json(
        args.output,
        {
            "machine": machine_info(),
            "settings": {**vars(args), "output": str(args.output)},
            "medians": medians,
            "runs": runs,
        },
    )
    print(f"raw figures: {args.output}")


if __name__ == "__main__":
    main()
