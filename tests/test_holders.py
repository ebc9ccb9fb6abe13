"""Leases kept alive per process: one holder entry per hash tag, reaped when its process dies.

Each test does to Redis what another process (or a failure) would, then checks that no slot is
leaked and no lease is silently dropped."""

from __future__ import annotations

import asyncio
import hashlib
import re
import time

import pytest
import redis as redis_py

from fastapi_stream_lease import (
    LeaseConfig,
    StreamLeaseError,
    StreamLeaseManager,
    StreamLeaseRejected,
    _core,
)

from support import tally
from support.apps import app_command
from support.waiting import count_is, eventually

# Members of dead holders one script call removes at most (REAP_BUDGET, src/lua/prelude/calls.lua).
REAP_BUDGET = 1000


def global_pool(key_prefix: str) -> str:
    return f"{{{key_prefix}}}:global"


def holders(key_prefix: str) -> str:
    return f"{{{key_prefix}}}:holders"


async def test_leases_reaped_while_held_are_checked_and_taken_back(make_redis_manager,
                                                                   redis_client, key_prefix):
    manager = make_redis_manager(lease_seconds=2, max_per_user=0)
    first = await manager.acquire("alice")
    # What another process's reaper does to a holder whose entry expired (a long stall).
    (holder,) = redis_client.zrange(holders(key_prefix), 0, -1)
    index = f"{holders(key_prefix)}:{holder.decode()}"
    for pool in redis_client.smembers(index):
        redis_client.zremrangebyscore(pool, holder, holder)
    redis_client.delete(holders(key_prefix), index, f"{index}:members")
    # This acquire trusts the entry its process knows (a grant told it a moment ago) and adds
    # its member without a look at it: the next round finds the entry gone, checks both leases
    # one by one and writes it anew.
    second = await manager.acquire("bob")

    await eventually(
        lambda: manager.stats()["reclaimed"] == 1,
        what="the reaped lease to be checked and taken back",
    )
    assert await manager.get_active_count() == 2
    assert not first.lost and not second.lost
    await manager.aclose()
    assert second.released

    # Every key gone, but the 1 s marker of the full pool's walk, after a while.
    await eventually(
        lambda: redis_client.keys(f"{{{key_prefix}}}*") == [], what="every key to be gone"
    )


async def test_a_holder_revived_after_a_partial_reap_checks_its_leases(make_redis_manager,
                                                                      redis_client, key_prefix):
    # Renewed every half lease, the process never knows its entry has two renewal periods left,
    # so every acquire reads it.
    manager = make_redis_manager(lease_seconds=3, renew_every=1.5, max_per_user=0)
    held = [await manager.acquire(f"user{i}") for i in range(250)]  # 251 pools
    # The process stalled: its entry expired. Its next acquire reaps 200 of its pools (the
    # reaper visits at most that many per call), then registers it again, with 51 still there.
    (holder,) = redis_client.zrange(holders(key_prefix), 0, -1)
    redis_client.zadd(holders(key_prefix), {holder: 0})
    held.append(await manager.acquire("late"))

    async def all_back() -> bool:
        counts = [await manager.get_active_count(f"user{i}") for i in range(250)]
        return counts == [1] * 250 and await manager.get_active_count() == 251

    await eventually(all_back, what="the reaped leases to be checked and taken back")
    assert manager.stats()["reclaimed"] > 0 and not any(lease.lost for lease in held)


async def test_grants_lost_by_a_failover_are_noticed_and_taken_back(make_redis_manager,
                                                                    redis_client, key_prefix):
    manager = make_redis_manager(lease_seconds=2, max_per_user=0)
    kept = await manager.acquire("alice")
    missing = await manager.acquire("bob")
    # A replica promoted before the last acquire reached it: that script's writes are gone, the
    # holder's entry (written by an earlier call) is there.
    (holder,) = redis_client.zrange(holders(key_prefix), 0, -1)
    for pool in redis_client.smembers(f"{holders(key_prefix)}:{holder.decode()}"):
        redis_client.zrem(pool, missing.lease_id)
    counted = f"{holders(key_prefix)}:{holder.decode()}:members"
    tally.take_out(redis_client, counted, missing.lease_id, 2)  # its member in two pools

    await eventually(
        lambda: manager.stats()["reclaimed"] == 1,
        what="the missing grant to be noticed and taken back",
    )
    assert await manager.get_active_count() == 2
    assert not kept.lost and not missing.lost


async def test_a_release_that_failed_is_retried(own_redis, make_own_redis_manager):
    manager = make_own_redis_manager(lease_seconds=2)
    lease = await manager.acquire("alice")
    kept = await manager.acquire("bob")  # keeps this process's holder entry alive
    own_redis.cli("ACL", "SETUSER", "default", "-fcall", "-evalsha", "-eval")  # scripts refused
    try:
        with pytest.raises(StreamLeaseError):
            await lease.release()
    finally:
        own_redis.cli("ACL", "SETUSER", "default", "+@all")
    # The holder stays alive, so only the retry can free the slot.
    await count_is(manager, 0, "alice")
    assert not kept.lost


async def test_members_of_unknown_holders_never_fill_a_pool(make_redis_manager, redis_client,
                                                            key_prefix):
    manager = make_redis_manager(max_per_user=0, max_global=1)
    redis_client.zadd(global_pool(key_prefix), {"ghost": 12345})  # its holder is unknown
    lease = await manager.acquire("alice")
    assert redis_client.zrange(global_pool(key_prefix), 0, -1) == [lease.lease_id.encode()]
    redis_client.zadd(global_pool(key_prefix), {"ghost": 12345})
    await count_is(manager, 1)  # a pool is walked at most once a second


async def test_a_dead_holder_is_reaped_by_the_next_acquire(make_redis_manager, redis_client,
                                                           key_prefix):
    # Long leases: no renewal round runs during the test.
    config = {"lease_seconds": 30, "max_per_user": 0, "max_global": 2}
    doomed = make_redis_manager(**config)
    held = [await doomed.acquire(f"user{i}") for i in range(2)]
    # The process stops renewing (as if killed): its entry expires, nothing else happens.
    (holder,) = redis_client.zrange(holders(key_prefix), 0, -1)
    redis_client.zadd(holders(key_prefix), {holder: 0})
    other = make_redis_manager(**config)
    lease = await other.acquire("carol")  # reaps the dead holder: its pools and its entry
    assert redis_client.zrange(global_pool(key_prefix), 0, -1) == [lease.lease_id.encode()]
    assert redis_client.zscore(holders(key_prefix), holder) is None
    assert not redis_client.exists(f"{holders(key_prefix)}:{holder.decode()}")
    await other.aclose()
    await doomed.aclose()
    assert all(lease.released for lease in held)


async def test_an_acquire_of_a_live_holder_leaves_reaping_to_the_keep_alive(make_redis_manager,
                                                                          redis_client,
                                                                          key_prefix):
    # A dead holder's members in a pool that does not look full stay through another live
    # holder's acquire (it reaps nothing: pay for what you use), and go at its keep-alive.
    # Long leases for the first: its renewal round does not run during the test.
    doomed = make_redis_manager(lease_seconds=30, max_per_user=0, max_global=10)
    ghost = await doomed.acquire("ghost")
    (dead,) = redis_client.zrange(holders(key_prefix), 0, -1)
    live = make_redis_manager(lease_seconds=2, max_per_user=0, max_global=10)
    kept = await live.acquire("kept")  # registers the live holder
    redis_client.zadd(holders(key_prefix), {dead: 0})  # the first process died, unreaped
    lease = await live.acquire("carol")
    assert redis_client.zscore(global_pool(key_prefix), ghost.lease_id) is not None
    await eventually(
        lambda: redis_client.zscore(global_pool(key_prefix), ghost.lease_id) is None,
        what="the live holder's keep-alive to reap the dead one",
    )
    assert not kept.lost and not lease.lost
    await lease.release()
    await kept.release()
    await live.aclose()
    await doomed.aclose()


async def test_one_acquire_and_release_of_a_live_holder_run_11_commands(own_redis,
                                                                       make_own_redis_manager):
    # The hot path's Redis work at the quickstart's configuration (a cap per user and a global
    # one, a waiting line): no reaper, no clock guard, no dead waiters looked for, no fencing
    # token (not asked for); the holder's entry, which the process knows lives two renewal
    # periods or more, neither read nor written, and no clock read for it; both pools listed
    # in the holder's index by one command, and no expiry set on the pools the acquire makes
    # (the keep-alive gives them theirs).
    manager = make_own_redis_manager(max_per_user=1000, max_global=100_000)
    await (await manager.acquire("warm")).release()  # the holder registered, the library loaded
    client = redis_py.Redis.from_url(own_redis.url)
    client.config_resetstat()
    await (await manager.acquire("alice")).release()
    stats = client.info("commandstats")
    outside = ("cmdstat_fcall", "cmdstat_config", "cmdstat_info")  # the calls, and the test's own
    inside = {name: row["calls"] for name, row in stats.items() if not name.startswith(outside)}
    assert stats["cmdstat_fcall"]["calls"] == 2
    assert sum(inside.values()) == 11, sorted(inside.items())
    assert not {"cmdstat_get", "cmdstat_zrangebyscore", "cmdstat_incr", "cmdstat_pexpire",
                "cmdstat_time", "cmdstat_zscore"} & set(inside), inside
    assert inside["cmdstat_zadd"] == 2, "a member in each of the two pools, not the entry"
    assert inside["cmdstat_sadd"] == 1, "the two pools indexed together"
    client.close()


async def test_pools_a_holder_left_leave_its_index(make_redis_manager, redis_client, key_prefix):
    # A release leaves its pools in the holder's index (no upkeep per stream); the keep-alive
    # drops those that are gone, and, while the index lists over 64 pools more than the holder
    # has members, those where it has none, though others' leases keep them.
    churner = make_redis_manager(lease_seconds=2, max_per_user=0)
    alice = await churner.acquire("alice")  # held throughout: the churner keeps renewing
    (holder,) = redis_client.zrange(holders(key_prefix), 0, -1)
    index = f"{holders(key_prefix)}:{holder.decode()}"
    keeper = make_redis_manager(lease_seconds=2, max_per_user=0)
    kept = [await keeper.acquire(f"kept{i}") for i in range(100)]
    for user in [f"kept{i}" for i in range(100)] + [f"gone{i}" for i in range(100)]:
        lease = await churner.acquire(user)
        await lease.release()

    def swept() -> bool:
        listed = redis_client.smembers(index)
        # alice's pool, the global pool, and at most 64 pools others' leases keep.
        return len(listed) <= 2 + 64 and all(redis_client.exists(pool) for pool in listed)

    await eventually(swept, timeout=30, what="the churner's index to drop the pools it left")
    assert await churner.get_active_count() == 101
    assert not alice.lost and not any(lease.lost for lease in kept)
    await keeper.aclose()
    await churner.aclose()
    await eventually(
        lambda: redis_client.keys(f"{{{key_prefix}}}*") == [], what="every key to be gone"
    )


async def test_a_closing_manager_leaves_no_key_after_users_came_and_went(make_redis_manager,
                                                                         redis_client, key_prefix):
    # Long leases: no keep-alive sweeps the index before the close; the close does.
    manager = make_redis_manager(lease_seconds=30, max_per_user=0)
    for i in range(300):
        lease = await manager.acquire(f"user{i}")
        await lease.release()
    (holder,) = redis_client.zrange(holders(key_prefix), 0, -1)
    assert redis_client.scard(f"{holders(key_prefix)}:{holder.decode()}") == 301
    await manager.aclose()
    assert redis_client.keys(f"{{{key_prefix}}}*") == []


async def test_a_dead_holder_is_reaped_a_bounded_number_of_members_per_call(
        make_redis_manager, redis_server, redis_client, key_prefix):
    child = await asyncio.create_subprocess_exec(
        *app_command("hold_many_leases", redis_server.url, key_prefix, "3000"),
        stdout=asyncio.subprocess.PIPE,
    )
    assert await asyncio.wait_for(child.stdout.readline(), 60) == b"held 3000\n"
    (holder,) = redis_client.zrange(holders(key_prefix), 0, -1)
    index = f"{holders(key_prefix)}:{holder.decode()}"
    pools = redis_client.smembers(index)
    child.kill()  # SIGKILL: nobody releases, nobody renews
    await child.wait()

    def members() -> int:
        return sum(redis_client.zcard(pool) for pool in pools)

    assert len(pools) == 2 and members() == 6000  # alice's pool and the global pool
    observer = make_redis_manager()
    removed_per_call: list[int] = []

    async def all_reaped() -> bool:
        before = members()
        count = await observer.get_active_count()  # reaps, then counts (one script call)
        removed_per_call.append(before - members())
        if members():  # a holder half reaped stays listed, with every pool it has left
            assert redis_client.zscore(holders(key_prefix), holder) is not None
            assert {p for p in pools if redis_client.zcount(p, holder, holder)} <= (
                redis_client.smembers(index)
            )
        return count == 0 and members() == 0

    await eventually(all_reaped, timeout=30, what="the dead holder's 6,000 members to go")
    assert max(removed_per_call) <= REAP_BUDGET, removed_per_call
    assert len([n for n in removed_per_call if n]) >= 6000 // REAP_BUDGET
    assert redis_client.zscore(holders(key_prefix), holder) is None
    assert not redis_client.exists(index), "its index went with its last member"


async def test_a_walk_removes_a_bounded_number_of_unknown_members_per_call(make_redis_manager,
                                                                           redis_client,
                                                                           key_prefix):
    # Members of a holder whose keys are gone (evicted): only the walk of a pool removes them.
    redis_client.zadd(global_pool(key_prefix), {f"ghost{i}": 12345 for i in range(2500)})
    observer = make_redis_manager()
    removed_per_call: list[int] = []

    async def all_walked() -> bool:
        before = redis_client.zcard(global_pool(key_prefix))
        count = await observer.get_active_count()  # walks the pool at most once a second
        removed_per_call.append(before - count)
        return count == 0

    await eventually(all_walked, what="the 2,500 unknown members to go")
    assert max(removed_per_call) <= REAP_BUDGET, removed_per_call
    assert len([n for n in removed_per_call if n]) >= 3


def core_script(redis_client, name: str):
    """One of the core's scripts as a script of its own, as the core sends it."""
    return redis_client.register_script(_core._script_source(name))


async def test_a_script_called_alone_is_to_the_byte_the_one_the_core_runs(own_redis, key_prefix):
    """Copies of the scripts' assembly in the tests and benchmarks could drift from the core's
    unseen: the code they call alone is the code the core sends as a script of its own (to a
    user without functions), every script of the core compiles alone, and a wrong name is told
    which names there are."""
    own_redis.cli("ACL", "SETUSER", "scripts", "on", ">pw", "~*", "&*", "+@all", "-function")
    url = f"redis://scripts:pw@127.0.0.1:{own_redis.port}/0"
    manager = StreamLeaseManager(url=url, config=LeaseConfig(key_prefix=key_prefix))
    try:
        assert await (await manager.acquire("alice")).release() is True
    finally:
        await manager.aclose()
    source = _core._script_source
    ran = [hashlib.sha1(source(s).encode()).hexdigest() for s in ("acquire", "release")]
    told = re.escape("""no script named "aquire": the core's scripts are acquire, """)
    with redis_py.Redis(port=own_redis.port) as client:
        assert client.script_exists(*ran) == [True, True]
        with pytest.raises(ValueError, match=told) as wrong:
            source("aquire")
        for name in str(wrong.value).split(" are ")[1].split(", "):
            client.script_load(source(name))


def lease_id(name: str) -> str:
    """A lease id as the core makes them (32 lowercase hex digits), named for the test's reader."""
    return hashlib.md5(name.encode()).hexdigest()


def batched_acquire(redis_client):
    """acquire.lua deciding a batch for holder 777, leases of 30 s with fencing tokens, without a
    line: called with
    [(lease name, weight, [(pool key, capacity), ...]), ...], laid out as the core sends it
    (`_core._acquire_call`) under each name's `lease_id`, answers each in order (a call of one,
    with its reply alone)."""
    script = core_script(redis_client, "acquire")

    def decide(leases):
        named = [(lease_id(name), weight, pools) for name, weight, pools in leases]
        keys, args = _core._acquire_call(777, 30_000, named, fencing_tokens=True)
        return script(keys=keys, args=args)

    return decide


def one_acquire(redis_client):
    """acquire.lua called with one lease, as the core sends a lone acquire."""
    decide = batched_acquire(redis_client)
    return lambda lease, weight, pools: decide([(lease, weight, pools)])


def test_a_batch_of_acquires_is_decided_in_order_and_an_error_spoils_no_other(redis_client,
                                                                            key_prefix):
    pool, tag = global_pool(key_prefix), holders(key_prefix)
    decide = batched_acquire(redis_client)
    wrong = f"{{{key_prefix}}}:wrong"
    redis_client.set(wrong, "a string, not a pool")

    def request(lease: str, *pools: str):
        # weight 1, each pool of capacity 1
        return (lease, 1, [(pool, 1) for pool in pools])

    replies = decide([request("first", pool), request("broken", wrong), request("second", pool)])
    granted, token = replies[0][:2] + replies[0][3:], replies[0][2]
    assert granted == [1, 0, 1], "granted; the holder was new"
    assert replies[1][0] == 6 and b"WRONGTYPE" in replies[1][1], "its own error, alone"
    assert replies[2] == [0, 1, 1, 30_000], "refused: the first took the only slot"
    assert redis_client.zrange(pool, 0, -1) == [lease_id("first").encode()]
    assert tally.counted(redis_client, f"{tag}:777:members") == 1, "counted once for the batch"
    assert redis_client.get(f"{tag}:fencing") == str(token).encode(), "the tag's last token"
    redis_client.delete(pool, wrong, tag, f"{tag}:777", f"{tag}:777:members", f"{tag}:clock",
                        f"{tag}:fencing")


def test_a_release_call_laid_out_by_the_core_undoes_its_acquires(redis_client, key_prefix):
    # Benchmarks and tests that call the scripts alone take both layouts from the core
    # (`_acquire_call`, `_release_call`), never a copy that could drift from it.
    pool, tag = global_pool(key_prefix), holders(key_prefix)
    # Each alone: a lone acquire and a lone release move the tally by what the core sends.
    leases = [(f"weight {weight}", weight, [(pool, 0)]) for weight in (1, 2)]
    acquire, members = one_acquire(redis_client), f"{tag}:777:members"
    assert [acquire(*lease)[0] for lease in leases] == [1, 1]
    assert redis_client.zcard(pool) == 3 and tally.counted(redis_client, members) == 3
    # Regression: the tally a lone acquire sent was worked out from another id than the member's.
    ids = sum(weight * tally.id_value(lease_id(name)) for name, weight, _ in leases)
    assert int(redis_client.get(members)) == 3 * tally.TALLY_UNIT + ids, "the members' own ids"
    release = core_script(redis_client, "release")
    for name, weight, pools in leases:
        keys, args = _core._release_call(777, [(lease_id(name), weight, pools)])
        assert release(keys=keys, args=args) == 1
    assert redis_client.zcard(pool) == 0 and int(redis_client.get(members)) == 0
    with pytest.raises(ValueError, match="32 lowercase hex digits"):
        _core._release_call(777, [("lease-1", 1, [(pool, 0)])])
    redis_client.delete(tag, f"{tag}:777", f"{tag}:777:members", f"{tag}:clock", f"{tag}:fencing")


def test_an_acquire_resent_after_a_dropped_connection_keeps_its_slot(redis_client, key_prefix):
    # The script as src/backend/redis/scripts.rs builds it, run twice with the same lease id
    # (what a client does when it resends a call whose reply was lost), against a pool of
    # capacity 1.
    tag, pool = holders(key_prefix), global_pool(key_prefix)
    acquire = one_acquire(redis_client)
    pools = [(pool, 1)]  # of capacity 1
    (code, alive, token, used) = acquire("lease-1", 1, pools)
    assert (code, alive, used) == (1, 0, 1)  # granted; the holder was new
    (code, life, again, used) = acquire("lease-1", 1, pools)
    assert (code, used) == (1, 1), "granted again, not refused its own slot"
    assert 0 < life <= 30_000, "the holder's entry was live: the ms it has left"
    assert again > token, "with a token of its own: the first reply never arrived"
    assert acquire("lease-2", 1, pools)[0] == 0, "others are refused"
    redis_client.delete(pool, tag, f"{tag}:777", f"{tag}:777:members", f"{tag}:clock",
                        f"{tag}:fencing")


def test_an_acquire_extends_its_holders_entry_only_below_two_renewal_periods(redis_client,
                                                                           key_prefix):
    # Leases of 30 s renewed every 10 s (`_acquire_call`): an entry the keep-alive renews has
    # 20 to 30 s left, and is left to it; the reply says what it has left, which the process
    # dates the grant's deadline from. One with less than 20 s left is extended.
    tag, pool = holders(key_prefix), global_pool(key_prefix)
    acquire = one_acquire(redis_client)
    assert acquire("first", 1, [(pool, 0)])[1] == 0, "the holder was new"

    def entry_left_ms() -> float:
        return redis_client.zscore(tag, "777") - server_ms(redis_client)

    def grant_with_entry_left(lease: str, left_ms: int) -> int:
        redis_client.zadd(tag, {"777": server_ms(redis_client) + left_ms})
        (code, life, _token, _used) = acquire(lease, 1, [(pool, 0)])
        assert code == 1
        return life

    life = grant_with_entry_left("kept", 25_000)
    assert 24_000 < life <= 25_000 and entry_left_ms() <= 25_000, "left to the keep-alive"
    life = grant_with_entry_left("extended", 15_000)
    assert 29_000 < life <= 30_000 and entry_left_ms() > 29_000, "extended to a lease"
    redis_client.delete(pool, tag, f"{tag}:777", f"{tag}:777:members", f"{tag}:clock")


def server_ms(redis_client) -> int:
    seconds, micros = redis_client.time()
    return seconds * 1000 + micros // 1000


def test_a_prune_removes_no_grant_made_while_it_was_under_way(redis_client, key_prefix):
    # The scripts as src/backend/redis/scripts.rs builds them, called in the order of a race
    # the protocol model checks: the prune's list is asked for, an acquire sent after the ids to
    # keep were taken is run by Redis, then the removal runs (and runs again, late).
    pool, tag = global_pool(key_prefix), holders(key_prefix)
    acquire = one_acquire(redis_client)
    strays, prune = core_script(redis_client, "strays"), core_script(redis_client, "prune")
    members = f"{tag}:777:members"

    def grant(lease: str, weight: int) -> None:
        assert acquire(lease, weight, [(pool, 0)])[0] == 1  # in the unlimited pool

    grant("held", 1)
    grant("released", 2)  # its release lost in a failover: in Redis, neither held nor in flight
    keep = [lease_id("held")]  # what the process holds and has in flight when it sends the list
    grant("granted-meanwhile", 1)  # sent after that, run first: the one-step prune removed it
    listed = strays(keys=[tag], args=[777, 1000, *keep])
    held, released, meanwhile = (lease_id(n).encode() for n in ("held", "released",
                                                                   "granted-meanwhile"))
    assert dict(zip(listed[::2], listed[1::2], strict=True)) == {meanwhile: 1, released: 2}
    assert redis_client.zcard(pool) == 4, "the list changes nothing"
    # The process drops from the list what is held or in flight by now (`Held::strays`, tested
    # in src/renewal/held.rs): the grant made meanwhile is; the released lease is not.
    assert prune(keys=[tag], args=[777, released, 2]) == 2
    assert sorted(redis_client.zrange(pool, 0, -1)) == sorted([meanwhile, held])
    assert tally.counted(redis_client, members) == 2
    # The removal sent again (a timeout, a late run): the id is never used again, so nothing.
    assert prune(keys=[tag], args=[777, released, 2]) == 0
    assert redis_client.zcard(pool) == 2 and tally.counted(redis_client, members) == 2
    assert strays(keys=[tag], args=[777, 1000, held, meanwhile]) == []
    redis_client.delete(pool, tag, f"{tag}:777", members, f"{tag}:clock", f"{tag}:fencing")


# The leases of the failover tests outlive a slow restore: stopping the server, writing the
# snapshot and starting it again took more than 3 s once on a loaded CI machine, and a lease not
# renewed for lease_seconds is lost (rightly), which is another story than the one under test.
# Renewal stays at 1 s, so the keep-alive still sees what the failover did within seconds.
OUTLIVES_A_RESTORE = {"lease_seconds": 12.0, "renew_every": 1.0}


async def released_in_redis(manager) -> None:
    """Waits until every release of ``manager`` reached Redis: one that timed out on a loaded
    machine is sent again later, and sent after a restore it would undo the failover a test
    stages (its slots then free by that road, not the one under test)."""
    await eventually(lambda: manager.stats()["unremoved"] == 0, what="the releases to land")


def restore(server, snapshot: bytes) -> None:
    """A failover that lost the last writes: the server comes back with an earlier state."""
    server.stop()
    (server.dir / "dump.rdb").write_bytes(snapshot)
    server.start()
    assert int(server.cli("dbsize")) > 0, f"the snapshot was not loaded on port {server.port}"


def snapshot(server) -> bytes:
    server.cli("save")
    return (server.dir / "dump.rdb").read_bytes()


async def test_a_grant_lost_in_a_failover_is_found_despite_cancelled_acquires(
    own_redis, make_own_redis_manager
):
    manager = make_own_redis_manager(**OUTLIVES_A_RESTORE, max_per_user=0, max_global=0)
    kept = await manager.acquire("alice")
    # Acquires whose scripts ran but whose callers gave up: their grants are given back, and
    # Redis must not count them for this holder any more (once it did, for good).
    own_redis.pause()
    gave_up = [asyncio.create_task(manager.acquire(f"gave-up-{i}")) for i in range(3)]
    await asyncio.sleep(0.1)
    for task in gave_up:
        task.cancel()
    own_redis.resume()
    await count_is(manager, 1)
    before = snapshot(own_redis)
    granted = await manager.acquire("bob")  # lost in the failover below
    restore(own_redis, before)
    await eventually(lambda: manager.stats()["reclaimed"] == 1,
                     what="the lost grant to be found and taken back")
    assert not granted.lost and await manager.get_active_count() == 2
    await kept.release()
    await granted.release()


async def test_a_release_lost_in_a_failover_frees_its_slot(own_redis, make_own_redis_manager):
    manager = make_own_redis_manager(**OUTLIVES_A_RESTORE, max_per_user=2)
    kept = await manager.acquire("alice")
    gone = await manager.acquire("alice")
    assert await manager.get_active_count("alice") == 2  # both in the snapshot
    before = snapshot(own_redis)
    await gone.release()  # lost in the failover below: it comes back under a live holder
    await released_in_redis(manager)
    restore(own_redis, before)

    async def alice_has_room() -> bool:
        try:
            lease = await manager.acquire("alice")
        except StreamLeaseError:
            return False
        await lease.release()
        return True

    await eventually(alice_has_room, what="the member of the released lease to be pruned")
    # The prune frees the slot when prune.lua runs, but its round counts the members removed
    # with its other results, after its check one by one and recount (design, section 7): an
    # acquire can take the slot before `pruned` moves, so the count is waited on, not read.
    # A slot freed by another road would leave the prune nothing to remove, and the count at 0.
    await eventually(lambda: manager.stats()["pruned"] == 2,
                     what="the prune of her two members (her pool's, the global pool's)")
    await kept.release()


# What a step of the Redis server's clock looks like to the scripts: every expiry and clock time
# they stored moves by the opposite amount, in one atomic call. (A real step of a server's wall
# clock needs root, or libfaketime, which cannot start redis-server.)
STEP_CLOCK = """
for _, key in ipairs(KEYS) do
  if redis.call('TYPE', key).ok == 'zset' then
    local entries = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
    for i = 1, #entries, 2 do
      redis.call('ZADD', key, tonumber(entries[i + 1]) - ARGV[1], entries[i])
    end
  else
    redis.call('SET', key, tonumber(redis.call('GET', key)) - ARGV[1], 'KEEPTTL')
  end
end
"""


def step_server_clock(redis_client, key_prefix: str, seconds: int) -> None:
    """Makes every holder's expiry (and each tag's last clock reading) look as if the Redis
    server's clock had just stepped by ``seconds``."""
    times = [holders(key_prefix)]
    if redis_client.exists(f"{holders(key_prefix)}:clock"):  # absent until a script reads the clock
        times.append(f"{holders(key_prefix)}:clock")
    redis_client.eval(STEP_CLOCK, len(times), *times, seconds * 1000)


async def test_a_forward_step_of_the_redis_clock_reaps_no_live_holder(make_redis_manager,
                                                                      redis_client, key_prefix):
    # Long leases: no renewal round runs during the test, so only the guard can save them.
    config = {"lease_seconds": 30, "max_per_user": 0, "max_global": 2}
    first = make_redis_manager(**config)
    held = [await first.acquire(f"user{i}") for i in range(2)]
    step_server_clock(redis_client, key_prefix, 3600)  # NTP, or a replica whose clock runs ahead
    second = make_redis_manager(**config)
    with pytest.raises(StreamLeaseRejected):  # the pool is full: its holder is alive
        await second.acquire("carol")
    assert await first.get_active_count() == 2
    assert not any(lease.lost for lease in held)
    assert first.stats()["reclaimed"] == 0


async def test_a_backward_step_of_the_redis_clock_keeps_no_dead_holder(make_redis_manager,
                                                                       redis_server, redis_client,
                                                                       key_prefix):
    holder = await asyncio.create_subprocess_exec(
        *app_command("hold_one_lease", redis_server.url, key_prefix),
        stdout=asyncio.subprocess.PIPE,
    )
    assert (await asyncio.wait_for(holder.stdout.readline(), 30)).startswith(b"held")
    holder.kill()  # SIGKILL: nobody releases, nobody renews
    await holder.wait()
    step_server_clock(redis_client, key_prefix, -3600)
    manager = make_redis_manager(max_per_user=1, lease_seconds=2)
    # Its 2 s lease frees within one more lease, not an hour later.
    await count_is(manager, 0, "alice")
    assert await manager.acquire("alice")


async def test_a_release_lost_in_a_failover_frees_its_slot_while_others_wait(
    own_redis, make_own_redis_manager
):
    # Counted as in flight for their whole wait, this process's waiters would hide the extra
    # members from the keep-alive's count for as long as they wait.
    manager = make_own_redis_manager(**OUTLIVES_A_RESTORE, max_per_user=0, max_global=3)
    kept = [await manager.acquire("alice"), await manager.acquire("bob")]
    gone = await manager.acquire("carol")
    before = snapshot(own_redis)
    await gone.release()  # lost in the failover below: the pool looks full again
    await released_in_redis(manager)
    restore(own_redis, before)

    async def answers() -> bool:
        try:
            return await manager.get_active_count() == 3
        except StreamLeaseError:  # the first call finds the old connection gone
            return False

    await eventually(answers, what="Redis to answer again")
    waiters = [asyncio.create_task(manager.acquire(f"w{i}", wait_timeout=30)) for i in range(3)]

    await eventually(lambda: manager.stats()["pruned"] == 2,
                     what="the member of the released lease to be pruned despite the waiters")
    # The slot it frees goes to one waiter (the first in line), and only one.
    done, waiting = await asyncio.wait(waiters, timeout=10, return_when=asyncio.FIRST_COMPLETED)
    assert len(done) == 1 and len(waiting) == 2
    for task in waiting:
        task.cancel()
    await done.pop().result().release()
    for lease in kept:
        await lease.release()


async def test_a_failover_that_swaps_a_grant_for_a_release_is_noticed(own_redis,
                                                                      make_own_redis_manager):
    """A failover that loses a grant and brings back a released lease of the same size leaves
    the holder's count of members right, so the count alone never noticed: bob's stream went
    uncounted and alice's released slot stayed taken. The sum of the members' ids beside the
    count tells them apart."""
    manager = make_own_redis_manager(**OUTLIVES_A_RESTORE, max_per_user=1, max_global=0)
    released = await manager.acquire("alice")
    before = snapshot(own_redis)
    await released.release()  # lost in the failover below: alice's member comes back
    await released_in_redis(manager)
    held = await manager.acquire("bob")  # lost too: bob's member is gone
    restore(own_redis, before)

    async def counted_right() -> bool:
        try:
            return (await manager.get_active_count("bob"),
                    await manager.get_active_count("alice")) == (1, 0)
        except StreamLeaseError:  # the first call finds the old connection gone
            return False

    await eventually(counted_right, what="bob's lease taken back and alice's member pruned")
    assert not held.lost


async def test_a_process_keeps_no_state_for_users_it_no_longer_serves(make_redis_manager,
                                                                      redis_client, key_prefix):
    """With global_pool=False each user has a hash tag of their own, which the holder joins
    with the user's first lease. A process that stayed in every tag it ever joined grew with
    every new user, in memory and in Redis, and its close had to leave every one of them. A
    tag where two renewal rounds in a row find it holds nothing is left; tags in use are kept."""
    manager = make_redis_manager(
        global_pool=False, max_per_user=1, lease_seconds=3, renew_every=0.2
    )
    kept = await manager.acquire("kept")

    async def serve(user: str) -> None:
        await (await manager.acquire(user)).release()

    for batch in range(10):
        await asyncio.gather(*(serve(f"user{batch}-{i}") for i in range(1000)))
    kept_tag = f"{{{key_prefix}:{manager._core.identity_digest('kept')}}}"

    def only_the_kept_users_keys() -> bool:
        keys = [key.decode() for key in redis_client.scan_iter(f"{{{key_prefix}:*", count=1000)]
        return all(key.startswith(kept_tag) for key in keys)

    await eventually(only_the_kept_users_keys, timeout=30, what="the served users' tags left")
    await eventually(lambda: manager.stats()["tags"] == 1, what="the process to forget them")
    assert not kept.lost and await manager.get_active_count("kept") == 1
    await kept.release()
    await eventually(lambda: manager.stats()["tags"] == 0, what="the last tag to be left")
    await eventually(  # walk markers live a second
        lambda: not any(redis_client.scan_iter(f"{{{key_prefix}:*")), what="every key to be gone"
    )


async def test_grants_arriving_while_the_event_loop_is_busy_past_a_lease_are_not_lost(
        make_redis_manager):
    """The event loop blocked longer than a lease while grants come back. A grant held only
    once the loop takes it is held past its deadline, and reported lost though Redis keeps it:
    under a burst of thousands of acquires a busy loop lost thousands of grants so. A grant is
    held on the core's runtime as soon as it arrives, and renewed there like the others."""
    manager = make_redis_manager(max_per_user=0, max_global=0, lease_seconds=1, renew_every=0.2)
    acquiring = [asyncio.create_task(manager.acquire(f"user{i}")) for i in range(100)]
    await asyncio.sleep(0)  # each task sends its acquire to the core
    time.sleep(1.5)  # noqa: ASYNC251 - the busy event loop under test
    leases = await asyncio.gather(*acquiring)
    assert not any(lease.lost for lease in leases) and manager.stats()["lost"] == 0
    assert await manager.get_active_count() == 100, "every grant still counted in Redis"
    await asyncio.gather(*(lease.release() for lease in leases))
