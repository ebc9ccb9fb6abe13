"""Settings from the environment: a manager given no ``url=`` nor ``redis=`` runs where
``$STREAM_LEASE_URL`` says, else ``$REDIS_URL`` (said once in the log), else on the embedded
store (each ``memory://`` manager's own, ``memory://<name>`` shared by name); what the code
passes wins."""

from __future__ import annotations

import logging

import pytest

from fastapi_stream_lease import LeaseConfig, PoolFull, StreamLeaseManager, _environment


@pytest.fixture
def environment(monkeypatch):
    """The variables unset, and the once-per-process log line not said yet."""
    for variable in ("STREAM_LEASE_URL", "REDIS_URL"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(_environment, "_fallback_said", False)
    return monkeypatch


def password_url(server) -> str:
    return server.url.replace("redis://", "redis://:secret-pw@")


async def test_stream_lease_url_is_used(environment, redis_server, key_prefix):
    environment.setenv("STREAM_LEASE_URL", redis_server.url)
    environment.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    manager = StreamLeaseManager()
    assert manager.backend == redis_server.url
    lease = await manager.acquire("u")
    await lease.release()
    await manager.aclose()


async def test_redis_url_is_used_without_stream_lease_url_and_said_once(
    environment, redis_server, caplog
):
    """``REDIS_URL`` set and ``StreamLeaseManager(config=...)`` ran on ``memory://``, silently:
    every single-worker pod counted its own caps."""
    environment.setenv("REDIS_URL", password_url(redis_server))
    with caplog.at_level(logging.INFO, logger="fastapi_stream_lease"):
        first, second = StreamLeaseManager(), StreamLeaseManager()
    assert first.backend == second.backend == password_url(redis_server).replace("secret-pw", "***")
    said = [r.getMessage() for r in caplog.records if "REDIS_URL" in r.getMessage()]
    assert len(said) == 1 and "STREAM_LEASE_URL is unset" in said[0]
    assert "secret-pw" not in caplog.text


@pytest.mark.parametrize("given", ["url", "redis"])
def test_what_the_code_passes_wins(environment, redis_server, given):
    environment.setenv("STREAM_LEASE_URL", "redis://127.0.0.1:1/0")
    environment.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    if given == "url":
        manager = StreamLeaseManager(url="memory://")
        assert manager.backend.startswith("memory://")
    else:
        import redis.asyncio as redis_asyncio

        manager = StreamLeaseManager(redis=redis_asyncio.Redis.from_url(redis_server.url))
        assert manager.backend == redis_server.url


@pytest.mark.parametrize("variable", ["STREAM_LEASE_URL", "REDIS_URL"])
def test_a_bad_url_in_the_environment_names_its_variable(environment, variable):
    environment.setenv(variable, "http://:hunter2@example.com")
    with pytest.raises(
        ValueError, match=rf"^\${variable}: unsupported URL .*fix or unset {variable}"
    ):
        StreamLeaseManager()
    # The password stays out of the message, as for a URL passed in code.
    with pytest.raises(ValueError) as refused:
        StreamLeaseManager()
    assert "hunter2" not in str(refused.value)


def test_neither_set_or_empty_is_the_embedded_store(environment):
    assert StreamLeaseManager().backend.startswith("memory://")
    environment.setenv("STREAM_LEASE_URL", " ")
    environment.setenv("REDIS_URL", "")
    assert StreamLeaseManager().backend.startswith("memory://")


async def test_a_named_embedded_store_is_shared_by_the_managers_that_name_it(environment):
    """As the testing guide says: each ``memory://`` manager has a store of its own;
    ``memory://<name>`` is the process's store of that name, shared by every manager naming it."""
    config = LeaseConfig(max_per_user=1)
    first, second = (StreamLeaseManager(url="memory://team", config=config) for _ in range(2))
    apart = StreamLeaseManager(url="memory://", config=config)
    held = await first.acquire("alice")
    with pytest.raises(PoolFull):
        await second.acquire("alice")
    other = await apart.acquire("alice")
    await held.release()
    await other.release()
    for manager in (first, second, apart):
        await manager.aclose()
