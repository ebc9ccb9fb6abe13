"""The hot path on the event loop's own thread (``STREAM_LEASE_IO_ON_LOOP_THREAD=1``, read when
a manager is built): acquires (waiting ones too), releases (with their budgets' settlement) and
hits make their Redis calls on a connection of the loop's own, one per loop; everything else
stays on the core's runtime. Each case runs with the switch on, on asyncio and uvloop."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis as redis_py

from fastapi_stream_lease import (
    BackendError,
    BackendUnavailable,
    LeaseConfig,
    RateLimit,
    RateLimited,
    StreamLeaseManager,
)

from support.loops import LOOP_FACTORIES, on_every_loop
from support.redis_servers import RedisServer, SentinelSetup
from support.waiting import admits_again, count_is, eventually, wait_until

SWITCH = "STREAM_LEASE_IO_ON_LOOP_THREAD"


@pytest.fixture(autouse=True)
def io_on_loop_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SWITCH, "1")


def connections(server: RedisServer) -> int:
    """Clients connected to ``server``, the one that asks included."""
    return server.cli("CLIENT", "LIST").count("id=")


@on_every_loop
async def test_lease_cycles_one_at_a_time_and_many_at_once(make_own_redis_manager):
    manager = make_own_redis_manager(max_per_user=0, max_global=64)
    for _ in range(30):
        lease = await manager.acquire("alice")
        assert await lease.release() is True
    leases = await asyncio.gather(*(manager.acquire(f"user{i}") for i in range(64)))
    assert manager.stats()["held"] == 64
    await count_is(manager, 64)
    assert all(await asyncio.gather(*(lease.release() for lease in leases)))
    await count_is(manager, 0)
    assert manager.stats()["held"] == 0
    assert manager.stats()["redis_call_failures"] == 0


@on_every_loop
async def test_a_wrapped_stream_releases_its_lease_at_its_end(make_own_redis_manager):
    manager = make_own_redis_manager(max_per_user=1)
    lease = await manager.acquire("alice")
    assert [x async for x in lease.wrap(["x", "y"])] == ["x", "y"]
    await count_is(manager, 0, "alice")
    again = await manager.acquire("alice")  # the slot is free
    await again.release()


@on_every_loop
async def test_acquires_cancelled_mid_call_leave_no_ghost_lease(make_own_redis_manager):
    manager = make_own_redis_manager(max_per_user=0, max_global=0)
    rng = random.Random(7)
    kept = []

    async def one(i: int) -> None:
        task = asyncio.create_task(manager.acquire(f"user{i % 11}"))
        await asyncio.sleep(rng.random() * 0.003)
        task.cancel()
        try:
            kept.append(await task)
        except asyncio.CancelledError:
            pass

    await asyncio.gather(*(one(i) for i in range(200)))
    await count_is(manager, len(kept))
    for lease in kept:
        await lease.release()
    await count_is(manager, 0)
    assert manager.stats()["held"] == 0


@on_every_loop
async def test_a_paused_redis_costs_one_timeout_then_the_breaker_answers(
    own_redis, make_own_redis_manager
):
    manager = make_own_redis_manager(redis_timeout=0.3)
    await (await manager.acquire("alice")).release()  # the loop's connection is open
    own_redis.pause()
    try:
        with pytest.raises(BackendUnavailable, match="did not answer"):
            await manager.acquire("alice")
        assert manager.stats()["breaker_open"]
        with pytest.raises(BackendUnavailable, match="circuit breaker"):
            await manager.acquire("alice")
    finally:
        own_redis.resume()
    await admits_again(manager)
    assert not manager.stats()["breaker_open"]


@on_every_loop
async def test_a_stopped_redis_is_unavailable_and_a_restarted_one_admits_again(
    own_redis, make_own_redis_manager
):
    manager = make_own_redis_manager(redis_timeout=0.3)
    held = await manager.acquire("alice")
    own_redis.stop()
    with pytest.raises(BackendUnavailable) as refused:
        await manager.acquire("bob")
    assert refused.value.as_response().status_code == 503
    own_redis.start()
    await admits_again(manager)
    await held.release()
    await count_is(manager, 0)


@on_every_loop
async def test_a_refused_connect_is_unreached(own_redis, make_own_redis_manager):
    """Nobody listens on the port: the acquire's error is the ``Unreached`` kind (raised as
    ``BackendUnavailable``), a call that never left this process, so nothing was counted in
    Redis and there is nothing to give back."""
    manager = make_own_redis_manager()
    own_redis.stop()
    with pytest.raises(BackendUnavailable, match="cannot reach Redis") as refused:
        await manager.acquire("alice")
    assert "refused" in str(refused.value).lower(), refused.value
    await manager.aclose()  # waits for the releases in flight, a give-back's included
    assert manager.stats()["unremoved"] == 0, "an unreached acquire gives nothing back"
    own_redis.start()
    assert await make_own_redis_manager().get_active_count() == 0


@on_every_loop
async def test_a_connect_that_gets_no_answer_leaves_the_loop_running(key_prefix):
    """A port whose accept queue is full takes no new connection (the kernel drops the
    handshake), so a connect to it waits. It waits on the core's runtime: the loop runs its
    other coroutines meanwhile, and the acquire fails as ``Unreached`` once ``redis_timeout``
    passes, nothing taken."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        fillers = [socket.socket() for _ in range(3)]
        for filler in fillers:
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
        manager = StreamLeaseManager(
            url=f"redis://127.0.0.1:{port}",
            config=LeaseConfig(key_prefix=key_prefix, redis_timeout=1.0),
        )
        try:
            acquiring = asyncio.create_task(manager.acquire("alice"))
            for _ in range(3):
                await asyncio.sleep(0)
            assert not acquiring.done(), "the acquire waits for the connect without the loop"
            with pytest.raises(BackendUnavailable):
                await acquiring
            await manager.aclose()
            assert manager.stats()["unremoved"] == 0, "an unreached acquire gives nothing back"
        finally:
            for filler in fillers:
                filler.close()


@on_every_loop
async def test_a_unix_socket_takes_the_loops_calls(key_prefix, tmp_path):
    """A URL of a Unix socket, with a password and another database, takes the loop-thread path:
    the loop's connection is one more client of the server, and the keys are on that database."""
    socket_path = tmp_path / "redis.sock"
    server = RedisServer("--unixsocket", str(socket_path), "--requirepass", "pw").start()
    manager = StreamLeaseManager(
        url=f"unix://{socket_path}?db=3&pass=pw",
        config=LeaseConfig(key_prefix=key_prefix, max_global=0),
    )
    try:
        await manager.get_active_count()  # a call on tokio: its connection opens
        before = connections(server)
        leases = await asyncio.gather(*(manager.acquire(f"user{i}") for i in range(8)))
        assert connections(server) == before + 1, "the loop's connection took the acquires"
        assert "db3:keys=" in server.cli("INFO", "keyspace")
        assert all(await asyncio.gather(*(lease.release() for lease in leases)))
        await count_is(manager, 0)
    finally:
        await manager.aclose()
        server.cleanup()


async def first_acquire_through(manager: StreamLeaseManager, what: str) -> Any:
    """The first lease for ``alice`` that ``manager`` gets, its acquire tried until one goes
    through (within 30 s)."""
    kept: list[Any] = []

    async def acquired() -> bool:
        try:
            kept.append(await manager.acquire("alice"))
        except BackendError:
            return False
        return True

    await eventually(acquired, timeout=30, what=what)
    return kept[0]


async def test_behind_sentinel_the_loops_calls_follow_the_master_through_a_switchover(
    tmp_path, key_prefix
):
    """Behind Sentinel the loop's connection goes to the master the sentinels name; once they
    switch it over (the old master demoted, still up), the next calls go to the new master."""
    setup = SentinelSetup(tmp_path).start()
    manager = StreamLeaseManager(url=setup.url, config=LeaseConfig(key_prefix=key_prefix,
                                                                   max_global=0))

    def held_on(server: RedisServer) -> int:
        return int(server.cli("ZCARD", f"{{{key_prefix}}}:global"))

    try:
        await manager.get_active_count()  # a call on tokio: its connection opens
        before = connections(setup.master)
        leases = await asyncio.gather(*(manager.acquire(f"user{i}") for i in range(8)))
        assert connections(setup.master) == before + 1, "the loop's connection took the acquires"
        assert held_on(setup.master) == 8
        assert all(await asyncio.gather(*(lease.release() for lease in leases)))

        old_master = setup.master_port()
        def switched_over() -> bool:
            try:
                return setup.sentinel_node().cli("SENTINEL", "FAILOVER", "lease-master") == "OK"
            except redis_py.ResponseError:  # NOGOODSLAVE until it has seen the replica's state
                return False

        await eventually(switched_over, what="the sentinel to accept a switchover")
        await eventually(lambda: setup.master_port() != old_master, timeout=30,
                         what="the sentinel to name the replica the master")
        # Until the old master is demoted, it takes writes that its resync then drops.
        await eventually(lambda: "role:slave" in setup.master.cli("INFO", "replication"),
                         timeout=30, what="the old master to be demoted")
        lease = await first_acquire_through(manager, "an acquire on the new master")
        assert held_on(setup.replica) == 1, "the lease is on the new master"
        await lease.release()
        assert held_on(setup.replica) == 0
    finally:
        await manager.aclose()
        setup.cleanup()


async def test_behind_sentinel_a_master_that_stops_answering_is_left_for_the_new_one(
    tmp_path, key_prefix
):
    """A master that stops answering (paused: its connections stay open) costs the loop's calls
    their timeout; the next calls ask the sentinels again, give the old master's connection up,
    and go to the master they promote."""
    setup = SentinelSetup(tmp_path).start()
    manager = StreamLeaseManager(url=setup.url, config=LeaseConfig(
        key_prefix=key_prefix, max_global=0, redis_timeout=0.5))
    old_master = setup.master_port()
    try:
        await (await manager.acquire("alice")).release()  # the loop's connection to the master
        setup.master.pause()
        with pytest.raises(BackendError):
            await manager.acquire("alice")
        lease = await first_acquire_through(manager, "an acquire on the promoted master")
        assert setup.master_port() != old_master
        assert int(setup.replica.cli("ZCARD", f"{{{key_prefix}}}:global")) == 1, "on the new master"
        await lease.release()
    finally:
        setup.master.resume()
        await manager.aclose()
        setup.cleanup()


@contextlib.contextmanager
def commands_seen(server: RedisServer) -> Iterator[list[dict[str, Any]]]:
    """The commands ``server`` runs while the block runs, as its ``MONITOR`` tells them (each
    with the port of the client that sent it)."""
    seen: list[dict[str, Any]] = []
    marker = f"end-of-monitor-{uuid.uuid4()}"
    client = redis_py.Redis(port=server.port, decode_responses=True)
    ready = threading.Event()

    def watch() -> None:
        with client.monitor() as monitor:
            ready.set()
            for command in monitor.listen():
                if marker in command["command"]:
                    return
                seen.append(command)

    watcher = threading.Thread(target=watch)
    watcher.start()
    ready.wait(timeout=10)
    try:
        yield seen
    finally:
        redis_py.Redis(port=server.port).echo(marker)
        watcher.join(timeout=10)
        client.close()


@on_every_loop
async def test_a_budgeted_release_settles_beside_it_on_the_loops_connection(
    own_redis, make_own_redis_manager
):
    manager = make_own_redis_manager()
    tokens = RateLimit("tokens", 10_000, per=3600, unit="tokens")
    await manager.get_active_count()  # a call on tokio: its connection opens
    with commands_seen(own_redis) as seen:
        lease = await manager.acquire("alice", budgets=[tokens], reserve=(0, 100))
        lease.consume(7)
        await lease.release()
        assert manager.stats()["unsettled"] == 0, "the release resolves once settled"
    sent_by = {
        script: {
            c["client_port"]
            for c in seen
            if c["command"].startswith("FCALL") and c["command"].split()[1].endswith(f"_{script}")
        }
        for script in ("acquire", "release", "settle")
    }
    assert len(sent_by["acquire"]) == 1, sent_by
    assert sent_by["release"] == sent_by["settle"] == sent_by["acquire"], sent_by
    assert (await manager.peek("alice", tokens)).used == 7


@on_every_loop
async def test_waiting_acquires_go_on_the_loops_connection_and_leave_the_line_when_cancelled(
    own_redis, make_own_redis_manager
):
    manager = make_own_redis_manager(max_per_user=0, max_global=1)
    await manager.get_active_count()  # a call on tokio: its connection opens
    with commands_seen(own_redis) as seen:
        held = await manager.acquire("alice")
        bob = asyncio.create_task(manager.acquire("bob", wait_timeout=30))
        carol = asyncio.create_task(manager.acquire("carol", wait_timeout=30))
        await eventually(lambda: manager.stats()["waiting"] == 2, what="both in line")
        carol.cancel()
        await eventually(lambda: manager.stats()["waiting"] == 1, what="carol out of line")
        await held.release()
        lease = await bob
    acquires_from = {
        c["client_port"]
        for c in seen
        if c["command"].startswith("FCALL") and c["command"].split()[1].endswith("_acquire")
    }
    assert len(acquires_from) == 1, f"every acquire, waiting ones too, from one client: {seen}"
    with pytest.raises(asyncio.CancelledError):
        await carol
    await lease.release()
    await count_is(manager, 0)
    assert own_redis.cli("ZCARD", f"{{{manager.config.key_prefix}}}:global|line") == "0"


@on_every_loop
async def test_hits_go_on_the_loops_connection_and_refuse_at_the_limit(
    own_redis, make_own_redis_manager
):
    manager = make_own_redis_manager()
    await manager.get_active_count()  # a call on tokio: its connection opens
    before = connections(own_redis)
    per_minute = RateLimit("api", 50, per=60)
    decisions = await asyncio.gather(*(manager.hit("alice", per_minute) for _ in range(40)))
    assert sorted(d[0].remaining for d in decisions) == list(range(10, 50))
    assert connections(own_redis) == before + 1, "the loop's connection took the hits"
    for _ in range(10):
        await manager.hit("alice", per_minute)
    with pytest.raises(RateLimited) as refused:
        await manager.hit("alice", per_minute)
    assert refused.value.as_response().status_code == 429


@pytest.mark.parametrize("db", [0, 1])
@pytest.mark.parametrize("loop_name", list(LOOP_FACTORIES))
def test_loops_in_threads_have_a_connection_each_closed_with_their_loop(
    own_redis, key_prefix, loop_name, db
):
    """A connection per loop, on db 0 as on another (the connection selects it first)."""
    manager = StreamLeaseManager(
        url=own_redis.url.removesuffix("/0") + f"/{db}",
        config=LeaseConfig(key_prefix=key_prefix, max_global=0),
    )
    loops = 4
    all_connected = threading.Barrier(loops + 1, timeout=30)
    counted = threading.Barrier(loops + 1, timeout=30)
    failures: list[BaseException] = []

    async def cycles(worker: int) -> None:
        for _ in range(20):
            lease = await manager.acquire(f"user{worker}")
            await lease.release()
        # Each loop keeps its connection while it lives; the main thread counts them.
        await asyncio.get_running_loop().run_in_executor(None, all_connected.wait)
        await asyncio.get_running_loop().run_in_executor(None, counted.wait)

    def worker(i: int) -> None:
        loop = LOOP_FACTORIES[loop_name]()
        try:
            loop.run_until_complete(cycles(i))
        except BaseException as error:  # reported by the main thread
            failures.append(error)
            all_connected.abort()
            counted.abort()
        finally:
            loop.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(loops)]
    for thread in threads:
        thread.start()
    all_connected.wait()
    during = connections(own_redis)
    counted.wait()
    for thread in threads:
        thread.join(timeout=30)
    assert not failures, failures
    assert during >= loops + 1, f"{during} clients: one connection per loop, and the asker"
    assert any(f"db{db}" in line for line in own_redis.cli("INFO", "keyspace").splitlines()), (
        f"the leases' keys were written to db {db}"
    )
    gc.collect()  # the loops go, and their connections with them
    wait_until(lambda: connections(own_redis) <= 2, what="the loops' connections to close")
    asyncio.run(manager.aclose())


@pytest.mark.parametrize("loop_name", list(LOOP_FACTORIES))
def test_a_loop_closed_with_calls_in_flight_leaks_no_lease(own_redis, key_prefix, loop_name):
    manager = StreamLeaseManager(
        url=own_redis.url,
        config=LeaseConfig(key_prefix=key_prefix, max_per_user=0, max_global=0),
    )

    async def connected() -> None:  # tokio's connection, which the releases take
        assert await manager.get_active_count() == 0

    asyncio.run(connected())
    loop = LOOP_FACTORIES[loop_name]()
    # The loop's connection opens while Redis is paused, and its calls run once the loop is
    # gone: each grant must be read before its release goes on tokio's connection (Redis
    # serves two connections in no set order).
    own_redis.pause()
    try:
        tasks = [loop.create_task(manager.acquire(f"user{i}")) for i in range(32)]
        # One turn: the acquires' calls go out, and the loop closes before their replies come.
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()
        del loop, tasks
        gc.collect()
        time.sleep(0.2)  # what the loop's end sends on tokio's connection reaches Redis first
    finally:
        own_redis.resume()

    async def settled() -> None:
        await count_is(manager, 0)
        assert manager.stats()["held"] == 0
        # Every grant was released by its own release, none left to the keep-alive's prune.
        assert manager.stats()["pruned"] == 0
        # The calls cut short by their loop's end said nothing of Redis' health.
        assert not manager.stats()["breaker_open"]
        await manager.aclose()

    asyncio.run(settled())


@pytest.mark.parametrize("protocol", ["resp2", "resp3"])
@on_every_loop
async def test_a_server_with_a_password_takes_the_loops_calls_after_its_handshake(
    key_prefix, protocol
):
    """The connection opens with the URL's handshake (``AUTH``, or ``HELLO 3`` with the
    credentials, then ``SELECT``) in the same write as its first call; a wrong password
    fails the call with the server's word and what to fix, and nothing runs unauthenticated."""
    server = RedisServer("--requirepass", "hunter2-secret").start()
    try:
        url = f"redis://:hunter2-secret@127.0.0.1:{server.port}/2?protocol={protocol}"
        async with StreamLeaseManager(
            url=url, config=LeaseConfig(key_prefix=key_prefix, max_per_user=1)
        ) as manager:
            lease = await manager.acquire("alice")
            assert [x async for x in lease.wrap(["x"])] == ["x"]
            await count_is(manager, 0, "alice")
            assert connections(server) >= 3, "tokio's connection, the loop's and the asker"
            assert "db2" in server.cli("INFO", "keyspace")
        wrong = url.replace("hunter2-secret", "guess")
        async with StreamLeaseManager(url=wrong, config=LeaseConfig(key_prefix=key_prefix)) as m:
            with pytest.raises(BackendError) as refused:
                await m.acquire("alice")
            assert "WRONGPASS" in str(refused.value) and "put the right user and password" in str(
                refused.value
            ), str(refused.value)
            assert "guess" not in str(refused.value)
    finally:
        server.cleanup()
