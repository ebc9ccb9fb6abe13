"""A worker streaming for two users: two endless streams of alice's and one of bob's, each
wrapped by its lease (30 s leases renewed every RENEW seconds). Prints ``streaming`` once all
three run, then ``ended <user> <error class>`` for each stream that ends; answers SIGUSR1 with
``running <n>`` (streams still running) and exits on SIGTERM after closing its manager
(test_revoke: an operator's revoke in another process ends alice's streams here within one
renewal period, and bob's never).

Usage: revocable_streams.py URL KEY_PREFIX SECRET RENEW
"""

import asyncio
import signal
import sys

from fastapi_stream_lease import LeaseConfig, StreamLeaseManager


async def ticks():
    while True:
        yield b"tick"
        await asyncio.sleep(0.01)


async def main(url: str, key_prefix: str, secret: str, renew: str) -> None:
    config = LeaseConfig(
        key_prefix=key_prefix,
        identity_secret=secret,
        lease_seconds=30,
        renew_every=float(renew),
        max_per_user=5,
    )
    manager = StreamLeaseManager(url=url, config=config)
    running = set()

    async def stream(user: str, lease) -> None:
        try:
            async for _ in lease.wrap(ticks()):
                pass
        except Exception as error:
            print("ended", user, type(error).__name__, flush=True)
        finally:
            running.discard(asyncio.current_task())

    for user in ("alice", "alice", "bob"):
        running.add(asyncio.create_task(stream(user, await manager.acquire(user))))
    print("streaming", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, lambda: print("running", len(running), flush=True))
    await stop.wait()
    for task in list(running):
        task.cancel()
    await manager.aclose()


asyncio.run(main(*sys.argv[1:5]))
