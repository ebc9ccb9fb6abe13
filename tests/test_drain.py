"""Draining a worker for a rolling deploy, and the 0.6 API's shutdown calls (issue 13). Each
behavioural test runs on the embedded store and on a real Redis."""

from __future__ import annotations

import asyncio

import pytest
from fastapi import FastAPI
from starlette.testclient import TestClient

from fastapi_stream_lease import (
    LeaseLost,
    LeaseRevoked,
    ManagerClosed,
    StreamLeaseRejected,
)


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
