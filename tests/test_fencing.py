"""Fencing tokens: each grant carries a number larger than every earlier grant's in its pools,
so a downstream that remembers the largest it saw can refuse a holder whose lease was lost."""

from __future__ import annotations

import asyncio

import pytest

from fastapi_stream_lease import Lease, LeaseConfig, StreamLeaseManager, StreamLeaseUnavailable

from support.waiting import eventually

# How far a token may lag the Redis server's clock in µs (FENCING_SLACK_US, src/lua/acquire.lua).
SLACK_US = 1_000_000


def server_clock_us(redis_client) -> int:
    seconds, micros = redis_client.time()
    return seconds * 1_000_000 + micros


async def test_every_grant_takes_a_fencing_token_above_every_earlier_one(make_manager):
    manager = make_manager(max_per_user=0, max_global=0, fencing_tokens=True)
    first = await manager.acquire("alice")
    heavy = await manager.acquire("bob", weight=3)
    # Acquires made together go to Redis in one call: each grant of it takes its own token.
    together = await asyncio.gather(*(manager.acquire(f"user-{i}") for i in range(8)))
    tokens = [lease.fencing_token for lease in together]
    assert all(type(token) is int and token < 2**63 for token in tokens), "a signed 64-bit int"
    assert 0 < first.fencing_token < heavy.fencing_token < min(tokens)
    assert len(set(tokens)) == len(tokens), "no two grants share a token"
    await first.release()
    again = await manager.acquire("alice")
    assert again.fencing_token > max(tokens), "a released lease's token is never given again"
    assert first.fencing_token < again.fencing_token, "a lease keeps its token after its release"


async def test_fencing_tokens_grow_across_managers_sharing_a_pool(make_redis_manager,
                                                                  redis_client):
    # Two managers: two workers of one app, each with its own connection and holder.
    workers = [make_redis_manager(max_per_user=1, max_global=1, fencing_tokens=True)
               for _ in range(2)]
    tokens = []
    for turn in range(6):
        before = server_clock_us(redis_client)
        lease = await workers[turn % 2].acquire(f"user-{turn}")
        after = server_clock_us(redis_client)
        tokens.append(lease.fencing_token)
        await lease.release()
        assert before - SLACK_US <= lease.fencing_token <= after, "the server's clock in µs"
    assert tokens == sorted(set(tokens)), f"not strictly increasing: {tokens}"


async def test_a_replica_copy_older_than_a_second_gives_no_lost_token_again(make_redis_manager,
                                                                         redis_client,
                                                                         key_prefix):
    manager = make_redis_manager(fencing_tokens=True)
    lost = await manager.acquire("alice")  # its token's write is lost with the failover below
    # What a replica promoted more than a second after it copied the tag's last token holds.
    copy = server_clock_us(redis_client) - SLACK_US - 1
    redis_client.set(f"{{{key_prefix}}}:holders:fencing", copy, px=3_600_000)
    after = await manager.acquire("bob")
    assert after.fencing_token > lost.fencing_token > copy


async def test_the_embedded_store_orders_the_leases_of_every_tag():
    # Without the global pool each user's keys have a hash tag of their own.
    manager = StreamLeaseManager(url="memory://", config=LeaseConfig(global_pool=False,
                                                                       fencing_tokens=True))
    leases = [await manager.acquire(user) for user in ("alice", "bob", "alice", "carol")]
    tokens = [lease.fencing_token for lease in leases]
    assert tokens == sorted(set(tokens)), f"not strictly increasing: {tokens}"
    await manager.aclose()


async def test_a_manager_that_asks_for_no_fencing_tokens_pays_nothing_for_them(make_manager,
                                                                            backend_url,
                                                                            key_prefix, request):
    manager = make_manager()
    assert not manager.config.fencing_tokens, "off unless asked for"
    lease = await manager.acquire("alice")
    with pytest.raises(RuntimeError, match=r"LeaseConfig\(fencing_tokens=True\)"):
        _ = lease.fencing_token
    if backend_url != "memory://":
        redis_client = request.getfixturevalue("redis_client")
        assert not redis_client.exists(f"{{{key_prefix}}}:holders:fencing"), "no INCR, no key"
    await lease.release()


async def granted_when_reachable(manager, user_id: str) -> Lease:
    """A lease for ``user_id`` from the first acquire that reaches the (restarted) server."""
    granted: list[Lease] = []

    async def acquired() -> bool:
        try:
            granted.append(await manager.acquire(user_id))
        except StreamLeaseUnavailable:
            return False
        return True

    await eventually(acquired, what="an acquire to reach the restarted server")
    return granted[0]


async def test_fencing_tokens_grow_past_a_restart_that_lost_every_write(own_redis,
                                                                        make_own_redis_manager):
    # Renewed often enough to take the held lease back soon after the restart, and long enough
    # to outlive a slow restart on a loaded machine.
    manager = make_own_redis_manager(
        max_global=2, redis_timeout=0.5, lease_seconds=12, renew_every=1.0, fencing_tokens=True
    )
    held = await manager.acquire("alice")
    token_held = held.fencing_token
    before = await manager.acquire("bob")
    await before.release()
    own_redis.restart()  # same port, empty data: the last token given is forgotten too
    after = await granted_when_reachable(manager, "carol")
    assert after.fencing_token > before.fencing_token > token_held
    await eventually(lambda: manager.stats()["reclaimed"] == 1,
                     what="the held lease to be taken back")
    assert not held.lost and held.fencing_token == token_held, "taken back with its token"


async def test_the_local_floor_orders_the_leases_it_admits(own_redis, make_own_redis_manager):
    manager = make_own_redis_manager(redis_timeout=0.3, failure_mode="open",
                                     fencing_tokens=True)
    own_redis.stop()
    first, second = await manager.acquire("alice"), await manager.acquire("bob")
    assert 0 < first.fencing_token < second.fencing_token
