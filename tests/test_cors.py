"""The CORS recipe (docs/recipes/cors.md) as written, under a real uvicorn, with a client that
sends an Origin as a browser does: the refusals carry the CORS headers and expose the quota
headers, and preflight requests count against nothing."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient

from fastapi_stream_lease import LeaseConfig, StreamLeaseManager

from support.redis_servers import RedisServer
from support.uvicorn_server import Uvicorn

RECIPE = Path(__file__).resolve().parent.parent / "docs" / "recipes" / "cors.md"
ORIGIN = "https://chat.example.com"
PREFIX = "cors-recipe"
EXPOSED = {"ratelimit", "ratelimit-policy", "retry-after"}


@pytest.fixture(scope="module")
def recipe_server(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[Uvicorn]:
    (code,) = re.findall(r"```python\n(.*?)```", RECIPE.read_text(), re.S)
    app_dir = tmp_path_factory.mktemp("cors")
    (app_dir / "cors_recipe.py").write_text(code)
    server = Uvicorn(
        "cors_recipe:app", app_dir, {"REDIS_URL": redis_server.url, "STREAM_LEASE_PREFIX": PREFIX}
    )
    yield server
    server.stop()


def exposed(response: httpx.Response) -> set[str]:
    names = response.headers["access-control-expose-headers"].split(",")
    return {name.strip().lower() for name in names}


def test_a_rate_limited_browser_sees_the_429_and_its_headers(recipe_server):
    with httpx.Client(base_url=recipe_server.base_url, timeout=10) as client:
        preflight = client.options("/api/chat/stream", headers={
            "Origin": ORIGIN, "Access-Control-Request-Method": "GET",
            "Access-Control-Request-Headers": "x-user",
        })
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == ORIGIN
        headers = {"Origin": ORIGIN, "X-User": "rate-user"}
        for _ in range(10):  # the preflight took none of the 10 starts
            assert client.get("/api/chat/stream", headers=headers).status_code == 200
        refused = client.get("/api/chat/stream", headers=headers)
    assert refused.status_code == 429
    assert refused.headers["access-control-allow-origin"] == ORIGIN
    assert exposed(refused) >= EXPOSED
    assert refused.headers["ratelimit-policy"] == '"stream_starts_per_minute";q=10;w=60'
    assert refused.headers["ratelimit"].startswith('"stream_starts_per_minute";r=0;t=')
    assert 1 <= int(refused.headers["retry-after"]) <= 66  # a tenth of a window late at most


async def test_a_browser_over_its_stream_cap_sees_the_429_and_its_headers(
    recipe_server, redis_server
):
    """The cap's refusal comes from the endpoint, through the exception handler: inside the
    CORS middleware too."""
    other_worker = StreamLeaseManager(
        url=redis_server.url,
        config=LeaseConfig(key_prefix=PREFIX, identity_secret="a-dev-secret-of-16+-bytes"),
    )
    held = [await other_worker.acquire("cap-user") for _ in range(2)]
    try:
        async with httpx.AsyncClient(base_url=recipe_server.base_url, timeout=10) as client:
            refused = await client.get(
                "/api/chat/stream", headers={"Origin": ORIGIN, "X-User": "cap-user"}
            )
    finally:
        for lease in held:
            await lease.release()
        await other_worker.aclose()
    assert refused.status_code == 429 and refused.json()["limit"] == "per_user"
    assert refused.headers["access-control-allow-origin"] == ORIGIN
    assert exposed(refused) >= EXPOSED
    assert "retry-after" in refused.headers and "ratelimit-policy" in refused.headers


def test_with_the_middleware_in_the_other_order_the_429_leaves_without_cors_headers(
    monkeypatch,
):
    """The recipe's warning: ``CORSMiddleware`` added before the limiter sits inside it, so the
    limiter's 429 reaches the browser without CORS headers (its page sees a network error)."""
    (code,) = re.findall(r"```python\n(.*?)```", RECIPE.read_text(), re.S)
    limiter, cors = re.findall(r"\n(?:#[^\n]*\n)*app\.add_middleware\(\n.*?\n\)\n", code, re.S)
    assert "RateLimitMiddleware" in limiter and "CORSMiddleware" in cors
    reversed_order = code.replace(limiter, "\n").replace(cors, cors + limiter)
    added = [reversed_order.index(f"(\n    {name}Middleware,") for name in ("CORS", "RateLimit")]
    assert added == sorted(added), "CORSMiddleware is added first now"
    monkeypatch.setenv("REDIS_URL", "memory://")
    names: dict[str, object] = {}
    exec(compile(reversed_order, "cors_recipe_reversed", "exec"), names)
    headers = {"Origin": ORIGIN, "X-User": "rate-user"}
    with TestClient(names["app"]) as client:
        admitted = [client.get("/api/chat/stream", headers=headers) for _ in range(10)]
        refused = client.get("/api/chat/stream", headers=headers)
    assert all(answer.headers["access-control-allow-origin"] == ORIGIN for answer in admitted)
    assert refused.status_code == 429 and "retry-after" in refused.headers
    assert "access-control-allow-origin" not in refused.headers
