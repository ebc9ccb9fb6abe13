"""The work a request does after its response (its background tasks) through a real uvicorn
and a real client: the lease of ``manager.stream_lease()`` ends when the response ends, not
when the background tasks do; no revoke or drain cancels those tasks, and a drain waits for
them within its timeout; a Server-Sent Events body is never held until they finish; and a
task's error is the app's own, never the stream's."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from fastapi_stream_lease import StreamLeaseManager

from support.app_server import AppServer, store_of
from support.waiting import eventually

PREFIX = f"after{uuid.uuid4().hex[:8]}"
SECRET = "after-body-secret-0123456789"


@pytest.fixture(scope="module")
def server(redis_server, tmp_path_factory) -> Iterator[AppServer]:
    log = tmp_path_factory.mktemp("after") / "uvicorn.log"
    started = AppServer("after_body", redis_server.url, log, PREFIX, SECRET)
    yield started
    started.stop()


@pytest.fixture
async def client(server) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as opened:
        yield opened


@pytest.fixture
async def store(redis_server) -> AsyncIterator[StreamLeaseManager]:
    async with store_of(redis_server.url, PREFIX, SECRET) as manager:
        yield manager


def new_name(kind: str) -> str:
    return f"{kind}{uuid.uuid4().hex[:8]}"


async def task_state(client: httpx.AsyncClient, task: str) -> str | None:
    return (await client.get(f"/tasks/{task}")).json()["state"]


async def task_is(client: httpx.AsyncClient, task: str, state: str) -> None:
    async def reached() -> bool:
        return await task_state(client, task) == state

    await eventually(reached, what=f"task {task} to be {state}")


async def count_is(store: StreamLeaseManager, user: str, count: int) -> bool:
    return await store.get_active_count(user) == count


@pytest.mark.parametrize("path", ["/json", "/sse"])
async def test_a_lease_ends_with_its_response_and_a_revoke_after_it_cuts_nothing(
    client, store, server, path
):
    """The slot is free once the body ended, while the request's background task still runs:
    the same user (1 stream allowed) is admitted again at once. A revoke then reaches no
    request: the task runs to its end, and the client got its complete body, nothing more."""
    user, task = new_name("u"), new_name("t")
    first = await client.get(path, params={"user": user, "task": task})
    assert first.status_code == 200, first.text
    assert "error" not in first.text
    await task_is(client, task, "running")
    await eventually(lambda: count_is(store, user, 0), what="the slot to be freed")
    again = await client.get(path, params={"user": user, "task": new_name("t")})
    assert again.status_code == 200, again.text
    await store.revoke(user)
    await client.post(f"/open/{task}")
    await task_is(client, task, "done")
    assert "Traceback" not in server.new_log()


async def test_a_lease_ends_when_its_client_leaves_while_background_tasks_run(client, store):
    """A client that leaves mid-stream frees the slot though the task that follows runs on."""
    user, task = new_name("u"), new_name("t")
    async with client.stream("GET", "/endless", params={"user": user, "task": task}) as body:
        lines = body.aiter_lines()  # kept: a dropped iterator, finalized, closes the response
        await anext(lines)
        assert await store.get_active_count(user) == 1
    await task_is(client, task, "running")
    await eventually(lambda: count_is(store, user, 0), what="the slot to be freed")
    await client.post(f"/open/{task}")
    await task_is(client, task, "done")


@pytest.mark.parametrize("path", ["/sse", "/sse-free"])
async def test_a_server_sent_events_body_ends_before_its_background_tasks(client, server, path):
    """The whole body, its end included, reaches the client while the task still waits."""
    task = new_name("t")
    body = await client.get(path, params={"user": new_name("u"), "task": task})
    assert body.text.count("data:") == 2 and "error" not in body.text, body.text
    assert await task_state(client, task) == "running"
    await client.post(f"/open/{task}")
    await task_is(client, task, "done")


async def test_a_background_tasks_error_is_the_apps_own_not_the_streams(client, server):
    """A ``PoolFull`` raised by a task after a complete body adds no error event to the
    stream; the server logs the task's failure with its traceback, as any app error."""
    server.new_log()
    task = new_name("t")
    params = {"user": new_name("u"), "task": task, "task_fails": "1"}
    # A client of its own: uvicorn closes the connection of a request whose app failed.
    async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as streaming:
        async with streaming.stream("GET", "/sse", params=params) as response:
            await client.post(f"/open/{task}")
            body = (await response.aread()).decode()
    assert body.count("data:") == 2 and "error" not in body, body
    await task_is(client, task, "failed")
    log = ""

    def traceback_logged() -> bool:
        nonlocal log
        log += server.new_log()
        return "Traceback" in log and "PoolFull" in log

    await eventually(traceback_logged, what="the task's traceback in the server's log")
    assert "stream ended" not in log, log


async def test_a_drain_waits_for_background_tasks_within_its_timeout(client, store, server):
    """A drain does not close its manager while a request's task runs, nor cancel the task; a
    task that outlives the drain's timeout still runs to its end."""
    user, task = new_name("u"), new_name("t")
    done = await client.get("/drainable", params={"user": user, "task": task})
    assert done.status_code == 200, done.text
    await eventually(lambda: count_is(store, user, 0), what="the slot to be freed")
    await client.post("/drain", params={"timeout": 30})
    assert not (await client.get("/drained")).json()["drained"]
    assert await task_state(client, task) == "running"
    await client.post(f"/open/{task}")
    await task_is(client, task, "done")

    async def drained() -> bool:
        return (await client.get("/drained")).json()["drained"]

    await eventually(drained, what="the drain to end")
