"""What only a real Redis can show: key layout, script cache loss, restarts, clients, timeouts."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import warnings
from pathlib import Path
from urllib.parse import quote

import pytest
import redis.asyncio as redis_asyncio

from fastapi_stream_lease import (
    BackendError,
    BackendUnavailable,
    LeaseConfig,
    LeaseLost,
    Resource,
    StreamLeaseManager,
    StreamLeaseRejected,
    StreamLeaseWarning,
)

from support import tally
from support.redis_servers import RedisServer
from support.tls import require_tls, tls_server
from support.waiting import admits_again, eventually, renewals_ran

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SECRET_VARIABLE = "STREAM_LEASE_IDENTITY_SECRET"


async def test_keys_hide_identities_share_one_hash_tag_and_expire(make_redis_manager,
                                                                redis_client, key_prefix):
    manager = make_redis_manager(renew_every=1)
    lease = await manager.acquire("alice@example.com")
    keys = sorted(k.decode() for k in redis_client.keys(f"{{{key_prefix}}}*"))
    # Two pools, the tag's holders, this manager's list of its pools there, its count of
    # members and the tag's last clock reading (docs/design.md, "Clock steps"); no fencing
    # token, which nobody asked for.
    assert [k.split(":")[1] for k in keys] == ["global"] + ["holders"] * 4 + ["user"]
    assert keys[4] == f"{keys[1]}:clock"
    assert all(k.startswith(f"{{{key_prefix}}}:") for k in keys)
    assert not any("alice" in k for k in keys)
    pools = [keys[0], keys[5]]
    assert [redis_client.pttl(k) for k in pools] == [-1, -1], "an acquire sets no pool expiry"
    # Idle keys expire: the pools from the holder's next keep-alive.
    await eventually(
        lambda: all(0 < redis_client.pttl(k) <= 3_600_000 for k in keys),
        what="the keep-alive to give every key of the tag an expiry",
    )
    (holder, expiry), = redis_client.zrange(keys[1], 0, -1, withscores=True)
    assert keys[2].endswith(f":{holder.decode()}")
    expires_in_ms = expiry - 1000 * redis_client.time()[0]
    assert 0 < expires_in_ms <= 31_000, "the holder expires in lease_seconds"
    assert tally.counted(redis_client, f"{keys[2]}:members") == 2
    for pool in (keys[0], keys[5]):
        assert redis_client.zrange(pool, 0, -1, withscores=True) == [
            (lease.lease_id.encode(), float(holder))
        ], "members are scored by their holder"
    await manager.aclose()
    assert redis_client.keys(f"{{{key_prefix}}}*") == [], "released pools leave no empty key"


async def test_identity_secret_changes_the_keys(make_redis_manager, redis_client, key_prefix):
    plain = make_redis_manager()
    keyed = make_redis_manager(identity_secret=b"k" * 32)
    leases = [await plain.acquire("alice"), await keyed.acquire("alice")]
    assert len(redis_client.keys(f"{{{key_prefix}}}:user:*")) == 2
    assert await plain.get_active_count("alice") == 1
    for lease in leases:
        await lease.release()


def test_a_redis_manager_without_identity_secret_warns_its_builder(redis_server):
    with pytest.warns(StreamLeaseWarning, match="no identity_secret: user ids are hashed") as seen:
        StreamLeaseManager(url=redis_server.url)
    assert [warning.filename for warning in seen] == [__file__], "points at the caller's line"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        StreamLeaseManager(url=redis_server.url, config=LeaseConfig(identity_secret=b"k" * 32))
        StreamLeaseManager(url="memory://")  # the keys never leave the process


def load_seed_quickstart(redis_url: str, tmp_path: Path) -> None:
    """Imports examples/seed_quickstart.py (the seed README's code), pointed at ``redis_url``."""
    code = (EXAMPLES / "seed_quickstart.py").read_text()
    code = code.replace("redis://localhost:6379", redis_url)
    path = tmp_path / "seed_quickstart_app.py"
    path.write_text(code)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    spec.loader.exec_module(importlib.util.module_from_spec(spec))


def test_the_warning_without_identity_secret_names_the_environment_variable(
    redis_server, tmp_path, monkeypatch
):
    monkeypatch.delenv(SECRET_VARIABLE, raising=False)
    with pytest.warns(StreamLeaseWarning, match=f"or set {SECRET_VARIABLE}"):
        load_seed_quickstart(redis_server.url, tmp_path)


def test_identity_secret_left_out_is_read_from_the_environment(
    redis_server, tmp_path, monkeypatch
):
    """A deployment sets the secret once, in STREAM_LEASE_IDENTITY_SECRET, for every worker and
    the CLI; the seed quickstart, which passes none, then keys its identities with it and runs
    without a warning."""
    monkeypatch.setenv(SECRET_VARIABLE, "k" * 32)
    assert LeaseConfig() == LeaseConfig(identity_secret="k" * 32)
    assert LeaseConfig(identity_secret=None) == LeaseConfig(identity_secret="k" * 32)
    assert LeaseConfig(identity_secret="g" * 32) != LeaseConfig(), "a given secret wins"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_seed_quickstart(redis_server.url, tmp_path)
    monkeypatch.setenv(SECRET_VARIABLE, "")  # set but empty: as if unset
    assert LeaseConfig() != LeaseConfig(identity_secret="k" * 32)


async def test_a_flushed_function_library_does_not_break_acquire_renew_or_release(
    own_redis, make_own_redis_manager
):
    manager = make_own_redis_manager(lease_seconds=3, max_per_user=2)
    first = await manager.acquire("alice")

    def flush() -> None:
        own_redis.cli("FUNCTION", "FLUSH")
        own_redis.cli("SCRIPT", "FLUSH")

    flush()
    second = await manager.acquire("alice")  # Function not found -> FUNCTION LOAD -> FCALL
    flush()
    await renewals_ran(manager)  # across the flush, and kept both leases
    assert await manager.get_active_count("alice") == 2
    assert not first.lost and not second.lost
    flush()
    assert await first.release() is True
    assert manager.stats()["renew_failures"] == 0
    assert "fastapi_stream_lease_" in own_redis.cli("FUNCTION", "LIST")


async def test_a_user_without_functions_runs_the_scripts_as_scripts(own_redis, key_prefix):
    """Where the server has no functions (Redis 6) or the user may not load them, the same
    scripts go as EVALSHA (reloaded on NOSCRIPT)."""
    own_redis.cli("ACL", "SETUSER", "scripts", "on", ">pw", "~*", "&*", "+@all", "-function")
    url = f"redis://scripts:pw@127.0.0.1:{own_redis.port}/0"
    config = LeaseConfig(key_prefix=key_prefix, lease_seconds=3)
    manager = StreamLeaseManager(url=url, config=config)
    try:
        lease = await manager.acquire("alice")
        own_redis.cli("SCRIPT", "FLUSH")
        await renewals_ran(manager)  # across the flush
        assert await manager.get_active_count("alice") == 1 and not lease.lost
        assert await lease.release() is True
        assert own_redis.cli("FUNCTION", "LIST") == ""
        assert manager.stats()["renew_failures"] == 0
    finally:
        await manager.aclose()


async def test_a_redis_restart_is_survived_and_leases_are_taken_back(own_redis,
                                                                     make_own_redis_manager):
    manager = make_own_redis_manager(lease_seconds=1, max_per_user=1)
    lease = await manager.acquire("alice")
    own_redis.restart()  # same port, empty data, empty script cache

    await eventually(
        lambda: manager.stats()["reclaimed"] == 1, what="the renewal loop to take the lease back"
    )
    assert not lease.lost
    assert await manager.get_active_count("alice") == 1
    await lease.release()


async def test_a_lease_lost_to_a_restart_ends_its_stream(own_redis, make_own_redis_manager):
    config = {"lease_seconds": 3, "max_per_user": 1}
    manager = make_own_redis_manager(**config)
    lease = await manager.acquire("alice")

    async def first_token_never_comes():
        await asyncio.Event().wait()
        yield "never"

    async def consume() -> list[str]:
        return [token async for token in lease.wrap(first_token_never_comes())]

    stream = asyncio.create_task(consume())
    own_redis.restart()
    # Another worker takes the freed slot before this one renews (renewal runs every second).
    other_worker = make_own_redis_manager(**config)
    thief = await other_worker.acquire("alice")
    with pytest.raises(LeaseLost):
        await asyncio.wait_for(stream, 10)
    assert lease.lost and manager.stats()["lost"] == 1
    assert await manager.get_active_count("alice") == 1, "never re-added past the capacity"
    await lease.release()  # releasing a lost lease is harmless and frees nothing of the thief's
    assert await other_worker.get_active_count("alice") == 1
    await thief.release()
    again = await manager.acquire("alice")  # the connection came back by itself
    await again.release()


async def test_a_lease_knows_its_deadline_when_redis_stops_answering(own_redis,
                                                                     make_own_redis_manager):
    manager = make_own_redis_manager(lease_seconds=1, redis_timeout=0.2)
    with pytest.raises(LeaseLost):
        async with manager.lease("alice") as lease:
            own_redis.pause()  # answers nothing: renewals hang until their timeout
            try:
                await asyncio.sleep(20)  # cancelled when the lease's deadline passes
            finally:
                own_redis.resume()
    assert lease.lost
    assert manager.stats()["lost"] == 1


async def test_on_lost_continue_only_records_the_loss(own_redis, make_own_redis_manager):
    config = {"lease_seconds": 3, "max_per_user": 1, "on_lost": "continue"}
    manager = make_own_redis_manager(**config)
    lease = await manager.acquire("alice")

    async def ticks():
        while True:
            yield "tick"
            await asyncio.sleep(0.05)

    stream = lease.wrap(ticks())
    assert await anext(stream) == "tick"
    own_redis.restart()
    other_worker = make_own_redis_manager(**config)
    thief = await other_worker.acquire("alice")

    await eventually(lambda: lease.lost, what="the loss to be recorded")
    assert await anext(stream) == "tick", "the stream goes on"
    await stream.aclose()
    await thief.release()


async def test_a_paused_redis_costs_one_timeout_then_the_breaker_answers(own_redis,
                                                                         make_own_redis_manager):
    manager = make_own_redis_manager(redis_timeout=0.3)
    assert await manager.get_active_count() == 0  # connected
    own_redis.pause()
    try:
        with pytest.raises(BackendUnavailable, match="did not answer"):
            await manager.acquire("alice")
        assert manager.stats()["breaker_open"]
        for _ in range(20):  # no further call waits for the dead server
            with pytest.raises(BackendUnavailable, match="circuit breaker"):
                await manager.acquire("alice")
    finally:
        own_redis.resume()

    await admits_again(manager, what="the breaker's probe to close it again")
    assert not manager.stats()["breaker_open"]


async def test_fail_open_admits_within_the_local_floor(own_redis, make_own_redis_manager):
    manager = make_own_redis_manager(
        max_per_user=2, max_global=4, redis_timeout=0.3, failure_mode="open", fallback_workers=2
    )
    assert await manager.get_active_count() == 0
    own_redis.stop()
    alice = [await manager.acquire("alice")]  # per-user floor: 2 / 2 workers = 1
    with pytest.raises(StreamLeaseRejected) as refused:
        await manager.acquire("alice")
    assert (refused.value.limit, refused.value.capacity) == ("per_user", 1)
    bob = await manager.acquire("bob")  # global floor: 4 / 2 workers = 2
    with pytest.raises(StreamLeaseRejected, match="global"):
        await manager.acquire("carol")
    await bob.release()  # local leases release locally
    carol = await manager.acquire("carol")
    own_redis.start()
    await alice[0].release()
    await carol.release()
    assert manager.stats()["held"] == 0


async def test_fail_closed_refuses_with_503_while_redis_is_down(own_redis,
                                                                make_own_redis_manager):
    manager = make_own_redis_manager(redis_timeout=0.3)
    held = await manager.acquire("alice")
    own_redis.stop()
    with pytest.raises(BackendUnavailable) as refused:
        await manager.acquire("bob")
    response = refused.value.as_response()
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    own_redis.start()

    await admits_again(manager, what="admissions to resume once Redis is back")
    await held.release()


async def test_the_first_probe_after_redis_returns_is_admitted(own_redis, make_own_redis_manager):
    """After an outage the first call to a restarted Redis got the refusal of a reconnect tried
    while it was down, so the breaker stayed open one more, doubled, cool-down (recovery took up
    to 10 s against the documented probe every 0.5 s to 5 s)."""
    manager = make_own_redis_manager(redis_timeout=0.3)
    await (await manager.acquire("alice")).release()
    own_redis.stop()
    failures = manager.stats()["redis_call_failures"]

    async def breaker_backed_off() -> bool:
        # Three failed calls: the cool-down has doubled at least twice.
        with pytest.raises(BackendUnavailable):
            await manager.acquire("alice")
        return manager.stats()["redis_call_failures"] >= failures + 3

    await eventually(breaker_backed_off, what="three failed probes while Redis is down")
    await asyncio.sleep(1.5)  # the reconnect the last failure started has failed by now
    own_redis.start()
    assert own_redis.ping()
    answered = manager.stats()["redis_call_failures"]
    await admits_again(manager, what="the next probe to be admitted")
    assert manager.stats()["redis_call_failures"] == answered, "no call failed once Redis answered"


async def test_fail_open_floors_add_up_to_at_most_the_cap(own_redis, make_own_redis_manager):
    # Two workers: each may admit half of each cap while Redis is down, counting what it holds.
    manager = make_own_redis_manager(
        max_per_user=2, max_global=4, redis_timeout=0.3, failure_mode="open", fallback_workers=2,
        lease_seconds=3,
    )
    alice, bob = await manager.acquire("alice"), await manager.acquire("bob")  # in Redis
    own_redis.stop()
    with pytest.raises(StreamLeaseRejected) as refused:
        await manager.acquire("alice")  # her share (1) is her Redis lease
    assert (refused.value.limit, refused.value.capacity, refused.value.current) == (
        "per_user", 1, 1
    )
    with pytest.raises(StreamLeaseRejected) as refused:
        await manager.acquire("carol")  # the global share (2) is alice's and bob's Redis leases
    assert (refused.value.limit, refused.value.capacity, refused.value.current) == ("global", 2, 2)
    bob.release_nowait()  # gone from this process at once (Redis hears of it later)
    carol = await manager.acquire("carol")
    with pytest.raises(StreamLeaseRejected, match="global"):
        await manager.acquire("dave")
    await carol.release()
    alice.release_nowait()
    own_redis.start()
    await eventually(lambda: manager.stats()["unremoved"] == 0, what="the retries to drain")


async def test_a_cap_below_the_number_of_workers_admits_nothing_locally(own_redis,
                                                                        make_own_redis_manager):
    # Rounding the share up would make a Resource(1) used as a lock 8-way while Redis is down;
    # the manager says so when it is built.
    with pytest.warns(StreamLeaseWarning, match="the share of max_per_user=1 is 0"):
        manager = make_own_redis_manager(
            max_per_user=1, redis_timeout=0.3, failure_mode="open", fallback_workers=8
        )
    assert await manager.get_active_count() == 0
    own_redis.stop()
    with pytest.raises(StreamLeaseRejected) as refused:
        await manager.acquire("alice")
    assert (refused.value.limit, refused.value.capacity) == ("per_user", 0)
    with pytest.raises(StreamLeaseRejected) as refused:
        await manager.acquire(None, resources=[Resource(1, "lock")])
    assert (refused.value.limit, refused.value.capacity) == ("lock", 0)


async def test_refusals_while_redis_is_down_leave_nothing_to_retry(own_redis,
                                                                  make_own_redis_manager):
    manager = make_own_redis_manager(redis_timeout=0.3, lease_seconds=3)
    assert await manager.get_active_count() == 0  # connected
    own_redis.stop()
    for _ in range(300):
        with pytest.raises(BackendUnavailable):
            await manager.acquire("alice")
    # Only calls that may have reached Redis (a probe now and then) leave a release to retry;
    # refusals by the breaker or a refused connection leave nothing.
    assert manager.stats()["unremoved"] < 10
    own_redis.start()
    await admits_again(manager, what="admissions to resume once Redis is back")
    await eventually(lambda: manager.stats()["unremoved"] == 0, what="the retries to drain")


async def test_a_key_of_another_type_gives_an_actionable_error(make_redis_manager, redis_client,
                                                             key_prefix):
    redis_client.set(f"{{{key_prefix}}}:global", "not a sorted set")
    manager = make_redis_manager()
    with pytest.raises(BackendError, match="choose another LeaseConfig"):
        await manager.acquire("alice")


async def test_one_lease_whose_release_fails_neither_fails_its_batch_nor_is_retried_forever(
    make_redis_manager, redis_client, key_prefix
):
    """Releases that come together go out in one script call. One lease that Redis cannot
    release (a key of another type where its user's pool should be) must not fail the others of
    that call, nor stay on the retry list for ever: the others are released, and it is removed
    where it can be, its release raises BackendError, and ``stats()`` counts it."""
    manager = make_redis_manager(lease_seconds=30, renew_every=0.2)
    kept = await manager.acquire("kept")  # keeps renewal rounds going (they retry releases)
    users = [f"user{i}" for i in range(20)]
    leases = [await manager.acquire(user) for user in users]
    broken = f"{{{key_prefix}}}:user:{manager._core.identity_digest(users[-1])}"
    redis_client.delete(broken)
    redis_client.set(broken, "not a sorted set")
    outcomes = await asyncio.gather(
        *(lease.release() for lease in leases), return_exceptions=True
    )
    assert outcomes[:-1] == [True] * 19, "the others of its call are released"
    assert isinstance(outcomes[-1], BackendError)
    assert "choose another LeaseConfig" in str(outcomes[-1])
    for user in users[:-1]:
        assert await manager.get_active_count(user) == 0
    assert await manager.get_active_count() == 1, "its member in the global pool is gone too"
    assert manager.stats()["unremoved"] == 0, "nothing a retry could do is left to retry"
    await renewals_ran(manager, calls=3)
    assert manager.stats()["unremoved"] == 0
    assert manager.stats()["unreleasable"] == 1
    await kept.release()


async def test_a_lone_acquire_or_release_over_a_key_of_another_type_fails_alone(
    make_redis_manager, redis_client, key_prefix
):
    """One stream at a time goes the scripts' lone way (no batch bookkeeping) once the process
    knows its entry: a key of another type where the user's pool should be fails that acquire,
    or that release, with BackendError, and nothing else."""
    manager = make_redis_manager()
    await (await manager.acquire("warm")).release()

    def break_pool(user: str) -> None:
        pool = f"{{{key_prefix}}}:user:{manager._core.identity_digest(user)}"
        redis_client.delete(pool)
        redis_client.set(pool, "not a sorted set")

    break_pool("mallory")
    with pytest.raises(BackendError, match="WRONGTYPE"):
        await manager.acquire("mallory")
    alice = await manager.acquire("alice")
    bob = await manager.acquire("bob")
    break_pool("bob")
    with pytest.raises(BackendError, match="choose another LeaseConfig"):
        await bob.release()
    assert await alice.release() is True
    assert await manager.get_active_count() == 0, "bob's member in the global pool is gone too"


async def test_wrong_password_gives_an_actionable_error(key_prefix):
    server = RedisServer("--requirepass", "right").start()
    try:
        manager = StreamLeaseManager(url=f"redis://:wrong@127.0.0.1:{server.port}/0")
        with pytest.raises(BackendError, match="user and password") as error:
            await manager.acquire("alice")
        assert "wrong" not in str(error.value).replace("WRONGPASS", "")
        good = StreamLeaseManager(url=f"redis://:right@127.0.0.1:{server.port}/0")
        lease = await good.acquire("alice")
        await lease.release()
        await good.aclose()
        await manager.aclose()
    finally:
        server.cleanup()


async def test_a_percent_encoded_password_authenticates(key_prefix):
    password = "p@ss:w/r%d?"
    server = RedisServer("--requirepass", password).start()
    try:
        url = f"redis://default:{quote(password, safe='')}@127.0.0.1:{server.port}/0"
        manager = StreamLeaseManager(url=url, config=LeaseConfig(key_prefix=key_prefix))
        assert manager.backend == f"redis://default:***@127.0.0.1:{server.port}/0"
        lease = await manager.acquire("alice")
        assert await manager.get_active_count() == 1
        await lease.release()
        await manager.aclose()
    finally:
        server.cleanup()


async def test_the_seed_constructor_takes_a_redis_asyncio_client(redis_server, key_prefix):
    client = redis_asyncio.from_url(redis_server.url)
    manager = StreamLeaseManager(
        redis=client, config=LeaseConfig(key_prefix=key_prefix, max_per_user=1)
    )
    assert manager.backend == redis_server.url
    lease = await manager.acquire("alice")
    assert await client.zcard(f"{{{key_prefix}}}:global") == 1
    with pytest.raises(StreamLeaseRejected):
        await manager.acquire("alice")
    await lease.release()
    await manager.aclose()
    await client.aclose()


async def test_many_leases_renew_in_batches(make_redis_manager):
    # Two lease periods: kept alive by renewal rounds, not by the acquires.
    manager = make_redis_manager(lease_seconds=2, max_per_user=0, max_global=0)
    leases = await asyncio.gather(*(manager.acquire(f"user{i}") for i in range(2500)))
    await asyncio.sleep(4)
    # On a quiet machine none is lost. When the 2,500 replies take longer than the 2 s lease (a
    # starved machine), a lease whose grant the process cannot prove alive in time is reported
    # lost at its deadline (docs/design.md, I4) and given back: what Redis counts is then
    # exactly what the process still holds.
    lost = sum(lease.lost for lease in leases)
    assert lost < 2500
    assert await manager.get_active_count() == 2500 - lost == manager.stats()["held"]
    await manager.aclose()
    observer = make_redis_manager()
    assert await observer.get_active_count() == 0


async def test_a_unix_socket_client_is_followed(key_prefix, tmp_path):
    socket_path = tmp_path / "redis.sock"
    server = RedisServer(
        "--unixsocket", str(socket_path), "--requirepass", "p@ss:word"
    ).start()
    try:
        client = redis_asyncio.Redis(unix_socket_path=str(socket_path), password="p@ss:word", db=2)
        manager = StreamLeaseManager(redis=client, config=LeaseConfig(key_prefix=key_prefix))
        assert manager.backend.startswith("unix://")
        assert "word" not in manager.backend
        lease = await manager.acquire("alice")
        assert await client.zcard(f"{{{key_prefix}}}:global") == 1  # same server, same db
        await lease.release()
        await manager.aclose()
        await client.aclose()
    finally:
        server.cleanup()


async def test_tls_with_a_private_ca(key_prefix, tmp_path):
    require_tls()
    server = tls_server(tmp_path).start()
    ca_file = str(tmp_path / "ca.pem")
    url = f"rediss://127.0.0.1:{server.port}/0"
    try:
        manager = StreamLeaseManager(
            url=url, config=LeaseConfig(key_prefix=key_prefix, max_per_user=1),
            tls_ca_file=ca_file,
        )
        lease = await manager.acquire("alice")
        with pytest.raises(StreamLeaseRejected):
            await manager.acquire("alice")
        await lease.release()
        await manager.aclose()

        client = redis_asyncio.Redis(
            host="127.0.0.1", port=server.port, ssl=True, ssl_ca_certs=ca_file
        )
        followed = StreamLeaseManager(redis=client, config=LeaseConfig(key_prefix=key_prefix))
        assert followed.backend == url
        assert await followed.get_active_count() == 0
        await followed.aclose()
        await client.aclose()

        untrusting = StreamLeaseManager(url=url, config=LeaseConfig(key_prefix=key_prefix))
        with pytest.raises(BackendError):
            await untrusting.acquire("alice")
        await untrusting.aclose()
        with pytest.raises(ValueError, match="cannot read tls_ca_file"):
            StreamLeaseManager(url=url, tls_ca_file=str(tmp_path / "missing.pem"))
    finally:
        server.cleanup()


async def test_redis_killed_mid_stream_then_restarted(own_redis, make_own_redis_manager):
    manager = make_own_redis_manager(
        lease_seconds=2, redis_timeout=0.3, max_per_user=0, max_global=5
    )
    received = [0, 0, 0]

    async def ticks(n: int):
        while True:
            received[n] += 1
            yield n
            await asyncio.sleep(0.02)

    async def consume(n: int) -> None:
        lease = await manager.acquire(f"user{n}")
        async for _ in lease.wrap(ticks(n)):
            pass

    streams = [asyncio.create_task(consume(n)) for n in range(3)]

    await eventually(lambda: min(received) > 0, what="three streams to flow")
    own_redis.stop()
    with pytest.raises(BackendUnavailable):  # closed: new streams are refused at once
        await manager.acquire("newcomer")
    own_redis.start()  # back within the lease, empty

    async def converged() -> bool:
        try:
            return await manager.get_active_count() == 3
        except BackendUnavailable:
            return False

    await eventually(converged, what="the count to converge to the 3 live streams")
    before = list(received)

    await eventually(
        lambda: all(now > then for now, then in zip(received, before, strict=True)),
        what="the streams to go on",
    )
    assert not any(stream.done() for stream in streams)

    # An outage longer than the lease: each stream ends with LeaseLost at its deadline.
    own_redis.stop()
    outcomes = await asyncio.wait_for(asyncio.gather(*streams, return_exceptions=True), 15)
    assert all(isinstance(outcome, LeaseLost) for outcome in outcomes)
    own_redis.start()


async def test_releases_made_together_go_out_together_each_with_its_own_answer(
    make_redis_manager, redis_client, key_prefix
):
    """While a release call is in flight the next releases queue and go in one call; each
    caller still learns whether Redis had its own lease."""
    manager = make_redis_manager(max_per_user=0)
    leases = [await manager.acquire(f"user{i}") for i in range(64)]
    gone = leases[10]
    keys = redis_client.scan_iter(f"{{{key_prefix}}}:*")
    pools = [key for key in keys if redis_client.type(key) == b"zset"]
    assert sum(redis_client.zrem(pool, gone.lease_id) for pool in pools) > 0  # behind our back
    calls_before = manager.stats()["redis_calls"]
    answers = await asyncio.gather(*(lease.release() for lease in leases))
    assert answers == [lease is not gone for lease in leases]
    assert manager.stats()["redis_calls"] - calls_before < len(leases)
    assert await manager.get_active_count() == 0


def core_workers() -> list[int]:
    """The thread ids of the core's tokio workers in this process."""
    tasks = Path("/proc/self/task").iterdir()
    return [int(t.name) for t in tasks if (t / "comm").read_text().strip() == "stream-lease"]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: nothing to move")
async def test_the_cores_worker_is_left_where_the_kernel_puts_it(make_redis_manager):
    """Guards against the worker pinned to its event loop's CPU, which cost a uvicorn worker
    11 % of its requests/s under load and a fifth of its streams/s one stream at a time
    (docs/performance.md): the worker may run on every CPU the process may."""
    manager = make_redis_manager()
    for _ in range(3):
        lease = await manager.acquire("alice")
        await lease.release()
    workers = core_workers()
    assert workers, "the core's worker thread is named stream-lease"
    assert all(os.sched_getaffinity(worker) == os.sched_getaffinity(0) for worker in workers)
