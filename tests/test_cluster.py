"""On a real 3-master Redis Cluster: no CROSSSLOT, caps hold, clients of both kinds work."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

from fastapi_stream_lease import LeaseConfig, RateLimit, StreamLeaseManager, StreamLeaseRejected

from support.redis_servers import RedisCluster
from support.waiting import eventually, renewals_ran


async def test_caps_hold_on_a_cluster(redis_cluster, key_prefix):
    config = LeaseConfig(key_prefix=key_prefix, max_per_user=2, max_global=5, lease_seconds=3)
    managers = [StreamLeaseManager(url=redis_cluster.url, config=config) for _ in range(3)]
    results = await asyncio.gather(
        *(managers[i % 3].acquire(f"user{i % 4}") for i in range(40)), return_exceptions=True
    )
    granted = [r for r in results if not isinstance(r, BaseException)]
    assert all(isinstance(r, StreamLeaseRejected) for r in results if r not in granted)
    assert len(granted) == 5
    for manager in managers:  # renewal batches run on the cluster too
        if manager.stats()["held"]:
            await renewals_ran(manager)
    assert await managers[0].get_active_count() == 5
    assert not any(lease.lost for lease in granted)
    for manager in managers:
        await manager.aclose()
    observer = StreamLeaseManager(url=redis_cluster.url, config=config)
    assert await observer.get_active_count() == 0
    await observer.aclose()


async def test_a_redis_asyncio_cluster_client_is_accepted(redis_cluster, key_prefix):
    first = redis_cluster.nodes[0]
    client = AsyncRedisCluster(host="127.0.0.1", port=first.port)
    manager = StreamLeaseManager(
        redis=client, config=LeaseConfig(key_prefix=key_prefix, max_per_user=1)
    )
    assert manager.backend.startswith("redis+cluster://")
    lease = await manager.acquire("alice")
    with pytest.raises(StreamLeaseRejected):
        await manager.acquire("alice")
    assert await client.zcard(f"{{{key_prefix}}}:global") == 1
    await lease.release()
    await manager.aclose()
    await client.aclose()


async def test_a_cluster_node_restart_is_survived(key_prefix, tmp_path):
    cluster = RedisCluster().start()  # its own: this test restarts a node
    try:
        config = LeaseConfig(key_prefix=key_prefix, max_per_user=1, lease_seconds=1,
                             redis_timeout=0.5)
        manager = StreamLeaseManager(url=cluster.url, config=config)
        lease = await manager.acquire("alice")
        slot = int(cluster.nodes[0].cli("cluster", "keyslot", f"{{{key_prefix}}}"))
        owner = next(n for n in cluster.nodes if _serves(n, slot))
        owner.process.kill()  # the shard holding every key of this manager dies ...
        owner.process.wait()
        owner.process = None
        owner.start()  # ... and comes back empty, with its cluster config (nodes.conf) intact

        async def renewed_or_lost() -> bool:
            try:
                count = await manager.get_active_count("alice")
            except Exception:
                return False
            return count == 1 or lease.lost

        await eventually(renewed_or_lost, timeout=20, what="the shard to serve again")
        assert manager.stats()["lost"] + manager.stats()["reclaimed"] <= 1
        await lease.release()
        again = await manager.acquire("alice")
        await again.release()
        await manager.aclose()
    finally:
        cluster.cleanup()


async def test_a_dead_shard_is_unavailable_not_an_error(key_prefix):
    # The first call after the shard dies gets MOVED back to it (and later ones CLUSTERDOWN):
    # taken for an error of the server, failure_mode="open" would refuse them.
    cluster = RedisCluster().start()  # its own: this test kills a node
    try:
        config = LeaseConfig(key_prefix=key_prefix, max_per_user=0, lease_seconds=2,
                             redis_timeout=0.5, failure_mode="open")
        manager = StreamLeaseManager(url=cluster.url, config=config)
        await (await manager.acquire("alice")).release()
        slot = int(cluster.nodes[0].cli("cluster", "keyslot", f"{{{key_prefix}}}"))
        next(n for n in cluster.nodes if _serves(n, slot)).stop()
        # Until the others mark it failed (cluster-node-timeout 2 s) and after: admitted on
        # this process's floor every time.
        loop = asyncio.get_running_loop()
        until = loop.time() + 4
        while loop.time() < until:
            lease = await manager.acquire("bob")
            await lease.release()
            await asyncio.sleep(0.1)
        await manager.aclose()
    finally:
        cluster.cleanup()


def _serves(node, slot: int) -> bool:
    """Whether ``node`` is the master of ``slot`` (read from its CLUSTER NODES line)."""
    shards = node.cli("cluster", "nodes").splitlines()
    me = next(s for s in shards if "myself" in s).split()
    for spec in me[8:]:
        start, _, end = spec.partition("-")
        if int(start) <= slot <= int(end or start):
            return True
    return False


async def test_without_a_global_pool_users_spread_across_shards(redis_cluster, key_prefix):
    config = LeaseConfig(key_prefix=key_prefix, max_per_user=1, global_pool=False,
                         lease_seconds=3)
    manager = StreamLeaseManager(url=redis_cluster.url, config=config)
    leases = [await manager.acquire(f"user{i}") for i in range(60)]
    keys_per_node = [
        len(node.cli("--scan", "--pattern", f"{{{key_prefix}:*").split()) for node in
        redis_cluster.nodes
    ]
    # per user: its pool, holders, the tag's clock, and this holder's pools and count of members
    assert sum(keys_per_node) == 5 * 60
    assert sum(1 for n in keys_per_node if n > 0) == 3, keys_per_node
    await renewals_ran(manager, calls=2 * 60)  # one keep-alive per tag, each in its slot
    assert manager.stats()["renew_failures"] == 0, manager.stats()  # no CROSSSLOT
    assert not any(lease.lost for lease in leases), manager.stats()
    assert await manager.get_active_count("user7") == 1
    with pytest.raises(StreamLeaseRejected):
        await manager.acquire("user7")
    with pytest.raises(ValueError, match="no global pool"):
        await manager.get_active_count()
    await manager.aclose()

    # Every key gone, but the 1 s marker of the full pool's walk, after a while.
    await eventually(
        lambda: all(
            node.cli("--scan", "--pattern", f"{{{key_prefix}:*") == ""
            for node in redis_cluster.nodes
        ),
        what="every key to be gone",
    )


async def test_rate_limits_share_a_slot_per_hit_and_spread_users(redis_cluster, key_prefix):
    minute, day = RateLimit("per_minute", 5, per=60), RateLimit("per_day", 50, per=86_400)
    spread = StreamLeaseManager(
        url=redis_cluster.url, config=LeaseConfig(key_prefix=key_prefix, global_pool=False)
    )
    for i in range(30):  # both policies of one user in one script call: no CROSSSLOT
        await spread.hit(f"user{i}", minute, day)
    keys_per_node = [
        len(node.cli("--scan", "--pattern", f"{{{key_prefix}:*:rate:*").split())
        for node in redis_cluster.nodes
    ]
    assert sum(keys_per_node) == 60 and all(keys_per_node), keys_per_node
    with pytest.raises(ValueError, match="need one hash tag"):
        await spread.hit("198.51.100.7", minute, (day, "alice|198.51.100.7"))
    await spread.aclose()
    shared = StreamLeaseManager(
        url=redis_cluster.url, config=LeaseConfig(key_prefix=key_prefix + "s")
    )
    await shared.hit("198.51.100.7", minute, (day, "alice|198.51.100.7"))
    lease = await shared.acquire("alice", rate_limits=[minute, day])
    assert [d.remaining for d in lease.rate_decisions] == [4, 49]
    await lease.release()
    await shared.aclose()


async def test_the_levels_of_one_admission_share_the_global_pools_slot(
    redis_cluster, key_prefix
):
    """A team's, a key's and a user's budgets move in one script call on a cluster: under the
    global pool every identity's counters are in its slot. Without one, each identity has a
    slot of its own, so such an admission is refused before anything is counted."""
    team = RateLimit("team_tokens", 1_000, per=60, unit="tokens")
    key = RateLimit("key_tokens", 1_000, per=60, unit="tokens")
    own = RateLimit("user_tokens", 1_000, per=60, unit="tokens")
    shared = StreamLeaseManager(url=redis_cluster.url, config=LeaseConfig(key_prefix=key_prefix))
    levels = [(team, "team-a"), (key, "key-1"), own]
    leases = [await shared.acquire(user, budgets=levels, reserve=300) for user in ("u1", "u2")]
    assert [d.used for d in leases[1].rate_decisions] == [600, 600, 300]
    with pytest.raises(StreamLeaseRejected, match="team_tokens"):
        await shared.acquire("u3", budgets=levels, reserve=500)
    await asyncio.gather(*(lease.release() for lease in leases))
    assert (await shared.usage("u3", (team, "team-a")))["team_tokens"].used == 0
    await shared.aclose()
    spread = StreamLeaseManager(
        url=redis_cluster.url, config=LeaseConfig(key_prefix=key_prefix + "s", global_pool=False)
    )
    for levels in ([(team, "team-a"), own], [(team, "team-a")]):  # the user's pool spans too
        with pytest.raises(ValueError, match="need one hash tag on a Redis Cluster"):
            await spread.acquire("u1", budgets=levels, reserve=300)
    assert (await spread.usage("u1", own))["user_tokens"].used == 0
    await spread.aclose()


async def test_budgets_of_users_on_every_shard_top_up_and_settle(redis_cluster, key_prefix):
    tokens = RateLimit("tokens_per_minute", 10_000, per=60, unit="tokens")
    spread = StreamLeaseManager(
        url=redis_cluster.url,
        config=LeaseConfig(key_prefix=key_prefix, global_pool=False, max_per_user=0),
    )
    users = [f"user{i}" for i in range(12)]
    leases = [await spread.acquire(user, budgets=[tokens], reserve=10) for user in users]
    for lease in leases:  # past every reservation: one round tops up streams on every shard
        lease.consume(300)

    async def charged() -> list[int]:
        usage = await asyncio.gather(*(spread.usage(user, tokens) for user in users))
        return [u["tokens_per_minute"].used for u in usage]

    # Each topped up to one increment ahead of what it streamed: 300 + 256.
    await eventually(lambda: _equal(charged(), [556] * 12), what="the top-ups")
    await asyncio.gather(*(lease.release() for lease in leases))
    assert await charged() == [300] * 12, "settled to what each streamed"
    await spread.aclose()


async def test_a_models_answer_sizes_are_counted_in_the_settlements_slot(
    redis_cluster, key_prefix
):
    """Without a global pool each user's counters have a tag of their own: the model's
    histogram of answer sizes is counted in the settlement's script, in that tag's slot, and
    read there."""
    tokens = RateLimit("tokens_per_minute", 10_000, per=60, unit="tokens")
    spread = StreamLeaseManager(
        url=redis_cluster.url,
        config=LeaseConfig(key_prefix=key_prefix, global_pool=False, max_per_user=0),
    )
    users = [f"user{i}" for i in range(6)]
    for user in users:
        lease = await spread.acquire(user, budgets=[tokens], reserve="auto", model="gpt-x")
        lease.consume(300)
        await lease.release()
    await eventually(lambda: spread.stats()["unsettled"] == 0, what="the settlements")
    model = spread._core.identity_digest("gpt-x")
    client = AsyncRedisCluster(host="127.0.0.1", port=redis_cluster.nodes[0].port)
    slots = set()
    for user in users:
        tag = f"{key_prefix}:{spread._core.identity_digest(user)}"
        assert await client.hgetall(f"{{{tag}}}:answers:{model}") == {b"9": b"1"}
        slots.add(await client.cluster_keyslot(tag))
        assert await spread.answer_estimate("gpt-x", user_id=user) == 1_024, "read in its slot"
    assert len(slots) > 1, "users on several slots"
    await client.aclose()
    await spread.aclose()


async def _equal(figures, expected) -> bool:
    return await figures == expected


async def test_cluster_waiters_are_woken_by_a_sharded_publish(redis_cluster, key_prefix):
    """A release on a cluster SPUBLISHes on the line's channel, in its slot; the waiting
    process SSUBSCRIBEs there, so a waiter is woken by the release, not by its periodic
    re-check (redis-py listens here too, to see the message itself)."""
    first = redis_cluster.nodes[0]
    client = AsyncRedisCluster(host="127.0.0.1", port=first.port)
    await client.initialize()  # the slots' nodes, which the sharded subscription needs
    channel = f"{{{key_prefix}}}:wake"
    listener = client.pubsub()
    await listener.ssubscribe(channel)
    config = LeaseConfig(key_prefix=key_prefix, max_per_user=0, max_global=1)
    holder_side = StreamLeaseManager(url=redis_cluster.url, config=config)
    waiter_side = StreamLeaseManager(url=redis_cluster.url, config=config)
    held = await holder_side.acquire("alice")
    waiting = asyncio.create_task(waiter_side.acquire("bob", wait_timeout=30))
    await eventually(lambda: waiter_side.stats()["waiting"] == 1, what="bob to wait")
    await held.release()
    lease = await asyncio.wait_for(waiting, 10)

    async def published() -> bool:
        message = await listener.get_sharded_message(ignore_subscribe_messages=True, timeout=0.1)
        return message is not None and message["channel"] == channel.encode()

    await eventually(published, what="the release's sharded wake-up")
    await lease.release()
    for manager in (holder_side, waiter_side):
        await manager.aclose()
    await listener.aclose()
    await client.aclose()
