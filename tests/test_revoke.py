"""Revoking a user's streams: every live stream of the user ends with LeaseRevoked, in this
process at once and in every other as soon as it hears the revoke on the revocations channel,
or, when it missed the message, within one renewal period; a ban refuses the user's new streams
with 403 until it ends; nothing else of the user's or anyone's is touched. The behavioural tests
run on the embedded store and on a real Redis; the others across managers (holders), worker
processes and a Redis Cluster."""

from __future__ import annotations

import asyncio
import signal

import pytest
from fastapi import FastAPI
from starlette.testclient import TestClient

from fastapi_stream_lease import (
    LeaseConfig,
    LeaseLost,
    LeaseRevoked,
    RateLimit,
    StreamLeaseManager,
    UserBanned,
    install_exception_handler,
)

from support.apps import app_command
from support.held_command import HeldCommand
from support.waiting import count_is, eventually, renewals_ran

SECRET = "revoke-tests-secret-0123456789"


async def ticks():
    while True:
        yield 1
        await asyncio.sleep(0.01)


async def drive(stream) -> int:
    return sum([item async for item in stream])


def streaming(lease) -> asyncio.Task:
    return asyncio.create_task(drive(lease.wrap(ticks())))


async def test_a_revoke_ends_every_stream_of_the_user_and_nothing_else(make_manager):
    manager = make_manager(max_per_user=5, identity_secret=SECRET)
    alices = [await manager.acquire("alice") for _ in range(2)]
    bobs = await manager.acquire("bob")
    runs = [streaming(lease) for lease in alices]
    bob_runs = streaming(bobs)
    minute = RateLimit("per_minute", 100, per=60)
    await manager.hit("alice", minute)

    assert await manager.revoke("alice") == 2
    for run in runs:
        with pytest.raises(LeaseRevoked) as ended:
            await run
        assert isinstance(ended.value, LeaseLost), "ends like a lost lease"
    assert all(lease.revoked and lease.released for lease in alices)
    await count_is(manager, 0, "alice")
    assert not bob_runs.done() and not bobs.lost, "bob's stream runs on"
    assert manager.stats()["revoked"] == 2
    assert (await manager.peek("alice", minute)).remaining == 99, "her counters are untouched"
    again = await manager.acquire("alice")  # no ban: new streams are admitted at once
    await again.release()
    bob_runs.cancel()
    await bobs.release()


async def test_a_ban_refuses_the_users_new_streams_until_it_ends(make_manager):
    manager = make_manager(max_per_user=5, identity_secret=SECRET)
    assert await manager.revoke("alice", ban_seconds=1.5) == 0, "nothing to end, a ban all the same"
    with pytest.raises(UserBanned) as banned:
        await manager.acquire("alice")
    assert banned.value.status_code == 403 and banned.value.retry_after in (1, 2)
    # Spoken to the client: neither the identity nor the library's API (regression: the body
    # named StreamLeaseManager.revoke to end users).
    assert "new ones are refused for" in str(banned.value) and "alice" not in str(banned.value)
    assert "StreamLeaseManager" not in str(banned.value.body())
    assert manager.stats()["held"] == 0, "a refusal takes nothing"
    bob = await manager.acquire("bob")
    await manager.revoke("alice", ban_seconds=0.1)  # a shorter ban never cuts a longer one
    with pytest.raises(UserBanned):
        await manager.acquire("alice")

    async def admitted() -> bool:
        try:
            lease = await manager.acquire("alice")
        except UserBanned:
            return False
        await lease.release()
        return True

    await eventually(admitted, what="the ban to end")
    await bob.release()


async def test_a_revoked_streams_end_tells_the_same_wait_as_its_users_ban(
    make_manager, make_redis_manager
):
    """Regression: ``revoke --ban 20`` told the revoked stream to retry in 1 s while its
    user's new requests got 403 for 20 s. The stream's end now says the ban's wait, in this
    worker and in another that hears of the revoke at its keep-alive."""
    here = make_manager(identity_secret=SECRET)
    ended = streaming(await here.acquire("alice"))
    await here.revoke("alice", ban_seconds=20)
    with pytest.raises(LeaseRevoked) as revoked:
        await asyncio.wait_for(ended, 5)
    with pytest.raises(UserBanned) as banned:
        await here.acquire("alice")
    assert revoked.value.retry_after == banned.value.retry_after == 20
    assert "new streams are refused for 20 s" in str(revoked.value)
    assert revoked.value.body()["retry_after"] == 20
    worker = make_redis_manager(identity_secret=SECRET, lease_seconds=30, renew_every=0.2)
    operator = make_redis_manager(identity_secret=SECRET, lease_seconds=30)
    elsewhere = streaming(await worker.acquire("bob"))
    unbanned = streaming(await worker.acquire("carol"))
    await operator.revoke("bob", ban_seconds=20)
    await operator.revoke("carol")
    with pytest.raises(LeaseRevoked) as revoked:
        await asyncio.wait_for(elsewhere, 10)
    assert revoked.value.retry_after in (19, 20)
    with pytest.raises(LeaseRevoked) as revoked:
        await asyncio.wait_for(unbanned, 10)
    assert revoked.value.retry_after == 1, "no ban: retry at once, elsewhere"


async def test_a_banned_user_gets_a_403_with_retry_after(make_manager):
    manager = make_manager(max_per_user=5, identity_secret=SECRET)
    app = FastAPI()
    install_exception_handler(app)

    @app.get("/stream")
    async def stream(user: str):
        async with manager.lease(user):
            return {"ok": True}

    await manager.revoke("alice", ban_seconds=60)
    with TestClient(app) as client:
        refused = client.get("/stream", params={"user": "alice"})
        assert refused.status_code == 403
        assert 59 <= int(refused.headers["retry-after"]) <= 60
        assert refused.json()["title"] == "Streams suspended"
        assert client.get("/stream", params={"user": "bob"}).status_code == 200


@pytest.mark.parametrize(
    ("user_id", "ban_seconds", "error", "says"),
    [
        ("", 0, ValueError, "user_id is empty"),
        (None, 0, TypeError, "needs an identity"),
        ("alice", -1, ValueError, "ban_seconds=-1"),
        ("alice", 10**9, ValueError, "30 days"),
        ("alice", "60", TypeError, "ban_seconds must be a number"),
        ("alice", float("nan"), ValueError, "finite"),
    ],
)
async def test_bad_revokes_say_what_was_wrong(make_manager, user_id, ban_seconds, error, says):
    manager = make_manager(identity_secret=SECRET)
    lease = await manager.acquire("alice")
    with pytest.raises(error, match=says):
        await manager.revoke(user_id, ban_seconds=ban_seconds)
    assert not lease.lost, "a bad call ends nothing"
    await lease.release()


async def test_a_revoke_made_while_the_first_subscription_is_on_its_way_still_ends_the_stream(
    redis_server, key_prefix, make_redis_manager
):
    """Regression: a worker's first subscription to the revocations looked for nothing revoked
    before it was up, so a revoke published while it was on its way (to no one in that worker)
    waited for the keep-alive's stamp, a renewal period later."""
    async with HeldCommand(redis_server.port, b"SUBSCRIBE") as proxy:
        # A subscription that timed out would come back as one made again: held for as long
        # as the revoke takes, it must stay the first.
        config = LeaseConfig(
            key_prefix=key_prefix, identity_secret=SECRET, lease_seconds=60, renew_every=20,
            redis_timeout=30,
        )
        worker = StreamLeaseManager(url=proxy.url, config=config)
        operator = make_redis_manager(identity_secret=SECRET, lease_seconds=60)
        await operator.get_active_count("alice")  # connected, its scripts loaded
        try:
            run = streaming(await worker.acquire("alice"))
            await asyncio.wait_for(proxy.held.wait(), timeout=10)
            assert await operator.revoke("alice") == 1
            proxy.release()
            with pytest.raises(LeaseRevoked):
                await asyncio.wait_for(run, timeout=5)
            assert proxy.holding == 1, "the first subscription, never made again"
        finally:
            await worker.aclose()


def deaf_url(redis_server, redis_client, name: str) -> str:
    """The server's URL for a user that may not subscribe to any channel (Redis's default for a
    new ACL user): a worker that never hears a revoke, as if every message were lost."""
    redis_client.execute_command(
        "ACL", "SETUSER", name, "on", "nopass", "~*", "resetchannels", "+@all"
    )
    return redis_server.url.replace("redis://", f"redis://{name}@", 1)


async def test_a_revoke_reaches_another_managers_streams_within_a_renewal_period_unheard(
    redis_server, redis_client, key_prefix, make_redis_manager,
):
    # Leases of 30 s renewed every 0.5 s by a worker that cannot hear the revocations channel:
    # only the keep-alive's stamp can end them this soon.
    config = LeaseConfig(
        key_prefix=key_prefix, identity_secret=SECRET, lease_seconds=30, renew_every=0.5
    )
    worker = StreamLeaseManager(url=deaf_url(redis_server, redis_client, "deaf1"), config=config)
    operator = make_redis_manager(identity_secret=SECRET, lease_seconds=30)
    alice, bob = await worker.acquire("alice"), await worker.acquire("bob")
    runs, bob_runs = streaming(alice), streaming(bob)
    assert await operator.revoke("alice") == 1
    with pytest.raises(LeaseRevoked):
        await asyncio.wait_for(runs, timeout=5)
    await count_is(operator, 0, "alice")
    assert not bob_runs.done() and await operator.get_active_count("bob") == 1
    assert worker.stats()["revoked"] == 1 and worker.stats()["lost"] == 0, "counted apart"
    bob_runs.cancel()
    await worker.aclose()


async def test_a_worker_that_missed_a_revoke_while_unsubscribed_checks_when_it_is_back(
    make_redis_manager, redis_client, key_prefix
):
    # Leases of 60 s renewed every 20 s: no keep-alive runs before the stream must end.
    worker = make_redis_manager(identity_secret=SECRET, lease_seconds=60, renew_every=20)
    operator = make_redis_manager(identity_secret=SECRET, lease_seconds=60)
    alice = await worker.acquire("alice")
    runs = streaming(alice)
    channel = f"{{{key_prefix}}}:revocations"
    await eventually(
        lambda: redis_client.pubsub_numsub(channel)[0][1] >= 1,
        timeout=10, what="the worker to listen for revokes",
    )
    redis_client.client_kill_filter(_type="pubsub")
    assert await operator.revoke("alice") == 1  # published while nobody listened
    with pytest.raises(LeaseRevoked):
        await asyncio.wait_for(runs, timeout=15)


async def test_a_revoked_lease_found_gone_is_never_taken_back(
    make_redis_manager, redis_client, key_prefix
):
    """A holder back from a stall checks its leases one by one: one revoked meanwhile is
    removed, not taken back, even with room."""
    worker = make_redis_manager(identity_secret=SECRET, lease_seconds=30, renew_every=0.2)
    lease = await worker.acquire("alice")
    run = streaming(lease)
    tag = f"{{{key_prefix}}}"
    # As a stall would leave it: the holder's entry gone, its members reaped; the revocation
    # listed but its count not seen (as if the keep-alive that saw it failed).
    redis_client.zadd(f"{tag}:holders:revoked", {lease.lease_id: 2**50})
    redis_client.delete(f"{tag}:holders")
    for pool in ("global", f"user:{worker._core.identity_digest('alice')}"):
        redis_client.zrem(f"{tag}:{pool}", lease.lease_id)
    with pytest.raises(LeaseRevoked):
        await asyncio.wait_for(run, timeout=5)
    await count_is(worker, 0, "alice")
    assert worker.stats()["reclaimed"] == 0


async def start_worker(url: str, prefix: str, renew: float):
    worker = await asyncio.create_subprocess_exec(
        *app_command("revocable_streams", url, prefix, SECRET, str(renew)),
        stdout=asyncio.subprocess.PIPE,
    )
    assert (await asyncio.wait_for(worker.stdout.readline(), 30)).startswith(b"streaming")
    return worker


async def test_a_revoke_ends_the_users_streams_in_every_worker_process_before_any_keepalive(
    redis_server, key_prefix, make_redis_manager
):
    # Leases of 30 s renewed every 15 s: the keep-alives that could find the revocation stamp
    # run 15 s after the streams began; the workers hear the revoke before that.
    renew = 15.0
    workers = [await start_worker(redis_server.url, key_prefix, renew) for _ in range(2)]
    operator = make_redis_manager(identity_secret=SECRET)
    await count_is(operator, 4, "alice")
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await operator.revoke("alice", ban_seconds=60) == 4
    for worker in workers:
        for _ in range(2):
            line = await asyncio.wait_for(worker.stdout.readline(), renew / 2)
            assert line.split() == [b"ended", b"alice", b"LeaseRevoked"]
    print(f"every worker's streams ended {loop.time() - started:.3f} s after the revoke")
    await count_is(operator, 0, "alice")
    assert await operator.get_active_count("bob") == 2
    for worker in workers:
        worker.send_signal(signal.SIGUSR1)
        assert (await asyncio.wait_for(worker.stdout.readline(), 10)).split() == [b"running", b"1"]
        worker.send_signal(signal.SIGTERM)
        assert await worker.wait() == 0
    with pytest.raises(UserBanned):
        await operator.acquire("alice")


@pytest.mark.parametrize("global_pool", [False, True])
async def test_a_revoke_on_a_cluster_reaches_other_managers_before_any_keepalive(
    redis_cluster, key_prefix, global_pool
):
    # The revoke publishes from its user's tag (its own slot, or the global pool's): a plain
    # channel reaches every node's subscribers either way.
    config = LeaseConfig(
        key_prefix=key_prefix,
        identity_secret=SECRET,
        global_pool=global_pool,
        lease_seconds=60,
        renew_every=20,
    )
    worker = StreamLeaseManager(url=redis_cluster.url, config=config)
    operator = StreamLeaseManager(url=redis_cluster.url, config=config)
    try:
        leases = {user: await worker.acquire(user) for user in ("alice", "bob", "carol")}
        runs = {user: streaming(lease) for user, lease in leases.items()}
        assert await operator.revoke("alice", ban_seconds=30) == 1
        with pytest.raises(LeaseRevoked):
            await asyncio.wait_for(runs["alice"], timeout=5)
        with pytest.raises(UserBanned):
            await operator.acquire("alice")
        assert not runs["bob"].done() and not runs["carol"].done()
        for user in ("bob", "carol"):
            runs[user].cancel()
            await leases[user].release()
    finally:
        await worker.aclose()
        await operator.aclose()


async def test_a_revoke_after_the_tags_revocation_key_was_lost_still_reaches_other_managers(
    redis_server, make_redis_manager, redis_client, key_prefix
):
    """The key that signals revocations to workers that missed the message expires an hour
    after a revoke (a restart or a failover loses it too). A revoke that re-creates it must not
    give it a value the workers saw already: they would take it for no change and keep the
    streams running."""
    config = LeaseConfig(
        key_prefix=key_prefix, identity_secret=SECRET, lease_seconds=30, renew_every=0.5
    )
    worker = StreamLeaseManager(url=deaf_url(redis_server, redis_client, "deaf2"), config=config)
    operator = make_redis_manager(identity_secret=SECRET, lease_seconds=30)
    bob = await worker.acquire("bob")  # keeps the worker's keep-alive going throughout
    first = await worker.acquire("alice")
    first_run = streaming(first)
    assert await operator.revoke("alice") == 1
    with pytest.raises(LeaseRevoked):
        await asyncio.wait_for(first_run, timeout=5)
    # Past the round that checks a changed tag once more, so only a new signal can end these.
    await renewals_ran(worker, calls=3)
    leases = [await worker.acquire("alice") for _ in range(3)]
    runs = [streaming(lease) for lease in leases]
    await renewals_ran(worker, calls=1)  # just after a keep-alive: the next is half a second off
    redis_client.delete(f"{{{key_prefix}}}:holders:revocations")
    assert await operator.revoke("alice") == 3
    for run in runs:
        with pytest.raises(LeaseRevoked):
            await asyncio.wait_for(run, timeout=5)
    await count_is(operator, 0, "alice")
    assert not bob.lost
    await worker.aclose()


async def test_a_revoked_lease_watched_twice_is_logged_once(make_manager, caplog):
    """A lease held by ``manager.lease()`` and streamed through ``lease.wrap()`` inside it
    has two watches: its revocation was logged by each on Redis, and by neither on the
    embedded store (the watch that raised at once logged nothing)."""
    manager = make_manager(identity_secret=SECRET)
    caplog.set_level("INFO", logger="fastapi_stream_lease")
    with pytest.raises(LeaseRevoked):
        async with manager.lease("alice") as lease:
            async for _ in lease.wrap(ticks()):
                await manager.revoke("alice")
    told = [r for r in caplog.records if getattr(r, "lease_id", None) == lease.lease_id]
    assert [r.lease_end for r in told] == ["revoked"]


async def test_awaiting_the_release_of_a_revoked_lease_waits_for_the_revokes_release(
    own_redis, make_own_redis_manager
):
    """Regression: a revoke releases the leases it ends in the background, and a
    ``release()`` awaited after it answered at once, while that call was still under way: the
    next acquire through another connection could find the slot still taken. Awaiting it now
    ends when the revoke's release call ended."""
    manager = make_own_redis_manager(max_per_user=1, redis_timeout=5.0)
    other = make_own_redis_manager(max_per_user=1)
    lease = await manager.acquire("alice")
    own_redis.pause()
    try:
        revoking = asyncio.create_task(manager.revoke("alice"))
        await eventually(lambda: lease.revoked and lease.released, what="the local revoke")
        releasing = asyncio.ensure_future(lease.release())
        await asyncio.sleep(0.1)
        assert not releasing.done(), "the release answered while the revoke's was under way"
    finally:
        own_redis.resume()
    assert await releasing is False
    await revoking
    await (await other.acquire("alice")).release()
