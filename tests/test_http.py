"""Through a real uvicorn server: the seed README's examples as written, and real clients that
hang up mid-stream."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from websockets.sync.client import connect

from fastapi_stream_lease import (
    BackendError,
    BackendUnavailable,
    BudgetExhausted,
    ClientDisconnected,
    LeaseConfig,
    LeaseLost,
    LineFull,
    ManagerClosed,
    PoolFull,
    RateLimited,
    StreamLeaseManager,
    StreamLeaseRejected,
    UserBanned,
)
from fastapi_stream_lease.errors import _QUOTA_EXCEEDED, _REDUCED_CAPACITY

from support.apps import APPS_DIR, quickstart
from support.ports import free_port
from support.uvicorn_server import Uvicorn
from support.waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent
SEED_CONFIG = LeaseConfig(max_per_user=2, max_global=500, lease_seconds=30.0)


@pytest.fixture
def seed_app(own_redis, tmp_path):
    """examples/seed_quickstart.py, pointed at the test's own Redis instead of port 6379."""
    code = (ROOT / "examples" / "seed_quickstart.py").read_text()
    assert code.count("redis://localhost:6379") == 1
    (tmp_path / "seed_app.py").write_text(code.replace("redis://localhost:6379", own_redis.url))
    server = Uvicorn("seed_app:app", tmp_path)
    yield server
    server.stop()


async def test_the_seed_handler_answers_every_refusal_and_never_500(own_redis, tmp_path):
    """The seed's one handler, ``@app.exception_handler(StreamLeaseRejected)``, answered a ban,
    a drain and an unreachable Redis with ``500 Internal Server Error``: those refusals were
    not StreamLeaseRejected."""
    code = (ROOT / "examples" / "seed_quickstart.py").read_text()
    (tmp_path / "seed_app.py").write_text(code.replace("redis://localhost:6379", own_redis.url))
    server = Uvicorn("seed_with_drain:app", APPS_DIR, {"PYTHONPATH": str(tmp_path)})
    operator = StreamLeaseManager(url=own_redis.url, config=SEED_CONFIG)
    try:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
            await operator.revoke("user_123", ban_seconds=60)
            banned = await client.get("/api/chat/stream")
            assert banned.status_code == 403 and int(banned.headers["retry-after"]) >= 1

            held = [await operator.acquire("u1", weight=100, max_per_user=0) for _ in range(5)]
            full = await client.get("/api/chat/stream", params={"user_id": "u2"})
            assert full.status_code == 503 and full.json()["limit"] == "global"
            assert all(not lease.released for lease in held)
            await operator.aclose()

            own_redis.stop()
            down = await client.get("/api/chat/stream", params={"user_id": "u3"})
            assert down.status_code == 503 and down.headers["retry-after"] == "1"
            assert down.headers["content-type"] == "application/problem+json"

            assert (await client.post("/admin/drain")).status_code == 200
            draining = await client.get("/api/chat/stream", params={"user_id": "u4"})
            assert draining.status_code == 503 and draining.headers["retry-after"] == "1"
            assert draining.json()["title"] == "Shutting down"
    finally:
        server.stop()


async def test_the_quickstart_streams_on_uvloop(own_redis, tmp_path):
    """uvicorn runs on uvloop wherever it is installed: the core's calls are settled on that
    loop as on asyncio's (the other servers here), streams at once included, and every lease
    is released."""
    (tmp_path / "quickstart.py").write_text(quickstart(own_redis.url))
    server = Uvicorn("quickstart:app", tmp_path, loop="uvloop")
    try:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
            responses = await asyncio.gather(
                *(client.get("/api/chat/stream", params={"user_id": f"u{n}"}) for n in range(4))
            )
        for response in responses:
            assert response.status_code == 200
            assert 'data: "streamed!"' in response.text  # native SSE sends each item as JSON
        wait_until(lambda: global_count(own_redis) == 0, what="the streams' leases released")
    finally:
        server.stop()


def global_count(redis_server) -> int:
    return int(redis_server.cli("zcard", "{stream_lease}:global"))


def test_seed_quickstart_streams_then_releases(seed_app, own_redis):
    response = httpx.get(seed_app.base_url + "/api/chat/stream", timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.text == "".join(
        f"data: {w}\n\n" for w in ["Hello", "world", "this", "is", "streamed!"]
    )
    wait_until(lambda: global_count(own_redis) == 0, what="the stream's lease to be released")


async def test_seed_quickstart_refuses_a_third_stream_with_429(seed_app, own_redis):
    # Two streams of user_123 held by another worker: limits hold across processes.
    other_worker = StreamLeaseManager(url=own_redis.url, config=SEED_CONFIG)
    held = [await other_worker.acquire("user_123") for _ in range(2)]
    async with httpx.AsyncClient(base_url=seed_app.base_url, timeout=10) as client:
        refused = await client.get("/api/chat/stream")
        assert refused.status_code == 429
        assert 1 <= int(refused.headers["retry-after"]) <= 30
        assert refused.headers["ratelimit-policy"] == '"per_user";q=2;qu="concurrent-requests"'
        body = refused.json()
        assert body["limit"] == "per_user" and body["current"] == 2 and body["capacity"] == 2
        assert "stream limit reached" in body["detail"]

        other_user = await client.get("/api/chat/stream", params={"user_id": "user_456"})
        assert other_user.status_code == 200

        await held[0].release()  # stream 1 finishes
        admitted = await client.get("/api/chat/stream")
        assert admitted.status_code == 200
    await other_worker.aclose()


def test_seed_websocket_example_holds_a_lease_while_open(seed_app, own_redis):
    ws_url = seed_app.base_url.replace("http://", "ws://") + "/ws/chat/user_123"
    with connect(ws_url) as websocket:
        websocket.send("hi")
        assert websocket.recv(timeout=10) == "Echo: hi"
        assert global_count(own_redis) == 1
    wait_until(lambda: global_count(own_redis) == 0, what="the socket's lease to be released")


def start_slow_app(backend_url: str, key_prefix: str, max_global: int = 1000) -> Uvicorn:
    return Uvicorn(
        "slow_stream_app:app",
        APPS_DIR,
        env={
            "STREAM_LEASE_URL": backend_url,
            "STREAM_LEASE_PREFIX": key_prefix,
            "STREAM_LEASE_MAX_GLOBAL": str(max_global),
        },
    )


@pytest.fixture
def slow_app(backend_url, key_prefix):
    server = start_slow_app(backend_url, key_prefix)
    yield server
    server.stop()


def request_stream(port: int, user_id: str, wait: float = 0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    path = f"/stream?user_id={user_id}&wait={wait}"
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
    return sock


def open_stream(port: int, user_id: str, wait: float = 0) -> socket.socket:
    """A raw HTTP client that reads the first event of an endless stream and keeps it open."""
    sock = request_stream(port, user_id, wait)
    received = b""
    while b"data: tick" not in received:
        chunk = sock.recv(4096)
        assert chunk, "server closed the stream"
        received += chunk
    assert received.startswith(b"HTTP/1.1 200")
    return sock


@pytest.mark.parametrize("hang_up", ["close", "reset"])
def test_a_client_hanging_up_mid_stream_frees_the_slot(slow_app, hang_up):
    def count() -> int:
        return json.loads(httpx.get(slow_app.base_url + "/count?user_id=alice").text)

    sock = open_stream(slow_app.port, "alice")
    assert count() == 1
    refused = httpx.get(slow_app.base_url + "/stream?user_id=alice")
    assert refused.status_code == 429
    assert "retry-after" in refused.headers

    if hang_up == "reset":  # an abrupt close: the peer sees a TCP RST, not a FIN
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sock.close()
    wait_until(lambda: count() == 0, what="the disconnected stream's lease to be released")
    open_stream(slow_app.port, "alice").close()


def test_sigterm_releases_every_lease_through_the_lifespan(redis_server, key_prefix):
    server = Uvicorn(
        "lifespan_app:app",
        APPS_DIR,
        {"STREAM_LEASE_URL": redis_server.url, "STREAM_LEASE_PREFIX": key_prefix},
        "--timeout-graceful-shutdown",
        "1",
    )
    streams = [open_stream(server.port, f"user{i}") for i in range(3)]
    key = f"{{{key_prefix}}}:global"
    assert int(redis_server.cli("zcard", key)) == 3
    server.process.send_signal(signal.SIGTERM)
    # uvicorn shuts down gracefully, then re-raises SIGTERM to report how it was stopped.
    assert server.process.wait(timeout=30) in (0, -signal.SIGTERM)
    # Released by aclose(), not by expiry: the leases had 30 s left.
    assert int(redis_server.cli("zcard", key)) == 0
    for sock in streams:
        sock.close()


def waiting_in_line(server: Uvicorn) -> int:
    """How many of the app's acquires wait in line (its manager's stats)."""
    return httpx.get(server.base_url + "/stats").json()["waiting"]


def test_a_client_that_leaves_while_waiting_leaves_the_line(backend_url, key_prefix):
    server = start_slow_app(backend_url, key_prefix, max_global=1)
    try:
        holder = open_stream(server.port, "holder")
        quitter = request_stream(server.port, "quitter", wait=30)  # first in line ...

        wait_until(lambda: waiting_in_line(server) == 1, what="the quitter to wait in line")
        quitter.close()  # ... and gone
        wait_until(
            lambda: waiting_in_line(server) == 0, what="the departed client to leave the line"
        )
        patient = request_stream(server.port, "patient", wait=30)
        time.sleep(0.3)
        holder.close()  # frees the slot: the next in line is "patient", not the departed one
        patient.settimeout(10)
        assert patient.recv(4096).startswith(b"HTTP/1.1 200")
        patient.close()
    finally:
        server.stop()


def test_a_websocket_client_that_leaves_while_waiting_leaves_the_line(backend_url, key_prefix):
    """A WebSocket waiting in line before its handshake stayed in line when its client went
    away, until its wait ran out (the waiting code watched only HTTP requests)."""
    server = start_slow_app(backend_url, key_prefix, max_global=1)
    try:
        holder = open_stream(server.port, "holder")
        quitter = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        quitter.sendall(
            b"GET /ws?user_id=quitter HTTP/1.1\r\nHost: test\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"Sec-WebSocket-Version: 13\r\n\r\n"
        )

        wait_until(lambda: waiting_in_line(server) == 1, what="the websocket to wait in line")
        quitter.close()  # gone before its handshake was answered
        wait_until(
            lambda: waiting_in_line(server) == 0, what="the departed websocket to leave the line"
        )
        holder.close()  # frees the slot: a websocket that comes now is admitted
        with connect(f"ws://127.0.0.1:{server.port}/ws?user_id=patient", open_timeout=10) as ws:
            assert ws.recv(timeout=10) == "tick 0"
    finally:
        server.stop()


def test_a_client_that_leaves_mid_upload_leaves_the_line(backend_url, key_prefix):
    """A client still sending its body when it goes away leaves the line at once, not at the
    end of its wait (the waiting code was reading the body when the disconnect came)."""
    server = start_slow_app(backend_url, key_prefix, max_global=1)
    try:
        holder = open_stream(server.port, "holder")
        uploader = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        uploader.sendall(
            b"GET /stream?user_id=uploader&wait=30 HTTP/1.1\r\nHost: test\r\n"
            b"Content-Length: 1000000\r\n\r\n" + b"x" * 1000
        )

        wait_until(lambda: waiting_in_line(server) == 1, what="the uploader to wait in line")
        uploader.close()  # gone before its body was all sent
        wait_until(
            lambda: waiting_in_line(server) == 0, what="the departed uploader to leave the line"
        )
        holder.close()
    finally:
        server.stop()


@pytest.mark.parametrize("size", [10, 1_000_000])
def test_a_body_sent_while_waiting_reaches_the_app_whole(backend_url, key_prefix, size):
    """The waiting code watches for a disconnect without taking the body: the app reads all of
    it, in order, once admitted (a small body held for it, a large one mostly left unread)."""
    server = start_slow_app(backend_url, key_prefix, max_global=1)
    try:
        holder = open_stream(server.port, "holder")
        body = os.urandom(size)
        with ThreadPoolExecutor(1) as pool:
            upload = pool.submit(
                httpx.post,
                server.base_url + "/upload?user_id=uploader&wait=30",
                content=body,
                timeout=30,
            )
            wait_until(
                lambda: httpx.get(server.base_url + "/stats").json()["waiting"] == 1,
                what="the uploader to wait in line",
            )
            holder.close()
            answer = upload.result(timeout=30)
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"size": size, "sha256": hashlib.sha256(body).hexdigest()}
    finally:
        server.stop()


def test_a_503_for_an_unreachable_store_tells_the_client_nothing_of_the_store(key_prefix):
    """The problem body carried the store's message to every client: its host and port."""
    port = free_port()
    server = start_slow_app(f"redis://:hunter2@127.0.0.1:{port}/0", key_prefix)
    try:
        response = httpx.get(server.base_url + "/stream", params={"user_id": "a"}, timeout=10)
    finally:
        server.stop()
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    assert response.json()["detail"] == (
        "Streams cannot be admitted right now; retry after Retry-After seconds."
    )
    for private in (str(port), "127.0.0.1", "hunter2", "Redis"):
        assert private not in response.text


def test_every_refusal_is_a_stream_lease_rejected_and_keeps_its_own_answer():
    """Rate and token limits were StreamLeaseErrors outside StreamLeaseRejected, so the seed's
    one handler let them through as 500s."""
    refusals = {
        RateLimited("too fast", "per_minute", [], 7): (429, _QUOTA_EXCEEDED),
        BudgetExhausted("spent", "tokens"): (429, _QUOTA_EXCEEDED),
        UserBanned("banned", 60): (403, "about:blank"),
        LineFull("line", "global", 3, 3, 2): (503, _REDUCED_CAPACITY),
        BackendUnavailable("down"): (503, _REDUCED_CAPACITY),
        ManagerClosed("draining"): (503, _REDUCED_CAPACITY),
    }
    for refusal, (status, problem_type) in refusals.items():
        assert isinstance(refusal, StreamLeaseRejected), type(refusal).__name__
        response = refusal.as_response()
        assert response.status_code == status
        assert json.loads(response.body)["type"] == problem_type
    for not_a_refusal in (LeaseLost("lost"), ClientDisconnected("gone")):
        assert not isinstance(not_a_refusal, StreamLeaseRejected)


def test_every_answer_carries_retry_after():
    answers = [
        PoolFull("full", "global", 5, 5, 3),
        BackendError("wrong password"),
        BackendUnavailable("down"),
        ManagerClosed("closed"),
        LeaseLost("lost"),
        ClientDisconnected("gone"),
    ]
    for error in answers:
        response = error.as_response()
        assert int(response.headers["retry-after"]) >= 1, type(error).__name__
