"""Fixtures: real Redis servers the tests start themselves, and managers on each backend."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
import redis as redis_py

from fastapi_stream_lease import LeaseConfig, StreamLeaseManager

from support.redis_servers import RedisCluster, RedisServer


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


@pytest.fixture
async def make_manager(backend_url: str, key_prefix: str) -> AsyncIterator[ManagerFactory]:
    """Builds managers on the test's backend; every one is closed at the end of the test."""
    managers: list[StreamLeaseManager] = []

    def make(url: str | None = None, **config: object) -> StreamLeaseManager:
        config.setdefault("key_prefix", key_prefix)
        manager = StreamLeaseManager(url=url or backend_url, config=LeaseConfig(**config))
        managers.append(manager)
        return manager

    yield make
    for manager in managers:
        if not manager.stats()["closed"]:
            await manager.aclose()


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis_py.Redis]:
    client = redis_py.Redis.from_url(redis_server.url)
    yield client
    client.close()
