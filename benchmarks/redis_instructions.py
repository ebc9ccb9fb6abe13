"""Redis's own work per acquire + release cycle, in CPU instructions: a figure the noise of a
shared machine does not move.

Timings of redis-server (``INFO commandstats``, its CPU time) on this project's shared 2-core
machine swing by 3x from one hour to the next, which hides a 10 % change in the scripts. This
benchmark runs redis-server under valgrind's callgrind and counts the instructions it executes
(event loop, parsing, Lua, the commands the scripts run) while this library runs N cycles:
the same count on every run, to about 1 %. Side by side in the same run, as the floor:

* **a trivial function, no arguments**: what two round trips of FCALL cost any client;
* **a trivial function, the cycle's arguments**: the same two calls with exactly the keys and
  arguments this library's acquire and release send (captured with MONITOR from a real cycle),
  a function that returns at once: what the call and its arguments cost before any script runs.

The library runs at 1 coroutine (each call alone), at 8 and at 64 (the core sends the calls
that come while one is in flight together: fewer calls per cycle; at 64 a call decides about
eight requests, so that row is close to the cost of one more request in a batch). Under
callgrind the server runs about 50 times slower, so the batches are bigger than at full speed:
read those rows as the cost with batching, not as a prediction of a batch size.

Needs valgrind (``scripts/apt-install.sh valgrind``); without it the benchmark says so and skips.
Run it with ``make bench``, or alone: ``benchmarks/.venv/bin/python
benchmarks/redis_instructions.py`` (about a minute).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from acquire_release import CoreCalls, capture_core_calls

from fastapi_stream_lease import LeaseConfig, StreamLeaseManager

from common import RESULTS_DIR, machine_info, print_table, write_json
from support.redis_servers import RedisServer

USERS = 16
# Cycles at 64 coroutines: as many for each.
BATCHED_CYCLES = 640
NOOP = "fastapi_stream_lease_floor"


class CallgrindServer(RedisServer):
    """A redis-server counted by callgrind: its counters are zeroed and read on demand."""

    def _command(self) -> list[str]:
        out = self.dir / "callgrind.out.%p"
        return ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                *super()._command()]

    def zero(self) -> None:
        assert self.process is not None
        subprocess.run(["callgrind_control", "-z", str(self.process.pid)], check=True,
                       capture_output=True)

    def instructions(self) -> int:
        """Instructions executed since the last zero (dumps a profile and reads its total)."""
        assert self.process is not None
        subprocess.run(["callgrind_control", "-d", str(self.process.pid)], check=True,
                       capture_output=True)
        newest = max(Path(self.dir).glob("callgrind.out.*"), key=lambda p: p.stat().st_mtime)
        for line in newest.read_text().splitlines():
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
        raise RuntimeError(f"no total in {newest}")


def commands_run(client: redis.Redis) -> tuple[int, int]:
    """(script calls, commands run inside them) since the last CONFIG RESETSTAT."""
    stats = client.info("commandstats")
    scripts = sum(v["calls"] for k, v in stats.items() if k.startswith("cmdstat_fcall"))
    inside = sum(
        v["calls"] for k, v in stats.items()
        if not k.startswith(("cmdstat_fcall", "cmdstat_config", "cmdstat_info", "cmdstat_monitor"))
    )
    return scripts, inside


async def library_cycles(url: str, cycles: int, concurrency: int) -> None:
    # Under callgrind a call takes 50 times longer: no timeout for the core to give up on.
    config = LeaseConfig(max_per_user=1000, max_global=100_000, redis_timeout=60)
    manager = StreamLeaseManager(url=url, config=config)

    async def worker(w: int) -> None:
        for i in range(cycles // concurrency):
            lease = await manager.acquire(f"user{(w * 7 + i) % USERS}")
            await lease.release()

    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    await manager.aclose()


async def captured_cycle(url: str) -> CoreCalls:
    """The script calls of one acquire + release of this library (MONITOR, as
    acquire_release.py reads them), once the library is loaded and the users known."""
    await library_cycles(url, USERS, 1)
    manager = StreamLeaseManager(url=url, config=LeaseConfig(max_per_user=1000))
    try:
        return await capture_core_calls(url, manager)
    finally:
        await manager.aclose()


def measure(server: CallgrindServer, name: str, cycles: int,
            run: Callable[[], object]) -> dict[str, Any]:
    client = redis.Redis(port=server.port)
    client.config_resetstat()
    server.zero()
    run()
    instructions = server.instructions()
    scripts, inside = commands_run(client)
    return {
        "scenario": name, "cycles": cycles, "instructions_per_cycle": instructions / cycles,
        "script_calls_per_cycle": scripts / cycles, "commands_inside_per_cycle": inside / cycles,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=400)
    args = parser.parse_args()
    if not (shutil.which("valgrind") and shutil.which("callgrind_control")):
        print("redis_instructions.py: skipped, valgrind is not installed "
              "(scripts/apt-install.sh valgrind)")
        return
    server = CallgrindServer().start()
    try:
        client = redis.Redis(port=server.port)
        client.execute_command(
            "FUNCTION", "LOAD", "REPLACE",
            f"#!lua name={NOOP}\nredis.register_function('{NOOP}', function() return 1 end)",
        )
        core_calls = asyncio.run(captured_cycle(server.url))
        # FCALL's words after the function's name: numkeys, KEYS, ARGV.
        acquire, release = core_calls.acquire[1:], core_calls.release[1:]
        n = args.cycles

        def floor(calls: list[list[str]]) -> Callable[[], object]:
            return lambda: [client.execute_command(*call) for _ in range(n) for call in calls]

        rows = [
            measure(server, "trivial function, no arguments", n,
                    floor([["FCALL", NOOP, "0"]] * 2)),
            measure(server, "trivial function, the cycle's arguments", n,
                    floor([["FCALL", NOOP, *call] for call in (acquire, release)])),
            measure(server, "this library, 1 coroutine", n,
                    lambda: asyncio.run(library_cycles(server.url, n, 1))),
            measure(server, "this library, 8 coroutines", n,
                    lambda: asyncio.run(library_cycles(server.url, n, 8))),
            measure(server, "this library, 64 coroutines", BATCHED_CYCLES,
                    lambda: asyncio.run(library_cycles(server.url, BATCHED_CYCLES, 64))),
        ]
    finally:
        server.cleanup()
    floor_ir = rows[1]["instructions_per_cycle"]
    print(f"\nredis-server instructions per acquire + release cycle (callgrind; {n} cycles, "
          f"{USERS} users; arguments: acquire {len(acquire) - 1}, release {len(release) - 1})")
    print_table(
        ["scenario", "instructions / cycle", "script calls / cycle", "commands inside / cycle",
         "vs the cycle's arguments alone"],
        [[r["scenario"], f"{r['instructions_per_cycle'] / 1000:,.1f}k",
          f"{r['script_calls_per_cycle']:.2f}", f"{r['commands_inside_per_cycle']:.1f}",
          f"{r['instructions_per_cycle'] / floor_ir:.2f}x"] for r in rows],
        left=1,
    )
    write_json(RESULTS_DIR / "redis_instructions.json", {"machine": machine_info(), "rows": rows})


if __name__ == "__main__":
    main()
