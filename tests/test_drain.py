"""Draining a worker for a rolling deploy, and the 0.6 API's shutdown calls. Each
behavioural test runs on the embedded store and on a real Redis."""

from __future__ import annotations

import asyncio
import os
import signal
from contextlib import asynccontextmanager

import pytest
import redis as redis_py
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from starlette.testclient import TestClient

from fastapi_stream_lease import (
    BackendUnavailable,
    LeaseConfig,
    LeaseLost,
    LeaseRevoked,
    ManagerClosed,
    StreamLeaseManager,
    StreamLeaseRejected,
)

from support.ports import free_port
from support.waiting import eventually


async def ticks(count: int, pause: float):
    for i in range(count):
        await asyncio.sleep(pause)
        yield i


async def drive(stream) -> list[int]:
    return [item async for item in stream]


async def test_a_drain_refuses_new_streams_and_lets_short_ones_finish(make_manager):
    manager = make_manager(max_per_user=5)
    lease = await manager.acquire("alice")
    running = asyncio.create_task(drive(lease.wrap(ticks(5, 0.05))))
    draining = asyncio.create_task(manager.drain(timeout=10))
    await asyncio.sleep(0.05)
    with pytest.raises(ManagerClosed) as refused:
        await manager.acquire("bob")
    assert refused.value.status_code == 503 and refused.value.retry_after >= 1
    assert "shutting down" in str(refused.value)
    assert await running == [0, 1, 2, 3, 4], "ran to its end"
    await draining
    assert manager.stats()["closed"] and manager.stats()["held"] == 0


@pytest.mark.parametrize("on_lost", ["cancel", "continue"])
async def test_streams_left_at_the_drains_timeout_end_as_revoked(make_manager, on_lost):
    manager = make_manager(max_per_user=5, on_lost=on_lost)
    other = make_manager(max_per_user=5)
    lease = await manager.acquire("alice")
    running = asyncio.create_task(drive(lease.wrap(ticks(1_000, 0.01))))
    await manager.drain(timeout=0.2)
    with pytest.raises(LeaseRevoked) as revoked:
        await running
    assert isinstance(revoked.value, LeaseLost), "ends like a lost lease"
    assert lease.revoked and lease.released
    if manager.backend != "memory://":
        assert await other.get_active_count("alice") == 0, "its slot is free for the others"


async def test_the_0_6_shutdown_and_lease_calls_are_accepted(make_manager):
    manager = make_manager(max_per_user=1)
    lease = await manager.acquire("alice")
    assert await manager.renew(lease) is True
    await manager.release(lease)
    assert await manager.renew(lease) is False
    async with manager.lease("alice"):
        with pytest.raises(StreamLeaseRejected):
            await manager.acquire("alice")
    await manager.close(drain=True, timeout=1.0)
    with pytest.raises(ManagerClosed):
        await manager.acquire("alice")
    quick = make_manager()
    await quick.acquire("bob")
    await quick.close(drain=False)
    assert quick.stats()["closed"] and quick.stats()["held"] == 0


def test_register_exception_handlers_answers_429(make_manager):
    manager = make_manager(max_per_user=1)
    app = FastAPI()
    manager.register_exception_handlers(app)

    @app.get("/stream")
    async def stream():
        first = await manager.acquire("alice")
        await manager.acquire("alice")
        await first.release()

    with TestClient(app) as client:
        response = client.get("/stream")
    assert response.status_code == 429 and "retry-after" in response.headers


async def test_a_drain_ends_the_workers_waiting_acquires_and_frees_their_places(
    make_manager, backend_url, key_prefix
):
    """Waiting acquires must not outlive the drain that refuses new streams: each ends at once
    with the drain's ``ManagerClosed`` and gives up its place in the line, while the worker's
    held stream still runs."""
    manager = make_manager(max_per_user=0, max_global=1)
    holder = await manager.acquire("holder")
    waiters = [asyncio.create_task(manager.acquire(f"user{i}", wait_timeout=60)) for i in range(10)]
    await eventually(lambda: manager.stats()["waiting"] == 10, what="10 waiters in line")
    draining = asyncio.create_task(manager.drain(timeout=60))
    await eventually(lambda: all(w.done() for w in waiters), what="the waiters to end")
    for waiter in waiters:
        assert isinstance(waiter.exception(), ManagerClosed), waiter.exception()
    assert manager.stats()["waiting"] == 0 and not draining.done(), "the held stream still runs"
    if backend_url != "memory://":
        line = redis_py.Redis.from_url(backend_url)
        await eventually(
            lambda: line.zcard(f"{{{key_prefix}}}:line") == 0
            and line.zcard(f"{{{key_prefix}}}:global|line") == 0,
            what="their places in the shared line given up",
        )
        line.close()
    with pytest.raises(ManagerClosed):
        await manager.acquire("late", wait_timeout=60)
    await holder.release()
    await draining


async def test_aclose_ends_the_waiting_acquires_too(make_manager):
    manager = make_manager(max_per_user=0, max_global=1)
    holder = await manager.acquire("holder")
    waiters = [asyncio.create_task(manager.acquire(f"user{i}", wait_timeout=60)) for i in range(3)]
    await eventually(lambda: manager.stats()["waiting"] == 3, what="3 waiters in line")
    await manager.aclose()
    await eventually(lambda: all(w.done() for w in waiters), what="the waiters to end")
    for waiter in waiters:
        assert isinstance(waiter.exception(), ManagerClosed), waiter.exception()
    assert manager.stats()["held"] == 0 and holder.released


def test_the_manager_as_the_apps_lifespan_closes_it_at_shutdown(make_manager):
    manager = make_manager(max_per_user=1)
    app = FastAPI(lifespan=manager.lifespan)

    @app.get("/stream")
    async def stream() -> StreamingResponse:
        lease = await manager.acquire("alice")
        return StreamingResponse(lease.wrap(f"{n} " async for n in ticks(3, 0.01)))

    with TestClient(app) as client:
        assert client.get("/stream").text == "0 1 2 "
        assert not manager.stats()["closed"]
    assert manager.stats()["closed"]


def test_the_managers_lifespan_composes_with_the_apps_own(make_manager):
    """Entered in the app's own lifespan, the manager outlives what the app sets up inside."""
    manager = make_manager()
    events: list[str] = []

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        async with manager.lifespan(app, drain_timeout=1):
            events.append("app started")
            yield
            events.append(f"app stopping, manager closed: {manager.stats()['closed']}")
        events.append(f"app stopped, manager closed: {manager.stats()['closed']}")

    with TestClient(FastAPI(lifespan=lifespan)):
        assert events == ["app started"]
    assert events[1:] == [
        "app stopping, manager closed: False",
        "app stopped, manager closed: True",
    ]


@pytest.mark.parametrize("global_pool", [True, False])
async def test_the_startup_check_fails_fast_when_the_store_is_unreachable(
    make_manager, key_prefix, global_pool
):
    async with make_manager(global_pool=global_pool).lifespan(check_backend=True):
        pass  # a store that answers: started
    # 0.6's startup check makes the same read.
    assert await make_manager(global_pool=global_pool).verify_cluster_config(strict=True)
    manager = StreamLeaseManager(
        url=f"redis://127.0.0.1:{free_port()}/0",
        config=LeaseConfig(key_prefix=key_prefix, redis_timeout=0.2, global_pool=global_pool),
    )
    with pytest.raises(BackendUnavailable):
        async with manager.lifespan(check_backend=True):
            pytest.fail("started without its store")
    with pytest.raises(BackendUnavailable):
        await manager.verify_cluster_config(strict=True, retry_attempts=1)
    async with manager.lifespan():  # unchecked, it starts (and refuses streams with 503)
        with pytest.raises(BackendUnavailable):
            await manager.acquire("alice")


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
async def test_the_lifespan_starts_the_drain_when_the_server_is_told_to_stop(
    make_manager, stop_signal
):
    """A server such as uvicorn runs the lifespan's shutdown only after every connection has
    closed; the stop signal that its handler receives is when a drain has to begin."""
    manager = make_manager(max_per_user=5)
    told_to_stop: list[int] = []

    def server_handler(number: int, _frame: object) -> None:
        told_to_stop.append(number)

    async def refused() -> bool:
        try:
            await (await manager.acquire("bob")).release()
        except ManagerClosed:
            return True
        return False

    default = signal.signal(stop_signal, server_handler)
    try:
        async with manager.lifespan(drain_timeout=60):
            if stop_signal == signal.SIGINT:
                assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, "left to its default"
            lease = await manager.acquire("alice")
            running = asyncio.create_task(drive(lease.wrap(ticks(5, 0.05))))
            os.kill(os.getpid(), stop_signal)
            await eventually(refused, what="the drain to refuse new streams")
            assert told_to_stop == [stop_signal], "the server's handler ran too"
            assert await running == [0, 1, 2, 3, 4], "ran to its end"
            await eventually(lambda: manager.stats()["closed"], what="the drain to close it")
        assert signal.getsignal(stop_signal) is server_handler, "given back to the server"
    finally:
        signal.signal(stop_signal, default)
