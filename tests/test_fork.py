"""Pre-forking servers (gunicorn --preload): a manager built before the fork works in each
child; one already used before the fork gives a clear error instead of hanging."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import asyncio, os, sys
from fastapi_stream_lease import LeaseConfig, StreamLeaseManager

manager = StreamLeaseManager(url=sys.argv[1], config=LeaseConfig(key_prefix=sys.argv[2]))
used = StreamLeaseManager(url=sys.argv[1], config=LeaseConfig(key_prefix=sys.argv[2]))

async def before_fork():
    lease = await used.acquire("parent")
    await lease.release()

async def in_child():
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
"""


def test_managers_across_fork(redis_server, key_prefix):
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, redis_server.url, key_prefix],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "child acquired 1" in done.stdout
    assert "used in process" in done.stdout and "before it forked" in done.stdout
