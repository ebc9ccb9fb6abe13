"""Several worker processes share one cap; a worker killed with SIGKILL frees its slots by
expiry without touching the others'; a worker stalled past its leases loses them to others and
never pushes a pool past its cap; a worker shut down by SIGTERM releases at once."""

from __future__ import annotations

import asyncio
import signal

import pytest

from fastapi_stream_lease import StreamLeaseRejected

from support.apps import app_command
from support.waiting import count_is, eventually


async def start_worker(url: str, prefix: str, name: str):
    worker = await asyncio.create_subprocess_exec(
        *app_command("holding_worker", url, prefix, name), stdout=asyncio.subprocess.PIPE
    )
    line = await asyncio.wait_for(worker.stdout.readline(), 30)
    assert line.startswith(b"held"), line
    return worker, line.split()[1:]


async def test_a_killed_worker_frees_its_slots_and_no_one_elses(redis_server, redis_client,
                                                               key_prefix, make_redis_manager):
    observer = make_redis_manager(max_per_user=0, max_global=4, lease_seconds=1)
    doomed, _ = await start_worker(redis_server.url, key_prefix, "a")
    survivor, survivor_ids = await start_worker(redis_server.url, key_prefix, "b")
    assert await observer.get_active_count() == 4
    with pytest.raises(StreamLeaseRejected):
        await observer.acquire("c")  # the two workers share one cap

    doomed.send_signal(signal.SIGKILL)
    await doomed.wait()
    await count_is(observer, 2)  # within lease_seconds (+ one renewal period)
    await asyncio.sleep(2.5)  # more than two lease periods: the survivor keeps renewing
    # The dead worker's members are gone (reaped), the survivor's all there.
    alive = redis_client.zrange(f"{{{key_prefix}}}:global", 0, -1)
    assert set(alive) == set(survivor_ids)
    lease = await observer.acquire("c")

    survivor.send_signal(signal.SIGTERM)  # graceful shutdown: releases in one round trip
    assert (await asyncio.wait_for(survivor.stdout.readline(), 30)).startswith(b"closed")
    assert await survivor.wait() == 0
    assert await observer.get_active_count() == 1
    await lease.release()


async def test_a_stalled_worker_loses_its_slots_and_the_cap_holds(redis_server, redis_client,
                                                                  key_prefix, make_redis_manager):
    observer = make_redis_manager(max_per_user=0, max_global=4, lease_seconds=1)
    stalled, _ = await start_worker(redis_server.url, key_prefix, "a")
    running, running_ids = await start_worker(redis_server.url, key_prefix, "b")
    stalled.send_signal(signal.SIGSTOP)  # a long pause: it renews nothing
    taken = []

    async def took_its_slots() -> bool:
        try:
            taken.append(await observer.acquire(f"c{len(taken)}"))
        except StreamLeaseRejected:
            pass
        return len(taken) == 2

    await eventually(took_its_slots, what="the stalled worker's slots to be reaped and taken")
    stalled.send_signal(signal.SIGCONT)

    async def stalled_lost_both() -> bool:
        stalled.send_signal(signal.SIGUSR1)
        line = await asyncio.wait_for(stalled.stdout.readline(), 30)
        return line.split() == [b"lost", b"2"]

    await eventually(stalled_lost_both, what="the resumed worker to find its leases lost")
    members = set(redis_client.zrange(f"{{{key_prefix}}}:global", 0, -1))
    assert members == set(running_ids) | {lease.lease_id.encode() for lease in taken}
    for worker in (stalled, running):
        worker.send_signal(signal.SIGTERM)
        assert await worker.wait() == 0
