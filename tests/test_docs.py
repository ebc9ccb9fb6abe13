"""The README's code and the demo run as written."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

ROOT = Path(__file__).resolve().parent.parent
BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def load_block(index: int, redis_url: str, tmp_path: Path):
    """Runs README block ``index`` as a module, pointed at the test's Redis."""
    code = BLOCKS[index].replace("redis://localhost:6379", redis_url)
    path = tmp_path / f"readme_block_{index}.py"
    path.write_text(code)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_has_the_blocks_these_tests_expect():
    assert len(BLOCKS) == 10
    assert "lease.wrap(token_generator())" in BLOCKS[0]
    assert "websocket_chat" in BLOCKS[1]


def test_readme_quickstart(redis_server, tmp_path):
    module = load_block(0, redis_server.url, tmp_path)
    with TestClient(module.app) as client:
        response = client.get("/api/chat/stream")
        assert response.status_code == 200
        assert "data: streamed!" in response.text


def test_readme_limiter(redis_server, tmp_path):
    module = load_block(3, redis_server.url, tmp_path)
    with TestClient(module.app) as client:
        assert client.get("/messages").json() == []
        assert client.get("/both").json() == "ok"


def test_readme_websocket(redis_server, tmp_path):
    module = load_block(1, redis_server.url, tmp_path)
    with TestClient(module.app) as client:
        # The example loops until the client leaves, which Starlette reports by raising.
        with pytest.raises(WebSocketDisconnect), client.websocket_connect("/ws/chat/u1") as ws:
            ws.send_text("hi")
            assert ws.receive_text() == "Echo: hi"


@pytest.mark.parametrize("index", [2, 4, 5, 6, 7, 8, 9])
def test_readme_snippets_run(redis_server, tmp_path, index):
    load_block(index, redis_server.url, tmp_path)


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_demo_tells_the_story_and_exits_0(redis_server, backend):
    env = {"REDIS_URL": redis_server.url} if backend == "redis" else {}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py")],
        capture_output=True, text=True, timeout=120,
        env={**{k: v for k, v in os.environ.items() if k != "REDIS_URL"}, **env},
    )
    assert done.returncode == 0, done.stderr
    assert "stream 3: HTTP 429, Retry-After:" in done.stdout
    assert "stream 3: HTTP 200" in done.stdout
    assert "demo done" in done.stdout
