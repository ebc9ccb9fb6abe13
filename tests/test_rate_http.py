"""Rate limits at the HTTP boundary: the dependency, the decorator, the middleware,
WebSockets, client IPs behind proxies, and headers parsed back with a structured-field parser
on success, on refusal and on a stream. Each runs on the embedded store and on Redis."""

from __future__ import annotations

import json

import http_sf
import httpx
import pytest
from fastapi import Depends, FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from fastapi_stream_lease import (
    RateLimit,
    RateLimited,
    RateLimitHeaders,
    RateLimitMiddleware,
    StreamLeaseManager,
    client_ip,
    install_exception_handler,
)

PER_MINUTE = RateLimit("chat_per_minute", 3, per=60)
PER_DAY = RateLimit("chat_per_day", 5, per=86_400, algorithm="fixed_window")
STARTS = RateLimit("stream_starts", 2, per=60)


def by_user(request: Request) -> str:
    return request.headers["x-user"]


async def by_user_async(request: Request) -> str:
    return request.headers["x-user"]


async def tokens():
    yield b"data: a\n\n"
    yield b"data: b\n\n"


def chat_app(manager: StreamLeaseManager, **options: bool) -> FastAPI:
    app = FastAPI()
    install_exception_handler(app, **options)

    @app.get("/chat", dependencies=[Depends(manager.rate_limit(PER_MINUTE, PER_DAY, key=by_user))])
    async def chat() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/stream", dependencies=[Depends(manager.rate_limit(PER_MINUTE, key=by_user_async))])
    async def stream() -> StreamingResponse:
        return StreamingResponse(tokens(), media_type="text/event-stream")

    @app.get("/decorated")
    @manager.rate_limited(PER_MINUTE, key=by_user)
    async def decorated(n: int = 0) -> int:
        return n

    @app.get("/sync-decorated")
    @manager.rate_limited(PER_MINUTE, key=by_user)
    def sync_decorated(request: Request) -> str:
        return request.url.path

    @app.get("/lease")
    async def lease_stream(request: Request) -> StreamingResponse:
        lease = await manager.acquire(by_user(request), request=request, rate_limits=[STARTS])
        return StreamingResponse(lease.wrap(tokens()), media_type="text/event-stream")

    @app.get("/by-ip", dependencies=[Depends(manager.rate_limit(PER_MINUTE))])
    async def by_ip(request: Request) -> str:
        return manager.client_ip(request)

    return app


def client(app, peer: str = "127.0.0.1") -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=(peer, 40000))
    return httpx.AsyncClient(transport=transport, base_url="http://test")


def policies(response: httpx.Response) -> list[tuple[str, dict[str, int]]]:
    return http_sf.parse(response.headers["RateLimit-Policy"].encode(), tltype="list")


def states(response: httpx.Response) -> dict[str, dict[str, int]]:
    parsed = http_sf.parse(response.headers["RateLimit"].encode(), tltype="list")
    return {name: params for name, params in parsed}


async def test_the_dependency_counts_both_policies_and_sends_the_headers(make_manager):
    manager = make_manager()
    async with client(chat_app(manager)) as http:
        for left in (2, 1, 0):
            response = await http.get("/chat", headers={"x-user": "alice"})
            assert response.status_code == 200
            assert policies(response) == [
                ("chat_per_minute", {"q": 3, "w": 60}),
                ("chat_per_day", {"q": 5, "w": 86400}),
            ]
            assert states(response)["chat_per_minute"]["r"] == left
            assert 0 < states(response)["chat_per_minute"]["t"] <= 66
        refused = await http.get("/chat", headers={"x-user": "alice"})
        assert refused.status_code == 429
        assert 59 <= int(refused.headers["Retry-After"]) <= 66
        assert states(refused) == {
            "chat_per_minute": {"r": 0, "t": states(refused)["chat_per_minute"]["t"]},
            "chat_per_day": {"r": 2, "t": states(refused)["chat_per_day"]["t"]},
        }
        body = json.loads(refused.text)
        assert body["violated-policies"] == ["chat_per_minute"]
        assert refused.headers["content-type"] == "application/problem+json"
        # The refusal consumed nothing from the day.
        assert (await manager.peek("alice", PER_DAY)).remaining == 2
        other = await http.get("/chat", headers={"x-user": "bob"})
        assert other.status_code == 200


async def test_a_stream_gets_its_headers_before_its_first_byte(make_manager):
    manager = make_manager()
    async with client(chat_app(manager)) as http:
        async with http.stream("GET", "/stream", headers={"x-user": "alice"}) as response:
            assert states(response)["chat_per_minute"]["r"] == 2
            assert [line async for line in response.aiter_lines() if line] == [
                "data: a", "data: b"
            ]


async def test_a_leased_stream_counts_its_start_and_sends_the_headers(make_manager):
    manager = make_manager(max_per_user=5)
    async with client(chat_app(manager)) as http:
        for left in (1, 0):
            response = await http.get("/lease", headers={"x-user": "alice"})
            assert response.status_code == 200 and "data: b" in response.text
            assert states(response)["stream_starts"]["r"] == left
            # The stream's own slots, alongside: 5 per user, 1000 in all, this one in use.
            assert dict(policies(response))["per_user"] == {"q": 5, "qu": "concurrent-requests"}
            assert states(response)["per_user"] == {"r": 4}
            assert states(response)["global"] == {"r": 999}
        refused = await http.get("/lease", headers={"x-user": "alice"})
        assert refused.status_code == 429
        assert states(refused)["stream_starts"]["r"] == 0
    assert await manager.get_active_count("alice") == 0


async def test_the_decorator_keeps_the_signature_and_needs_no_request(make_manager):
    manager = make_manager()
    async with client(chat_app(manager)) as http:
        response = await http.get("/decorated", params={"n": 7}, headers={"x-user": "alice"})
        assert response.json() == 7
        assert states(response)["chat_per_minute"]["r"] == 2
        response = await http.get("/sync-decorated", headers={"x-user": "alice"})
        assert response.json() == "/sync-decorated"
        await http.get("/decorated", headers={"x-user": "alice"})
        assert (await http.get("/decorated", headers={"x-user": "alice"})).status_code == 429


async def test_legacy_headers_on_request(make_manager):
    manager = make_manager()
    async with client(chat_app(manager, legacy_rate_limit_headers=True)) as http:
        response = await http.get("/chat", headers={"x-user": "alice"})
        assert response.headers["X-RateLimit-Scope"] == "chat_per_minute"
        assert response.headers["X-RateLimit-Limit"] == "3"
        assert response.headers["X-RateLimit-Remaining"] == "2"
        assert 0 < int(response.headers["X-RateLimit-Reset"]) <= 66


async def test_rate_limit_headers_alone_write_what_the_response_did_not_set(make_manager):
    """``RateLimitHeaders`` without ``install_exception_handler`` (an app that wires its own
    middleware): the recorded headers are added, and one the response set itself is kept."""
    manager = make_manager()
    app = FastAPI()
    app.add_middleware(RateLimitHeaders, legacy=True)

    @app.get("/chat", dependencies=[Depends(manager.rate_limit(PER_MINUTE, key=by_user))])
    async def chat() -> JSONResponse:
        return JSONResponse({"ok": True}, headers={"RateLimit": '"own";r=7'})

    async with client(app) as http:
        response = await http.get("/chat", headers={"x-user": "alice"})
        assert policies(response) == [("chat_per_minute", {"q": 3, "w": 60})]
        assert response.headers.get_list("RateLimit") == ['"own";r=7']
        assert response.headers["X-RateLimit-Remaining"] == "2"


async def test_forwarded_addresses_count_only_from_trusted_proxies(make_manager):
    manager = make_manager(trusted_proxies=["10.0.0.0/8"])
    app = chat_app(manager)
    forged = {"x-forwarded-for": "203.0.113.9"}
    async with client(app, peer="198.51.100.7") as http:  # not a proxy: the header is a lie
        response = await http.get("/by-ip", headers=forged)
        assert response.json() == "198.51.100.7"
    async with client(app, peer="10.1.2.3") as http:  # our proxy: the header is the client
        response = await http.get("/by-ip", headers={"x-forwarded-for": "203.0.113.9, 10.0.0.8"})
        assert response.json() == "203.0.113.9"
        # Not the header this proxy writes (X-Forwarded-For): the proxy's client wrote it.
        response = await http.get("/by-ip", headers={"forwarded": 'for="[2001:db8::7]:4711"'})
        assert response.json() == "10.1.2.3"
    # 203.0.113.9 spent one; the liar was counted under its own address.
    assert (await manager.peek("203.0.113.9", PER_MINUTE)).remaining == 2
    assert (await manager.peek("198.51.100.7", PER_MINUTE)).remaining == 2


@pytest.mark.parametrize("key", [by_user, by_user_async])
async def test_the_middleware_limits_the_routes_it_names(make_manager, key):
    manager = make_manager()
    app = FastAPI()

    @app.get("/api/chat/{room}")
    async def room(room: str) -> str:
        return room

    @app.get("/health")
    async def health() -> str:
        return "ok"

    limit = RateLimit("api", 2, per=60)
    app.add_middleware(
        RateLimitMiddleware, manager=manager, routes={"/api/chat": [limit]}, key=key
    )
    install_exception_handler(app)
    async with client(app) as http:
        alice = {"x-user": "alice"}
        assert (await http.get("/api/chat/a", headers=alice)).status_code == 200
        response = await http.get("/api/chat/b", headers=alice)
        assert states(response)["api"]["r"] == 0
        refused = await http.get("/api/chat/c", headers=alice)
        assert refused.status_code == 429 and "Retry-After" in refused.headers
        assert states(refused)["api"]["r"] == 0
        assert (await http.get("/api/chat/a", headers={"x-user": "bob"})).status_code == 200
        for _ in range(5):
            assert (await http.get("/health", headers=alice)).status_code == 200


def test_the_middleware_refuses_a_websocket_connect_over_its_limit(backend_url, key_prefix):
    from fastapi_stream_lease import LeaseConfig

    manager = StreamLeaseManager(url=backend_url, config=LeaseConfig(key_prefix=key_prefix))
    app = FastAPI()

    @app.websocket("/ws")
    async def echo(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_text("hello")
        await websocket.close()

    connects = RateLimit("ws_connects", 2, per=60)
    app.add_middleware(RateLimitMiddleware, manager=manager, routes={"/ws": [connects]})
    with TestClient(app) as test_client:
        for _ in range(2):
            with test_client.websocket_connect("/ws") as ws:
                assert ws.receive_text() == "hello"
        with pytest.raises(WebSocketDisconnect) as refused:
            with test_client.websocket_connect("/ws"):
                pass
        assert refused.value.code == 1008


async def test_servers_take_the_middleware_for_an_asgi3_app():
    """Its ``__call__`` hands a request on as the app's own awaitable instead of being a
    coroutine: servers that tell ASGI 3 from ASGI 2 or WSGI by whether ``__call__`` is a
    coroutine function (uvicorn asks ``asyncio``, Hypercorn ``inspect``) must still see ASGI 3."""
    import asyncio
    import inspect

    import uvicorn

    manager = StreamLeaseManager(url="memory://")
    limited = RateLimitMiddleware(FastAPI(), manager=manager, routes={"/": [PER_MINUTE]})
    assert inspect.iscoroutinefunction(limited.__call__)
    assert asyncio.iscoroutinefunction(limited.__call__)
    config = uvicorn.Config(limited)
    config.load()
    assert config.interface == "asgi3"
    await manager.aclose()


def test_websocket_connects_and_messages_are_limited(backend_url, key_prefix):
    from fastapi_stream_lease import LeaseConfig

    manager = StreamLeaseManager(url=backend_url, config=LeaseConfig(key_prefix=key_prefix))
    app = FastAPI()
    connects = RateLimit("ws_connects", 2, per=60)
    messages = RateLimit("ws_messages", 3, per=60)

    @app.websocket("/ws/{user}")
    async def chat(websocket: WebSocket, user: str) -> None:
        try:  # as any WebSocket endpoint ends when its client leaves
            guarded = await manager.guard_websocket(
                websocket, connects=[connects], messages=[messages], key=lambda ws: user
            )
            await guarded.accept()
            while True:
                await guarded.send_text("echo: " + await guarded.receive_text())
        except WebSocketDisconnect:
            return

    with TestClient(app) as test_client:
        with test_client.websocket_connect("/ws/alice") as ws:
            for text in ("a", "b", "c"):
                ws.send_text(text)
                assert ws.receive_text() == "echo: " + text
            ws.send_text("d")  # the fourth message in a minute
            with pytest.raises(WebSocketDisconnect) as closed:
                ws.receive_text()
            assert closed.value.code == 1008
        with test_client.websocket_connect("/ws/alice") as ws:
            ws.send_text("e")  # messages are counted per user, across connections
            with pytest.raises(WebSocketDisconnect):
                ws.receive_text()
        with pytest.raises(WebSocketDisconnect) as refused:  # the third connect in a minute
            with test_client.websocket_connect("/ws/alice"):
                pass
        assert refused.value.code == 1008
        with test_client.websocket_connect("/ws/bob") as ws:
            ws.send_text("hi")
            assert ws.receive_text() == "echo: hi"


@pytest.mark.parametrize(
    ("routes", "error", "message"),
    [
        ({"api": [PER_MINUTE]}, ValueError, "must be a path"),
        ({"/api": []}, ValueError, "at least one RateLimit"),
        ({"/api": ["per_minute"]}, TypeError, "must be RateLimit values"),
        ({"/api": [PER_MINUTE, PER_MINUTE]}, ValueError, "given twice"),
        ({"/api": [(PER_MINUTE, "team")]}, TypeError, "count the identity its key gives"),
    ],
)
def test_bad_routes_fail_at_start_up(routes, error, message):
    with pytest.raises(error, match=message):
        RateLimitMiddleware(FastAPI(), manager=StreamLeaseManager(), routes=routes)


def test_bad_forms_fail_at_start_up():
    manager = StreamLeaseManager()
    with pytest.raises(ValueError, match="could never be allowed"):
        manager.rate_limit(PER_MINUTE, cost=4)
    with pytest.raises(ValueError, match="trusted proxy 'nope' is not a network"):
        client_ip(Request({"type": "http", "client": ("1.2.3.4", 1), "headers": []}), ["nope"])
    assert issubclass(RateLimited, Exception)


async def test_a_dry_run_over_its_limit_answers_with_its_headers_and_never_refuses(make_manager):
    manager = make_manager()
    new_rule = RateLimit("new_rule", 1, per=60, enforce=False)
    app = FastAPI()
    install_exception_handler(app)

    @app.get("/chat", dependencies=[Depends(manager.rate_limit(new_rule, key=by_user))])
    async def chat() -> dict[str, bool]:
        return {"ok": True}

    async with client(app) as http:
        answers = [await http.get("/chat", headers={"x-user": "alice"}) for _ in range(3)]
    assert [response.status_code for response in answers] == [200, 200, 200]
    assert all(policies(r) == [("new_rule", {"q": 1, "w": 60})] for r in answers)
    assert [states(r)["new_rule"]["r"] for r in answers] == [0, 0, 0]
    assert (await manager.peek("alice", new_rule)).used == 3
