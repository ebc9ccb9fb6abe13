"""Forks with two managers, one used before the fork and one not; the child uses both and
prints what it got (test_fork).

Usage: fork_after_use.py URL KEY_PREFIX
"""

import asyncio
import os
import sys

from fastapi_stream_lease import LeaseConfig, StreamLeaseManager

url, key_prefix = sys.argv[1:3]
manager = StreamLeaseManager(url=url, config=LeaseConfig(key_prefix=key_prefix))
used = StreamLeaseManager(url=url, config=LeaseConfig(key_prefix=key_prefix))


async def before_fork() -> None:
    lease = await used.acquire("parent")
    await lease.release()


async def in_child() -> None:
    lease = await manager.acquire("child")
    print("child acquired", await manager.get_active_count("child"), flush=True)
    await lease.release()
    try:
        await used.acquire("child")
    except RuntimeError as error:
        print("used manager:", error, flush=True)
    await used.aclose()
    await manager.aclose()


asyncio.run(before_fork())
pid = os.fork()
if pid == 0:
    asyncio.run(in_child())
    os._exit(0)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
