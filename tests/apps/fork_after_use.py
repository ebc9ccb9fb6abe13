"""Forks with two managers, one used before the fork (and holding a lease) and one not; the
child uses both and drops its copy of the held lease, then the parent prints what it still holds
(test_fork).

Usage: fork_after_use.py URL KEY_PREFIX
"""

import asyncio
import gc
import os
import sys

from fastapi_stream_lease import Lease, LeaseConfig, StreamLeaseManager

url, key_prefix = sys.argv[1:3]
manager = StreamLeaseManager(url=url, config=LeaseConfig(key_prefix=key_prefix))
used = StreamLeaseManager(url=url, config=LeaseConfig(key_prefix=key_prefix))


async def before_fork() -> Lease:
    lease = await used.acquire("parent")
    await lease.release()
    return await used.acquire("parent")


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


async def in_parent() -> None:
    print("parent holds", await used.get_active_count("parent"), flush=True)


held = asyncio.run(before_fork())
pid = os.fork()
if pid == 0:
    asyncio.run(in_child())
    del held  # the parent's lease: the child must not release it
    gc.collect()
    asyncio.run(asyncio.sleep(0.5))  # time for a release, were one started
    os._exit(0)
_, status = os.waitpid(pid, 0)
asyncio.run(in_parent())
sys.exit(os.waitstatus_to_exitcode(status))
