"""Sends N hits at once for alice against a limit of 10 per minute, prints how many were
admitted (test_rates: four of these together must admit exactly 10).

Usage: hit_burst.py URL KEY_PREFIX N
"""

import asyncio
import sys
import warnings

from fastapi_stream_lease import LeaseConfig, RateLimit, RateLimited, StreamLeaseManager

warnings.simplefilter("ignore")  # the identity-secret warning: not what this program tests


async def main(url: str, key_prefix: str, hits: int) -> None:
    manager = StreamLeaseManager(url=url, config=LeaseConfig(key_prefix=key_prefix))
    limit = RateLimit("burst", 10, per=60)
    results = await asyncio.gather(
        *(manager.hit("alice", limit) for _ in range(hits)), return_exceptions=True
    )
    errors = [r for r in results if isinstance(r, BaseException) and not isinstance(r, RateLimited)]
    if errors:
        raise errors[0]
    print(sum(isinstance(r, list) for r in results), flush=True)
    await manager.aclose()


asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
