"""Threshold alerts (``StreamLeaseManager(on_threshold=..., alert_at=...)``): told once per
policy, identity, threshold and window, with the identity's keyed hash, never the identity.
Each behavioural test runs on the embedded store and on a real Redis."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from fastapi_stream_lease import (
    LeaseConfig,
    RateLimit,
    StreamLeaseManager,
    ThresholdCrossed,
)
from fastapi_stream_lease.telemetry import NAME

from support.waiting import eventually

ALICE, BOB = "id-alice-5c1e", "id-bob-93aa"


def alerting_manager(
    backend_url: str, key_prefix: str, **options: object
) -> tuple[StreamLeaseManager, list[ThresholdCrossed]]:
    told: list[ThresholdCrossed] = []

    async def on_threshold(alert: ThresholdCrossed) -> None:
        told.append(alert)

    config = LeaseConfig(key_prefix=key_prefix, max_per_user=5)
    return StreamLeaseManager(
        url=backend_url, config=config, on_threshold=on_threshold, **options
    ), told


async def told_about(told: list[ThresholdCrossed], digest: str, count: int) -> None:
    """Waits for ``count`` alerts of ``digest`` (hooks run off the hot path, in order)."""
    await eventually(lambda: sum(a.identity_hash == digest for a in told) >= count)


async def test_each_threshold_is_told_once_in_a_window_and_never_with_the_identity(
    backend_url, key_prefix
):
    """Crossing 80 % then 100 % tells each once; hits past them in the same window tell
    nothing more, however many there are."""
    manager, told = alerting_manager(backend_url, key_prefix)
    # A dry run keeps counting past its limit, so hits past 100 % are decided too.
    per_hour = RateLimit("requests_per_hour", 10, per=3600, enforce=False)
    for cost in (7, 1, 1, 1, 1, 5):  # 7, 8 (80 %), 9, 10 (100 %), 11, 16
        await manager.hit(ALICE, per_hour, cost=cost)
    # Bob's hit, queued after Alice's, is told after them: every alert of Alice's is in.
    await manager.hit(BOB, per_hour, cost=10)
    bob, alice = (manager._core.identity_digest(who) for who in (BOB, ALICE))
    await told_about(told, bob, 2)
    assert [(a.policy, a.threshold, a.used, a.limit) for a in told if a.identity_hash == alice] == [
        ("requests_per_hour", 0.8, 8, 10),
        ("requests_per_hour", 1.0, 10, 10),
    ]
    assert all(a.reset > 0 for a in told)
    assert alice != bob and all(ALICE not in repr(a) and BOB not in repr(a) for a in told)
    await manager.aclose()


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window"])
async def test_a_threshold_is_told_again_in_the_next_window(backend_url, key_prefix, algorithm):
    """A fixed window's alert comes again in the next window; a sliding window's once the
    units that reached it have left the window."""
    manager, told = alerting_manager(backend_url, key_prefix, alert_at=(0.5,))
    burst = RateLimit("burst", 4, per=0.5, algorithm=algorithm)
    digest = manager._core.identity_digest(ALICE)
    await manager.hit(ALICE, burst, cost=2)
    await told_about(told, digest, 1)
    await eventually(lambda: window_is_new(manager, burst), what="the next window")
    await manager.hit(ALICE, burst, cost=3)
    await told_about(told, digest, 2)
    assert [(a.threshold, a.used) for a in told] == [(0.5, 2), (0.5, 3)]
    await manager.aclose()


async def window_is_new(manager: StreamLeaseManager, policy: RateLimit) -> bool:
    return (await manager.peek(ALICE, policy)).remaining == policy.limit


async def test_workers_sharing_redis_tell_each_threshold_once_in_total_per_window(
    redis_server, key_prefix
):
    """Two workers (two managers on one Redis) take turns pushing one identity past 80 % and
    100 %: each threshold is told once in total, not once by each worker; in the next window,
    once in total again."""
    workers = [alerting_manager(redis_server.url, key_prefix) for _ in range(2)]
    burst = RateLimit("burst_per_second", 10, per=1, algorithm="fixed_window", enforce=False)
    alice = workers[0][0]._core.identity_digest(ALICE)
    for window in (1, 2):
        await eventually(lambda: window_is_new(workers[0][0], burst), what="a new window")
        for turn, cost in enumerate((7, 1, 1, 1, 1, 1)):  # 7, 8 (80 %), 9, 10 (100 %), 11, 12
            await workers[turn % 2][0].hit(ALICE, burst, cost=cost)
        for n, (manager, told) in enumerate(workers):
            # Queued after Alice's: once told, every alert of Alice's this worker had is in.
            await manager.hit(f"{BOB}-{window}-{n}", burst, cost=10)
            await told_about(told, manager._core.identity_digest(f"{BOB}-{window}-{n}"), 2)
        alices = [(a.threshold, a.used) for _, t in workers for a in t if a.identity_hash == alice]
        assert sorted(alices) == sorted([(0.8, 8), (1.0, 10)] * window), f"window {window}"
    for manager, _ in workers:
        await manager.aclose()


async def test_a_reset_allowance_tells_its_thresholds_again(backend_url, key_prefix):
    """A reset (a fresh allowance) forgets what was told with the counts: reaching 80 % again
    in the same window is told again."""
    manager, told = alerting_manager(backend_url, key_prefix, alert_at=(0.8,))
    per_hour = RateLimit("requests_per_hour", 10, per=3600, algorithm="fixed_window")
    digest = manager._core.identity_digest(ALICE)
    await manager.hit(ALICE, per_hour, cost=8)
    await told_about(told, digest, 1)
    await manager.reset(ALICE, per_hour)
    await manager.hit(ALICE, per_hour, cost=9)
    await told_about(told, digest, 2)
    assert [(a.threshold, a.used) for a in told] == [(0.8, 8), (0.8, 9)]
    await manager.aclose()


async def test_alerts_write_nothing_below_a_threshold_nor_while_nobody_listens(
    redis_server, redis_client, key_prefix
):
    """A hit that reaches no threshold leaves no mark, and a manager nobody listens to leaves
    none at any use, even for a policy with thresholds of its own; the first threshold told
    leaves one, next to the counter."""
    listened, _ = alerting_manager(redis_server.url, key_prefix)
    unheard = StreamLeaseManager(url=redis_server.url, config=LeaseConfig(key_prefix=key_prefix))
    per_hour = RateLimit("requests_per_hour", 10, per=3600, alert_at=(0.8,))

    def marks() -> list[bytes]:
        return redis_client.keys(f"{{{key_prefix}}}:rate:*:told")

    await unheard.hit(ALICE, per_hour, cost=9)
    await listened.hit(BOB, per_hour, cost=7)
    assert marks() == []
    await listened.hit(BOB, per_hour, cost=1)
    assert [key.decode() for key in marks()] == [
        f"{key.decode()}:told" for key in redis_client.keys(f"{{{key_prefix}}}:rate:*")
        if not key.endswith(b":told") and listened._core.identity_digest(BOB) in key.decode()
    ]
    for manager in (listened, unheard):
        await manager.aclose()


async def test_a_stream_start_that_reserves_a_budget_past_a_threshold_is_told(
    backend_url, key_prefix
):
    manager, told = alerting_manager(backend_url, key_prefix)
    budget = RateLimit("tokens_per_hour", 100, per=3600, unit="tokens")
    lease = await manager.acquire(ALICE, budgets=[budget], reserve=(10, 75))
    await told_about(told, manager._core.identity_digest(ALICE), 1)
    assert [(a.policy, a.threshold, a.used) for a in told] == [("tokens_per_hour", 0.8, 85)]
    await lease.release()
    await manager.aclose()


async def test_a_level_paired_with_an_identity_is_told_with_that_identitys_hash(
    backend_url, key_prefix
):
    """A start's team budget that crosses a threshold is told with the team's hash, and its
    user's budget, below it, tells nothing: each level alerts for the identity it counts."""
    manager, told = alerting_manager(backend_url, key_prefix)
    team = RateLimit("team_tokens_per_hour", 100, per=3600, unit="tokens")
    own = RateLimit("user_tokens_per_hour", 1_000, per=3600, unit="tokens")
    lease = await manager.acquire(ALICE, budgets=[(team, "team-7"), own], reserve=(10, 75))
    team_hash = manager._core.identity_digest("team-7")
    await told_about(told, team_hash, 1)
    assert [(a.policy, a.threshold, a.identity_hash) for a in told] == [
        ("team_tokens_per_hour", 0.8, team_hash)
    ]
    await lease.release()
    await manager.aclose()


async def test_thresholds_crossed_are_counted_by_policy_and_threshold_without_identity(
    backend_url, key_prefix
):
    reader = InMemoryMetricReader()
    manager = StreamLeaseManager(
        url=backend_url,
        config=LeaseConfig(key_prefix=key_prefix),
        meter_provider=MeterProvider(metric_readers=[reader]),
    )
    per_minute = RateLimit("per_minute", 5, per=60)
    # A policy's own thresholds count in the metric as the manager's do.
    halfway = RateLimit("halfway_per_minute", 10, per=60, alert_at=(0.5,))
    for who in (ALICE, BOB):
        for _ in range(5):
            await manager.hit(who, per_minute, halfway)
    data = reader.get_metrics_data()
    counted = {
        (tuple(sorted(point.attributes.items())), point.value)
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == f"{NAME}.rate.threshold_crossed"
        for point in metric.data.data_points
    }
    assert counted == {
        ((("policy", "per_minute"), ("threshold", 0.8)), 2),
        ((("policy", "per_minute"), ("threshold", 1.0)), 2),
        ((("policy", "halfway_per_minute"), ("threshold", 0.5)), 2),
    }
    await manager.aclose()


async def test_a_policys_own_alert_at_overrides_the_managers_and_an_empty_one_silences_it(
    backend_url, key_prefix
):
    """Thresholds given to one policy (``RateLimit(alert_at=...)``) were ignored: every policy
    alerted at the manager's. A policy with its own is told at those, one without at the
    manager's, and one with ``alert_at=()`` never."""
    manager, told = alerting_manager(backend_url, key_prefix, alert_at=(0.8,))
    own = RateLimit("own_per_hour", 10, per=3600, alert_at=(0.9, 0.5))
    managed = RateLimit("managed_per_hour", 10, per=3600)
    silent = RateLimit("silent_per_hour", 10, per=3600, alert_at=())
    assert (own.alert_at, managed.alert_at, silent.alert_at) == ((0.5, 0.9), None, ())
    assert "alert_at=(0.5, 0.9)" in repr(own) and "alert_at=()" in repr(silent)
    assert own != RateLimit("own_per_hour", 10, per=3600)
    for cost in (5, 4, 1):  # 5 (50 %), 9 (80 %, 90 %), 10 (100 %)
        decisions = await manager.hit(ALICE, own, managed, silent, cost=cost)
    assert [d.policy for d in decisions] == [own, managed, silent]
    # Bob's hit, queued after Alice's, is told after them: every alert of Alice's is in.
    await manager.hit(BOB, managed, cost=8)
    await told_about(told, manager._core.identity_digest(BOB), 1)
    alice = manager._core.identity_digest(ALICE)
    assert [(a.policy, a.threshold, a.used) for a in told if a.identity_hash == alice] == [
        ("own_per_hour", 0.5, 5),
        ("own_per_hour", 0.9, 9),
        ("managed_per_hour", 0.8, 9),
    ]
    await manager.aclose()


@pytest.mark.parametrize(
    "alert_at, complaint",
    [
        ((0.8, 0), "above 0"),
        ((-1,), "above 0"),
        ((0.8, 101), "at most 100"),
        ((0.8, float("nan")), "above 0"),
        (tuple(n / 20 for n in range(1, 18)), "at most 16 fractions"),
        ("0.8", "sequence"),
        ((0.8, "x"), "fractions"),
    ],
)
@pytest.mark.parametrize(
    "build",
    [
        lambda alert_at: StreamLeaseManager(alert_at=alert_at),
        lambda alert_at: RateLimit("per_hour", 10, per=3600, alert_at=alert_at),
    ],
    ids=["manager", "policy"],
)
def test_alert_at_that_is_not_fractions_above_zero_is_refused_with_what_to_pass(
    build, alert_at, complaint
):
    with pytest.raises((TypeError, ValueError), match=complaint):
        build(alert_at)
