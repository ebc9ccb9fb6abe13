"""Lease behaviour, run on the embedded backend and on a real Redis."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import re

import pytest

from fastapi_stream_lease import (
    Lease,
    LeaseConfig,
    ManagerClosed,
    Resource,
    StreamLeaseRejected,
)
from fastapi_stream_lease.manager import ManagerStats

from support.apps import app_command
from support.loops import on_every_loop
from support.waiting import admits_again, count_is, eventually


async def test_per_user_and_global_caps_hold(make_manager):
    manager = make_manager(max_per_user=2, max_global=3)
    # Keep every lease referenced: a lease that is garbage collected releases itself.
    a1 = await manager.acquire("alice")
    a2 = await manager.acquire("alice")
    with pytest.raises(StreamLeaseRejected) as refused:
        await manager.acquire("alice")
    rejection = refused.value
    assert (rejection.limit, rejection.capacity, rejection.current) == ("per_user", 2, 2)
    assert refused.value.status_code == 429
    assert 1 <= refused.value.retry_after <= 5

    b1 = await manager.acquire("bob")
    with pytest.raises(StreamLeaseRejected) as full:
        await manager.acquire("carol")
    assert (full.value.limit, full.value.capacity, full.value.current) == ("global", 3, 3)
    assert full.value.status_code == 503
    assert await manager.get_active_count("carol") == 0, "a refused acquire takes nothing"

    await a1.release()
    c1 = await manager.acquire("carol")
    assert await manager.get_active_count() == 3
    assert not any(lease.released for lease in (a2, b1, c1))
    assert await manager.get_active_count("alice") == 1


async def test_refusals_by_shared_pools_can_withhold_their_usage(make_manager):
    manager = make_manager(max_per_user=1, max_global=2, disclose_usage=False)
    assert "disclose_usage=False" in repr(manager.config)
    held = [await manager.acquire("alice"), await manager.acquire("bob")]
    resources = make_manager(max_global=0, disclose_usage=False)
    gpu = Resource(1, "gpu")
    held.append(await resources.acquire(None, resources=[gpu]))

    for refusing, user_id, pools, limit in [
        (manager, "carol", (), "global"),
        (resources, None, [gpu], "gpu"),
    ]:
        with pytest.raises(StreamLeaseRejected) as full:
            await refusing.acquire(user_id, resources=pools)
        refused = full.value
        assert (refused.limit, refused.capacity, refused.current) == (limit, None, None)
        assert str(refused).startswith(f"{limit} stream limit reached; retry in ")
        response = refused.as_response()
        assert response.status_code == 503
        assert 1 <= int(response.headers["retry-after"]) <= 5
        assert not any(name.startswith("ratelimit") for name in response.headers)
        body = json.loads(response.body)
        assert "capacity" not in body and "current" not in body
        assert not re.search(r"\d+ of \d+", body["detail"])

    # The user's own quota is theirs to know.
    with pytest.raises(StreamLeaseRejected) as own:
        await manager.acquire("alice")
    assert (own.value.capacity, own.value.current) == (1, 1)
    assert own.value.as_response().headers["ratelimit"] == '"per_user";r=0;t=' + str(
        own.value.retry_after
    )
    assert len(held) == 3 and LeaseConfig().disclose_usage


async def test_zero_disables_a_limit(make_manager):
    manager = make_manager(max_per_user=0, max_global=0)
    leases = [await manager.acquire("alice") for _ in range(50)]
    assert await manager.get_active_count("alice") == 50
    assert await manager.get_active_count() == 50
    for lease in leases:
        await lease.release()
    assert await manager.get_active_count() == 0


async def test_200_concurrent_acquires_for_capacity_5_admit_exactly_5(make_manager):
    manager = make_manager(max_per_user=0, max_global=5)
    results = await asyncio.gather(
        *(manager.acquire(f"user{i}") for i in range(200)), return_exceptions=True
    )
    granted = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, StreamLeaseRejected)]
    assert len(granted) == 5
    assert len(refused) == 195
    assert await manager.get_active_count() == 5


async def test_a_vanished_holder_frees_its_slot_after_lease_seconds(make_manager, backend_url,
                                                                    key_prefix):
    if backend_url == "memory://":
        pytest.skip("the embedded store lives and dies with its only holder, the process")
    holder = await asyncio.create_subprocess_exec(
        *app_command("hold_one_lease", backend_url, key_prefix), stdout=asyncio.subprocess.PIPE
    )
    assert (await asyncio.wait_for(holder.stdout.readline(), 30)).startswith(b"held")
    holder.kill()  # SIGKILL: nobody releases, nobody renews
    await holder.wait()
    manager = make_manager(max_per_user=1, lease_seconds=2)
    with pytest.raises(StreamLeaseRejected):
        await manager.acquire("alice")
    await count_is(manager, 0, "alice")
    assert await manager.acquire("alice")


async def test_a_long_stream_keeps_its_slot(make_manager):
    manager = make_manager(max_per_user=1, lease_seconds=1)
    lease = await manager.acquire("alice")

    async def slow_stream():
        for i in range(6):
            await asyncio.sleep(0.5)  # the stream lives 3 x lease_seconds
            yield i

    seen = []
    async for item in lease.wrap(slow_stream()):
        assert await manager.get_active_count("alice") == 1
        with pytest.raises(StreamLeaseRejected):
            await manager.acquire("alice")
        seen.append(item)
    assert seen == list(range(6))
    assert not lease.lost
    await count_is(manager, 0, "alice")


@on_every_loop
async def test_release_on_normal_end_exception_and_cancellation(make_manager):
    manager = make_manager(max_per_user=1)

    async def tokens(fail: bool = False, hang: bool = False):
        yield "a"
        if fail:
            raise RuntimeError("model crashed")
        if hang:
            await asyncio.Event().wait()
        yield "b"

    lease = await manager.acquire("alice")
    assert [t async for t in lease.wrap(tokens())] == ["a", "b"]
    assert lease.released
    await count_is(manager, 0, "alice")

    lease = await manager.acquire("alice")
    with pytest.raises(RuntimeError, match="model crashed"):
        async for _ in lease.wrap(tokens(fail=True)):
            pass
    await count_is(manager, 0, "alice")

    lease = await manager.acquire("alice")

    async def consume():
        async for _ in lease.wrap(tokens(hang=True)):
            pass

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await count_is(manager, 0, "alice")

    # A generator closed early (Starlette does this on disconnect) releases too.
    lease = await manager.acquire("alice")
    stream = lease.wrap(tokens(hang=True))
    assert await stream.__anext__() == "a"
    await stream.aclose()
    await count_is(manager, 0, "alice")


async def test_sync_iterables_can_be_wrapped(make_manager):
    manager = make_manager(max_per_user=1)
    lease = await manager.acquire("alice")
    assert [x async for x in lease.wrap(["x", "y"])] == ["x", "y"]
    await count_is(manager, 0, "alice")


async def test_release_twice_is_harmless(make_manager):
    manager = make_manager(max_per_user=1)
    lease = await manager.acquire("alice")
    assert await lease.release() is True
    assert await lease.release() is False
    assert lease.release_nowait() is False
    assert lease.released and not lease.lost
    assert await manager.get_active_count("alice") == 0


async def test_a_garbage_collected_lease_is_released(make_manager):
    manager = make_manager(max_per_user=1)
    lease = await manager.acquire("alice")
    del lease
    gc.collect()
    await count_is(manager, 0, "alice")
    assert manager.stats()["held"] == 0


async def test_context_manager_releases_on_exit_and_on_error(make_manager):
    manager = make_manager(max_per_user=1)
    async with manager.lease("alice") as lease:
        assert await manager.get_active_count("alice") == 1
    assert lease.released
    assert await manager.get_active_count("alice") == 0
    with pytest.raises(ValueError, match="boom"):
        async with manager.lease("alice"):
            raise ValueError("boom")
    assert await manager.get_active_count("alice") == 0


async def test_weighted_leases_take_that_many_slots_everywhere(make_manager):
    manager = make_manager(max_per_user=5, max_global=4)
    heavy = await manager.acquire("alice", weight=3)
    assert heavy.weight == 3
    assert await manager.get_active_count("alice") == 3
    assert await manager.get_active_count() == 3
    with pytest.raises(StreamLeaseRejected) as refused:
        await manager.acquire("bob", weight=2)
    assert refused.value.limit == "global"
    light = await manager.acquire("bob")
    await heavy.release()
    assert await manager.get_active_count() == 1
    with pytest.raises(ValueError, match="could never be granted"):
        await manager.acquire("bob", weight=6)
    await light.release()


async def test_aclose_releases_everything_this_process_holds(make_manager):
    manager = make_manager(max_per_user=0, max_global=0)
    leases = [await manager.acquire(f"user{i}") for i in range(20)]
    observer = make_manager(max_per_user=0, max_global=0)
    await manager.aclose()
    assert all(lease.released for lease in leases)
    if manager.backend != "memory://":
        assert await observer.get_active_count() == 0
    stats = manager.stats()
    assert (stats["held"], stats["lost"], stats["closed"]) == (0, 0, True)


async def test_stats_have_the_documented_keys(make_manager):
    assert set(make_manager().stats()) == ManagerStats.__required_keys__


async def test_an_acquire_in_flight_when_the_manager_closes_takes_nothing(make_manager):
    manager = make_manager(max_per_user=0, max_global=0)
    observer = make_manager(max_per_user=0, max_global=0)
    in_flight = [asyncio.ensure_future(manager.acquire(f"user{i}")) for i in range(50)]
    await asyncio.sleep(0)
    await manager.aclose()
    outcomes = await asyncio.gather(*in_flight, return_exceptions=True)
    assert all(isinstance(o, (ManagerClosed, Lease)) for o in outcomes)
    for lease in (o for o in outcomes if isinstance(o, Lease)):
        assert lease.released
    assert manager.stats()["held"] == 0
    if manager.backend != "memory://":
        await count_is(observer, 0)


async def test_without_a_global_pool_only_per_user_caps_apply(make_manager):
    manager = make_manager(max_per_user=1, global_pool=False)
    leases = [await manager.acquire(f"user{i}") for i in range(30)]
    with pytest.raises(StreamLeaseRejected):
        await manager.acquire("user3")
    with pytest.raises(ValueError, match="no global pool"):
        await manager.get_active_count()
    for lease in leases:
        await lease.release()
    assert await manager.get_active_count("user3") == 0


async def test_a_per_call_cap_serves_tiers_from_one_manager(make_manager):
    manager = make_manager(max_per_user=1)
    free = await manager.acquire("free-user")
    with pytest.raises(StreamLeaseRejected):
        await manager.acquire("free-user")
    paid = [await manager.acquire("paid-user", max_per_user=3) for _ in range(3)]
    with pytest.raises(StreamLeaseRejected) as refused:
        await manager.acquire("paid-user", max_per_user=3)
    assert refused.value.capacity == 3
    with pytest.raises(ValueError, match="max_per_user=-1 is out of range"):
        await manager.acquire("paid-user", max_per_user=-1)
    async with manager.lease("free-user", max_per_user=2):
        assert await manager.get_active_count("free-user") == 2
    for lease in [free, *paid]:
        await lease.release()


async def test_releases_racing_renewals_leave_nothing_behind(make_manager):
    # Renewal every 50 ms while leases come and go: a lease released between a renewal round's
    # snapshot and its script must not be taken back and left behind for 30 s.
    manager = make_manager(max_per_user=0, max_global=0, lease_seconds=30, renew_every=0.05)

    async def churn(n: int) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 1.5
        while loop.time() < deadline:
            lease = await manager.acquire(f"user{n}")
            await asyncio.sleep(0.001)
            await lease.release()

    await asyncio.gather(*(churn(n) for n in range(32)))
    await count_is(manager, 0)
    assert manager.stats()["held"] == 0


async def test_a_streams_end_sends_its_release_and_logs_a_failure_when_it_comes(
    own_redis, make_own_redis_manager, caplog
):
    """A wrapped stream's end sends the release and ends without waiting for the store's
    answer (the stream's task has nothing left to do with it): it ends while Redis answers
    nothing; the release's failure is logged when its call gives up, and the keep-alive
    releases the lease again once Redis is back."""
    manager = make_own_redis_manager(redis_timeout=1.0)
    lease = await manager.acquire("alice")

    async def tokens():
        yield "a"
        yield "b"

    caplog.set_level(logging.WARNING, logger="fastapi_stream_lease")
    own_redis.pause()
    try:
        assert [token async for token in lease.wrap(tokens())] == ["a", "b"]
        assert lease.released
        assert not caplog.records, "the stream ended before its release's answer"
        await eventually(
            lambda: any("release failed" in r.getMessage() for r in caplog.records),
            what="the failed release to be logged",
        )
    finally:
        own_redis.resume()
    await admits_again(manager)
    await count_is(manager, 0)
