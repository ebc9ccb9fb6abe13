"""Bad input gets a clear error that says how to fix it, and changes nothing."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncIterator

import pytest
from starlette.requests import Request

from fastapi_stream_lease import (
    BackendFailurePolicy,
    BackendUnavailable,
    LeaseConfig,
    Resource,
    StreamLeaseError,
    StreamLeaseManager,
    _core,
    stream_lease_exception_handler,
)

from support.ports import free_port


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"max_per_user": True}, TypeError, "max_per_user must be an int"),
        ({"max_per_user": 1.5}, TypeError, "max_per_user must be an int"),
        ({"max_per_user": "2"}, TypeError, "max_per_user must be an int"),
        ({"max_per_user": -1}, ValueError, "out of range"),
        ({"max_global": -5}, ValueError, "out of range"),
        ({"max_global": 10**30}, ValueError, "too large"),
        ({"lease_seconds": 0}, ValueError, "lease_seconds=0"),
        ({"lease_seconds": 0.01}, ValueError, "out of range"),
        ({"lease_seconds": -3}, ValueError, "out of range"),
        ({"lease_seconds": float("nan")}, ValueError, "finite"),
        ({"lease_seconds": "30"}, TypeError, "number of seconds"),
        ({"lease_seconds": True}, TypeError, "number of seconds"),
        ({"renew_every": 20, "lease_seconds": 30}, ValueError, "at most lease_seconds / 2"),
        ({"redis_timeout": 0}, ValueError, "redis_timeout"),
        ({"key_prefix": "{app}"}, ValueError, "braces"),
        ({"key_prefix": "my app"}, ValueError, "whitespace"),
        ({"key_prefix": ""}, ValueError, "1 to 128 bytes"),
        ({"key_prefix": 7}, TypeError, "key_prefix must be a str"),
        ({"identity_secret": ""}, ValueError, "identity_secret is 0 bytes long"),
        # A short HMAC key was accepted silently, while no key at all warns.
        ({"identity_secret": "s3cret"}, ValueError, "is 6 bytes long: use at least 16 random"),
        ({"identity_secret": b"x" * 15}, ValueError, "is 15 bytes long"),
        ({"identity_secret": 5}, TypeError, "str or bytes"),
        ({"key_prefix": "app\udc80"}, ValueError, "key_prefix is not valid text: .* at index 3"),
        ({"identity_secret": "s\udc80"}, ValueError, "identity_secret is not valid text"),
        ({"retry_after": 0}, ValueError, "retry_after"),
        ({"retry_after_seconds": -1}, ValueError, "retry_after_seconds cannot be negative"),
        ({"acquire_timeout": -1}, ValueError, "acquire_timeout must be a finite number >= 0"),
        ({"wait_timeout": float("inf")}, ValueError, "wait_timeout must be a finite number"),
        # A flag given 1 or "yes" said "'int' object is not an instance of 'bool'", no name.
        ({"global_pool": 1}, TypeError, "global_pool must be a boolean .True or False., got int"),
        ({"include_lease_headers": "yes"}, TypeError, "include_lease_headers must be a boolean"),
    ],
)
def test_bad_config_is_refused_at_construction(kwargs, error, message):
    with pytest.raises(error, match=message):
        LeaseConfig(**kwargs)


DISAGREE = "disagree on what to do when Redis is down: pass one of them"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"fail_open": True, "failure_mode": "closed"},
            f"failure_mode='closed' and fail_open=True {DISAGREE}",
        ),
        (
            {"fail_open": False, "failure_mode": "open"},
            f"failure_mode='open' and fail_open=False {DISAGREE}",
        ),
        (
            {"fail_open": True, "failure_policy": BackendFailurePolicy()},
            f"fail_open=True and failure_policy {DISAGREE}",
        ),
        (
            {"failure_mode": "open", "failure_policy": BackendFailurePolicy()},
            f"failure_mode='open' and failure_policy {DISAGREE}",
        ),
        (
            {"retry_after": 5, "retry_after_seconds": 5},
            "retry_after and retry_after_seconds are one setting .*: pass one of them",
        ),
        (
            {"wait_timeout": 1, "acquire_timeout": 1},
            "wait_timeout and acquire_timeout are one setting .*: pass one of them",
        ),
    ],
)
def test_a_0_6_setting_given_with_ours_must_agree_or_be_left_out(kwargs, message):
    """configuration.md: ``fail_open`` must agree with ``failure_mode`` and ``failure_policy``;
    of ``retry_after``/``retry_after_seconds`` and ``wait_timeout``/``acquire_timeout``, pass
    one of the two."""
    with pytest.raises(ValueError, match=message):
        LeaseConfig(**kwargs)
    agreeing = LeaseConfig(fail_open=True, failure_mode="open")
    assert agreeing.failure_mode == "open"


@pytest.mark.parametrize(
    ("secret", "message"),
    [
        ("s3cret", "STREAM_LEASE_IDENTITY_SECRET is 6 bytes long: use at least 16 random"),
        ("x" * 15, "STREAM_LEASE_IDENTITY_SECRET is 15 bytes long"),
    ],
)
def test_a_short_identity_secret_from_the_environment_is_refused(monkeypatch, secret, message):
    monkeypatch.setenv("STREAM_LEASE_IDENTITY_SECRET", secret)
    with pytest.raises(ValueError, match=message):
        LeaseConfig()
    LeaseConfig(identity_secret="a-given-secret-of-16+-bytes")  # a given one is used instead


def test_an_identity_secret_in_the_environment_that_is_not_text_is_refused(monkeypatch):
    monkeypatch.setitem(os.environb, b"STREAM_LEASE_IDENTITY_SECRET", b"\xff" * 32)
    with pytest.raises(ValueError, match="STREAM_LEASE_IDENTITY_SECRET is not valid UTF-8"):
        LeaseConfig()


def test_config_defaults_and_repr_hide_the_secret():
    config = LeaseConfig(identity_secret="s3cret-of-16-bytes")
    assert (config.lease_seconds, config.max_per_user, config.max_global) == (30.0, 3, 1000)
    assert config.renew_every == 10.0
    assert config.key_prefix == "stream_lease"
    assert "s3cret" not in repr(config)
    assert LeaseConfig(max_per_user=2) == LeaseConfig(max_per_user=2)


@pytest.mark.parametrize(
    ("user_id", "error", "message"),
    [
        ("", ValueError, "user_id is empty"),
        (None, TypeError, "pass a user_id"),
        (7, TypeError, r"got int: pass str\(...\)"),
        (b"alice", TypeError, "user_id must be a str, got bytes"),
        ("x" * 1025, ValueError, "1025 bytes long"),
        ("ok\ud800", ValueError, "user_id is not valid text: it holds a lone surrogate at index 2"),
        ("\udcff", ValueError, "UTF-8 cannot encode"),
    ],
)
async def test_bad_identities_are_refused(make_manager, user_id, error, message):
    manager = make_manager()
    with pytest.raises(error, match=message) as refused:
        await manager.acquire(user_id)
    assert type(refused.value) is error, "a plain TypeError or ValueError, nothing more obscure"
    if user_id is not None:  # None counts the global pool
        with pytest.raises(error, match=message):
            await manager.get_active_count(user_id)
    assert await manager.get_active_count() == 0


@pytest.mark.parametrize("user_id", [b"tok-Zq7Xk9", 12345678987, ["tok-Zq7Xk9"]])
async def test_a_refused_user_id_is_never_echoed(user_id):
    # A user id may be a session token: the error names its type only.
    manager = StreamLeaseManager()
    with pytest.raises(TypeError) as refused:
        await manager.acquire(user_id)
    assert "Zq7Xk9" not in str(refused.value) and "12345678987" not in str(refused.value)
    await manager.aclose()


@pytest.mark.parametrize(
    ("weight", "error"), [(0, ValueError), (-1, ValueError), (True, TypeError), (1.0, TypeError)]
)
async def test_bad_weights_are_refused(make_manager, weight, error):
    manager = make_manager()
    with pytest.raises(error, match="weight"):
        await manager.acquire("alice", weight=weight)


@pytest.mark.parametrize(
    ("renew_interval", "error", "message"),
    [
        (0, ValueError, "renew_interval must be positive and shorter than lease_seconds=30"),
        (30, ValueError, "renew_interval must be positive"),
        ("5", TypeError, "renew_interval must be a number of seconds .int or float., got str"),
        (True, TypeError, "got bool"),
    ],
)
async def test_a_bad_renew_interval_is_refused_and_its_lease_released(
    make_manager, renew_interval, error, message
):
    """Regression: ``renew_interval="5"`` raised "'<' not supported between instances"."""
    manager = make_manager(max_per_user=1)

    async def items() -> AsyncIterator[str]:
        yield "never"

    with pytest.raises(error, match=message):
        async with manager.lease("alice", renew_interval=renew_interval):
            pytest.fail("the block ran")
    lease = await manager.acquire("alice")
    with pytest.raises(error, match=message):
        async for _ in lease.wrap(items(), renew_interval=renew_interval):
            pytest.fail("the stream ran")
    assert lease.released
    await (await manager.acquire("alice")).release()


def test_the_core_acquire_takes_one_checked_value_not_loose_positional_arguments():
    """Ten positional arguments across the binding let the Python side and the core drift
    apart in order unnoticed: the core's acquire takes one AcquireArgs, built by keyword and
    checked when built, and refuses anything else."""
    with pytest.raises(TypeError, match="user_id must be a str"):
        _core.AcquireArgs(user_id=5)
    with pytest.raises(TypeError):
        _core.AcquireArgs("alice")  # type: ignore[misc]
    manager = _core.Manager("memory://", LeaseConfig())
    with pytest.raises(TypeError, match="AcquireArgs"):
        manager.acquire("alice")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://localhost:6379", "unsupported URL"),
        ("localhost:6379", "unsupported URL"),
        ("redis+cluster://", "names no node"),
        ("redis://:hunter2@/x", "cannot use Redis URL"),
        # A password in a parameter the client does not read would be left out of the
        # connection; other clients' URLs write it so.
        ("redis://127.0.0.1:6379/0?password=hunter2", r"Put the password in the URL"),
        ("unix:///run/redis.sock?db=2&password=hunter2", r"unix:///path/to/redis.sock\?pass="),
    ],
)
def test_bad_urls_are_refused_without_leaking_passwords(url, message):
    with pytest.raises(ValueError, match=message) as error:
        StreamLeaseManager(url=url)
    assert "hunter2" not in str(error.value)


# Passwords may hold URL delimiters unencoded: the URL then parses differently, or not at all.
@pytest.mark.parametrize(
    "url",
    [
        "redis://:Zq7/Xk9@127.0.0.1:6390/0",
        "redis://app:Zq7?Xk9@127.0.0.1:6390/0",
        "redis://app:Zq7@Xk9:W/q?@127.0.0.1:6390/0",
        "rediss+cluster://:Zq7?Xk9@127.0.0.1:1,127.0.0.1:2",
        "http://app:Zq7/Xk9@127.0.0.1",
    ],
)
def test_passwords_holding_url_delimiters_never_reach_an_error(url):
    with pytest.raises(ValueError, match="URL") as error:
        StreamLeaseManager(url=url)
    assert "Zq7" not in str(error.value) and "Xk9" not in str(error.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "redis+sentinel://app:Zq7/Xk9@127.0.0.1:1/master",
            "redis+sentinel://app:***@127.0.0.1:1/master",
        ),
        ("redis://app:Zq7%2FXk9@127.0.0.1:6390/0", "redis://app:***@127.0.0.1:6390/0"),
    ],
)
def test_passwords_holding_url_delimiters_never_reach_the_backend_name(url, shown):
    assert StreamLeaseManager(url=url).backend == shown


def test_wrong_arguments_to_the_manager():
    with pytest.raises(TypeError, match="either redis=<client> or url"):
        StreamLeaseManager(redis=object(), url="memory://")
    with pytest.raises(TypeError, match=r"must be a redis\.asyncio\.Redis"):
        StreamLeaseManager(redis=object())
    with pytest.raises(TypeError, match="config must be a LeaseConfig"):
        StreamLeaseManager(config={"max_per_user": 2})  # type: ignore[arg-type]


async def test_an_unreachable_redis_fails_fast_with_a_clear_error(caplog):
    manager = StreamLeaseManager(
        url=f"redis://:hunter2@127.0.0.1:{free_port()}/0", config=LeaseConfig(redis_timeout=0.5)
    )
    started = time.monotonic()
    with pytest.raises(BackendUnavailable, match="cannot reach Redis") as error:
        await manager.acquire("alice")
    assert time.monotonic() - started < 5, "no seconds of hidden retries"
    assert "hunter2" not in str(error.value)
    assert isinstance(error.value, StreamLeaseError)
    response = error.value.as_response()
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    assert b"127.0.0.1" not in response.body, "the store's address is for the log, not clients"
    with caplog.at_level(logging.WARNING, logger="fastapi_stream_lease"):
        await stream_lease_exception_handler(Request({"type": "http"}), error.value)
    assert "cannot reach Redis at" in caplog.text and "hunter2" not in caplog.text
    await manager.aclose()


def test_clients_that_cannot_be_followed_are_refused_clearly():
    import redis.asyncio as redis_asyncio

    with pytest.raises(TypeError, match="skip certificate checks"):
        insecure = redis_asyncio.Redis(host="localhost", ssl=True, ssl_cert_reqs="none")
        StreamLeaseManager(redis=insecure)
    with pytest.raises(ValueError, match="no master name"):
        StreamLeaseManager(url="redis+sentinel://127.0.0.1:26379")


def test_ipv6_clients_keep_their_brackets():
    import redis.asyncio as redis_asyncio

    manager = StreamLeaseManager(redis=redis_asyncio.Redis(host="::1", port=7001, db=3))
    assert manager.backend == "redis://[::1]:7001/3"


def test_max_global_needs_the_global_pool():
    assert LeaseConfig(global_pool=False).max_global == 0
    with pytest.raises(ValueError, match="max_global needs the global pool"):
        LeaseConfig(global_pool=False, max_global=10)


def test_waiting_for_ones_own_quota_needs_the_global_pool():
    # The lines live in the global pool's hash tag; a user's own tag (global_pool=False) has
    # none: say so instead of never waiting.
    with pytest.raises(ValueError, match="wait_for_own_quota needs the global pool"):
        LeaseConfig(global_pool=False, wait_for_own_quota=True)
    assert LeaseConfig(global_pool=False, wait_timeout=5).wait_timeout == 5


async def test_a_resource_cannot_pose_as_the_users_own_quota():
    # Its refusals would read as the user's own quota (429, never waiting): the name is reserved.
    manager = StreamLeaseManager(url="memory://")
    with pytest.raises(ValueError, match="reserved for each user's own quota"):
        await manager.acquire(None, resources=[Resource(1, "per_user")])
    assert manager.stats()["held"] == 0
    await manager.aclose()


async def test_a_resource_name_that_is_not_text_is_refused_clearly():
    manager = StreamLeaseManager(url="memory://")
    with pytest.raises(ValueError, match=r"resource name is not valid text: .* at index 2"):
        await manager.acquire("alice", resources=[Resource(1, "db\udc80")])
    assert manager.stats()["held"] == 0
    await manager.aclose()
