"""The core's Redis I/O on the event loop's own thread (``STREAM_LEASE_IO_ON_LOOP_THREAD=1``,
experimental) against the default path through tokio, in the same run.

With the switch off, every acquire, release and hit crosses threads twice (the loop wakes a
tokio worker, which writes the socket, reads the reply and wakes the loop through the bridge's
socketpair); with it on, acquires that do not wait, releases and hits go on a connection the
loop's own selector watches. This benchmark runs the same loop of operations (acquire +
release, 16 users, unlimited pools; or one rate-limit hit, 16 users) in child processes of
itself, switch off and on taking turns, at 1 and at 64 coroutines, on asyncio's default loop and
on uvloop, and prints the medians: operations per second, the p50 of one, the process's CPU per
operation (every thread), and redis-server's CPU per operation. The machine is shared and
noisy: read the two rows of one scenario against each other.

Run it alone against a Redis of your own (plain TCP or a Unix socket: the switch's scope)::

    benchmarks/.venv/bin/python benchmarks/loop_thread.py --url redis://127.0.0.1:6380/0
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

from fastapi_stream_lease import LeaseConfig, RateLimit, StreamLeaseManager

from common import (
    RESULTS_DIR,
    machine_info,
    print_table,
    redis_cpu_seconds,
    redis_py_client,
    scenario_name,
    write_json,
)

USERS = 16
SWITCH = "STREAM_LEASE_IO_ON_LOOP_THREAD"
LOOPS = ("asyncio", "uvloop")
WORKS = ("acquire + release", "hit")
RATE = RateLimit("loopthread", 10**12, per=3600)


async def cycles(url: str, work: str, coroutines: int, seconds: float) -> dict[str, float]:
    """Runs ``work`` (acquire + release, or a hit) for ``seconds``; what it costs, per op."""
    manager = StreamLeaseManager(
        url=url, config=LeaseConfig(key_prefix="loopthread", max_per_user=0, max_global=0)
    )
    redis = redis_py_client(url)
    for _ in range(100):  # warm: connected, the library loaded, the holder registered
        await (await manager.acquire("warm-up")).release()
    done, stop = 0, False
    durations: list[float] = []

    async def worker(w: int) -> None:
        nonlocal done
        user = f"user{w % USERS}"
        while not stop:
            started = time.perf_counter()
            if work == "hit":
                await manager.hit(user, RATE)
            else:
                await (await manager.acquire(user)).release()
            durations.append(time.perf_counter() - started)
            done += 1

    redis_cpu = await redis_cpu_seconds(redis)
    wall, process = time.perf_counter(), time.process_time()
    workers = [asyncio.create_task(worker(w)) for w in range(coroutines)]
    await asyncio.sleep(seconds)
    stop = True
    await asyncio.gather(*workers)
    wall = time.perf_counter() - wall
    process = time.process_time() - process
    redis_cpu = await redis_cpu_seconds(redis) - redis_cpu
    await manager.aclose()
    await redis.aclose()
    return {
        "cycles_per_s": done / wall,
        "p50_ms": 1e3 * statistics.median(durations),
        "process_us": 1e6 * process / done,
        "redis_us": 1e6 * redis_cpu / done,
    }


def child_run(
    url: str, work: str, loop: str, switch: bool, coroutines: int, seconds: float
) -> dict:
    env = {**os.environ, SWITCH: "1" if switch else "0"}
    done = subprocess.run(
        [sys.executable, __file__, "--child", "--url", url, "--work", work, "--loop", loop,
         "--coroutines", str(coroutines), "--seconds", str(seconds)],
        env=env, check=True, capture_output=True, text=True,
    )
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--coroutines", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--loop", choices=LOOPS, default="asyncio", help=argparse.SUPPRESS)
    parser.add_argument("--work", choices=WORKS, default=WORKS[0], help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run = cycles(args.url, args.work, args.coroutines, args.seconds)
        if args.loop == "uvloop":
            import uvloop

            print(json.dumps(uvloop.run(run)))
        else:
            print(json.dumps(asyncio.run(run)))
        return
    runs: dict[tuple[str, str, int, bool], list[dict[str, float]]] = {}
    for work in WORKS:
        for coroutines in (1, 64):
            for _ in range(args.repeats):
                for loop in LOOPS:
                    for switch in (False, True):  # in turns, so a slow minute weighs on both
                        runs.setdefault((work, loop, coroutines, switch), []).append(
                            child_run(args.url, work, loop, switch, coroutines, args.seconds)
                        )
    rows, summary = [], []
    for (work, loop, coroutines, switch), results in sorted(runs.items()):
        median = {k: statistics.median(r[k] for r in results) for k in results[0]}
        summary.append(
            {"work": work, "loop": loop, "coroutines": coroutines, "switch": switch, **median}
        )
        rows.append([
            work, loop, scenario_name(coroutines), "on" if switch else "off",
            f"{median['cycles_per_s']:,.0f}", f"{median['p50_ms']:.2f}",
            f"{median['process_us']:.1f}", f"{median['redis_us']:.1f}",
        ])
    print(f"\n{SWITCH} off (tokio) and on (the loop's thread) in turns; medians of "
          f"{args.repeats} runs of {args.seconds:g} s (CPU in µs per operation)")
    print_table(["work", "loop", "scenario", "switch", "ops/s", "p50 ms", "process CPU",
                 "Redis CPU"], rows, left=4)
    today = datetime.date.today().isoformat()
    write_json(RESULTS_DIR / f"loop_thread-{today}.json",
               {"machine": {**machine_info(), "event_loop": "asyncio's default loop and uvloop"},
                "runs": summary})


if __name__ == "__main__":
    main()
