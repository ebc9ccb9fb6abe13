"""Leased global slots (``LeaseConfig(lease_global_slots=True)``): each process takes the global
pool's slots in slabs and starts streams from them, with no call to the global pool's shard;
each user's keys have a hash tag of their own. The cap holds across processes, a slab no stream
uses goes back, and a slab found lost loses the streams it serves. On a real Redis: the embedded
store is one process, and counts its streams as it always does."""

from __future__ import annotations

import asyncio
import random

import pytest
import redis as redis_py

from fastapi_stream_lease import (
    LeaseConfig,
    Resource,
    StreamLeaseManager,
    StreamLeaseRejected,
)

from support.waiting import count_is, eventually

pytestmark = pytest.mark.usefixtures("redis_server")


def slabs_of(client: redis_py.Redis, prefix: str) -> dict[bytes, int]:
    """The slabs the global pool holds: each a lease, its members ``<id>``, ``<id>#2``, ...;
    by id, with its slots."""
    slabs: dict[bytes, int] = {}
    for member in client.zrange(f"{{{prefix}}}:global", 0, -1):
        lease = member.split(b"#")[0]
        slabs[lease] = slabs.get(lease, 0) + 1
    return slabs


async def test_streams_start_from_slabs_and_users_keys_leave_the_global_pools_tag(
    make_redis_manager, redis_client, key_prefix
):
    manager = make_redis_manager(max_per_user=1, max_global=100, lease_global_slots=True)
    leases = [await manager.acquire(f"user{i}") for i in range(40)]
    slabs = slabs_of(redis_client, key_prefix)
    # Slabs grow with the slots in use (a quarter of them, at most a tenth of the cap): fewer
    # takes than streams, and never more than a slab's worth of slots held unused.
    assert len(slabs) < 20
    assert max(slabs.values()) <= 100 // 10
    assert 40 <= sum(slabs.values()) <= 40 + 100 // 10
    # Each user's own pool is in a tag of its own; the global pool's tag holds the slabs only.
    shared_tag = {key for key in redis_client.keys(f"{{{key_prefix}}}:*")}
    assert not any(b":user:" in key for key in shared_tag)
    own_pools = redis_client.keys(f"{{{key_prefix}:*}}:user")
    assert len(own_pools) == 40
    # The global count is the slabs' slots, used or held free; the held leases, the streams'
    # and the slabs'; the headers' pools, the user's own.
    assert await manager.get_active_count() == sum(slabs.values())
    assert manager.stats()["held"] == 40 + len(slabs)
    assert leases[0].pool_usage == [("per_user", 1, 1)]
    for lease in leases:
        await lease.release()


async def test_a_slab_takes_at_most_16_slots_and_a_cold_process_exactly_its_streams(
    make_redis_manager, redis_client, key_prefix
):
    manager = make_redis_manager(max_per_user=0, max_global=10_000, lease_global_slots=True)
    first = await manager.acquire("first", weight=3)
    assert list(slabs_of(redis_client, key_prefix).values()) == [3]
    leases = [first] + [await manager.acquire(f"user{i}") for i in range(150)]
    slabs = slabs_of(redis_client, key_prefix)
    assert max(slabs.values()) == 16  # a quarter of 150 slots is more: 16 is the most
    for lease in leases:
        await lease.release()


async def test_the_cap_holds_across_processes_that_lease_slots(make_redis_manager, key_prefix):
    cap = 10
    managers = [
        make_redis_manager(max_per_user=0, max_global=cap, lease_global_slots=True)
        for _ in range(3)
    ]
    outcomes = await asyncio.gather(
        *(managers[i % 3].acquire(f"user{i}") for i in range(60)), return_exceptions=True
    )
    granted = [o for o in outcomes if not isinstance(o, BaseException)]
    assert all(isinstance(o, StreamLeaseRejected) for o in outcomes if o not in granted)
    assert 1 <= len(granted) <= cap
    for lease in granted:
        await lease.release()
    # What the others no longer use goes back (at once, or idle for a second): one process can
    # then take the whole cap.
    await count_is(managers[0], 0)
    again = [await managers[1].acquire(f"again{i}") for i in range(cap)]
    with pytest.raises(StreamLeaseRejected) as refused:
        await managers[2].acquire("one-too-many")
    assert refused.value.limit == "global"
    for lease in again:
        await lease.release()


async def test_a_stream_refused_by_its_own_quota_leaves_its_slot_to_the_next(
    make_redis_manager, redis_client, key_prefix
):
    manager = make_redis_manager(max_per_user=1, max_global=100, lease_global_slots=True)
    first = await manager.acquire("alice")
    with pytest.raises(StreamLeaseRejected) as refused:
        await manager.acquire("alice")
    assert refused.value.limit == "per_user"
    slabs = slabs_of(redis_client, key_prefix)
    second = await manager.acquire("bob")  # on the slot the refused stream gave back
    assert slabs_of(redis_client, key_prefix) == slabs
    await first.release()
    await second.release()


async def test_a_slab_no_stream_uses_goes_back(make_redis_manager, redis_client, key_prefix):
    manager = make_redis_manager(max_global=100, lease_global_slots=True)
    leases = [await manager.acquire(f"user{i}") for i in range(12)]
    for lease in leases:
        await lease.release()
    # One empty slab is kept for a second, for the next stream; the rest go back at once.
    assert len(slabs_of(redis_client, key_prefix)) <= 1
    await count_is(manager, 0)
    assert manager.stats()["held"] == 0


async def test_closing_gives_every_slab_back(make_redis_manager, redis_client, key_prefix):
    manager = make_redis_manager(max_global=100, lease_global_slots=True)
    await manager.acquire("alice")
    await manager.aclose()
    assert slabs_of(redis_client, key_prefix) == {}


async def test_a_slab_found_lost_loses_the_streams_it_serves(
    make_redis_manager, redis_client, key_prefix
):
    """A failover that lost the slab's grant, and another process that took the room since: the
    holder's keep-alive finds its slab missing with no room to take it back."""
    holder = make_redis_manager(max_global=2, lease_global_slots=True, lease_seconds=1.5)
    lease = await holder.acquire("alice")
    # What a failover to a replica that missed the grant leaves: neither the slab's member nor
    # its holder's count of members (scripts replicate whole).
    tallies = redis_client.keys(f"{{{key_prefix}}}:holders:*:members")
    redis_client.delete(f"{{{key_prefix}}}:global", *tallies)
    other = make_redis_manager(max_global=2, lease_global_slots=True)
    taken = [await other.acquire(f"user{i}") for i in range(2)]
    await eventually(lambda: lease.lost, what="the stream of the lost slab lost")
    assert holder.stats()["lost"] >= 2  # the slab and its stream
    assert await other.get_active_count() == 2
    for held in taken:
        await held.release()


async def test_a_waiter_gets_a_slot_another_process_frees(make_redis_manager):
    first = make_redis_manager(max_global=1, lease_global_slots=True)
    second = make_redis_manager(max_global=1, lease_global_slots=True)
    held = await first.acquire("alice")
    waiting = asyncio.create_task(second.acquire("bob", wait_timeout=10))
    await eventually(lambda: second.stats()["waiting"] == 1, what="bob in line")
    await held.release()
    # The freed slot's slab goes back once idle (a second), and the line wakes bob.
    lease = await waiting
    await lease.release()


async def test_the_local_floor_keeps_the_global_share_while_redis_is_down(
    own_redis, make_own_redis_manager
):
    """Regression: a stream admitted by the local floor (``failure_mode="open"``, Redis down)
    gave its slot back as soon as it started (the slot stayed with the request's record, not
    the floor's lease), so the floor admitted every stream past the global share."""
    manager = make_own_redis_manager(
        max_per_user=0, max_global=4, redis_timeout=0.3, failure_mode="open", fallback_workers=2,
        lease_global_slots=True,
    )
    assert await manager.get_active_count() == 0
    own_redis.stop()
    held = [await manager.acquire(f"user{i}") for i in range(2)]  # global floor: 4 / 2 = 2
    with pytest.raises(StreamLeaseRejected, match="global"):
        await manager.acquire("user2")
    await held[0].release()  # the slot comes back with the floor's lease
    held[0] = await manager.acquire("user2")
    own_redis.start()
    for lease in held:
        await lease.release()


async def test_a_waiter_over_its_own_quota_is_refused_for_the_global_pool_after_its_wait(
    make_redis_manager,
):
    manager = make_redis_manager(max_per_user=1, max_global=1, lease_global_slots=True)
    held = await manager.acquire("alice")
    with pytest.raises(StreamLeaseRejected) as refused:
        await manager.acquire("alice", wait_timeout=0.3)
    assert refused.value.limit == "global"
    await held.release()


async def test_the_embedded_store_counts_streams_as_it_always_does():
    manager = StreamLeaseManager(
        url="memory://", config=LeaseConfig(max_global=3, lease_global_slots=True)
    )
    leases = [await manager.acquire(f"user{i}") for i in range(3)]
    assert await manager.get_active_count() == 3
    with pytest.raises(StreamLeaseRejected):
        await manager.acquire("user4")
    for lease in leases:
        await lease.release()
    await manager.aclose()


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"global_pool": False}, "drop global_pool=False, or lease_global_slots"),
        ({"max_global": 0}, "give max_global a capacity, or drop lease_global_slots"),
        ({"wait_for_own_quota": True}, "drop one of the two"),
        ({"lease_global_slots": "yes"}, "lease_global_slots must be a boolean"),
    ],
)
def test_bad_settings_say_what_to_change(config, message):
    settings = {"lease_global_slots": True, **config}
    with pytest.raises((ValueError, TypeError), match=message):
        LeaseConfig(**settings)


async def test_resources_and_a_user_in_one_acquire_are_refused_with_the_reason(
    make_redis_manager,
):
    manager = make_redis_manager(lease_global_slots=True)
    with pytest.raises(ValueError, match="lease_global_slots=True"):
        await manager.acquire("alice", resources=[Resource(2, "gpu")])


async def test_random_starts_ends_and_lost_grants_never_exceed_the_cap(
    make_redis_manager, redis_client, key_prefix
):
    """Streams of random users, weights and waits start and end in three processes (managers:
    each its own holder) while grants are lost now and then (a failover's: a holder's slab
    members and its count of them gone). Outside the window a loss opens (its holder's next
    keep-alives take the slab back or lose it with its streams), the live streams' slots never
    exceed the cap."""
    cap, lease_seconds = 6, 1.5
    managers = [
        make_redis_manager(max_per_user=2, max_global=cap, lease_global_slots=True,
                           lease_seconds=lease_seconds)
        for _ in range(3)
    ]
    rng = random.Random(7)
    live: dict[int, tuple[object, int]] = {}
    losses: list[float] = []
    worst = 0
    loop = asyncio.get_running_loop()
    stop = loop.time() + 12.0

    def in_a_window() -> bool:
        # A round (every lease_seconds / 3) finds the loss, within three of them (the chaos
        # auditor's settling bound, with calls that never time out here), and the stream of a
        # lost lease ends within half a second.
        return any(loop.time() - at < lease_seconds + 0.5 for at in losses)

    def check() -> None:
        nonlocal worst
        used = sum(weight for lease, weight in live.values() if not lease.lost)
        if not in_a_window():
            worst = max(worst, used)
            assert used <= cap, f"{used} slots in live streams, cap {cap}"

    async def streams(runner: int) -> None:
        n = 0
        while loop.time() < stop:
            manager = rng.choice(managers)
            weight = rng.choice([1, 1, 1, 2])
            wait = rng.choice([0.0, 0.0, 0.3])
            try:
                lease = await manager.acquire(f"user{rng.randrange(8)}", weight=weight,
                                              wait_timeout=wait)
            except StreamLeaseRejected:
                await asyncio.sleep(rng.uniform(0, 0.05))
                continue
            key = runner * 100_000 + n
            n += 1
            live[key] = (lease, weight)
            check()
            # One stream in five outlives a loss's window: one wrongly kept shows over the cap.
            await asyncio.sleep(rng.uniform(0, 0.3) if rng.random() < 0.8 else rng.uniform(3, 6))
            del live[key]
            await lease.release()

    async def failovers() -> None:
        while loop.time() < stop:
            await asyncio.sleep(rng.uniform(2.5, 3.5))
            slabs = list(slabs_of(redis_client, key_prefix))
            if not slabs:
                continue
            lost = rng.choice(slabs)
            losses.append(loop.time())
            members = [m for m in redis_client.zrange(f"{{{key_prefix}}}:global", 0, -1)
                       if m.split(b"#")[0] == lost]
            score = members and redis_client.zscore(f"{{{key_prefix}}}:global", members[0])
            if not score:
                continue  # given back meanwhile
            holder = int(score)
            redis_client.zrem(f"{{{key_prefix}}}:global", *members)
            redis_client.delete(f"{{{key_prefix}}}:holders:{holder}:members")

    async def checks() -> None:
        while loop.time() < stop:
            check()
            await asyncio.sleep(0.05)

    await asyncio.gather(failovers(), checks(), *(streams(r) for r in range(10)))
    assert worst > 0
    for manager in managers:
        await manager.aclose()
    assert slabs_of(redis_client, key_prefix) == {}
