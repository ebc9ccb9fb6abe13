"""A worker holding two leases (1 s, 4 global slots shared with the other workers): prints
``held <id> <id>``, answers SIGUSR1 with ``lost <count>``, and on SIGTERM closes its manager as
an app's lifespan does, then prints ``closed`` (test_workers).

Usage: holding_worker.py URL KEY_PREFIX NAME
"""

import asyncio
import signal
import sys

from fastapi_stream_lease import LeaseConfig, StreamLeaseManager


async def main(url: str, key_prefix: str, name: str) -> None:
    config = LeaseConfig(max_per_user=0, max_global=4, lease_seconds=1, key_prefix=key_prefix)
    manager = StreamLeaseManager(url=url, config=config)
    leases = [await manager.acquire(f"{name}-{i}") for i in range(2)]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(
        signal.SIGUSR1, lambda: print("lost", manager.stats()["lost"], flush=True)
    )
    print("held", *(lease.lease_id for lease in leases), flush=True)
    await stop.wait()
    await manager.aclose()  # what an app's lifespan does on shutdown
    print("closed", flush=True)


asyncio.run(main(*sys.argv[1:4]))
