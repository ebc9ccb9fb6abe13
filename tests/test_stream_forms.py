"""A lease held through ``manager.stream_lease()`` for every form of stream a FastAPI endpoint
is written in today (native Server-Sent Events on GET and POST, JSON Lines, a returned
``StreamingResponse``, a WebSocket), and clean ends with a reason for the streams the library
stops (a revoke, a budget cut, a drain), through a real uvicorn server and real clients: the
client gets the documented final event or close code, the body ends normally, and the server's
log has one line for the end and no traceback."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import Depends, FastAPI
from fastapi.sse import EventSourceResponse
from starlette.testclient import TestClient
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from fastapi_stream_lease import (
    Lease,
    LeaseConfig,
    StreamLeaseManager,
    install_exception_handler,
)

from support.apps import APPS_DIR
from support.uvicorn_server import Uvicorn
from support.waiting import eventually

PREFIX = f"forms{uuid.uuid4().hex[:8]}"
SECRET = "stream-forms-secret-0123456789"
REDUCED_CAPACITY = "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
QUOTA_EXCEEDED = "https://iana.org/assignments/http-problem-types#quota-exceeded"


class Server:
    """The app of tests/apps/stream_forms.py under uvicorn, its log in a file."""

    def __init__(self, redis_url: str, log: Path, *args: str) -> None:
        env = {
            "STREAM_LEASE_URL": redis_url,
            "STREAM_LEASE_PREFIX": PREFIX,
            "STREAM_LEASE_SECRET": SECRET,
        }
        self.log_path = log
        self.uvicorn = Uvicorn("stream_forms:app", APPS_DIR, env, *args, log=log)
        self.base_url = self.uvicorn.base_url
        self._read = 0

    def new_log(self) -> str:
        """What the server logged since the last call."""
        text = self.log_path.read_text()
        new, self._read = text[self._read :], len(text)
        return new


@pytest.fixture(scope="module")
def server(redis_server, tmp_path_factory) -> Iterator[Server]:
    started = Server(redis_server.url, tmp_path_factory.mktemp("forms") / "uvicorn.log")
    yield started
    started.uvicorn.stop()


@pytest.fixture
async def store(redis_server) -> AsyncIterator[StreamLeaseManager]:
    """Another process's view of the app's leases: counts them, revokes them."""
    config = LeaseConfig(key_prefix=PREFIX, identity_secret=SECRET)
    manager = StreamLeaseManager(url=redis_server.url, config=config)
    yield manager
    await manager.aclose()


def new_user() -> str:
    return f"u{uuid.uuid4().hex[:8]}"


class Opened:
    """One stream a client opened: its first item read, the rest readable."""

    def __init__(self, form: str, user: str) -> None:
        self.form = form
        self.user = user


async def read_sse(response: httpx.Response) -> AsyncIterator[tuple[str, str, str]]:
    """The events of a Server-Sent Events body: (event, data, retry)."""
    fields: dict[str, str] = {}
    async for line in response.aiter_lines():
        if line:
            name, _, value = line.partition(": ")
            fields[name] = value
        elif fields:
            yield fields.get("event", "message"), fields.get("data", ""), fields.get("retry", "")
            fields = {}


HTTP_FORMS = {
    # form: (method, path, how its items look)
    "sse-get": ("GET", "/sse", "sse"),
    "sse-post": ("POST", "/sse", "sse"),
    "jsonl": ("GET", "/jsonl", "jsonl"),
    "streaming": ("GET", "/streaming", "sse"),
    "wrapped": ("GET", "/wrapped", "sse"),
}


async def first_then_rest(client: httpx.AsyncClient, form: str, user: str, **params: object):
    """Opens ``form``'s stream for ``user``; yields once after its first item, then the items
    that follow until the body ends (raising if it does not end normally)."""
    method, path, kind = HTTP_FORMS[form]
    request = client.build_request(method, path, params={"user": user, **params})
    response = await client.send(request, stream=True)
    try:
        assert response.status_code == 200, await response.aread()
        items = read_sse(response) if kind == "sse" else jsonl_lines(response)
        first = await anext(items)
        yield first
        async for item in items:
            yield item
    finally:
        await response.aclose()


async def jsonl_lines(response: httpx.Response) -> AsyncIterator[dict[str, object]]:
    async for line in response.aiter_lines():
        if line:
            yield json.loads(line)


def ended_with_problem(form: str, last: object) -> dict[str, object]:
    """The problem JSON of the final event or line of ``form``'s stream."""
    if HTTP_FORMS[form][2] == "sse":
        event, data, retry = last  # type: ignore[misc]
        assert event == "error", last
        problem = json.loads(data)
        assert retry == str(problem["retry_after"] * 1000)
        return problem
    assert isinstance(last, dict) and set(last) == {"error"}, last
    return last["error"]  # type: ignore[return-value]


def assert_logged_one_end(server: Server, error: str) -> None:
    log = server.new_log()
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log
    assert sum(f"stream ended" in line and error in line for line in log.splitlines()) == 1, log


@pytest.mark.parametrize("form", list(HTTP_FORMS))
async def test_a_revoke_ends_an_idle_stream_with_a_final_event_and_no_traceback(
    server, store, form
):
    """A stream the library ended aborted its response (the client read an incomplete body)
    and the server logged a traceback, even with install_exception_handler."""
    user = new_user()
    async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as client:
        stream = first_then_rest(client, form, user, idle=1)  # waits an hour after its first
        await anext(stream)
        assert await store.get_active_count(user) == 1
        await store.revoke(user)
        rest = [item async for item in stream]  # ends normally: no RemoteProtocolError
    assert len(rest) == 1
    problem = ended_with_problem(form, rest[0])
    assert problem["status"] == 503 and problem["type"] == REDUCED_CAPACITY
    assert problem["title"] == "Stream lease revoked" and problem["retry_after"] == 1
    assert "revoked" in problem["detail"]
    await eventually(lambda: _count_is(store, user, 0), what="the revoked lease to be freed")
    assert_logged_one_end(server, "LeaseRevoked")


async def _count_is(store: StreamLeaseManager, user: str, count: int) -> bool:
    return await store.get_active_count(user) == count
