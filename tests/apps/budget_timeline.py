"""Runs the streams a JSON spec describes against one token budget, and prints what each
streamed and when, as one JSON line: the streams' own counts by time, for test_budgets to check
the bound in every window. Times are ``time.time()``, one clock for every process on the machine.

Spec: {"budget": {"limit": n, "per": seconds, "algorithm": "sliding_window" | "fixed_window"},
"start": the time.time() to start at, "lanes": [[stream, ...], ...]}: each lane runs its streams
one after the other; a stream is {"at": seconds after start (it waits until then), "reserve": n,
"delay": seconds from its admission to its first chunk, "chunks": [tokens, ...], "pause": seconds
after each chunk, "until": seconds after start to keep trying a refused start}.

Prints {"streams": [{"opened": t, "closed": t, "events": [[t, tokens], ...], "cut": bool,
"largest": tokens}, ...], "refused": n}: one entry per stream admitted, and how many starts the
budget refused.

Usage: budget_timeline.py URL KEY_PREFIX SPEC_PATH
"""

import asyncio
import json
import sys
import time
import warnings

from fastapi_stream_lease import (
    BudgetExhausted,
    LeaseConfig,
    RateLimit,
    RateLimited,
    StreamLeaseManager,
)

warnings.simplefilter("ignore")  # the identity-secret warning: not what this program tests


async def main(url: str, key_prefix: str, spec: dict) -> None:
    budget = RateLimit("tokens", unit="tokens", **spec["budget"])
    manager = StreamLeaseManager(url=url, config=LeaseConfig(key_prefix=key_prefix, max_per_user=0))
    start = spec["start"]
    streams: list[dict] = []
    refused = 0

    async def chunks(delay: float, sizes: list[int], pause: float):
        await asyncio.sleep(delay)
        for size in sizes:
            yield size
            if pause:
                await asyncio.sleep(pause)

    async def one_stream(stream: dict) -> None:
        nonlocal refused
        await asyncio.sleep(max(0.0, start + stream["at"] - time.time()))
        while True:
            try:
                lease = await manager.acquire("alice", budgets=[budget], reserve=stream["reserve"])
                break
            except RateLimited:
                refused += 1
                if time.time() > start + stream["until"]:
                    return
                await asyncio.sleep(0.05)
        record = {"opened": time.time(), "events": [], "cut": False, "largest": 0}
        try:
            planned = chunks(stream["delay"], stream["chunks"], stream["pause"])
            async for size in lease.wrap(planned, tokens=int):
                record["events"].append([time.time(), size])
                record["largest"] = max(record["largest"], size)
        except BudgetExhausted:
            record["cut"] = True
        record["closed"] = time.time()
        streams.append(record)

    async def lane(planned: list[dict]) -> None:
        for stream in planned:
            await one_stream(stream)

    await asyncio.gather(*(lane(planned) for planned in spec["lanes"]))
    await manager.aclose()
    print(json.dumps({"streams": streams, "refused": refused}), flush=True)


with open(sys.argv[3]) as spec_file:
    asyncio.run(main(sys.argv[1], sys.argv[2], json.load(spec_file)))
