"""A request's objects are freed when it ends, by reference counting, in every form the library
serves: none is left in a reference cycle for the collector, which would keep each request's
scope (and everything it reaches) alive until a collection and make the collections dearer.

Regression: ``StreamEndMiddleware`` kept each request in a cycle: the scope held its guard, the
guard held the server's ``send``, and an outer middleware's ``send`` (``RateLimitHeaders``'s, or
an app's own) is a closure over the scope. Through a real uvicorn and a real client; the app
turns the automatic collection off and names what a collection finds (tests/apps/request_cycles.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.sync.client import connect

from support.app_server import AppServer

REQUESTS = 20
FORMS = ["/plain", "/limited", "/behind-middleware", "/sse", "/wrapped", "/ws"]


@pytest.fixture(scope="module")
def server(redis_server, tmp_path_factory) -> Iterator[AppServer]:
    log: Path = tmp_path_factory.mktemp("cycles") / "uvicorn.log"
    prefix = f"cycles{uuid.uuid4().hex[:8]}"
    started = AppServer("request_cycles", redis_server.url, log, prefix, "cycles-secret-0123456789")
    yield started
    started.stop()


@pytest.mark.parametrize("path", FORMS)
def test_a_requests_objects_are_freed_when_it_ends(server: AppServer, path: str) -> None:
    with httpx.Client(base_url=server.base_url, timeout=10) as client:
        client.get("/cycles")  # what earlier requests (and the server's start) left
        for n in range(REQUESTS):
            if path == "/ws":
                url = server.base_url.replace("http", "ws", 1) + f"/ws?user=u{n}"
                with connect(url) as websocket:
                    assert websocket.recv() == "Hello world"
            else:
                answer = client.get(path, params={"user": f"u{n}"})
                assert answer.status_code == 200, answer.text
        assert client.get("/cycles").json() == {}
