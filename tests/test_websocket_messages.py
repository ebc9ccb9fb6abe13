"""A guarded WebSocket counts every inbound message against its message rate, whichever way the
endpoint reads it, through a real uvicorn and a real WebSocket client."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from support.apps import APPS_DIR
from support.uvicorn_server import Uvicorn
from support.waiting import wait_until

LIMIT = 5  # tests/apps/websocket_readers.py: 5 messages a minute per reader

# Each reader, the message it reads, and how the endpoint sees the refused one.
READERS = {
    "receive_text": ("hi", "WebSocketDisconnect 1008"),
    "receive_bytes": (b"hi", "WebSocketDisconnect 1008"),
    "receive_json": ('"hi"', "WebSocketDisconnect 1008"),
    "iter_text": ("hi", "loop ended"),
    "iter_bytes": (b"hi", "loop ended"),
    "iter_json": ('"hi"', "loop ended"),
    "receive": ("hi", "websocket.disconnect 1008"),
}


@pytest.fixture(scope="module", params=["memory", "redis"])
def server(request: pytest.FixtureRequest) -> Iterator[Uvicorn]:
    """One app per backend; each reader counts under an identity of its own."""
    url = "memory://" if request.param == "memory" else request.getfixturevalue("redis_server").url
    env = {"STREAM_LEASE_URL": url, "STREAM_LEASE_PREFIX": f"t{uuid.uuid4().hex[:12]}"}
    app = Uvicorn("websocket_readers:app", APPS_DIR, env)
    yield app
    app.stop()


@pytest.mark.parametrize("reader", READERS)
def test_no_reader_gets_past_the_message_rate(server: Uvicorn, reader: str) -> None:
    """Messages read through ``iter_text()``, ``iter_json()``, ``iter_bytes()`` or ``receive()``
    are counted as those read through ``receive_text()`` are: the one over the limit closes the
    socket with 1008 and reaches the endpoint as the client's disconnect."""
    message, seen_by_the_endpoint = READERS[reader]
    url = server.base_url.replace("http://", "ws://") + f"/ws/{reader}"
    with connect(url) as websocket:
        for _ in range(LIMIT):
            websocket.send(message)
            assert websocket.recv(timeout=10) == "echo"
        websocket.send(message)
        with pytest.raises(ConnectionClosed) as closed:
            websocket.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008

    def how_it_ended() -> str | None:
        return httpx.get(f"{server.base_url}/ended/{reader}", timeout=10).json()

    wait_until(lambda: how_it_ended() == seen_by_the_endpoint, what="the endpoint to end")


def test_a_client_leaving_is_not_counted_as_a_message(server: Uvicorn) -> None:
    """Only the messages a client sends count: its disconnect, which reaches ``receive()`` as
    a message too, takes nothing from the rate."""
    url = server.base_url.replace("http://", "ws://") + "/ws/receive?as=leaver"
    with connect(url) as websocket:
        for _ in range(LIMIT - 1):
            websocket.send("hi")
            assert websocket.recv(timeout=10) == "echo"

    def ended() -> bool:
        return httpx.get(f"{server.base_url}/ended/receive", timeout=10).json() == (
            "websocket.disconnect 1000"
        )

    wait_until(ended, what="the endpoint to see the client leave")
    with connect(url) as websocket:
        websocket.send("hi")  # the last message of the minute's allowance
        assert websocket.recv(timeout=10) == "echo"
        websocket.send("hi")
        with pytest.raises(ConnectionClosed) as closed:
            websocket.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
