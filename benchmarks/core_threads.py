"""The core's tokio threads: one (the default) against two, in the same run.

Each process gets one tokio runtime (``src/runtime.rs``); ``TOKIO_WORKER_THREADS`` sets its
worker threads, 1 unless set. This benchmark runs the same acquire + release loop (16 users,
unlimited pools) in child processes of itself, with 1 and with 2 workers taking turns, at 1 and
at 64 coroutines, and prints the medians: cycles per second, the process's CPU per cycle (every
thread), the event loop thread's share, and the rest (the core's threads). The machine is
shared and noisy: read the two rows of one scenario against each other.

Run it with ``make bench``, or alone against a Redis of your own::

    benchmarks/.venv/bin/python benchmarks/core_threads.py --url redis://127.0.0.1:6380/0
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time

from fastapi_stream_lease import LeaseConfig, StreamLeaseManager

from common import RESULTS_DIR, machine_info, print_table, scenario_name, write_json

USERS = 16


async def cycles(url: str, coroutines: int, seconds: float) -> dict[str, float]:
    """Runs acquire + release cycles for ``seconds``; what they cost, per cycle."""
    manager = StreamLeaseManager(
        url=url, config=LeaseConfig(key_prefix="threads", max_per_user=0, max_global=0)
    )
    for _ in range(100):  # warm: connected, the library loaded, the holder registered
        await (await manager.acquire("warm-up")).release()
    done, stop = 0, False

    async def worker(w: int) -> None:
        nonlocal done
        while not stop:
            await (await manager.acquire(f"user{w % USERS}")).release()
            done += 1

    wall, process, loop_thread = time.perf_counter(), time.process_time(), time.thread_time()
    workers = [asyncio.create_task(worker(w)) for w in range(coroutines)]
    await asyncio.sleep(seconds)
    stop = True
    await asyncio.gather(*workers)
    wall = time.perf_counter() - wall
    process = time.process_time() - process
    loop_thread = time.thread_time() - loop_thread
    await manager.aclose()
    return {
        "cycles_per_s": done / wall,
        "process_us": 1e6 * process / done,
        "loop_thread_us": 1e6 * loop_thread / done,
        "core_threads_us": 1e6 * (process - loop_thread) / done,
    }


def child_run(url: str, threads: int, coroutines: int, seconds: float) -> dict[str, float]:
    env = {**os.environ, "TOKIO_WORKER_THREADS": str(threads)}
    done = subprocess.run(
        [sys.executable, __file__, "--child", "--url", url, "--coroutines", str(coroutines),
         "--seconds", str(seconds)],
        env=env, check=True, capture_output=True, text=True,
    )
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--coroutines", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(cycles(args.url, args.coroutines, args.seconds))))
        return
    runs: dict[tuple[int, int], list[dict[str, float]]] = {}
    for coroutines in (1, 64):
        for _ in range(args.repeats):
            for threads in (1, 2):  # in turns, so a slow minute weighs on both
                runs.setdefault((coroutines, threads), []).append(
                    child_run(args.url, threads, coroutines, args.seconds)
                )
    rows, summary = [], []
    for (coroutines, threads), results in runs.items():
        median = {k: statistics.median(r[k] for r in results) for k in results[0]}
        summary.append({"coroutines": coroutines, "threads": threads, **median})
        rows.append([
            scenario_name(coroutines), str(threads),
            f"{median['cycles_per_s']:,.0f}", f"{median['process_us']:.0f}",
            f"{median['loop_thread_us']:.0f}", f"{median['core_threads_us']:.0f}",
        ])
    print(f"\nacquire + release, TOKIO_WORKER_THREADS 1 (the default) and 2 in turns; medians of "
          f"{args.repeats} runs of {args.seconds:g} s (CPU in µs per cycle)")
    print_table(["scenario", "core threads", "cycles/s", "process CPU", "event loop thread",
                 "core threads' CPU"], rows, left=2)
    write_json(RESULTS_DIR / "core_threads.json", {"machine": machine_info(), "runs": summary})


if __name__ == "__main__":
    main()
