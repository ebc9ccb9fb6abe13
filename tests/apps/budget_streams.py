"""Runs STREAMS concurrent streams for alice against a 10,000-token minute budget for SECONDS
seconds: each reserves 200 tokens, streams chunks of 5 until it has sent 1,500 or its budget
runs out (on_budget="cut"), and a refused start tries again. Prints the tokens it streamed and
the most streams it had open at once (test_budgets: three of these together must stay within
the budget plus one top-up increment per concurrent stream).

Usage: budget_streams.py URL KEY_PREFIX STREAMS SECONDS
"""

import asyncio
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

BUDGET = RateLimit("tokens_per_minute", 10_000, per=60, unit="tokens")
CHUNK = 5


async def main(url: str, key_prefix: str, streams: int, seconds: float) -> None:
    config = LeaseConfig(key_prefix=key_prefix, max_per_user=streams * 3)
    manager = StreamLeaseManager(url=url, config=config)
    streamed = 0
    open_now = most_open = 0
    deadline = time.monotonic() + seconds

    async def chunks():
        for i in range(1_500 // CHUNK):
            yield i
            await asyncio.sleep(0.002)

    async def stream_until_deadline() -> None:
        nonlocal streamed, open_now, most_open
        while time.monotonic() < deadline:
            try:
                lease = await manager.acquire("alice", budgets=[BUDGET], reserve=200)
            except RateLimited:
                await asyncio.sleep(0.05)
                continue
            open_now += 1
            most_open = max(most_open, open_now)
            try:
                async for _ in lease.wrap(chunks(), tokens=lambda _: CHUNK):
                    streamed += CHUNK
            except BudgetExhausted:
                pass
            finally:
                open_now -= 1

    await asyncio.gather(*(stream_until_deadline() for _ in range(streams)))
    await manager.aclose()
    print(streamed, most_open, flush=True)


asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])))
