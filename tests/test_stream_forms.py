"""A lease held through ``manager.stream_lease()`` for every form of stream a FastAPI endpoint
is written in today (native Server-Sent Events on GET and POST, JSON Lines, a returned
``StreamingResponse``, a WebSocket), and clean ends with a reason for the streams the library
stops (a revoke, a budget cut, a drain), through a real uvicorn server and real clients: the
client gets the documented final event or close code, the body ends normally, and the server's
log has one line for the end and no traceback."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import Depends, FastAPI, WebSocket
from fastapi.responses import StreamingResponse
from fastapi.sse import EventSourceResponse
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from fastapi_stream_lease import (
    Lease,
    LeaseConfig,
    RateLimit,
    StreamLeaseManager,
    install_exception_handler,
)

from support.app_server import AppServer, store_of
from support.waiting import eventually, wait_until

PREFIX = f"forms{uuid.uuid4().hex[:8]}"
SECRET = "stream-forms-secret-0123456789"
REDUCED_CAPACITY = "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
QUOTA_EXCEEDED = "https://iana.org/assignments/http-problem-types#quota-exceeded"


def forms_server(redis_url: str, log: Path, *args: str) -> AppServer:
    """The app of tests/apps/stream_forms.py under uvicorn, its log in a file."""
    return AppServer("stream_forms", redis_url, log, PREFIX, SECRET, *args)


@pytest.fixture(scope="module")
def server(redis_server, tmp_path_factory) -> Iterator[AppServer]:
    started = forms_server(redis_server.url, tmp_path_factory.mktemp("forms") / "uvicorn.log")
    yield started
    started.stop()


@pytest.fixture
async def store(redis_server) -> AsyncIterator[StreamLeaseManager]:
    async with store_of(redis_server.url, PREFIX, SECRET) as manager:
        yield manager


def new_user() -> str:
    return f"u{uuid.uuid4().hex[:8]}"


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


async def assert_logged_one_end(server: AppServer, error: str, user: str) -> None:
    """One line for the end (INFO for a revoke or a drain, WARNING otherwise), written once
    the response ended; no traceback; never the user's identity."""
    level = "INFO" if error == "LeaseRevoked" else "WARNING"
    log = ""

    def end_logged() -> bool:
        nonlocal log
        log += server.new_log()
        return f"{level} stream ended" in log

    await eventually(end_logged, what="the end's log line")
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log
    ends = [line for line in log.splitlines() if line.startswith(f"{level} stream ended")]
    assert len(ends) == 1 and f": {error}: " in ends[0], log
    assert user not in log


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
    await assert_logged_one_end(server, "LeaseRevoked", user)


async def _count_is(store: StreamLeaseManager, user: str, count: int) -> bool:
    return await store.get_active_count(user) == count


async def test_a_revoke_ends_an_idle_byte_stream_with_its_end(server, store):
    """A plain byte stream has no room for a reason: it just ends, normally."""
    user = new_user()
    async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as client:
        async with client.stream("GET", "/bytes", params={"user": user, "idle": 1}) as response:
            chunks = response.aiter_bytes()
            assert await anext(chunks) == b"tick\n"
            await store.revoke(user)
            assert [chunk async for chunk in chunks] == []
    await assert_logged_one_end(server, "LeaseRevoked", user)


def ws_url(server: AppServer, user: str, **params: str) -> str:
    query = "&".join(f"{k}={v}" for k, v in {"user": user, **params}.items())
    return server.base_url.replace("http://", "ws://") + f"/ws?{query}"


async def test_a_revoke_closes_an_idle_websocket_with_1013_and_the_reason(server, store):
    user = new_user()
    async with connect(ws_url(server, user, idle="1")) as websocket:
        assert json.loads(await websocket.recv()) == {"tick": 0}
        assert await store.get_active_count(user) == 1
        await store.revoke(user)
        with pytest.raises(ConnectionClosed) as closed:
            await websocket.recv()
    assert closed.value.rcvd is not None
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1013, "Stream lease revoked")
    await eventually(lambda: _count_is(store, user, 0), what="the socket's lease to be freed")
    await assert_logged_one_end(server, "LeaseRevoked", user)


@pytest.mark.parametrize("form", ["sse-get", "jsonl"])
async def test_a_budget_cut_ends_the_stream_with_a_429_event(server, store, form):
    """Counted with lease.consume() in a Server-Sent Events endpoint, with
    lease.wrap(..., tokens=...) in a JSON Lines one."""
    user = new_user()
    path = "/budget" if form == "sse-get" else "/budget-jsonl"
    async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as client:
        async with client.stream("GET", path, params={"user": user}) as response:
            read = read_sse if form == "sse-get" else jsonl_lines
            items = [item async for item in read(response)]  # type: ignore[operator]
    *ticks, last = items
    assert ticks and all("tick" in str(item) for item in ticks)
    problem = ended_with_problem(form, last)
    assert problem["status"] == 429 and problem["type"] == QUOTA_EXCEEDED
    assert problem["title"] == "Token budget exhausted"
    await eventually(lambda: _count_is(store, user, 0), what="the cut stream's lease to be freed")
    await assert_logged_one_end(server, "BudgetExhausted", user)


async def test_a_reservation_that_never_fits_answers_400_and_one_that_fits_later_429(server):
    """A request whose reservation is more than the budget's whole limit was answered 500 (a
    ValueError) though only asking for fewer tokens can help: it answers 400 without
    Retry-After, while one that fits once the window frees room answers 429 with it."""
    user = new_user()
    async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as client:
        too_many = {"user": user, "prompt_tokens": 1, "max_tokens": 300}
        never = await client.get("/reserved", params=too_many)
        assert never.status_code == 400 and "retry-after" not in never.headers
        problem = never.json()
        assert problem["title"] == "Reservation larger than the budget"
        assert problem["violated-policies"] == ["tokens_per_minute"]
        assert "max_tokens" in problem["detail"]
        whole = {"user": user, "prompt_tokens": 100, "max_tokens": 200}
        async with client.stream("GET", "/reserved", params=whole) as holding:
            assert holding.status_code == 200
            later = await client.get("/reserved", params={**whole, "max_tokens": 1})
    assert later.status_code == 429 and int(later.headers["retry-after"]) >= 1
    assert later.json()["type"] == QUOTA_EXCEEDED


async def test_a_drain_ends_an_idle_stream_with_a_final_event(server):
    user = new_user()
    async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as client:
        async with client.stream("GET", "/drainable", params={"user": user}) as response:
            events = read_sse(response)
            assert (await anext(events))[0] == "tick"
            assert (await client.post("/drain")).json() == {"drained": True}
            rest = [event async for event in events]
            refused = await client.get("/drainable", params={"user": user})
    assert [event for event, _, _ in rest] == ["error"]
    assert json.loads(rest[0][1])["title"] == "Stream lease revoked"
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    await assert_logged_one_end(server, "LeaseRevoked", user)


FORMS_HOLDING_A_SLOT = ["sse-get", "sse-post", "jsonl", "streaming", "websocket"]


@pytest.mark.parametrize("form", FORMS_HOLDING_A_SLOT)
async def test_each_form_holds_its_slot_while_it_streams_and_frees_it_after(server, store, form):
    user = new_user()
    async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as client:
        if form == "websocket":
            async with connect(ws_url(server, user)) as websocket:
                await websocket.recv()
                assert await store.get_active_count(user) == 1
        else:
            stream = first_then_rest(client, form, user)
            await anext(stream)
            assert await store.get_active_count(user) == 1
            await stream.aclose()  # the client leaves
            await eventually(lambda: _count_is(store, user, 0), what="the slot to be freed")
            method, path, _ = HTTP_FORMS[form]
            finished = await client.request(method, path, params={"user": user, "count": 2})
            assert finished.status_code == 200 and "error" not in finished.text
            assert finished.text.rstrip().endswith(("1}", "tick 1")), finished.text
        await eventually(lambda: _count_is(store, user, 0), what="the slot to be freed")
    assert "Traceback" not in server.new_log()


async def test_the_cap_holds_across_three_worker_processes(redis_server, store, tmp_path):
    """Two streams per user across every worker: the third is refused with 429, a fresh one
    is admitted once one ends."""
    workers = forms_server(redis_server.url, tmp_path / "uvicorn.log", "--workers", "3")
    user = new_user()
    try:
        async with httpx.AsyncClient(base_url=workers.base_url, timeout=10) as client:
            opened = [first_then_rest(client, "sse-get", user) for _ in range(2)]
            for stream in opened:
                await anext(stream)
            refused = await client.get("/sse", params={"user": user})
            assert refused.status_code == 429 and "retry-after" in refused.headers
            assert refused.json()["limit"] == "per_user"
            await opened[0].aclose()
            await eventually(lambda: _count_is(store, user, 1), what="a slot to be freed")
            third = first_then_rest(client, "sse-get", user)
            await anext(third)
            await third.aclose()
            await opened[1].aclose()
        assert "Traceback" not in workers.new_log()
    finally:
        workers.stop()


def test_scope_function_makes_the_dependency_an_admission_check():
    """``Depends(..., scope="function")``: the caps are checked, the stream holds no slot."""
    manager = StreamLeaseManager(url="memory://", config=LeaseConfig(max_per_user=1))
    app = FastAPI()
    install_exception_handler(app)
    admitted = Depends(manager.stream_lease(user=lambda: "alice"), scope="function")

    @app.get("/sse", response_class=EventSourceResponse)
    async def sse(lease: Lease = admitted) -> AsyncIterator[dict[str, int]]:
        yield {"held": await manager.get_active_count("alice")}

    with TestClient(app) as client:
        assert client.get("/sse").text == 'data: {"held":0}\n\n'


def test_the_dependency_without_the_middleware_says_which_line_is_missing():
    manager = StreamLeaseManager(url="memory://")
    app = FastAPI()
    needed = Depends(manager.stream_lease(user=lambda: "alice"))

    @app.get("/sse", response_class=EventSourceResponse)
    async def sse(lease: Lease = needed) -> AsyncIterator[dict[str, bool]]:
        yield {"ok": True}

    with TestClient(app) as client, pytest.raises(RuntimeError, match="install_exception_handler"):
        client.get("/sse")
    with pytest.raises(TypeError, match="user must be a dependency that returns the user id"):
        manager.stream_lease(user="alice")  # type: ignore[arg-type]


@pytest.mark.parametrize("version", ["0.117.1", "0.99.0"])
def test_the_dependency_refuses_a_fastapi_that_exits_it_before_the_body_streams(
    monkeypatch, version
):
    """Before FastAPI 0.118 a ``yield`` dependency's exit ran before the body streamed: the
    lease was released and the stream ran unprotected, silently."""
    import fastapi

    manager = StreamLeaseManager(url="memory://")
    monkeypatch.setattr(fastapi, "__version__", version)
    with pytest.raises(RuntimeError, match=rf"needs FastAPI 0\.118 or later, found {version}"):
        manager.stream_lease(user=lambda: "alice")
    monkeypatch.setattr(fastapi, "__version__", "0.118.0")
    assert callable(manager.stream_lease(user=lambda: "alice"))


def test_a_lease_revoked_before_the_response_starts_is_answered_with_its_503():
    manager = StreamLeaseManager(url="memory://", config=LeaseConfig(identity_secret=SECRET))
    app = FastAPI()
    install_exception_handler(app)
    leased = Depends(manager.stream_lease(user=lambda: "alice"))

    @app.get("/slow")
    async def slow(lease: Lease = leased) -> dict[str, bool]:
        await manager.revoke("alice")
        await asyncio.sleep(3600)  # ended by the revoke, not by the sleep
        return {"answered": True}

    with TestClient(app) as client:
        answer = client.get("/slow")
    assert answer.status_code == 503 and answer.headers["retry-after"] == "1"
    assert answer.json()["title"] == "Stream lease revoked"


def test_a_revoked_lease_of_the_dependency_is_released_as_lost_after_on_lost():
    """The dependency told ``on_released`` "cancelled" for a lease whose loss ended the
    request (the loss ends it by cancelling its task); the migration guide promises
    ``on_lost(lease, reason)`` then ``on_released(lease, "lost")``."""
    heard: list[tuple[str, str]] = []
    config = LeaseConfig(
        identity_secret=SECRET,
        on_lost=lambda lease, reason: heard.append(("on_lost", reason)),
        on_released=lambda lease, reason: heard.append(("on_released", reason)),
    )
    manager = StreamLeaseManager(url="memory://", config=config)
    app = FastAPI()
    install_exception_handler(app)
    leased = Depends(manager.stream_lease(user=lambda: "alice"))

    @app.get("/sse", response_class=EventSourceResponse)
    async def sse(lease: Lease = leased) -> AsyncIterator[dict[str, int]]:
        yield {"tick": 1}
        await manager.revoke("alice")
        await asyncio.sleep(3600)  # ended by the revoke
        yield {"tick": 2}

    expected = [("on_lost", "revoked"), ("on_released", "lost")]
    with TestClient(app) as client:
        body = client.get("/sse").text
        assert "event: error" in body and '"tick":2' not in body
        # The hooks run on the client's event loop, which ends with this block.
        wait_until(lambda: heard == expected, what="on_lost, then on_released")


def test_a_budget_cut_closes_a_websocket_with_1008_and_the_reason():
    manager = StreamLeaseManager(url="memory://", config=LeaseConfig(identity_secret=SECRET))
    budget = RateLimit("tokens_per_minute", 300, per=60, unit="tokens")
    app = FastAPI()
    install_exception_handler(app)
    leased = Depends(manager.stream_lease(user=lambda: "alice", budgets=[budget], reserve=100))

    @app.websocket("/ws")
    async def ws(websocket: WebSocket, lease: Lease = leased) -> None:
        await websocket.accept()
        while True:
            await lease.wait_budget()
            lease.consume(100)
            await websocket.send_text("tokens")

    with TestClient(app) as client, client.websocket_connect("/ws") as websocket:
        with pytest.raises(WebSocketDisconnect) as closed:
            while True:
                assert websocket.receive_text() == "tokens"
    assert (closed.value.code, closed.value.reason) == (1008, "Token budget exhausted")


@pytest.mark.parametrize(
    ("status", "code"), [(429, 1008), (403, 1008), (503, 1013), (500, 1011), (502, 1011)]
)
def test_a_websocket_closes_with_1008_for_a_4xx_1013_for_a_503_and_1011_for_another_5xx(
    status, code
):
    """Every status but 503 closed with 1008 (Policy Violation), a server's 500 included."""
    from fastapi_stream_lease.stream_end import ws_close_code

    assert ws_close_code(status) == code


@pytest.mark.parametrize(
    ("media_type", "last"),
    [
        ("application/x-ndjson", '{"error":{"type":"' + REDUCED_CAPACITY + '"'),
        ("text/plain", "line\n"),  # nothing more: the body just ends
    ],
)
def test_a_wrapped_stream_ends_by_its_media_type(media_type, last):
    manager = StreamLeaseManager(url="memory://", config=LeaseConfig(identity_secret=SECRET))
    app = FastAPI()
    install_exception_handler(app)

    @app.get("/stream")
    async def stream() -> StreamingResponse:
        lease = await manager.acquire("alice")

        async def lines() -> AsyncIterator[str]:
            yield "line\n"
            await manager.revoke("alice")
            await asyncio.sleep(3600)  # ended by the revoke
            yield "never\n"

        return StreamingResponse(lease.wrap(lines()), media_type=media_type)

    with TestClient(app) as client:
        body = client.get("/stream").text
    assert body.startswith("line\n") and "never" not in body
    assert body.splitlines(keepends=True)[-1].startswith(last)
