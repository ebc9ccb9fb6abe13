"""The API of PyPI's pure-Python ``fastapi-stream-lease`` 0.6.3, drop-in: the Python code of its
README (as its wheel carries it, fetched from the package index at test time) runs
unchanged, each block with the names that README leaves to its reader (``client``, ``manager``,
``websocket``, ...); and the 0.6 options and hooks do what docs/recipes/migrating.md says."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import importlib.metadata
import inspect
import logging
import math
import re
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import prometheus_client
import pytest
import redis.asyncio as redis_asyncio
from fastapi import FastAPI, WebSocket
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

import fastapi_stream_lease
from fastapi_stream_lease import (
    CircuitState,
    LeaseConfig,
    LeaseRevoked,
    PoolFull,
    ProtectedStreamingResponse,
    RateLimit,
    Resource,
    StreamLeaseManager,
    StreamLeaseUnavailable,
)

from support.ports import free_port
from support.published import readme_of
from support.waiting import eventually

ROOT = Path(__file__).resolve().parent.parent
README = readme_of("fastapi-stream-lease", "0.6.3")
# Every Python block, dedented (some sit in list items).
BLOCKS = [
    textwrap.dedent(code)
    for code in re.findall(r"^( *)```python\n(.*?)^\1```", README, re.S | re.M)
    for code in [code[1]]
]


def block_with(marker: str) -> str:
    (code,) = [code for code in BLOCKS if marker in code]
    return code


FASTAPI_APP = block_with("app = FastAPI(lifespan=lifespan)")
WEBSOCKET = block_with("websocket.receive_text()")
FAILURE_POLICY = block_with("policy = BackendFailurePolicy(")
CIRCUIT_STATE = block_with("manager.circuit_state == CircuitState.OPEN")
PROMETHEUS = block_with("PrometheusMetrics()")
OPENTELEMETRY = block_with("OpenTelemetryMetrics()")
HOOKS = block_with("on_acquired=lambda lease")
(CLOSE,) = [code for code in BLOCKS if code == "await manager.close(drain=True, timeout=5.0)\n"]
VERIFY = block_with("# Logs a warning on drift")
POOL = block_with("redis.ConnectionPool.from_url")
FAKEREDIS = block_with("from fakeredis.aioredis import FakeRedis")


def test_every_python_block_of_the_readme_is_run_here():
    ran = {
        FASTAPI_APP, WEBSOCKET, FAILURE_POLICY, CIRCUIT_STATE, PROMETHEUS, OPENTELEMETRY, HOOKS,
        CLOSE, VERIFY, POOL, FAKEREDIS,
    }  # fmt: skip
    assert ran == set(BLOCKS)


def on(url: str, code: str) -> str:
    """``code`` pointed at the test's Redis instead of port 6379."""
    return code.replace("redis://localhost:6379", url.removesuffix("/0"))


async def run(code: str, names: dict[str, Any]) -> dict[str, Any]:
    """Runs a block as the README shows it (top-level ``await`` and ``async with`` included)
    with ``names`` defined; returns its namespace."""
    compiled = compile(code, "<0.6.3 README>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    outcome = eval(compiled, names)
    if inspect.isawaitable(outcome):
        await outcome
    return names


def reader_names(**more: Any) -> dict[str, Any]:
    """What a reader of the README has in scope: the package's exports, a logger, and more."""
    names: dict[str, Any] = {name: getattr(fastapi_stream_lease, name) for name in
                             fastapi_stream_lease.__all__}  # fmt: skip
    return {**names, "logger": logging.getLogger("readme"), **more}


def test_the_fastapi_integration_runs_unchanged(redis_server, tmp_path):
    path = tmp_path / "readme_0_6_app.py"
    path.write_text(on(redis_server.url, FASTAPI_APP))
    sys.path.insert(0, str(tmp_path))
    try:
        module = __import__(path.stem)
        with TestClient(module.app) as client:  # the lifespan verifies, then closes
            response = client.get("/stream")
            assert response.status_code == 200
            assert response.text == "data: token or event\n\n"
            assert response.headers["content-type"].startswith("text/event-stream")
        assert module.manager.is_closing
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(path.stem, None)


def test_the_websocket_block_holds_a_lease_for_the_session():
    manager = StreamLeaseManager(config=LeaseConfig(max_per_user=1))
    app = FastAPI()

    @app.websocket("/ws")
    async def session(websocket: WebSocket) -> None:
        await websocket.accept()
        await run(WEBSOCKET, reader_names(manager=manager, user_id="u1", websocket=websocket))

    with TestClient(app) as client:
        # The block loops until the client leaves, which Starlette reports by raising.
        with pytest.raises(WebSocketDisconnect), client.websocket_connect("/ws") as websocket:
            websocket.send_text("hi")
            assert websocket.receive_text() == "hi"
            assert manager.stats()["held"] == 1
    assert manager.stats()["held"] == 0


async def test_the_failure_policy_and_circuit_state_blocks(redis_server):
    client = redis_asyncio.from_url(redis_server.url)
    names = await run(FAILURE_POLICY, reader_names(client=client))
    manager = names["manager"]
    assert manager.config.failure_mode == "closed" and not manager.config.fail_open
    lease = await manager.acquire("u1")
    assert manager.circuit_state == CircuitState.CLOSED
    await run(CIRCUIT_STATE, names)
    await lease.release()
    await manager.aclose()
    await client.aclose()


@pytest.mark.parametrize("block", [PROMETHEUS, OPENTELEMETRY], ids=["prometheus", "otel"])
async def test_the_telemetry_adapters_give_the_manager_its_providers(redis_server, block):
    client = redis_asyncio.from_url(redis_server.url)
    names = await run(block, reader_names(client=client, config=LeaseConfig()))
    manager = names["manager"]
    assert manager.metrics is names["metrics"]
    lease = await manager.acquire("u1")
    await lease.release()
    if block is PROMETHEUS:
        exported = prometheus_client.generate_latest(names["metrics"].registry).decode()
        acquired = r'^fastapi_stream_lease_requests_total\{[^}]*result="acquired"\} 1\.0$'
        assert re.search(acquired, exported, re.M)
    await manager.aclose()
    await client.aclose()


class Recorder:
    """A ``prometheus_client`` metric's calls, as the README's hooks make them."""

    def __init__(self) -> None:
        self.value = 0
        self.reasons: list[str] = []

    def inc(self) -> None:
        self.value += 1

    def dec(self) -> None:
        self.value -= 1

    def labels(self, reason: str) -> Recorder:
        self.reasons.append(reason)
        return self


async def test_the_lifecycle_hooks_block_hears_every_event(backend_url, key_prefix):
    recorders = {
        name: Recorder() for name in
        ("PROMETHEUS_ACTIVE", "PROMETHEUS_REJECTED", "PROMETHEUS_LOST", "PROMETHEUS_BACKEND_ERRORS")
    }  # fmt: skip
    config = (await run(HOOKS, reader_names(**recorders)))["config"]
    active, rejected, lost = (recorders[f"PROMETHEUS_{n}"] for n in ("ACTIVE", "REJECTED", "LOST"))
    manager = StreamLeaseManager(url=backend_url, config=config)
    leases = [await manager.acquire(f"{key_prefix}-u1") for _ in range(3)]
    await eventually(lambda: active.value == 3, what="on_acquired three times")
    with pytest.raises(fastapi_stream_lease.PoolFull):
        await manager.acquire(f"{key_prefix}-u1")
    await eventually(lambda: rejected.reasons == ["user_limit"], what="on_rejected")
    for lease in leases:
        await lease.release()
    await eventually(lambda: active.value == 0, what="on_released three times")

    with pytest.raises(LeaseRevoked):
        async with manager.lease(f"{key_prefix}-u2"):
            await manager.revoke(f"{key_prefix}-u2")
            await asyncio.sleep(30)  # ended by the revocation
    await eventually(lambda: lost.reasons == ["revoked"], what="on_lost")
    await manager.aclose()

    unreachable = StreamLeaseManager(url=f"redis://127.0.0.1:{free_port()}/0", config=config)
    with pytest.raises(StreamLeaseUnavailable):
        await unreachable.acquire("u3")
    backend_errors = recorders["PROMETHEUS_BACKEND_ERRORS"]
    await eventually(lambda: backend_errors.value == 1, what="on_backend_error")
    assert rejected.reasons == ["user_limit"], "a Redis failure goes to on_backend_error alone"


async def test_a_slow_hook_never_holds_up_a_release(make_manager):
    """Hooks run off the hot path: a release returns while its on_released hook still runs."""
    gate = threading.Event()
    heard: list[str] = []

    def slow(lease: object, reason: str) -> None:
        gate.wait(30)
        heard.append(reason)

    manager = make_manager(on_released=slow)
    lease = await manager.acquire("u1")
    assert await lease.release() is True  # returned with the hook blocked
    assert await manager.get_active_count("u1") == 0
    gate.set()
    await eventually(lambda: heard == ["manual"], what="the hook to finish")


async def test_hook_events_past_hook_queue_size_are_dropped_with_a_warning(make_manager, caplog):
    started, gate = threading.Event(), threading.Event()
    heard: list[str] = []

    def slow(lease: object) -> None:
        started.set()
        gate.wait(30)
        heard.append("acquired")

    manager = make_manager(on_acquired=slow, hook_queue_size=1)
    leases = [await manager.acquire("u0")]
    await eventually(started.is_set, what="the first hook to run")  # and block
    leases += [await manager.acquire(f"u{i}") for i in (1, 2)]
    # The second waits in the queue, the third finds it full.
    assert "lifecycle hook queue full (hook_queue_size=1): 1 event(s) dropped" in caplog.text
    gate.set()
    await eventually(lambda: heard == ["acquired", "acquired"], what="the two queued hooks")
    for lease in leases:
        await lease.release()


async def test_a_0_6_on_lost_callable_ends_the_stream_and_is_called(make_manager):
    heard: list[tuple[str, str]] = []
    manager = make_manager(
        on_lost=lambda lease, reason: heard.append((lease.lease_id, reason)),
        on_released=lambda lease, reason: heard.append(("released", reason)),
    )
    assert callable(manager.config.on_lost)

    async def endless():
        while True:
            yield "data: tick\n\n"
            await asyncio.sleep(0.01)

    response = await manager.stream("u1", endless())
    body = response.body_iterator
    assert await anext(body) == "data: tick\n\n"
    (lease,) = manager.active_leases
    await manager.revoke("u1")
    with pytest.raises(LeaseRevoked):
        while True:
            await anext(body)
    await eventually(
        lambda: heard == [(lease.lease_id, "revoked"), ("released", "lost")],
        what="on_lost, then on_released",
    )
    assert manager.active_leases == frozenset()


async def test_the_close_and_verify_blocks(redis_server):
    client = redis_asyncio.from_url(redis_server.url)
    names = reader_names(manager=StreamLeaseManager(client))
    await run(VERIFY, names)  # the store answers: no error
    await run(CLOSE, names)
    assert names["manager"].is_closing
    await client.aclose()


async def test_verify_cluster_config_fails_fast_on_an_unreachable_store():
    manager = StreamLeaseManager(url=f"redis://127.0.0.1:{free_port()}/0")
    assert await manager.verify_cluster_config(retry_attempts=1) is False
    with pytest.raises(StreamLeaseUnavailable):
        await manager.verify_cluster_config(strict=True, retry_attempts=2, retry_delay=0)
    assert manager.circuit_state == CircuitState.OPEN


async def test_a_client_on_a_sized_pool_is_followed(redis_server):
    names = await run(on(redis_server.url, POOL), reader_names())
    manager = StreamLeaseManager(redis=names["client"])
    assert manager.backend == redis_server.url
    lease = await manager.acquire("u1")
    await lease.release()
    await manager.aclose()
    await names["client"].aclose()


def test_the_fakeredis_testing_example_passes_under_pytest(tmp_path):
    """A fakeredis client given as redis= is served by the embedded store."""
    (tmp_path / "test_readme_fakeredis.py").write_text(FAKEREDIS)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:valkey",
         "test_readme_fakeredis.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


async def test_stream_sends_the_lease_headers_and_refuses_like_acquire(make_manager):
    manager = make_manager(max_per_user=1, max_global=5, include_lease_headers=True)
    response = await manager.stream("42", iter(["a", "b"]), media_type="text/plain")
    assert isinstance(response, ProtectedStreamingResponse)
    assert response.headers["x-stream-lease-id"] == response.lease.lease_id
    assert response.headers["x-stream-lease-user-limit"] == "1"
    assert response.headers["x-stream-lease-global-limit"] == "5"
    assert await manager.get_active_count("42") == 1
    with pytest.raises(fastapi_stream_lease.StreamLeaseRejected) as refused:
        await manager.stream("42", iter(["c"]))
    assert refused.value.reason == "user_limit"
    assert [item async for item in response.body_iterator] == ["a", "b"]
    assert await manager.get_active_count("42") == 0

    uncapped = make_manager(max_per_user=0, max_global=5, include_lease_headers=True)
    response = await uncapped.stream("u1", iter(["a"]))
    assert "x-stream-lease-user-limit" not in response.headers, "an unlimited pool has no cap"
    assert response.headers["x-stream-lease-global-limit"] == "5"
    await response.lease.release()


class OwnedStream:
    """An async iterator that records whether it was closed."""

    def __init__(self) -> None:
        self.closed = False

    def __aiter__(self) -> OwnedStream:
        return self

    async def __anext__(self) -> str:
        raise StopAsyncIteration

    async def aclose(self) -> None:
        self.closed = True


async def test_stream_takes_0_6s_timeout_as_its_acquire_timeout(make_manager):
    """The 0.6 README's ``manager.stream(..., timeout=...)`` fell into the response's options
    and failed building the ``StreamingResponse``."""
    manager = make_manager(max_per_user=0, max_global=1)
    held = await manager.acquire("u1")
    waiting = asyncio.ensure_future(manager.stream("u2", iter(["a"]), timeout=30))
    await eventually(lambda: manager.stats()["waiting"] == 1, what="the stream to wait")
    await held.release()
    response = await waiting
    assert isinstance(response, ProtectedStreamingResponse)
    assert response.lease is not None and not response.lease.released
    await response.lease.release()
    with pytest.raises(TypeError, match="acquire_timeout or its other name timeout"):
        await manager.stream("u2", iter(["a"]), timeout=1, acquire_timeout=1)


def rejection_reasons_in_migrating_md() -> set[str]:
    """The ``on_rejected`` reasons docs/recipes/migrating.md names: 0.6's two, then ours."""
    page = (ROOT / "docs" / "recipes" / "migrating.md").read_text()
    hooks = page.split("**Hooks.**", 1)[1].split("on_backend_error", 1)[0]
    return {"user_limit", "global_limit", *re.findall(r'`"(\w+)"`', hooks)}


REJECTIONS = ["user_limit", "global_limit", "resource_limit", "line_full", "rate_limit",
              "banned", "closing"]  # fmt: skip


def test_every_rejection_reason_the_migration_page_names_is_produced_below():
    """The page listed ``"budget_exhausted"``, which ``acquire()`` never raises."""
    assert set(REJECTIONS) == rejection_reasons_in_migrating_md()


@pytest.mark.parametrize("reason", REJECTIONS)
async def test_on_rejected_hears_each_refusal_by_its_reason(make_manager, key_prefix, reason):
    heard: list[tuple[str | None, str]] = []
    manager = make_manager(
        max_per_user=1, max_global=2, max_waiting=1,
        on_rejected=lambda user_id, why: heard.append((user_id, why)),
    )  # fmt: skip
    user = f"{key_prefix}-u1"
    held = [await manager.acquire(user)]
    waiting: asyncio.Future[Any] | None = None
    with pytest.raises(fastapi_stream_lease.StreamLeaseRejected) as refused:
        if reason == "user_limit":
            await manager.acquire(user)
        elif reason == "global_limit":
            held.append(await manager.acquire(f"{key_prefix}-u2"))
            await manager.acquire(f"{key_prefix}-u3")
        elif reason == "resource_limit":
            held.append(await manager.acquire(None, resources=[Resource(1, "db")]))
            await manager.acquire(None, resources=[Resource(1, "db")])
        elif reason == "line_full":
            held.append(await manager.acquire(f"{key_prefix}-u2"))
            waiting = asyncio.ensure_future(manager.acquire(f"{key_prefix}-u3", wait_timeout=30))
            await eventually(lambda: manager.stats()["waiting"] == 1, what="one in line")
            await manager.acquire(f"{key_prefix}-u4", wait_timeout=30)
        elif reason == "rate_limit":
            once = RateLimit("once", 1, per=60)
            await held.pop().release()
            held.append(await manager.acquire(user, rate_limits=[once]))
            await held.pop().release()
            await manager.acquire(user, rate_limits=[once])
        elif reason == "banned":
            await manager.revoke(user, ban_seconds=60)
            await manager.acquire(user)
        else:
            await manager.drain(timeout=0)
            await manager.acquire(user)
    await eventually(lambda: [why for _, why in heard] == [reason], what=f"on_rejected {reason}")
    assert refused.value.reason == reason
    if waiting is not None:
        waiting.cancel()
    for lease in held:
        await lease.release()


async def test_close_source_false_leaves_the_callers_stream_open(make_manager):
    manager = make_manager()
    for close_source in (True, False):
        source = OwnedStream()
        lease = await manager.acquire("u1")
        assert [item async for item in lease.wrap(source, close_source=close_source)] == []
        assert source.closed is close_source and lease.released


async def test_close_source_closes_a_sync_generator_left_early(make_manager):
    """Only an async source's ``aclose()`` was looked for: a sync generator the client left
    early was never closed, its ``finally`` never ran."""
    manager = make_manager()
    for close_source in (True, False):
        closed: list[bool] = []

        def numbers(closed: list[bool] = closed) -> Iterator[int]:
            try:
                yield from range(100)
            finally:
                closed.append(True)

        source = numbers()
        lease = await manager.acquire("u1")
        items = lease.wrap(source, close_source=close_source)
        assert await anext(items) == 0
        await items.aclose()
        assert closed == ([True] if close_source else []) and lease.released
        source.close()


def test_the_0_6_names_are_these_classes():
    from fastapi_stream_lease import (
        BackendError,
        CircuitBreakerConfig,
        ConfigurationMismatchError,
        Lease,
        LeaseLost,
        ManagerClosed,
        StreamLease,
        StreamLeaseLost,
        StreamLeaseRejected,
    )

    assert StreamLeaseLost is LeaseLost and StreamLease is Lease
    assert issubclass(BackendError, StreamLeaseUnavailable)
    assert issubclass(ManagerClosed, StreamLeaseUnavailable)
    assert issubclass(StreamLeaseUnavailable, StreamLeaseRejected)
    mismatch = ConfigurationMismatchError("differs", {"max_global": 1}, {"max_global": 2})
    assert mismatch.existing_config == {"max_global": 1}
    with pytest.raises(ValueError, match="failure_threshold must be an int of at least 1"):
        CircuitBreakerConfig(failure_threshold=0)


def test_a_refusal_converts_to_an_http_exception_too():
    refused = fastapi_stream_lease.PoolFull("full", "per_user", 2, 2, 7)
    exception = refused.as_http_exception()
    assert exception.status_code == 429 and exception.headers["Retry-After"] == "7"
    assert exception.detail == refused.detail == "full"


async def test_acquire_timeout_waits_for_the_users_own_cap_too(make_manager):
    """0.6's acquire_timeout waited whichever cap was full: here it sets wait_for_own_quota."""
    manager = make_manager(max_per_user=1, acquire_timeout=10)
    assert manager.config.wait_for_own_quota and manager.config.wait_timeout == 10
    held = await manager.acquire("u1")
    waiting = asyncio.ensure_future(manager.acquire("u1"))
    await eventually(lambda: manager.stats()["waiting"] == 1, what="the second to wait")
    await held.release()
    await (await waiting).release()


def test_acquire_timeout_sets_wait_for_own_quota_only_with_the_global_pool():
    """As configuration.md and migrating.md say: the users' own lines need the global pool."""
    config = LeaseConfig(acquire_timeout=0.5)
    assert config.wait_for_own_quota and config.wait_timeout == 0.5
    config = LeaseConfig(acquire_timeout=0.5, global_pool=False)
    assert not config.wait_for_own_quota and config.wait_timeout == 0.5
    assert not LeaseConfig(acquire_timeout=0).wait_for_own_quota


async def test_a_fakeredis_client_is_served_by_the_embedded_store():
    from fakeredis.aioredis import FakeRedis

    fake = FakeRedis()
    manager = StreamLeaseManager(fake, LeaseConfig(max_per_user=1))
    assert manager.backend.startswith("memory://fakeredis-")
    lease = await manager.acquire("u1")
    assert await fake.keys() == [], "nothing is written to the FakeRedis"
    await lease.release()
    await manager.aclose()


async def test_managers_given_one_fakeredis_client_share_one_store():
    """Regression: two managers handed one fakeredis client each had a store of their own, so
    their caps were not shared as they are on the server the client stands in for; a client
    of its own is a store of its own."""
    from fakeredis.aioredis import FakeRedis

    fake, other = FakeRedis(), FakeRedis()
    config = LeaseConfig(max_per_user=1)
    first, second = StreamLeaseManager(fake, config), StreamLeaseManager(fake, config)
    apart = StreamLeaseManager(other, config)
    assert first.backend == second.backend != apart.backend
    lease = await first.acquire("u1")
    with pytest.raises(PoolFull):
        await second.acquire("u1")
    assert await second.get_active_count("u1") == 1
    await (await apart.acquire("u1")).release()
    await lease.release()
    await (await second.acquire("u1")).release()
    for manager in (first, second, apart):
        await manager.aclose()


class RecordingAdapter:
    """A 0.6 telemetry adapter of one's own: every call it gets, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def record_operation(self, operation, outcome, duration: float) -> None:
        assert duration >= 0
        self.calls.append(("operation", operation.value, outcome.value))

    def record_lost(self, reason) -> None:
        self.calls.append(("lost", reason.value))

    def record_backend_error(self, kind) -> None:
        self.calls.append(("backend_error", kind.value))

    def record_active_leases(self, count: int) -> None:
        self.calls.append(("active", count))

    @contextlib.contextmanager
    def trace_operation(self, operation):
        self.calls.append(("trace", operation.value))
        try:
            yield
        except Exception as error:  # the refusal, thrown in as into 0.6's block
            self.calls.append(("traced", operation.value, type(error).__name__))
            raise
        self.calls.append(("traced", operation.value))


async def test_an_adapter_of_ones_own_is_told_of_acquires_losses_and_redis_errors(
    backend_url, key_prefix
):
    adapter = RecordingAdapter()
    config = LeaseConfig(key_prefix=key_prefix, max_per_user=1)
    manager = StreamLeaseManager(url=backend_url, config=config, telemetry=adapter)
    lease = await manager.acquire("u1")
    with pytest.raises(PoolFull):
        await manager.acquire("u1")
    await lease.release()
    held = await manager.acquire("u1")
    await manager.revoke("u1")
    await held.release()
    acquired = [("trace", "acquire"), ("traced", "acquire"), ("operation", "acquire", "success")]
    assert adapter.calls == [
        *acquired, ("active", 1),
        ("trace", "acquire"), ("traced", "acquire", "PoolFull"),
        ("operation", "acquire", "rejected"),
        ("active", 0),
        *acquired, ("active", 1),
        ("lost", "redis_revoked"), ("active", 0),
    ]  # fmt: skip
    unreachable = StreamLeaseManager(
        url="redis://127.0.0.1:1", config=LeaseConfig(redis_timeout=0.2), telemetry=adapter
    )
    adapter.calls.clear()
    with pytest.raises(StreamLeaseUnavailable):
        await unreachable.acquire("u1")
    assert adapter.calls == [
        ("trace", "acquire"),
        ("traced", "acquire", "BackendUnavailable"),
        ("backend_error", "connection"),
        ("operation", "acquire", "backend_error"),
    ]
    await unreachable.aclose()


async def test_an_adapter_is_called_only_for_what_it_has_and_its_failures_change_nothing(
    backend_url, key_prefix, caplog
):
    class Failing:
        def record_operation(self, *args) -> None:
            raise RuntimeError("the adapter's own bug")

    config = LeaseConfig(key_prefix=key_prefix)
    manager = StreamLeaseManager(url=backend_url, config=config, telemetry=Failing())
    lease = await manager.acquire("u1")  # no trace_operation, no record_active_leases
    await lease.release()
    assert [r.getMessage() for r in caplog.records if "adapter" in r.getMessage()] == [
        "telemetry adapter's record_operation raised RuntimeError"
    ]
    with pytest.raises(TypeError, match=r"an adapter with 0\.6's methods .*got object"):
        StreamLeaseManager(telemetry=object())


def test_the_0_6_metric_names_map_to_series_the_dashboard_reads():
    """Every series migrating.md's table of metric names gives is one the Grafana dashboard
    reads (which the Prometheus example's test shows exported)."""
    page = (ROOT / "docs" / "recipes" / "migrating.md").read_text()
    table = page[page.index("**Metric names.**") : page.index("**Renewal is the manager's.**")]
    ours = set(re.findall(r"\| [^|]*\| ([^|]*)\|", table)[2:])
    named = {n for cell in ours for n in re.findall(r"`(fastapi_stream_lease_[a-z_]+)", cell)}
    dashboard = (ROOT / "examples" / "grafana" / "fastapi-stream-lease.json").read_text()
    read = {
        n.removesuffix("_bucket") for n in re.findall(r"fastapi_stream_lease_[a-z_]+", dashboard)
    }
    assert named and named <= read, named - read


def test_the_prometheus_extra_brings_what_prometheus_metrics_imports():
    pyproject = (ROOT / "pyproject.toml").read_text()
    extra = re.search(r"^prometheus = \[(.*?)\]", pyproject, re.S | re.M)
    assert extra, "pyproject.toml has a prometheus extra"
    wanted = {re.split(r"[<>=]", r)[0] for r in re.findall(r'"([^"]+)"', extra[1])}
    assert wanted == {"opentelemetry-sdk", "opentelemetry-exporter-prometheus", "prometheus-client"}
    for distribution in wanted:  # each installed here, as the extra would install it
        assert importlib.metadata.version(distribution)


async def test_expires_at_is_the_holders_deadline_pushed_on_by_renewals(make_redis_manager):
    manager = make_redis_manager(lease_seconds=3, renew_every=0.3)
    lease = await manager.acquire("u1")
    other = await manager.acquire("u2")  # the same holder, the same deadline
    first = lease.expires_at
    assert 0 < first - time.monotonic() <= 3
    assert abs(other.expires_at - first) < 0.05
    await eventually(lambda: lease.expires_at > first + 0.2, what="a renewal pushing it on")
    await lease.release()
    assert lease.expires_at <= time.monotonic(), "released: no time left"
    await other.release()


async def test_expires_at_on_the_embedded_store_is_never():
    manager = StreamLeaseManager(url="memory://")
    lease = await manager.acquire("u1")
    assert lease.expires_at == math.inf
    await manager.aclose()
