"""Fixtures: real Redis servers the tests start themselves, and managers on each backend."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager

import pytest
import redis as redis_py

from fastapi_stream_lease import LeaseConfig, StreamLeaseManager

from support.loops import LOOP_FACTORIES
from support.redis_servers import RedisCluster, RedisServer, server_binary, server_version

# The manager reads its URL from these when given none: a developer's shell must not point the
# tests' managers at a Redis of theirs (the tests that need them set them).
for _variable in ("STREAM_LEASE_URL", "REDIS_URL"):
    os.environ.pop(_variable, None)


def pytest_report_header() -> str:
    return f"server: {server_version()} ({server_binary()})"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--server-only",
        action="store_true",
        help="leave out the embedded store's cases (a second server's run: `make test` runs "
        "the server tests again on Valkey, and the embedded store's cases are the first run's)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With ``--server-only``, deselects the cases parametrized on the embedded store
    (``"memory"``): they do not touch the server, so a second server's run would repeat them."""
    if not config.getoption("--server-only"):
        return
    embedded, kept = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        (embedded if "memory" in params.values() else kept).append(item)
    if embedded:
        config.hook.pytest_deselected(items=embedded)
        items[:] = kept


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    """The loops a test runs on: each of ``LOOP_FACTORIES`` for the tests marked
    ``support.loops.on_every_loop``, asyncio's default loop for the others."""
    marker = item.get_closest_marker("asyncio")
    if marker is not None and "loop_factories" in marker.kwargs:
        return LOOP_FACTORIES
    return {"asyncio": asyncio.new_event_loop}


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.cleanup()


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A server of the test's own, for tests that kill, pause or flush it."""
    server = RedisServer().start()
    yield server
    server.cleanup()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster]:
    cluster = RedisCluster().start()
    yield cluster
    cluster.cleanup()


@pytest.fixture
def key_prefix() -> str:
    """A prefix of the test's own, so tests sharing one server never see each other's keys."""
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture(params=["memory", "redis"])
def backend_url(request: pytest.FixtureRequest) -> str:
    """Each behavioural test runs on the embedded backend and on a real Redis."""
    if request.param == "memory":
        return "memory://"
    return request.getfixturevalue("redis_server").url


ManagerFactory = Callable[..., StreamLeaseManager]


@asynccontextmanager
async def managers_on(url: str, key_prefix: str) -> AsyncIterator[ManagerFactory]:
    """A factory of managers on ``url``, built from ``LeaseConfig`` keyword arguments (the test's
    key prefix unless given); every one still open is closed when the block ends."""
    managers: list[StreamLeaseManager] = []

    def make(**config: object) -> StreamLeaseManager:
        config.setdefault("key_prefix", key_prefix)
        manager = StreamLeaseManager(url=url, config=LeaseConfig(**config))
        managers.append(manager)
        return manager

    yield make
    for manager in managers:
        if not manager.stats()["closed"]:
            await manager.aclose()


@pytest.fixture
async def make_manager(backend_url: str, key_prefix: str) -> AsyncIterator[ManagerFactory]:
    """Builds managers on the test's backend (each behavioural test runs on both)."""
    async with managers_on(backend_url, key_prefix) as make:
        yield make


@pytest.fixture
async def make_redis_manager(
    redis_server: RedisServer, key_prefix: str
) -> AsyncIterator[ManagerFactory]:
    """Builds managers on the Redis server the tests share."""
    async with managers_on(redis_server.url, key_prefix) as make:
        yield make


@pytest.fixture
async def make_own_redis_manager(
    own_redis: RedisServer, key_prefix: str
) -> AsyncIterator[ManagerFactory]:
    """Builds managers on the test's own Redis server, fresh and free to kill, pause or flush."""
    async with managers_on(own_redis.url, key_prefix) as make:
        yield make


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis_py.Redis]:
    client = redis_py.Redis.from_url(redis_server.url)
    yield client
    client.close()
