"""What a rate limit costs an HTTP endpoint: one uvicorn worker under wrk, unprotected against
the same endpoint behind this project's limits and behind two Python peers, in one run.

Uvicorn servers (one process each, ``loop="asyncio"``, ``http="h11"``, no access log, as
``end_to_end.py`` starts them) serve ``GET /`` answering ``{"msg": "Hello World"}``:

* ``plain``: no limiter;
* ``empty-dependency``: no limiter, ``dependencies=[Depends(nothing)]`` with an async
  ``nothing(request)`` that returns at once: what any dependency costs, the baseline of the
  dependency form;
* ``plain-headers``: no limiter; a pure ASGI middleware adds to every response's start the two
  headers this project's forms send, ``RateLimit-Policy`` and ``RateLimit`` for both policies,
  of the same length, fixed: what sending them costs the server (h11 checks each header), the
  share of the forms' cost that any limiter sending them pays;
* ``fastapi_stream_lease``: two policies (``per_minute``, ``per_day``) through
  ``dependencies=[Depends(manager.rate_limit(per_minute, per_day, key=user))]``, and
  ``install_exception_handler(app)``, which adds ``StreamEndMiddleware`` with its rate-limit
  headers: every response carries ``RateLimit-Policy`` and ``RateLimit`` for both policies;
* ``fastapi_stream_lease-middleware``: the same two policies through the library's ASGI
  middleware instead of a FastAPI dependency, ``app.add_middleware(RateLimitMiddleware,
  manager=manager, routes={"/": (per_minute, per_day)}, key=user)``, then
  ``install_exception_handler(app)`` (its ``StreamEndMiddleware`` wraps it): the same Redis work
  without FastAPI's dependency solving;
* ``fastapi_stream_lease-leased`` and ``fastapi_stream_lease-middleware-leased``: the two forms
  above with both policies built ``lease_units=True`` (each process serves a busy user's hits
  from units it took ahead, ``docs/guide/rate-limits.md``);
* ``slowapi``: as its README shows, ``Limiter(key_func=user, storage_uri=<redis>,
  headers_enabled=True)``, ``app.state.limiter``, its exception handler, and
  ``@limiter.limit("<n>/minute;<n>/day")`` on the endpoint (which then takes ``request`` and
  ``response``); slowapi runs ``limits``' synchronous Redis storage, its default fixed window,
  and writes the ``X-RateLimit-*`` headers of one limit;
* ``fastapi-limiter``: as its README shows for multiple limiters, two
  ``Depends(RateLimiter(limiter=Limiter(...)))``, each pyrate-limiter ``Limiter`` over a
  ``RedisBucket`` on a redis.asyncio client (pyrate-limiter's README), ``identifier=user``. It
  writes no rate-limit headers.

``user`` is the ``X-User`` request header: wrk (a Lua ``request()``) spreads the requests over
16 users. Limits are far above what a run reaches: nothing is refused (a non-2xx answer fails
the benchmark). Each server gets a 1 s wrk warm-up, then the endpoints take turns, ``--repeats``
times each: ``wrk -t1 -c64 -d<window>s`` (HTTP/1.1 keep-alive, 64 connections). Measured:
requests/s, wrk's latency percentiles, and the server process's CPU per request
(``/proc/<pid>/stat``). The table gives the medians and each limiter's cost against ``plain``:
the throughput lost in %, and the server CPU it adds per request. A run's throughput drifts
with the shared machine: "by turn" is the median of each turn's cost against the plain
endpoint's run of the same turn, seconds apart, with the least and the most.

``--freeze-heap`` has each server call ``gc.freeze()`` once its app is built, as an app can at
the end of its start-up: the cycle collector's full collections then skip the objects made so
far, which a request suspended in a dependency makes frequent (``docs/performance.md``).

Run it from the repository root with ``bash benchmarks/run.sh`` (which installs wrk), or against
a Redis of your own (keys under ``{ratehttp-*}:``, ``LIMITS:`` and ``pyrate-ratehttp-*``)::

    benchmarks/.venv/bin/python benchmarks/rate_http.py --url redis://127.0.0.1:6380/0

The table is printed; the raw figures go to ``benchmarks/results/rate_http.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import http.client
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
import uvicorn
from fastapi import Depends, FastAPI, Request, Response
from fastapi_limiter.depends import RateLimiter
from pyrate_limiter import Duration, Limiter, Rate, RedisBucket
from slowapi import Limiter as SlowLimiter
from slowapi import _rate_limit_exceeded_handler
from slowapi.errors import RateLimitExceeded

from fastapi_stream_lease import (
    LeaseConfig,
    RateLimit,
    RateLimitMiddleware,
    StreamLeaseManager,
    install_exception_handler,
)

from common import (
    PROJECT,
    RESULTS_DIR,
    ServerProcess,
    cpu_seconds,
    machine_info,
    print_table,
    write_json,
)
from support.urls import without_password

SCRIPT = Path(__file__).resolve()
DEFAULT_OUTPUT = RESULTS_DIR / "rate_http.json"
MIDDLEWARE = f"{PROJECT}-middleware"
LEASED = f"{PROJECT}-leased"
MIDDLEWARE_LEASED = f"{MIDDLEWARE}-leased"
EMPTY_DEPENDENCY = "empty-dependency"
PLAIN_HEADERS = "plain-headers"
VARIANTS = (
    "plain",
    EMPTY_DEPENDENCY,
    PLAIN_HEADERS,
    PROJECT,
    MIDDLEWARE,
    LEASED,
    MIDDLEWARE_LEASED,
    "slowapi",
    "fastapi-limiter",
)
USERS = 16
PER_MINUTE = 10**8
PER_DAY = 10**11
WRK_TIMEOUT_S = 120.0

# wrk: one user per request, round robin over USERS; a JSON line of figures at the end.
WRK_SCRIPT = f"""
local n = 0
request = function()
  n = n + 1
  return wrk.format("GET", "/", {{["X-User"] = "user-" .. (n % {USERS})}})
end
done = function(summary, latency, requests)
  io.write(string.format(
    'WRKJSON {{"requests": %d, "duration_us": %d, "connect": %d, "read": %d, "write": %d,'
    .. ' "status": %d, "timeout": %d, "p50_us": %d, "p90_us": %d, "p99_us": %d}}\\n',
    summary.requests, summary.duration, summary.errors.connect, summary.errors.read,
    summary.errors.write, summary.errors.status, summary.errors.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99)))
end
"""


# ---------------------------------------------------------------------------------------------
# The servers (serve mode)


def user(request: Request) -> str:
    return request.headers.get("x-user", "anonymous")


#: The two headers the forms send for ``per_minute`` and ``per_day`` with every unit left.
FIXED_HEADERS = [
    (
        b"ratelimit-policy",
        f'"per_minute";q={PER_MINUTE};w=60, "per_day";q={PER_DAY};w=86400'.encode(),
    ),
    (
        b"ratelimit",
        f'"per_minute";r={PER_MINUTE - 1};t=60, "per_day";r={PER_DAY - 1};t=86400'.encode(),
    ),
]


def with_fixed_headers(app: Any) -> Any:
    """``app`` whose responses start with :data:`FIXED_HEADERS` added."""

    async def headed(scope: Any, receive: Any, send: Any) -> None:
        async def send_headed(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *FIXED_HEADERS]}
            await send(message)

        await app(scope, receive, send_headed)

    return headed


def add_project_limits(app: FastAPI, variant: str, url: str, prefix: str) -> None:
    """``GET /`` behind this project's two policies: through a dependency, or through
    ``RateLimitMiddleware`` (the ``-middleware`` variants); ``-leased``: each policy with
    ``lease_units=True``."""
    manager = StreamLeaseManager(
        url=url,
        config=LeaseConfig(
            key_prefix=f"{prefix}-{variant}", identity_secret=b"rate_http.py bench secret"
        ),
    )
    lease_units = variant in (LEASED, MIDDLEWARE_LEASED)
    per_minute = RateLimit("per_minute", PER_MINUTE, per=60, lease_units=lease_units)
    per_day = RateLimit("per_day", PER_DAY, per=86_400, lease_units=lease_units)
    if variant in (MIDDLEWARE, MIDDLEWARE_LEASED):
        routes = {"/": (per_minute, per_day)}
        app.add_middleware(RateLimitMiddleware, manager=manager, routes=routes, key=user)
        install_exception_handler(app)  # its StreamEndMiddleware, added last, wraps it

        @app.get("/")
        async def behind_middleware() -> dict[str, str]:
            return {"msg": "Hello World"}

        return
    install_exception_handler(app)

    @app.get("/", dependencies=[Depends(manager.rate_limit(per_minute, per_day, key=user))])
    async def limited() -> dict[str, str]:
        return {"msg": "Hello World"}


async def build_app(variant: str, url: str, prefix: str) -> FastAPI:
    """The endpoint, unprotected (``plain``) or behind one library's limits."""
    app = FastAPI()
    if variant == "plain":

        @app.get("/")
        async def plain() -> dict[str, str]:
            return {"msg": "Hello World"}

    elif variant == PLAIN_HEADERS:

        @app.get("/")
        async def plain_headed() -> dict[str, str]:
            return {"msg": "Hello World"}

        app.add_middleware(with_fixed_headers)

    elif variant == EMPTY_DEPENDENCY:

        async def nothing(request: Request) -> None:
            return None

        @app.get("/", dependencies=[Depends(nothing)])
        async def with_dependency() -> dict[str, str]:
            return {"msg": "Hello World"}

    elif variant in (PROJECT, LEASED, MIDDLEWARE, MIDDLEWARE_LEASED):
        add_project_limits(app, variant, url, prefix)

    elif variant == "slowapi":
        limiter = SlowLimiter(key_func=user, storage_uri=url, headers_enabled=True)
        app.state.limiter = limiter
        app.add_exception_handler(RateLimitExceeded, _rate_limit_exceeded_handler)

        @app.get("/")
        @limiter.limit(f"{PER_MINUTE}/minute;{PER_DAY}/day")
        async def slow(request: Request, response: Response) -> dict[str, str]:
            return {"msg": "Hello World"}

    elif variant == "fastapi-limiter":
        client = aioredis.Redis(connection_pool=aioredis.ConnectionPool.from_url(url))

        async def limiter_for(rate: Rate, name: str) -> Limiter:
            return Limiter(await RedisBucket.init([rate], client, f"pyrate-{prefix}:{name}"))

        minute = await limiter_for(Rate(PER_MINUTE, Duration.MINUTE), "minute")
        day = await limiter_for(Rate(PER_DAY, Duration.DAY), "day")

        async def identifier(request: Request) -> str:
            return f"{user(request)}:{request.scope['path']}"

        @app.get(
            "/",
            dependencies=[
                Depends(RateLimiter(limiter=minute, identifier=identifier)),
                Depends(RateLimiter(limiter=day, identifier=identifier)),
            ],
        )
        async def fastapi_limited() -> dict[str, str]:
            return {"msg": "Hello World"}

    else:
        raise ValueError(f"unknown variant {variant!r}")
    return app


async def serve(variant: str, url: str, port: int, prefix: str, freeze_heap: bool) -> None:
    app = await build_app(variant, url, prefix)  # in the loop the server runs on
    if freeze_heap:
        # What an app can do once its start-up is done: the collector stops walking the
        # objects made so far (the app, the framework, the modules) in its full collections.
        gc.collect()
        gc.freeze()
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        loop="asyncio",
        http="h11",
        log_level="warning",
        access_log=False,
    )
    await uvicorn.Server(config).serve()


# ---------------------------------------------------------------------------------------------
# The benchmark (parent)


@dataclass(frozen=True)
class HttpRun:
    variant: str
    repeat: int
    connections: int
    window_s: float
    requests: int
    requests_per_s: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    errors: int
    server_cpu_pct: float
    server_cpu_us_per_request: float


class Server(ServerProcess):
    """One uvicorn process serving one variant on a free port."""

    def __init__(
        self, variant: str, url: str, prefix: str, freeze_heap: bool, under: Sequence[str] = ()
    ) -> None:
        """``under``: a command the server runs under (a profiler), with its arguments."""
        argv = [*under, sys.executable, str(SCRIPT), "--serve", variant, "--url", url]
        argv += ["--prefix", prefix]
        if freeze_heap:
            argv.append("--freeze-heap")
        super().__init__(variant, argv)
        self.variant = variant
        self.headers: dict[str, str] = {}

    def wait_ready(self, tries: int = 100) -> None:
        """Bounded: ``tries`` tries, 100 over about 20 s; keeps the first answer's headers."""
        for _try in range(tries):
            if not self.running():
                break
            connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10.0)
            try:
                connection.request("GET", "/", headers={"X-User": "ready-check"})
                answer = connection.getresponse()
                body = answer.read()
            except OSError:
                time.sleep(0.2)
                continue
            finally:
                connection.close()
            if answer.status != 200 or json.loads(body) != {"msg": "Hello World"}:
                raise RuntimeError(f"{self.variant}: first answer {answer.status} {body!r}")
            self.headers = {k.lower(): v for k, v in answer.getheaders()}
            return
        raise RuntimeError(f"the {self.variant} server did not come up on port {self.port}")


def wrk(port: int, connections: int, seconds: float, script: Path) -> dict[str, Any]:
    command = [
        "wrk",
        "-t1",
        f"-c{connections}",
        f"-d{seconds:g}s",
        "-s",
        str(script),
        f"http://127.0.0.1:{port}/",
    ]
    output = subprocess.run(
        command, capture_output=True, text=True, check=True, timeout=WRK_TIMEOUT_S
    ).stdout
    for line in output.splitlines():
        if line.startswith("WRKJSON "):
            figures: dict[str, Any] = json.loads(line[len("WRKJSON ") :])
            return figures
    raise RuntimeError(f"no figures in wrk's output: {output!r}")


def one_run(
    server: Server, repeat: int, connections: int, window_s: float, script: Path
) -> HttpRun:
    cpu_before, started = cpu_seconds(server.process.pid), time.perf_counter()
    figures = wrk(server.port, connections, window_s, script)
    cpu_after, elapsed = cpu_seconds(server.process.pid), time.perf_counter() - started
    duration_s = figures["duration_us"] / 1e6
    requests = int(figures["requests"])
    errors = sum(int(figures[k]) for k in ("connect", "read", "write", "status", "timeout"))
    return HttpRun(
        variant=server.variant,
        repeat=repeat,
        connections=connections,
        window_s=duration_s,
        requests=requests,
        requests_per_s=requests / duration_s,
        p50_ms=figures["p50_us"] / 1000,
        p90_ms=figures["p90_us"] / 1000,
        p99_ms=figures["p99_us"] / 1000,
        errors=errors,
        server_cpu_pct=100.0 * (cpu_after - cpu_before) / elapsed,
        server_cpu_us_per_request=1e6 * (cpu_after - cpu_before) / max(requests, 1),
    )


def measure(
    url: str,
    variants: Sequence[str],
    repeats: int,
    connections: int,
    window_s: float,
    freeze_heap: bool,
) -> tuple[list[HttpRun], dict[str, dict[str, str]]]:
    """The variants taking turns; returns the runs and each server's first answer's headers."""
    prefix = f"ratehttp-{uuid.uuid4().hex[:8]}"
    servers: list[Server] = []
    runs: list[HttpRun] = []
    with tempfile.TemporaryDirectory(prefix="rate-http-") as scratch:
        script = Path(scratch) / "users.lua"
        script.write_text(WRK_SCRIPT, encoding="utf-8")
        try:
            servers = [Server(variant, url, prefix, freeze_heap) for variant in variants]
            for server in servers:
                server.wait_ready()
            for server in servers:
                warm = one_run(server, 0, connections, 1.0, script)
                if warm.errors:
                    raise RuntimeError(f"{server.variant}: {warm.errors} errors in the warm-up")
            for repeat in range(1, repeats + 1):
                turn = (repeat - 1) % len(servers)
                for server in servers[turn:] + servers[:turn]:
                    run = one_run(server, repeat, connections, window_s, script)
                    runs.append(run)
                    print(
                        f"  #{repeat} {run.variant:<22} {run.requests_per_s:>7,.0f} requests/s"
                        f"  p50 {run.p50_ms:.2f} ms  p99 {run.p99_ms:.2f} ms"
                        f"  server CPU {run.server_cpu_us_per_request:.0f} us/request"
                        f"  errors {run.errors}",
                        flush=True,
                    )
        finally:
            for server in servers:
                server.stop()
    return runs, {server.variant: server.headers for server in servers}


def summarize(runs: Sequence[HttpRun], variants: Sequence[str]) -> list[dict[str, Any]]:
    figures = ("requests_per_s", "p50_ms", "p90_ms", "p99_ms", "server_cpu_us_per_request")
    medians = {
        variant: {
            name: statistics.median(getattr(r, name) for r in runs if r.variant == variant)
            for name in figures
        }
        for variant in variants
    }
    plain = medians["plain"]
    # The dependency form against what any dependency costs (when both ran).
    empty = medians.get(EMPTY_DEPENDENCY)
    # Each turn's cost against the plain endpoint's run of the same turn, seconds apart: the
    # machine's slower drifts cancel out of these.
    plain_in_turn = {r.repeat: r.requests_per_s for r in runs if r.variant == "plain"}
    turn_costs = {
        variant: sorted(
            100.0 * (1.0 - r.requests_per_s / plain_in_turn[r.repeat])
            for r in runs
            if r.variant == variant and r.repeat in plain_in_turn
        )
        for variant in variants
    }
    return [
        {
            "variant": variant,
            "runs": sum(1 for r in runs if r.variant == variant),
            **medians[variant],
            "errors": sum(r.errors for r in runs if r.variant == variant),
            "throughput_cost_pct": 100.0
            * (1.0 - medians[variant]["requests_per_s"] / plain["requests_per_s"]),
            "turn_costs_pct": turn_costs[variant],
            "ratio_vs_plain": medians[variant]["requests_per_s"] / plain["requests_per_s"],
            "server_cpu_us_per_request_delta": medians[variant]["server_cpu_us_per_request"]
            - plain["server_cpu_us_per_request"],
            **(
                {
                    "throughput_cost_vs_empty_dependency_pct": 100.0
                    * (1.0 - medians[variant]["requests_per_s"] / empty["requests_per_s"])
                }
                if variant in (PROJECT, LEASED) and empty is not None
                else {}
            ),
        }
        for variant in variants
    ]


ENDPOINTS = {
    "plain": "plain endpoint, no limiter",
    EMPTY_DEPENDENCY: "plain endpoint, an empty dependency",
    PLAIN_HEADERS: "plain endpoint, the same 2 headers, fixed",
    PROJECT: f"{PROJECT}, 2 policies + headers",
    MIDDLEWARE: f"{PROJECT} RateLimitMiddleware, same",
    LEASED: f"{PROJECT}, same, lease_units=True",
    MIDDLEWARE_LEASED: f"{PROJECT} RateLimitMiddleware, lease_units=True",
    "slowapi": f"slowapi {version('slowapi')}, 2 limits + headers",
    "fastapi-limiter": f"fastapi-limiter {version('fastapi-limiter')}, 2 limiters",
}


def print_results(summary: Sequence[dict[str, Any]], connections: int) -> None:
    rows = [
        [
            ENDPOINTS[s["variant"]],
            f"{s['runs']}",
            f"{s['requests_per_s']:,.0f}",
            f"{s['p50_ms']:.2f}",
            f"{s['p99_ms']:.2f}",
            f"{s['server_cpu_us_per_request']:.0f}",
            "" if s["variant"] == "plain" else f"{s['throughput_cost_pct']:.1f} %",
            "" if s["variant"] == "plain" else turn_cost(s["turn_costs_pct"]),
            "" if s["variant"] == "plain" else f"{s['server_cpu_us_per_request_delta']:+.0f}",
        ]
        for s in summary
    ]
    header = ["endpoint", "runs", "requests/s", "p50 ms", "p99 ms", "CPU us/req"]
    print_table([*header, "cost", "by turn", "CPU delta us/req"], rows, left=1)
    for s in summary:
        if "throughput_cost_vs_empty_dependency_pct" in s:
            cost = s["throughput_cost_vs_empty_dependency_pct"]
            print(f"{ENDPOINTS[s['variant']]}: {cost:.1f} % of the empty dependency's throughput")
    errors = sum(s["errors"] for s in summary)
    print(
        f"one uvicorn worker (h11), wrk -t1 -c{connections}, keep-alive; medians of the runs;"
        " cost = throughput lost\nagainst the plain endpoint in the same run; by turn = the"
        " median of each turn's cost against the\nplain endpoint's run of that turn (the least"
        " and the most in brackets); CPU us/req = the server\nprocess's CPU per request."
        f" Errors (non-2xx, socket): {errors}."
    )


def turn_cost(costs: Sequence[float]) -> str:
    """The median of a variant's costs by turn, with the least and the most."""
    if not costs:
        return ""
    return f"{statistics.median(costs):.1f} % ({costs[0]:.1f} to {costs[-1]:.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description="HTTP cost of rate limits under uvicorn + wrk.")
    parser.add_argument("--url", help="Redis URL, e.g. redis://127.0.0.1:6380/0")
    parser.add_argument("--repeats", type=int, default=5, help="runs per variant")
    parser.add_argument("--duration", type=float, default=2.0, help="seconds of each wrk run")
    parser.add_argument("--connections", type=int, default=64, help="wrk's connections")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="JSON results file")
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help=f"comma-separated endpoints to run (plain always runs; default: {','.join(VARIANTS)})",
    )
    parser.add_argument(
        "--freeze-heap",
        action="store_true",
        help="each server calls gc.freeze() once its app is built, before it serves",
    )
    internal = parser.add_argument_group("internal mode (started by this script)")
    internal.add_argument("--serve", choices=VARIANTS, help="run a server for this variant")
    internal.add_argument("--port", type=int, help="--serve: port to listen on")
    internal.add_argument("--prefix", help="--serve: key prefix")
    args = parser.parse_args()

    if args.url is None:
        parser.error("--url is required")
    if args.serve:
        asyncio.run(serve(args.serve, args.url, args.port, args.prefix, args.freeze_heap))
        return
    if args.duration <= 0 or args.repeats < 1 or args.connections < 1:
        parser.error("--duration must be > 0, --repeats and --connections >= 1")
    variants = ["plain", *(v for v in args.variants.split(",") if v and v != "plain")]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown --variants {', '.join(unknown)}: choose from {', '.join(VARIANTS)}")
    if shutil.which("wrk") is None:
        parser.error("wrk is not on PATH: run bash benchmarks/setup_bench_env.sh")

    print(
        f"HTTP cost of rate limits against {args.url}: one uvicorn worker per endpoint, wrk -t1"
        f" -c{args.connections} -d{args.duration:g}s, {args.repeats} runs per endpoint"
        + (
            ", each server's heap frozen (gc.freeze()) once its app is built"
            if args.freeze_heap
            else ""
        )
    )
    runs, headers = measure(
        args.url, variants, args.repeats, args.connections, args.duration, args.freeze_heap
    )
    summary = summarize(runs, variants)
    print_results(summary, args.connections)
    wrk_version = subprocess.run(["wrk", "-v"], capture_output=True, text=True).stdout
    write_json(
        args.output,
        {
            "machine": {
                **machine_info(),
                "uvicorn": uvicorn.__version__,
                "http": "h11",
                "wrk": wrk_version.splitlines()[0] if wrk_version else "",
                **{
                    package: version(package)
                    for package in (
                        "fastapi-stream-lease",
                        "fastapi",
                        "starlette",
                        "slowapi",
                        "limits",
                        "fastapi-limiter",
                        "pyrate-limiter",
                        "redis",
                    )
                },
            },
            "settings": {
                "url": without_password(args.url),
                "repeats": args.repeats,
                "window_s": args.duration,
                "connections": args.connections,
                "freeze_heap": args.freeze_heap,
                "users": USERS,
                "per_minute_limit": PER_MINUTE,
                "per_day_limit": PER_DAY,
            },
            "first_answer_headers": headers,
            "summary": summary,
            "runs": [asdict(r) for r in runs],
        },
    )
    print(f"raw figures: {args.output}")


if __name__ == "__main__":
    main()
