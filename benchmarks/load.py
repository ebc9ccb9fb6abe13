"""``make load``: a proof at full size. uvicorn with 4 workers serves ``load_app.py`` to real
Server-Sent Events and WebSocket clients (random users, some much busier than others; slow
first tokens; 30 % hang up mid-stream; refused ones retry shortly), and Redis is restarted
empty in the middle. The same run is made with the library (2 streams per user, 40 in all) and
without it. The server side's own record of every stream's start and end is then audited:

* with the library, at no moment are more than 2 streams of one user, or 40 in all, live,
  except in the window the docs state for a restart that lost Redis's data (the caps hold
  again within ``3 x renew_every + 4 x redis_timeout`` of Redis answering, plus 0.5 s);
* once the clients stop, no stream is live and Redis counts no slot, within a lease's time;
* without it, the streams climb past both caps.

It prints those figures and draws ``benchmarks/results/load.png``: streams live in all and for
the busiest user, over time, against the caps, with the library and without.

Usage: benchmarks/.venv/bin/python benchmarks/load.py [--seconds 40] (``make load`` sets up the
release build first).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis
import websockets

from common import BENCH_DIR, RESULTS_DIR
from support.ports import free_port
from support.redis_servers import RedisServer, server_version
from support.waiting import eventually

# The app's caps and lease duration (given to load_app.py): renewal every 2 s, so a restart's
# leases are settled within seconds.
PER_USER, IN_ALL, LEASE_SECONDS = 2, 40, 6.0
WORKERS = 4
CLIENTS = 80
USERS = [f"user-{n:02d}" for n in range(24)]
WEIGHTS = [1 / (n + 1) for n in range(len(USERS))]  # user-00 is 24 times as busy as user-23
SSE_SHARE = 0.7
HANG_UP_SHARE = 0.3
# The docs' bound for a restart that lost Redis's data: 3 x renew_every + 4 x redis_timeout
# after Redis answers again, then 0.5 s (renew_every = lease_seconds / 3, redis_timeout 1 s).
RESTART_WINDOW = 3 * LEASE_SECONDS / 3 + 4 * 1.0 + 0.5


@dataclass
class Run:
    protected: bool
    started: float = 0.0
    restart: tuple[float, float] = (0.0, 0.0)  # Redis killed, Redis answering again
    answers: Counter[str] = field(default_factory=Counter)
    events: list[tuple[float, int, str, str]] = field(default_factory=list)  # t, +1/-1, user, kind
    leftover_streams: int = 0
    leftover_slots: int | None = None
    settled_after: float | None = None
    worker_log: Path | None = None

    @property
    def name(self) -> str:
        return "with the library" if self.protected else "without it"


async def sse(http: httpx.AsyncClient, base: str, user: str, hang_up: float | None) -> str:
    started = time.monotonic()
    try:
        async with http.stream("GET", f"{base}/sse", params={"user": user}) as response:
            if response.status_code != 200:
                await response.aread()
                return str(response.status_code)
            async for _line in response.aiter_lines():
                if hang_up is not None and time.monotonic() - started > hang_up:
                    return "hung up"
        return "200"
    except httpx.HTTPError:
        return "error"


async def websocket(base: str, user: str, hang_up: float | None) -> str:
    started = time.monotonic()
    try:
        async with websockets.connect(f"{base}/ws?user={user}", open_timeout=10) as socket:
            async for _message in socket:
                if hang_up is not None and time.monotonic() - started > hang_up:
                    return "hung up"
            return "200" if socket.close_code == 1000 else f"closed {socket.close_code}"
    except websockets.InvalidStatus as refused:  # refused before the handshake: HTTP 403
        return f"ws {refused.response.status_code}"
    except (OSError, websockets.WebSocketException):
        return "error"


async def client(
    http: httpx.AsyncClient, port: int, rng: random.Random, until: float, answers: Counter[str]
) -> None:
    """One client: a stream after another until ``until``; a refused one waits a little."""
    while time.time() < until:
        user = rng.choices(USERS, WEIGHTS)[0]
        hang_up = rng.uniform(0.3, 4.0) if rng.random() < HANG_UP_SHARE else None
        if rng.random() < SSE_SHARE:
            answer = await sse(http, f"http://127.0.0.1:{port}", user, hang_up)
        else:
            answer = await websocket(f"ws://127.0.0.1:{port}", user, hang_up)
        answers[answer] += 1
        await asyncio.sleep(rng.uniform(0.1, 0.5) if answer not in ("200", "hung up") else 0)


def read_audit(directory: Path) -> list[tuple[float, int, str, str]]:
    events = []
    for path in directory.glob("*.jsonl"):  # one per worker
        for line in path.read_text().splitlines():
            event = json.loads(line)
            events.append((event["t"], event["d"], event["u"], event["k"]))
    return sorted(events)


async def run(protected: bool, server: RedisServer, seconds: float, seed: int) -> Run:
    result = Run(protected)
    audit = Path(tempfile.mkdtemp(prefix="load-audit-"))
    port = free_port()
    app = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "uvicorn", "--app-dir", str(BENCH_DIR), "load_app:app",
        "--workers", str(WORKERS), "--port", str(port), "--log-level", "warning",
        stderr=(audit / "workers.log").open("w"),
        env={**os.environ, "REDIS_URL": server.url, "LOAD_AUDIT_DIR": str(audit),
             "LOAD_PROTECTED": "1" if protected else "0", "LOAD_PER_USER": str(PER_USER),
             "LOAD_IN_ALL": str(IN_ALL), "LOAD_LEASE_SECONDS": str(LEASE_SECONDS)},
    )  # fmt: skip
    try:

        def serving() -> bool:
            """Every worker up (each opens its audit file as it starts), and answering."""
            assert app.returncode is None, "uvicorn exited"
            if len(list(audit.glob("*.jsonl"))) < WORKERS:
                return False
            try:
                return httpx.get(f"http://127.0.0.1:{port}/openapi.json").status_code == 200
            except httpx.TransportError:
                return False

        await eventually(serving, timeout=120, what="uvicorn's workers")
        # One HTTP client for all (an SSL context each would take seconds to make).
        http = httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=CLIENTS * 2))
        result.started = time.time()
        until = result.started + seconds
        rng = random.Random(seed)
        clients = [
            asyncio.create_task(
                client(http, port, random.Random(rng.random()), until, result.answers)
            )
            for _ in range(CLIENTS)
        ]
        await asyncio.sleep(seconds * 0.4)
        killed = time.time()
        await asyncio.to_thread(server.restart)  # empty: no persistence
        result.restart = (killed, time.time())
        await asyncio.gather(*clients)
        await http.aclose()

        # Everything ends: no live stream on the server, no slot left in Redis.
        stopped = time.monotonic()
        client_redis = redis.Redis(port=server.port)
        deadline = stopped + LEASE_SECONDS * 2
        while time.monotonic() < deadline:
            live = sum(event[1] for event in read_audit(audit))
            slots = client_redis.zcard("{load}:global")
            if live == 0 and (slots == 0 or not protected):
                result.settled_after = time.monotonic() - stopped
                break
            await asyncio.sleep(0.1)
        result.events = read_audit(audit)
        result.worker_log = audit / "workers.log"
        result.leftover_streams = sum(event[1] for event in result.events)
        result.leftover_slots = client_redis.zcard("{load}:global") if protected else None
        client_redis.close()
    finally:
        app.terminate()
        await asyncio.wait_for(app.wait(), 60)
    return result


def most_live(run: Run, window: tuple[float, float] | None, inside: bool) -> tuple[int, int]:
    """The most streams live at once in all and for one user, counting the moments inside the
    window (``inside``) or outside it."""
    total, by_user = 0, defaultdict(int)
    worst_total = worst_user = 0
    for t, change, user, _kind in run.events:
        total += change
        by_user[user] += change
        counted = window is None or ((window[0] <= t <= window[1]) == inside)
        if counted and change > 0:
            worst_total = max(worst_total, total)
            worst_user = max(worst_user, by_user[user])
    return worst_total, worst_user


def series(run: Run, step: float = 0.1) -> tuple[list[float], list[int], list[int]]:
    """Seconds since the start, streams live in all, and live for the busiest user then."""
    times, totals, busiest = [], [], []
    total, by_user = 0, defaultdict(int)
    events = iter(run.events)
    pending = next(events, None)
    t = run.started
    end = run.events[-1][0] if run.events else t
    while t <= end + step:
        while pending is not None and pending[0] <= t:
            total += pending[1]
            by_user[pending[2]] += pending[1]
            pending = next(events, None)
        times.append(t - run.started)
        totals.append(total)
        busiest.append(max(by_user.values(), default=0))
        t += step
    return times, totals, busiest


def plot(runs: list[Run], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (in_all, one_user) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True)
    colors = {True: "#1f77b4", False: "#d62728"}
    for run in runs:
        times, totals, busiest = series(run)
        label = f"{run.name} ({WORKERS} uvicorn workers)"
        in_all.plot(times, totals, color=colors[run.protected], label=label, linewidth=1.2)
        one_user.plot(times, busiest, color=colors[run.protected], label=label, linewidth=1.2)
    protected = next(run for run in runs if run.protected)
    killed, back = (t - protected.started for t in protected.restart)
    for axes, cap, what in ((in_all, IN_ALL, "cap in all"), (one_user, PER_USER, "cap per user")):
        axes.axhline(cap, color="black", linestyle="--", linewidth=1, label=what)
        axes.axvspan(killed, back + RESTART_WINDOW, color="#bbbbbb", alpha=0.35,
                     label="Redis restarted empty, and the docs' window after it")  # fmt: skip
        axes.grid(alpha=0.3)
    in_all.set_ylabel("streams live, in all")
    one_user.set_ylabel("streams live,\nthe busiest user")
    one_user.set_xlabel("seconds")
    in_all.legend(loc="upper left", fontsize=8)
    in_all.set_title(
        f"SSE and WebSocket streams under load: {CLIENTS} clients, {len(USERS)} users,"
        " counted by the server"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def report(runs: list[Run]) -> bool:
    ok = True
    for run in runs:
        started = sum(1 for event in run.events if event[1] > 0)
        kinds = Counter(event[3] for event in run.events if event[1] > 0)
        answers = ", ".join(f"{answer} x{n:,}" for answer, n in run.answers.most_common())
        print(f"\n{run.name}: {started:,} streams ({kinds['sse']:,} SSE, {kinds['ws']:,}"
              f" WebSocket); client outcomes: {answers}")  # fmt: skip
        if run.protected:
            print("  (error: a stream cut short, as a lost lease ends its stream after the"
                  f" restart; the workers' log: {run.worker_log})")
        window = (run.restart[0], run.restart[1] + RESTART_WINDOW)
        outside = most_live(run, window, inside=False)
        inside = most_live(run, window, inside=True)
        if run.protected:
            checks = [
                (f"most live in all, outside the restart window: {outside[0]} (cap {IN_ALL})",
                 outside[0] <= IN_ALL),
                (f"most live for one user, outside it: {outside[1]} (cap {PER_USER})",
                 outside[1] <= PER_USER),
                (f"after the clients stopped: {run.leftover_streams} live streams, "
                 f"{run.leftover_slots} slots in Redis"
                 + (f" (settled in {run.settled_after:.1f} s)" if run.settled_after else ""),
                 run.leftover_streams == 0 and run.leftover_slots == 0),
            ]  # fmt: skip
            for text, held in checks:
                ok &= held
                print(f"  {'OK  ' if held else 'FAIL'} {text}")
            print(f"  info inside the window ({RESTART_WINDOW:.1f} s after Redis answered again):"
                  f" at most {inside[0]} in all, {inside[1]} for one user")  # fmt: skip
        else:
            everywhere = most_live(run, None, inside=True)
            print(f"  most live in all: {everywhere[0]} (the cap would be {IN_ALL}); for one"
                  f" user: {everywhere[1]} (would be {PER_USER})")  # fmt: skip
    return ok


async def main(seconds: float, seed: int, output: Path) -> int:
    server = RedisServer().start()
    print(f"==> {server_version()} on 127.0.0.1:{server.port}; {WORKERS} uvicorn workers,"
          f" {CLIENTS} clients, {seconds:.0f} s a run, Redis restarted empty at"
          f" {seconds * 0.4:.0f} s", flush=True)  # fmt: skip
    try:
        runs = [await run(protected, server, seconds, seed) for protected in (True, False)]
    finally:
        server.cleanup()
    ok = report(runs)
    plot(runs, output)
    summary = {
        run.name: {"answers": dict(run.answers), "streams": sum(e[1] > 0 for e in run.events)}
        for run in runs
    }
    output.with_suffix(".json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"\n{'all invariants held' if ok else 'AN INVARIANT FAILED'}; picture: {output}")
    return 0 if ok else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=40.0, help="length of each run")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "load.png")
    options = parser.parse_args()
    sys.exit(asyncio.run(main(options.seconds, options.seed, options.output)))
