"""OpenTelemetry metrics and traces, recorded with the SDK's in-memory reader and
exporter during a scenario that meets every result; no raw identity anywhere."""

from __future__ import annotations

import asyncio
import gc
import json
import logging

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased

from fastapi_stream_lease import (
    LeaseConfig,
    LineFull,
    RateLimit,
    Resource,
    StreamLeaseError,
    StreamLeaseManager,
)
from fastapi_stream_lease.telemetry import NAME, RESULTS

#: Identities no attribute, event or log line may contain.
ALICE, BOB, CAROL, DAVE = "id-alice-5c1e", "id-bob-93aa", "id-carol-0d72", "id-dave-e4b8"


@pytest.fixture
def telemetry():
    reader = InMemoryMetricReader()
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    return MeterProvider(metric_readers=[reader]), tracer_provider, reader, exporter


def acquires(exporter) -> list[dict]:
    """The facts of every traced acquire: the attributes of the library's own spans and of the
    acquire events on others."""
    return [
        dict(s.attributes) if s.name == f"{NAME}.acquire" else dict(e.attributes)
        for s in exporter.get_finished_spans()
        for e in (s.events if s.name != f"{NAME}.acquire" else (None,))
        if e is None or e.name == f"{NAME}.acquire"
    ]


def points(reader, name: str) -> list:
    data = reader.get_metrics_data()
    return [
        point
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == name
        for point in metric.data.data_points
    ]


async def test_every_result_is_counted_once_and_no_identity_leaks(
    backend_url, key_prefix, telemetry, caplog
):
    meters, tracers, reader, exporter = telemetry
    caplog.set_level(logging.DEBUG, logger="fastapi_stream_lease")
    config = LeaseConfig(
        key_prefix=key_prefix, max_per_user=1, max_global=3, identity_secret=b"s" * 16
    )
    manager = StreamLeaseManager(
        url=backend_url,
        config=config,
        meter_provider=meters,
        tracer_provider=tracers,
        trace_identities=True,
    )
    per_minute = RateLimit("starts_per_minute", 1, per=60)
    tokens = RateLimit("tokens_per_minute", 100, per=60, unit="tokens")
    gpu = Resource(capacity=1, name="gpu")

    async def refused(**kwargs) -> None:
        with pytest.raises((StreamLeaseError, ValueError)):
            await manager.acquire(**kwargs)

    request = tracers.get_tracer("test").start_as_current_span("request")  # a traced request
    with request:
        held = [
            await manager.acquire(ALICE, rate_limits=[per_minute], budgets=[tokens], reserve=60)
        ]
        await refused(user_id=ALICE)  # per_user
        held.append(await manager.acquire(BOB, resources=[gpu]))
        await refused(user_id=None, resources=[gpu])  # resource
        await refused(user_id=CAROL, rate_limits=[per_minute, per_minute])  # invalid (twice)
        held.append(await manager.acquire(CAROL))
        await refused(user_id=DAVE)  # global
        active = {p.attributes["pool"]: p.value for p in points(reader, f"{NAME}.leases.active")}
        assert active == {"per_user": 3, "global": 3, "gpu": 1}
        waiting = asyncio.create_task(manager.acquire(DAVE, wait_timeout=30))
        await asyncio.sleep(0.2)
        waiting.cancel()  # canceled
        with pytest.raises(asyncio.CancelledError):
            await waiting
        for lease in held:
            held_tokens = lease.tokens_used
            if held_tokens is not None:
                lease.consume(7)
            await lease.release()
        await refused(user_id=ALICE, rate_limits=[per_minute])  # rate
        await refused(user_id=ALICE, budgets=[tokens], reserve=95)  # budget: 7 used, 93 left
        unreachable = StreamLeaseManager(
            url="redis://127.0.0.1:1",
            config=LeaseConfig(redis_timeout=0.2, identity_secret=b"s" * 16),
            meter_provider=meters,
            tracer_provider=tracers,
        )
        with pytest.raises(StreamLeaseError):
            await unreachable.acquire(ALICE)  # backend_unavailable
        await unreachable.aclose()
        narrow = StreamLeaseManager(
            url=backend_url,
            config=LeaseConfig(
                key_prefix=f"{key_prefix}-narrow",
                max_per_user=0,
                max_global=1,
                max_waiting=1,
                identity_secret=b"s" * 16,
            ),
            meter_provider=meters,
            tracer_provider=tracers,
        )
        occupant = await narrow.acquire(ALICE)  # acquired
        queued = asyncio.create_task(narrow.acquire(BOB, wait_timeout=30))
        await asyncio.sleep(0.2)
        with pytest.raises(LineFull):
            await narrow.acquire(CAROL, wait_timeout=30)  # line_full
        queued.cancel()  # canceled
        with pytest.raises(asyncio.CancelledError):
            await queued
        await narrow.aclose()  # the occupant goes with the close
        assert occupant.released
        await manager.revoke(CAROL, ban_seconds=60)
        await refused(user_id=CAROL)  # banned
        lease = await manager.acquire(ALICE)
        await manager.drain(timeout=0)
        assert lease.revoked
        await refused(user_id=ALICE)  # closed

    results = {
        p.attributes["result"]: p.value for p in points(reader, "fastapi_stream_lease.requests")
    }
    assert results == {
        "acquired": 5,
        "line_full": 1,
        "per_user": 1,
        "resource": 1,
        "invalid": 1,
        "global": 1,
        "canceled": 2,
        "rate": 1,
        "budget": 1,
        "backend_unavailable": 1,
        "banned": 1,
        "closed": 1,
    }
    assert set(results) == set(RESULTS)
    active = {p.attributes["pool"]: p.value for p in points(reader, f"{NAME}.leases.active")}
    assert set(active.values()) <= {0}, "nothing held any more"
    (durations,) = points(reader, f"{NAME}.lease.duration")
    assert durations.count == 3, "the three released; the fourth went with the drain's close"
    charged = {
        p.attributes["direction"]: p.value for p in points(reader, "fastapi_stream_lease.tokens")
    }
    assert charged == {"input": 0, "output": 7}
    calls = {p.attributes["outcome"]: p.value for p in points(reader, f"{NAME}.redis.calls")}
    assert calls["error"] >= 1, "the unreachable manager's call"
    assert (calls["ok"] > 0) == (backend_url != "memory://")
    (spent,) = points(reader, f"{NAME}.redis.call.time")
    assert spent.value > 0

    (request_span,) = exporter.get_finished_spans()
    events = [e for e in request_span.events if e.name == f"{NAME}.acquire"]
    assert len(events) == sum(results.values()), "one event per acquire, on the request's span"
    assert sorted(e.attributes[f"{NAME}.result"] for e in events) == sorted(
        result for result, n in results.items() for _ in range(n)
    )
    assert request_span.attributes[f"{NAME}.result"] == "closed", "the last acquire's"
    digest = manager._core.identity_digest(ALICE)
    assert any(e.attributes.get(f"{NAME}.identity_hash") == digest for e in events)
    telemetry_text = json.dumps(
        [
            [dict(s.attributes), [(e.name, dict(e.attributes)) for e in s.events], s.name]
            for s in exporter.get_finished_spans()
        ]
        + [
            [dict(p.attributes)]
            for name in ("requests", "leases.active", "tokens", "redis.calls", "pool.used")
            for p in points(reader, f"fastapi_stream_lease.{name}")
        ],
        default=str,
    ) + "\n".join(
        record.getMessage() + json.dumps(vars(record), default=str) for record in caplog.records
    )
    revoked = [r for r in caplog.records if r.getMessage().startswith("revoked")]
    assert [(r.levelname, r.identity_hash) for r in revoked] == [
        ("INFO", manager._core.identity_digest(CAROL))
    ]
    refusals = [r.result for r in caplog.records if r.getMessage().startswith("acquire refused")]
    not_refusals = ("acquired", "canceled", "invalid")
    assert sorted(refusals) == sorted(
        result for result, n in results.items() for _ in range(n) if result not in not_refusals
    ), "each refusal logged once at DEBUG, with its result"
    drained = [r for r in caplog.records if r.getMessage().startswith("drained")]
    assert [(r.levelname, r.revoked) for r in drained] == [("INFO", 1)]
    for identity in (ALICE, BOB, CAROL, DAVE):
        assert identity not in telemetry_text


async def test_without_providers_nothing_is_instrumented(backend_url, key_prefix):
    manager = StreamLeaseManager(url=backend_url, config=LeaseConfig(key_prefix=key_prefix))
    lease = await manager.acquire(ALICE)
    await lease.release()
    assert manager._telemetry is None, "the API's default providers record nothing: no cost"


async def test_a_grant_counts_when_taken_and_its_held_time_from_its_release(
    backend_url, key_prefix, telemetry
):
    """The core counts a grant once its caller takes it, and keeps how long the lease was held
    from its release until a reader collects; the count never goes back, not even when its
    manager is gone."""
    meters, _, reader, _ = telemetry
    manager = StreamLeaseManager(
        url=backend_url, config=LeaseConfig(key_prefix=key_prefix), meter_provider=meters
    )
    lease = await manager.acquire(ALICE)
    assert [p.value for p in points(reader, f"{NAME}.requests")] == [1]
    assert [p.count for p in points(reader, f"{NAME}.lease.duration")] in ([], [0])
    await asyncio.sleep(0.05)
    await lease.release()
    (durations,) = points(reader, f"{NAME}.lease.duration")
    assert (durations.count, durations.sum >= 0.05) == (1, True)
    await manager.aclose()
    del manager, lease
    gc.collect()
    assert [p.value for p in points(reader, f"{NAME}.requests")] == [1]


async def test_held_times_the_core_did_not_keep_are_logged_at_collection(
    backend_url, key_prefix, telemetry, caplog
):
    """Past 2,000,000 held times between two collections the core counts the rest as dropped
    (``held_times.rs`` tests the bound); the collection logs how many were not recorded."""
    meters, _, reader, _ = telemetry
    manager = StreamLeaseManager(
        url=backend_url, config=LeaseConfig(key_prefix=key_prefix), meter_provider=meters
    )
    await (await manager.acquire(ALICE)).release()
    instruments = manager._instruments()

    class DroppedThree:
        """The manager's core, as it answers once three held times found no room."""

        def __getattr__(self, name: str) -> object:
            return getattr(manager._core, name)

        def collect_lease_times(self) -> tuple[int, list[float], int]:
            return 1, [], 3

    instruments.core = DroppedThree()
    with caplog.at_level(logging.WARNING, logger=NAME):
        points(reader, f"{NAME}.requests")
        points(reader, f"{NAME}.requests")
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning.startswith("3 lease durations were not recorded")
    await manager.aclose()


async def test_an_acquire_in_a_trace_its_sampler_dropped_is_not_traced(
    backend_url, key_prefix, telemetry
):
    """Most requests, at ``ParentBased(TraceIdRatioBased(0.1))``: counted and timed all the
    same, and neither a span nor an event made."""
    meters, _, reader, exporter = telemetry
    dropping = TracerProvider(sampler=ParentBased(ALWAYS_OFF))
    dropping.add_span_processor(SimpleSpanProcessor(exporter))
    manager = StreamLeaseManager(
        url=backend_url,
        config=LeaseConfig(key_prefix=key_prefix),
        meter_provider=meters,
        tracer_provider=dropping,
    )
    await (await manager.acquire(ALICE)).release()  # a root span the sampler drops
    with dropping.get_tracer("app").start_as_current_span("GET /stream"):
        await (await manager.acquire(ALICE)).release()
    assert exporter.get_finished_spans() == ()
    assert [p.value for p in points(reader, f"{NAME}.requests")] == [2]
    (durations,) = points(reader, f"{NAME}.lease.duration")
    assert durations.count == 2
    await manager.aclose()
    await manager.aclose()


@pytest.mark.parametrize("acquire_spans", [False, True])
async def test_an_acquire_is_an_event_on_the_requests_span_or_a_span_when_asked(
    backend_url, key_prefix, telemetry, acquire_spans
):
    """Inside a sampled request span, the acquire's facts are an event on it (no span of the
    library's own) unless ``acquire_spans=True``; outside any span, a span of its own."""
    _, tracers, _, exporter = telemetry
    manager = StreamLeaseManager(
        url=backend_url,
        config=LeaseConfig(key_prefix=key_prefix),
        tracer_provider=tracers,
        acquire_spans=acquire_spans,
    )
    with tracers.get_tracer("app").start_as_current_span("GET /stream"):
        await (await manager.acquire(ALICE)).release()
    await (await manager.acquire(ALICE)).release()  # no request span
    spans = exporter.get_finished_spans()
    names = [s.name for s in spans]
    request = spans[names.index("GET /stream")]
    own = [s for s in spans if s.name == f"{NAME}.acquire"]
    if acquire_spans:
        assert [s.parent.span_id if s.parent else None for s in own] == [
            request.context.span_id,
            None,
        ]
        assert f"{NAME}.result" not in request.attributes
    else:
        assert [s.parent for s in own] == [None], "only the acquire outside a request"
        assert [e.name for e in request.events] == [f"{NAME}.acquire", f"{NAME}.lease.released"]
        assert request.attributes[f"{NAME}.result"] == "acquired"
    facts = acquires(exporter)
    assert [f[f"{NAME}.result"] for f in facts] == ["acquired", "acquired"]
    assert all(f[f"{NAME}.pools"] == ("per_user", "global") for f in facts)
    assert all(f[f"{NAME}.wait_seconds"] >= 0 for f in facts)
    await manager.aclose()


async def test_telemetry_switches_of_the_wrong_type_say_so():
    for name in ("trace_identities", "acquire_spans"):
        with pytest.raises(TypeError, match=f"{name} must be True or False, got 'yes'"):
            StreamLeaseManager(**{name: "yes"})


async def test_a_dry_runs_would_be_refusals_are_counted_by_policy_and_marked_in_the_trace(
    backend_url, key_prefix, telemetry
):
    meters, tracers, reader, exporter = telemetry
    manager = StreamLeaseManager(
        url=backend_url,
        config=LeaseConfig(key_prefix=key_prefix, max_per_user=5),
        meter_provider=meters,
        tracer_provider=tracers,
    )
    new_rule = RateLimit("new_rule", 1, per=60, enforce=False)
    old_rule = RateLimit("old_rule", 10, per=60)
    for _ in range(3):
        await manager.hit(ALICE, new_rule, old_rule)  # the second and third would be refused
    with tracers.get_tracer("test").start_as_current_span("request"):
        lease = await manager.acquire(ALICE, rate_limits=[new_rule, old_rule])
    await lease.release()
    counted = {p.attributes["policy"]: p.value for p in points(reader, f"{NAME}.rate.would_refuse")}
    assert counted == {"new_rule": 3}
    (facts,) = acquires(exporter)
    assert facts[f"{NAME}.would_refuse"] == ("new_rule",)
    assert [p.value for p in points(reader, f"{NAME}.requests")] == [1], "it was acquired"
    await manager.aclose()


@pytest.mark.parametrize("lease_units", [False, True])
async def test_the_forms_hits_are_counted_like_the_managers(
    backend_url, key_prefix, telemetry, lease_units
):
    """A form's hit allowed with nothing to wait for skips the manager's ``hit`` only when
    nothing listens: with telemetry on, every hit through the middleware is counted."""
    import httpx
    from fastapi import FastAPI

    from fastapi_stream_lease import RateLimitMiddleware

    meters, tracers, reader, _exporter = telemetry
    manager = StreamLeaseManager(
        url=backend_url,
        config=LeaseConfig(key_prefix=key_prefix),
        meter_provider=meters,
        tracer_provider=tracers,
    )
    app = FastAPI()

    @app.get("/")
    async def root() -> str:
        return "ok"

    new_rule = RateLimit("new_rule", 1, per=60, enforce=False, lease_units=lease_units)
    app.add_middleware(RateLimitMiddleware, manager=manager, routes={"/": [new_rule]})
    transport = httpx.ASGITransport(app=app, client=("10.0.0.1", 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        for _ in range(30):
            assert (await http.get("/")).status_code == 200
    counted = {p.attributes["policy"]: p.value for p in points(reader, f"{NAME}.rate.would_refuse")}
    assert counted == {"new_rule": 29}
    await manager.aclose()


async def test_a_trace_names_the_policies_of_every_level_and_no_identity_of_theirs(
    backend_url, key_prefix, telemetry
):
    """An acquire whose policies count identities of their own (a team) is traced with every
    policy's name, and with neither the user's nor the team's identity."""
    meters, tracers, _, exporter = telemetry
    manager = StreamLeaseManager(
        url=backend_url,
        config=LeaseConfig(key_prefix=key_prefix),
        meter_provider=meters,
        tracer_provider=tracers,
    )
    team_starts = RateLimit("team_starts", 10, per=60)
    user_tokens = RateLimit("user_tokens", 1_000, per=60, unit="tokens")
    with tracers.get_tracer("test").start_as_current_span("request"):
        lease = await manager.acquire(
            ALICE, rate_limits=[(team_starts, BOB)], budgets=[user_tokens], reserve=10
        )
    await lease.release()
    (facts,) = acquires(exporter)
    assert facts[f"{NAME}.policies"] == ("team_starts", "user_tokens")
    assert all(who not in repr(facts) for who in (ALICE, BOB))
    await manager.aclose()


async def test_shared_pools_are_read_across_workers_once_per_collection(
    backend_url, key_prefix, telemetry
):
    meters, _, reader, _ = telemetry
    config = LeaseConfig(key_prefix=key_prefix, max_global=10, identity_secret=b"s" * 16)
    manager = StreamLeaseManager(url=backend_url, config=config, meter_provider=meters)
    other = StreamLeaseManager(url=backend_url, config=config)  # another worker, no telemetry
    gpu = Resource(capacity=2, name="gpu")
    held = [await manager.acquire(ALICE, resources=[gpu]), await manager.acquire(BOB)]
    if backend_url != "memory://":  # the embedded store is this manager's alone
        held.append(await other.acquire(CAROL, resources=[gpu]))
    telemetry_of = manager._instruments()
    reads = 0
    read = telemetry_of.sampler.read

    async def counted() -> None:
        nonlocal reads
        reads += 1
        await read()

    telemetry_of.sampler.read = counted

    def figures(name: str) -> dict[str, int]:
        return {p.attributes["pool"]: p.value for p in points(reader, name)}

    # A reader in another thread (a periodic exporter, Prometheus) waits for the one read.
    used = await asyncio.to_thread(figures, f"{NAME}.pool.used")
    expected = {"global": 3, "gpu": 2} if backend_url != "memory://" else {"global": 2, "gpu": 1}
    assert used == expected
    assert await asyncio.to_thread(figures, f"{NAME}.pool.capacity") == {"global": 10, "gpu": 2}
    assert reads == 1, "one call per collection, at most one a second: never per request"
    for lease in held:
        await lease.release()
    # A collection on the manager's own loop never blocks it: it starts a read for the next.
    telemetry_of.sampler.read_at = -1.0
    assert figures(f"{NAME}.pool.used") == expected
    await telemetry_of.sampler.reading
    assert figures(f"{NAME}.pool.used") == {"global": 0, "gpu": 0}
    await manager.aclose()
    await other.aclose()


async def test_shared_pools_on_a_cluster_are_one_call(redis_cluster, key_prefix):
    config = LeaseConfig(key_prefix=key_prefix, max_global=5, identity_secret=b"s" * 16)
    manager = StreamLeaseManager(url=redis_cluster.url, config=config)
    lease = await manager.acquire(ALICE, resources=[Resource(capacity=3, name="gpu")])
    assert sorted(await manager._core.shared_usage()) == [("global", 1, 5), ("gpu", 1, 3)]
    await lease.release()
    await manager.aclose()
