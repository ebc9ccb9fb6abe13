"""The fixtures 0.6.3's test suite asks of its conftest, put in its place when that suite runs
against this package (tests/test_suite_0_6.py): the same names and settings, with every
client on the real Redis server at ``$REDIS_URL`` (the suite's own conftest gives it an
in-memory imitation of Redis)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as redis

from fastapi_stream_lease import LeaseConfig, StreamLeaseManager


@pytest.fixture
async def fake_redis() -> AsyncIterator[redis.Redis]:
    """A client of the real server, emptied after each test."""
    client = redis.from_url(os.environ["REDIS_URL"])
    try:
        yield client
    finally:
        await client.flushall()
        await client.aclose()


@pytest.fixture
def lease_config() -> LeaseConfig:
    return LeaseConfig(lease_seconds=2.0, max_per_user=2, max_global=4, key_prefix="test_lease")


@pytest.fixture
def lease_manager(fake_redis: redis.Redis, lease_config: LeaseConfig) -> StreamLeaseManager:
    return StreamLeaseManager(redis=fake_redis, config=lease_config)
