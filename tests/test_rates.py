"""Request-rate limits: several policies per hit, all or nothing, exact across workers.
Each behavioural test runs on the embedded store and on a real Redis."""

from __future__ import annotations

import asyncio
import gc
import json
import math
import random
import re
import time
from collections.abc import Awaitable
from datetime import datetime, timedelta, timezone

import pytest

from fastapi_stream_lease import (
    BackendUnavailable,
    RateDecision,
    RateLimit,
    RateLimited,
    Resource,
    StreamLeaseManager,
    StreamLeaseRejected,
    ThresholdCrossed,
    _core,
    rate_limit_headers,
)

from support.apps import app_command
from support.calendar import COUNTDOWN_SLACK_MS, DAY, MONTH, WEEK, boundaries, clock_ms
from support.waiting import eventually

PER_MINUTE = RateLimit("chat_per_minute", 5, per=60)
PER_DAY = RateLimit("chat_per_day", 3, per=86_400, algorithm="fixed_window")


async def test_a_hit_refused_by_one_policy_consumes_from_none(make_manager):
    manager = make_manager()
    for left in (2, 1, 0):
        minute, day = await manager.hit("alice", PER_MINUTE, PER_DAY)
        assert (minute.remaining, day.remaining) == (left + 2, left)
        assert day.limit == 3 and 0 < day.reset <= 86_400
    with pytest.raises(RateLimited) as refused:
        await manager.hit("alice", PER_MINUTE, PER_DAY)
    assert refused.value.policy == "chat_per_day"
    assert 86_000 < refused.value.retry_after <= 86_400
    # The day refused: the minute lost nothing.
    assert (await manager.peek("alice", PER_MINUTE)).remaining == 2
    assert (await manager.hit("alice", PER_MINUTE, cost=2))[0].remaining == 0


async def test_a_hits_awaitable_serves_wherever_asyncio_takes_a_future(make_manager):
    """A hit decided without waiting (the embedded store, units held here) returns an
    awaitable already resolved, not a future of the loop: it must still be awaitable twice, with
    the same outcome, and taken by ``gather``, ``wait_for`` and ``ensure_future``."""
    manager = make_manager()
    once = RateLimit("once", 1, per=60)
    hit = manager._core.hit("alice", (once,), 1, True)
    first, again = await hit, await hit
    assert first == again and first[0].used == 1
    refused = manager._core.hit("alice", (once,), 1, True)
    for _ in range(2):
        with pytest.raises(RateLimited):
            await refused
    per_minute = RateLimit("per_minute", 10, per=60)
    (gathered,) = await asyncio.gather(manager._core.hit("bob", (per_minute,), 1, True))
    waited = await asyncio.wait_for(manager._core.hit("bob", (per_minute,), 1, True), 5)
    ensured = await asyncio.ensure_future(manager._core.hit("bob", (per_minute,), 1, True))
    assert [d[0].used for d in (gathered, waited, ensured)] == [1, 2, 3]


async def test_a_hit_allowed_without_waiting_reaches_the_forms_as_its_decisions():
    """The forms take a hit that nothing waits for as its decisions, with no awaitable (so no
    coroutine of theirs runs for it); a refused one as an awaitable that raises the refusal."""
    manager = StreamLeaseManager(url="memory://")
    once = RateLimit("once", 1, per=60)
    await manager.hit("warm-up", once)  # telemetry looked for: none, so nothing to tell
    decided = manager._hit_now("alice", (once,), 1)
    assert isinstance(decided, list) and decided[0].used == 1
    refused = manager._hit_now("alice", (once,), 1)
    assert not isinstance(refused, list)
    with pytest.raises(RateLimited) as raised:
        await refused
    assert raised.value.decisions[0].remaining == 0
    await manager.aclose()


async def test_the_forms_hits_are_told_to_a_listener():
    """With ``on_threshold``, a form's hit goes through ``hit``, which tells the thresholds
    it reached, even when nothing waits for its decisions."""
    told: list[ThresholdCrossed] = []

    async def on_threshold(alert: ThresholdCrossed) -> None:
        told.append(alert)

    manager = StreamLeaseManager(url="memory://", on_threshold=on_threshold)
    twice = RateLimit("twice", 2, per=60, alert_at=(0.5,))
    await manager.hit("warm-up", RateLimit("other", 1, per=60, alert_at=()))
    decided = manager._hit_now("alice", (twice,), 1)
    assert not isinstance(decided, list)
    assert (await decided)[0].used == 1
    await eventually(lambda: len(told) == 1)
    assert told[0].policy == "twice" and told[0].threshold == 0.5
    await manager.aclose()


async def test_refusals_caught_where_they_were_awaited_leave_nothing_alive(make_manager):
    """Regression: an awaitable already resolved with a refusal held its error where the cycle
    collector could not see it; the error's traceback holds the frames that awaited it, one of
    them held the awaitable, and so every refusal an app caught stayed alive, with its request."""
    manager = make_manager(max_per_user=1)
    held = await manager.acquire("alice")
    once = RateLimit("once", 1, per=60)
    await manager.hit("bob", once)

    async def refused(attempt: Awaitable[object]) -> None:
        try:
            await attempt
        except StreamLeaseRejected:
            pass

    for _ in range(20):
        await refused(manager.acquire("alice"))
        await refused(manager.hit("bob", once))
        await refused(manager._core.hit("bob", (once,), 1, True))
    await asyncio.sleep(0)  # the loop lets go of the last future's callback
    gc.collect()
    alive = [o for o in gc.get_objects() if isinstance(o, StreamLeaseRejected)]
    assert not alive
    await held.release()


async def test_a_decision_shows_the_rate_limit_the_app_passed(make_manager):
    manager = make_manager()
    minute, team = RateLimit("per_minute", 5, per=60), RateLimit("team", 50, per=60)
    decisions = await manager.hit("alice", minute, (team, "team-1"))
    assert decisions[0].policy is minute and decisions[1].policy is team, "none made per hit"
    dry = make_manager(enforce_rate_limits=False)
    (decision,) = await dry.hit("alice", minute)
    assert decision.policy == RateLimit("per_minute", 5, per=60, enforce=False), (
        "the manager's dry run shows in it")


async def test_simultaneous_hits_admit_exactly_the_limit(make_manager):
    manager = make_manager()
    burst = RateLimit("burst", 10, per=60)
    results = await asyncio.gather(
        *(manager.hit(f"user{i % 2}", burst) for i in range(200)), return_exceptions=True
    )
    admitted = [r for r in results if isinstance(r, list)]
    refused = [r for r in results if isinstance(r, RateLimited)]
    assert (len(admitted), len(refused)) == (20, 180)  # 10 each for two users


async def test_hits_made_together_go_out_together_each_decided(make_redis_manager):
    """While a hit call is in flight the next hits queue and go in one call, decided one after
    the other: exactly the limit is admitted."""
    manager = make_redis_manager()
    burst = RateLimit("burst", 10, per=60)
    calls_before = manager.stats()["redis_calls"]
    results = await asyncio.gather(
        *(manager.hit("alice", burst) for _ in range(50)), return_exceptions=True
    )
    assert sum(isinstance(r, list) for r in results) == 10
    assert sum(isinstance(r, RateLimited) for r in results) == 40
    assert manager.stats()["redis_calls"] - calls_before < 50


async def test_hits_from_four_processes_admit_exactly_the_limit(redis_server, key_prefix):
    processes = [
        await asyncio.create_subprocess_exec(
            *app_command("hit_burst", redis_server.url, key_prefix, "50"),
            stdout=asyncio.subprocess.PIPE,
        )
        for _ in range(4)
    ]
    outputs = [await asyncio.wait_for(p.communicate(), 60) for p in processes]
    admitted = sum(int(out.split()[0]) for out, _ in outputs)
    assert admitted == 10
    assert all(p.returncode == 0 for p in processes)


@pytest.mark.parametrize("algorithm", ["sliding_window", "fixed_window"])
async def test_a_fresh_allowance_after_the_window(make_manager, algorithm):
    manager = make_manager()
    short = RateLimit("short", 2, per=0.5, algorithm=algorithm)
    await manager.hit("alice", short)
    await manager.hit("alice", short)
    with pytest.raises(RateLimited) as refused:
        await manager.hit("alice", short)
    assert refused.value.retry_after == 1  # whole seconds, never 0

    async def allowed() -> bool:
        try:
            await manager.hit("alice", short)
        except RateLimited:
            return False
        return True

    await eventually(allowed, what="a fresh allowance")


async def test_users_and_scopes_have_separate_counters(make_manager):
    manager = make_manager()
    one = RateLimit("scope_a", 1, per=60)
    other = RateLimit("scope_b", 1, per=60)
    longer = RateLimit("scope_a", 1, per=120)  # same name, another window: another counter
    await manager.hit("alice", one)
    await manager.hit("bob", one)
    await manager.hit("alice", other)
    await manager.hit("alice", longer)
    with pytest.raises(RateLimited):
        await manager.hit("alice", one)


async def test_peek_consumes_nothing_and_reset_gives_a_fresh_allowance(make_manager):
    manager = make_manager()
    limit = RateLimit("login_per_ip", 2, per=60)
    assert await manager.peek("10.0.0.7", limit) == RateDecision(limit, 2, 2, 0.0, 0)
    await manager.hit("10.0.0.7", limit, cost=2)
    assert (await manager.peek("10.0.0.7", limit)).remaining == 0
    assert (await manager.peek("10.0.0.7", limit)).remaining == 0
    await manager.reset("10.0.0.7", limit)
    assert (await manager.peek("10.0.0.7", limit)).remaining == 2


async def test_limits_up_to_a_trillion_count_exactly(make_manager):
    manager = make_manager()
    huge = RateLimit("bytes_per_day", 10**12, per=86_400)
    (decision,) = await manager.hit("alice", huge, cost=10**12 - 1)
    assert decision.remaining == 1
    await manager.hit("alice", huge)
    with pytest.raises(RateLimited):
        await manager.hit("alice", huge)


async def test_a_refusal_answers_429_with_headers_and_the_violated_policy(make_manager):
    manager = make_manager()
    await manager.hit("alice", PER_MINUTE, cost=5)
    with pytest.raises(RateLimited) as refused:
        await manager.hit("alice", PER_MINUTE, PER_DAY)
    response = refused.value.as_response()
    assert response.status_code == 429
    # Slices of a tenth of the window count whole: the units leave within 60 to 66 s.
    assert 59 <= int(response.headers["Retry-After"]) <= 66
    assert response.headers["RateLimit-Policy"] == (
        '"chat_per_minute";q=5;w=60, "chat_per_day";q=3;w=86400'
    )
    minute, day = response.headers["RateLimit"].split(", ")
    assert minute.startswith('"chat_per_minute";r=0;t=') and day == '"chat_per_day";r=3;t=0'
    body = json.loads(response.body)
    assert body["violated-policies"] == ["chat_per_minute"] and body["status"] == 429


async def test_a_counter_found_without_expiry_is_repaired(make_redis_manager, redis_client,
                                                          key_prefix):
    manager = make_redis_manager()
    for limit in (PER_MINUTE, PER_DAY):
        await manager.hit("alice", limit)
        (key,) = redis_client.keys(f"{{{key_prefix}}}:rate:{limit.name}:*")
        redis_client.persist(key)  # an operator, a restore or a bug left it without one
        assert redis_client.pttl(key) == -1
        await manager.peek("alice", limit)
        assert 0 < redis_client.pttl(key) <= math.ceil(limit.per * 1.1 * 1000)
        assert "alice" not in key.decode(), "identities are hashed"


async def test_a_fixed_counter_kept_as_a_string_counts_on_as_a_hash(make_redis_manager,
                                                                    redis_client, key_prefix):
    """A fixed window's counter kept as a string (its units; its window's end in its expiry), as
    a rolling upgrade finds one in a live Redis, neither fails a call (WRONGTYPE) nor loses its
    units: the first call that reads it rewrites it as the hash, its end kept (a full window from
    then when it had none)."""
    manager = make_redis_manager()
    await manager.hit("alice", PER_DAY)
    (key,) = redis_client.keys(f"{{{key_prefix}}}:rate:{PER_DAY.name}:*")
    redis_client.delete(key)
    redis_client.set(key, 2, px=50_000)
    assert (await manager.peek("alice", PER_DAY)).remaining == 1
    assert redis_client.type(key) == b"hash" and 0 < redis_client.pttl(key) <= 50_000
    (decision,) = await manager.hit("alice", PER_DAY)
    assert decision.remaining == 0 and 0 < decision.reset <= 50
    with pytest.raises(RateLimited):
        await manager.hit("alice", PER_DAY)
    redis_client.delete(key)
    redis_client.set(key, 3)  # and one without an expiry: its units count for a full window
    with pytest.raises(RateLimited):
        await manager.hit("alice", PER_DAY)
    assert redis_client.type(key) == b"hash" and 0 < redis_client.pttl(key) <= 86_400_000


async def test_closed_refuses_and_open_counts_a_local_share_while_redis_is_down(
        own_redis, make_own_redis_manager):
    closed = make_own_redis_manager(redis_timeout=0.5)
    opened = make_own_redis_manager(redis_timeout=0.5, failure_mode="open", fallback_workers=2)
    limit = RateLimit("per_minute", 5, per=60)
    own_redis.stop()
    with pytest.raises(BackendUnavailable):
        await closed.hit("alice", limit)
    # Half of 5, rounded down: the two workers together never allow more than the limit.
    (decision,) = await opened.hit("alice", limit)
    assert (decision.limit, decision.remaining) == (2, 1)
    await opened.hit("alice", limit)
    with pytest.raises(RateLimited):
        await opened.hit("alice", limit)



async def test_a_paused_redis_answers_within_the_timeout_under_each_mode(
        own_redis, make_own_redis_manager):
    closed = make_own_redis_manager(redis_timeout=0.3)
    opened = make_own_redis_manager(redis_timeout=0.3, failure_mode="open")
    limit = RateLimit("per_minute", 5, per=60)
    own_redis.pause()  # SIGSTOP: connections hang, nothing is refused
    try:
        with pytest.raises(BackendUnavailable):
            await closed.hit("alice", limit)
        (decision,) = await opened.hit("alice", limit)  # one worker: the whole limit, locally
        assert (decision.limit, decision.remaining) == (5, 4)
    finally:
        own_redis.resume()
    # Back: counted in Redis again (the breaker lets a probe through within 5 s).
    async def counted_in_redis() -> bool:
        try:
            return (await closed.hit("alice", limit))[0].remaining == 4
        except BackendUnavailable:
            return False

    await eventually(counted_in_redis, what="Redis to count again")

@pytest.mark.parametrize(
    ("args", "kwargs", "error", "message"),
    [
        (("a", 0), {"per": 60}, ValueError, "limit=0 is out of range"),
        (("a", -1), {"per": 60}, ValueError, "limit=-1 is out of range"),
        (("a", True), {"per": 60}, TypeError, "limit must be an int"),
        (("a", 10**13), {"per": 60}, ValueError, "out of range"),
        (("a", 5), {"per": 0}, ValueError, "per=0 s is out of range"),
        (("a", 5), {"per": float("nan")}, ValueError, "per must be finite"),
        (("a", 5), {"per": 400 * 86_400}, ValueError, "one year"),
        (("a", 5), {"per": [60]}, TypeError, "per must be a number"),
        (
            ("a", 5),
            {"per": "fortnight"},
            ValueError,
            re.escape('per="fortnight" is not a window: use "second", "minute", "hour", "day"'),
        ),
        (("a", 5), {"per": "60"}, ValueError, "or a number of seconds"),
        (
            ("a", 5),
            {"per": "day", "algorithm": "sliding_window"},
            ValueError,
            "a calendar window, a fixed window: leave algorithm out",
        ),
        (("a", 5), {"per": 60, "algorithm": "leaky"}, ValueError, "unknown algorithm"),
        (("a b", 5), {"per": 60}, ValueError, "name 'a b' is not valid|\"a b\" is not valid"),
        ((7, 5), {"per": 60}, TypeError, "name must be a str"),
        (
            ("tpm", 5),
            {"per": 60, "unit": "tokens", "enforce": False},
            ValueError,
            "enforce=False is for request rates only",
        ),
        (("a", 5), {"per": 60, "enforce": 0}, TypeError, "enforce must be a boolean"),
    ],
)
def test_bad_policies_are_refused_at_construction(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        RateLimit(*args, **kwargs)


@pytest.mark.parametrize(
    ("identity", "policies", "cost", "error", "message"),
    [
        ("alice", (PER_MINUTE, PER_MINUTE), 1, ValueError, "given twice"),
        ("alice", (PER_MINUTE,), 6, ValueError, "could never be allowed"),
        ("alice", (PER_MINUTE,), -1, ValueError, "cost=-1 is out of range"),
        ("alice", (), 1, ValueError, "at least one RateLimit"),
        ("alice", ("per_minute",), 1, TypeError, "must be RateLimit values"),
        ("", (PER_MINUTE,), 1, ValueError, "user_id is empty"),
        ("x" * 2000, (PER_MINUTE,), 1, ValueError, "more than the 1024 allowed"),
        (None, (PER_MINUTE,), 1, TypeError, "needs an identity"),
    ],
)
async def test_bad_hits_are_refused_and_consume_nothing(make_manager, identity, policies, cost,
                                                        error, message):
    manager = make_manager()
    with pytest.raises(error, match=message):
        await manager.hit(identity, *policies, cost=cost)
    assert (await manager.peek("alice", PER_MINUTE)).remaining == 5


def test_policies_are_values():
    assert RateLimit("a", 5, per=60) == RateLimit("a", 5, per=60.0, algorithm="sliding_window")
    assert len({RateLimit("a", 5, per=60), RateLimit("a", 5, per=60)}) == 1
    assert repr(PER_DAY) == "RateLimit('chat_per_day', 3, per=86400.0, algorithm='fixed_window')"
    dry = RateLimit("a", 5, per=60, enforce=False)
    assert (dry.enforce, RateLimit("a", 5, per=60).enforce) == (False, True)
    assert dry != RateLimit("a", 5, per=60)
    assert repr(dry) == "RateLimit('a', 5, per=60.0, algorithm='sliding_window', enforce=False)"


@pytest.mark.parametrize(
    ("written", "as_numbers"),
    [
        (("chat", "5/minute"), RateLimit("chat", 5, per=60)),
        (("chat", "100 per hour"), RateLimit("chat", 100, per=3600)),
        (("chat", "10/30 seconds"), RateLimit("chat", 10, per=30)),
        (("chat", "1000/day"), RateLimit("chat", 1000, per="day")),
        (("chat", 5, "minute"), RateLimit("chat", 5, per=60)),
        (("chat", 5, "second"), RateLimit("chat", 5, per=1)),
        (("chat", 5, "2 hours"), RateLimit("chat", 5, per=7200)),
    ],
)
def test_the_notation_of_limits_and_slowapi_is_the_same_policy(written, as_numbers):
    """``RateLimit("x", "5/minute")`` said "missing argument 'per'", and ``per="minute"`` was a
    ValueError while ``per="day"`` worked."""
    assert RateLimit(*written) == as_numbers


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "message"),
    [
        (("a", "5/fortnight"), {}, ValueError, 'write a count per window, as "5/minute"'),
        (("a", "five a minute"), {}, ValueError, 'cannot read "five a minute" as a rate'),
        (("a", "0/minute"), {}, ValueError, "limit=0 is out of range"),
        (("a", "5/year"), {}, ValueError, r"per=365 \* 86400"),
        (("a", "5/minute"), {"per": 60}, TypeError, "names its window: leave per out"),
        (("a", 5), {}, TypeError, 'per=60 \\(seconds\\), per="minute"'),
        (("a", "5/day"), {"algorithm": "sliding_window"}, ValueError, "a calendar window"),
    ],
)
def test_a_rate_that_cannot_be_read_shows_the_accepted_forms(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        RateLimit(*args, **kwargs)


#: A new rule rolled out as a dry run, beside the rule in force.
NEW_RULE = RateLimit("new_rule", 2, per=60, enforce=False)
OLD_RULE = RateLimit("old_rule", 4, per=60)


async def test_a_dry_run_over_its_limit_counts_every_hit_and_never_refuses(make_manager):
    """A dry-run policy past its limit lets hits through and says it would have refused;
    the enforced policy beside it still refuses, and a refused hit takes nothing from either."""
    manager = make_manager()
    seen = []
    for _ in range(4):
        new, old = await manager.hit("alice", NEW_RULE, OLD_RULE)
        assert not old.would_refuse
        seen.append((new.used, new.remaining, new.would_refuse))
    assert seen == [(1, 1, False), (2, 0, False), (3, 0, True), (4, 0, True)]
    with pytest.raises(RateLimited) as refused:
        await manager.hit("alice", NEW_RULE, OLD_RULE)
    assert refused.value.policy == "old_rule"
    assert [d.would_refuse for d in refused.value.decisions] == [True, True]
    assert (await manager.peek("alice", NEW_RULE)).used == 4, "the refused hit took nothing"


async def test_a_dry_run_over_its_limit_never_refuses_a_stream_start(make_manager):
    manager = make_manager(max_per_user=10)
    leases = [await manager.acquire("alice", rate_limits=[NEW_RULE, OLD_RULE]) for _ in range(4)]
    assert [lease.rate_decisions[0].would_refuse for lease in leases] == [False, False, True, True]
    assert leases[-1].rate_decisions[0].used == 4
    with pytest.raises(RateLimited) as refused:
        await manager.acquire("alice", rate_limits=[NEW_RULE, OLD_RULE])
    assert refused.value.policy == "old_rule"
    assert await manager.get_active_count("alice") == 4
    assert (await manager.peek("alice", NEW_RULE)).used == 4, "the refused start took nothing"
    for lease in leases:
        await lease.release()


async def test_enforce_rate_limits_false_makes_every_request_rate_a_dry_run(make_manager):
    """The manager-wide switch: every request rate of hits and starts counts and reports but
    never refuses; a token budget still refuses."""
    manager = make_manager(enforce_rate_limits=False)
    assert not manager.config.enforce_rate_limits
    assert "enforce_rate_limits=False" in repr(manager.config)
    one = RateLimit("one_per_minute", 1, per=60)
    decisions = [(await manager.hit("alice", one))[0] for _ in range(3)]
    assert [(d.used, d.would_refuse, d.policy.enforce) for d in decisions] == [
        (1, False, False),
        (2, True, False),
        (3, True, False),
    ]
    lease = await manager.acquire("alice", rate_limits=[one])
    assert lease.rate_decisions[0].would_refuse
    tokens = RateLimit("tokens_per_minute", 100, per=60, unit="tokens")
    held = await manager.acquire("bob", budgets=[tokens], reserve=60)
    with pytest.raises(RateLimited) as refused:
        await manager.acquire("bob", budgets=[tokens], reserve=60)
    assert refused.value.policy == "tokens_per_minute"
    await held.release()
    await lease.release()


async def test_a_stream_refused_a_slot_consumes_no_rate(make_manager):
    manager = make_manager(max_per_user=1)
    starts = RateLimit("starts_per_minute", 5, per=60)
    lease = await manager.acquire("alice", rate_limits=[starts])
    (decision,) = lease.rate_decisions
    assert (decision.policy, decision.remaining) == (starts, 4)
    with pytest.raises(StreamLeaseRejected):
        await manager.acquire("alice", rate_limits=[starts])
    assert (await manager.peek("alice", starts)).remaining == 4
    await lease.release()


async def test_a_start_refused_for_rate_takes_no_slot_nor_waits(make_manager):
    manager = make_manager(max_global=10)
    starts = RateLimit("starts_per_minute", 1, per=60)
    await (await manager.acquire("alice", rate_limits=[starts])).release()
    with pytest.raises(RateLimited) as refused:
        await manager.acquire("alice", wait_timeout=30, rate_limits=[starts, PER_DAY])
    assert refused.value.policy == "starts_per_minute"
    assert [d.remaining for d in refused.value.decisions] == [0, 3]
    assert await manager.get_active_count("alice") == 0
    assert await manager.get_active_count() == 0
    assert manager.stats()["waiting"] == 0
    assert (await manager.peek("alice", PER_DAY)).remaining == 3, "nothing consumed"
    lease = await manager.acquire("bob", rate_limits=[starts])  # bob has his own counter
    await lease.release()


async def test_rate_limits_need_a_user(make_manager):
    manager = make_manager()
    with pytest.raises(ValueError, match="pass a user_id with them"):
        await manager.acquire(None, resources=[Resource(1, "db")], rate_limits=[PER_DAY])
    with pytest.raises(TypeError, match="must be RateLimit values"):
        await manager.acquire("alice", rate_limits=["per_minute"])
    assert manager.stats()["held"] == 0


async def test_open_mode_counts_starts_against_a_local_share(own_redis, make_own_redis_manager):
    manager = make_own_redis_manager(redis_timeout=0.5, failure_mode="open", fallback_workers=2)
    starts = RateLimit("starts_per_minute", 3, per=60)
    own_redis.stop()
    lease = await manager.acquire("alice", rate_limits=[starts])
    assert [(d.limit, d.remaining) for d in lease.rate_decisions] == [(1, 0)]
    with pytest.raises(RateLimited):
        await manager.acquire("alice", rate_limits=[starts])
    await lease.release()


async def test_a_login_counts_per_ip_and_per_user_and_ip_in_one_step(make_manager):
    manager = make_manager()
    per_ip = RateLimit("login_ip_per_minute", 3, per=60)
    per_user_ip = RateLimit("login_user_ip_per_minute", 2, per=60)

    async def attempt(username: str) -> None:
        ip = "198.51.100.7"
        await manager.hit(ip, per_ip, (per_user_ip, f"{username}|{ip}"))

    await attempt("alice")
    await attempt("alice")
    with pytest.raises(RateLimited) as refused:
        await attempt("alice")  # alice's pair is spent; the IP is not charged for it
    assert refused.value.policy == "login_user_ip_per_minute"
    assert (await manager.peek("198.51.100.7", per_ip)).remaining == 1
    await attempt("bob")  # another user from the same address: the IP's last one
    with pytest.raises(RateLimited) as refused:
        await attempt("carol")
    assert refused.value.policy == "login_ip_per_minute"
    with pytest.raises(ValueError, match='rate limit "login_user_ip_per_minute" is empty'):
        await manager.hit("198.51.100.7", per_ip, (per_user_ip, ""))


DAILY = RateLimit("chat_daily", 3, per="day")


async def test_a_calendar_day_resets_at_midnight_utc_not_a_day_after_its_first_hit(
        make_manager, backend_url):
    """A day window's counter ends at the next midnight UTC: its reset, the headers' ``t`` and
    ``usage()`` count down to that boundary, whenever the first hit came."""
    manager = make_manager()
    before = clock_ms(backend_url)
    (decision,) = await manager.hit("alice", DAILY)
    after = clock_ms(backend_url)
    midnight = boundaries(after)[DAY]
    if boundaries(before)[DAY] != midnight:
        pytest.skip("the hit straddled midnight UTC")
    # The reply's reset is whole ms to the boundary, from a time between the two readings.
    assert midnight - after <= round(decision.reset * 1000) <= midnight - before
    assert (decision.limit, decision.remaining, DAILY.calendar) == (3, 2, "day")
    usage = (await manager.usage("alice", DAILY))["chat_daily"]
    assert usage.used == 1
    countdown = round(usage.reset * 1000)
    assert midnight - clock_ms(backend_url) - COUNTDOWN_SLACK_MS <= countdown <= midnight - before
    headers = rate_limit_headers([decision])
    assert headers["RateLimit-Policy"] == '"chat_daily";q=3;w=86400'
    assert headers["RateLimit"] == f'"chat_daily";r=2;t={math.ceil(decision.reset)}'
    await manager.hit("alice", DAILY, cost=2)
    with pytest.raises(RateLimited) as refused:
        await manager.hit("alice", DAILY)
    assert "(3 per UTC day)" in str(refused.value)
    assert refused.value.retry_after <= math.ceil((midnight - before) / 1000)


@pytest.mark.parametrize(("period", "which"), [("week", WEEK), ("month", MONTH)])
async def test_a_calendar_weeks_and_months_reset_is_at_the_boundary_on_the_stores_clock(
        make_manager, backend_url, period, which):
    limit = RateLimit(f"per_{period}", 10, per=period)
    manager = make_manager()
    before = clock_ms(backend_url)
    (decision,) = await manager.hit("alice", limit)
    after = clock_ms(backend_url)
    end = boundaries(after)[which]
    if boundaries(before)[which] != end:
        pytest.skip(f"the hit straddled a {period}'s end")
    assert end - after <= round(decision.reset * 1000) <= end - before
    assert repr(limit) == f"RateLimit('per_{period}', 10, per='{period}', algorithm='fixed_window')"


# One policy of each window kind for the randomized bound: short windows where the test runs
# across several of them, calendar periods (whose boundary the test cannot move) as they are.
WINDOW_KINDS = {
    "sliding": RateLimit("random_sliding", 12, per=0.3),
    "fixed": RateLimit("random_fixed", 12, per=0.3, algorithm="fixed_window"),
    "day": RateLimit("random_day", 40, per="day"),
    "week": RateLimit("random_week", 40, per="week"),
    "month": RateLimit("random_month", 40, per="month"),
}


def worst_window(hits: list[tuple[float, float, int]], per: float) -> int:
    """The most units of ``hits`` (sent, answered, cost; the server counted each in between)
    sure to fall within one window of ``per`` seconds: those sent and answered within ``per``
    of one hit's sending."""
    return max(
        sum(cost for sent, answered, cost in hits if start <= sent and answered < start + per)
        for start, _, _ in hits
    )


def units_per_window(ends: list[tuple[float, int]], gap: float) -> list[int]:
    """The units of each fixed window, from each allowed hit's (window end as the hit saw it:
    sent plus its ``reset``, cost); ends closer than ``gap`` are one window's."""
    windows: list[list[float | int]] = []
    for end, cost in sorted(ends):
        if windows and end - windows[-1][0] < gap:
            windows[-1][1] += cost
        else:
            windows.append([end, cost])
    return [int(units) for _, units in windows]


@pytest.mark.parametrize(
    "kind, seed", [("sliding", 1), ("fixed", 2), ("day", 3), ("week", 4), ("month", 5)]
)
async def test_random_hits_of_several_workers_hold_each_window_kinds_bound(
    make_manager, backend_url, kind, seed
):
    """Hits of random costs at random times from three managers (one on the embedded store)
    against one policy, by the hits' own counts: a sliding window never holds more than
    ``limit`` in any ``per`` seconds; a fixed window and a calendar day, week or month never
    count more than ``limit`` in one window."""
    rng = random.Random(seed)
    policy = WINDOW_KINDS[kind]
    managers = [make_manager() for _ in range(1 if backend_url == "memory://" else 3)]
    seconds = 3 * policy.per if policy.calendar is None else 0.2
    lanes = [
        [(rng.choice([0, 0, rng.uniform(0, seconds / 8)]), rng.randint(1, 4)) for _ in range(30)]
        for _ in range(4)
    ]
    allowed: list[tuple[float, float, int]] = []
    ends: list[tuple[float, int]] = []
    refused = 0

    async def lane(manager, hits: list[tuple[float, int]]) -> None:
        nonlocal refused
        for pause, cost in hits:
            await asyncio.sleep(pause)
            sent = time.monotonic()
            try:
                (decision,) = await manager.hit("alice", policy, cost=cost)
            except RateLimited:
                refused += 1
                continue
            allowed.append((sent, time.monotonic(), cost))
            ends.append((sent + decision.reset, cost))

    await asyncio.gather(*(lane(managers[i % len(managers)], hits) for i, hits in enumerate(lanes)))
    assert refused, "the hits ran the policy out"
    if kind == "sliding":
        assert worst_window(allowed, policy.per) <= policy.limit
    else:
        # Fixed windows' ends are a window apart; calendar periods' ends, days at least.
        windows = units_per_window(ends, gap=policy.per / 2)
        assert max(windows) <= policy.limit, windows
        assert kind != "fixed" or len(windows) > 1, "the hits ran across windows"


def calendar_boundaries_in_lua(redis_client, times_ms: list[int]) -> list[list[int]]:
    """The next day, week and month boundaries after each time, as the scripts compute them
    (the calendar arithmetic of the core's prelude, run on the server with ``now`` set)."""
    source = _core._script_source("hit")
    start = source.index("local DAY_MS")
    arithmetic = source[start:source.index("-- One rate policy's counter", start)]
    script = redis_client.register_script(
        "local now\n" + arithmetic + """
local ends = {}
for i = 1, #ARGV do
  now = tonumber(ARGV[i])
  ends[i] = {now + fixed_span('d', 0), now + fixed_span('w', 0), now + fixed_span('m', 0)}
end
return ends"""
    )
    return script(keys=[], args=times_ms)


def test_the_scripts_calendar_ends_days_weeks_and_months_where_pythons_calendar_does(
        redis_client):
    """The server-side calendar arithmetic (midnight UTC, ISO weeks from Monday, months of 28
    to 31 days, leap years, December to January) matches Python's calendar at awkward times."""
    utc = timezone.utc
    moments = [
        datetime(2026, 12, 31, 23, 59, 59, 999_000, tzinfo=utc),
        datetime(2027, 1, 1, tzinfo=utc),
        datetime(2028, 2, 28, 12, tzinfo=utc),
        datetime(2028, 2, 29, 23, 59, tzinfo=utc),
        datetime(2100, 2, 28, 23, tzinfo=utc),
        datetime(2000, 2, 29, tzinfo=utc),
        datetime(2026, 12, 6, 23, 59, tzinfo=utc),  # a Sunday
        datetime(2026, 12, 7, tzinfo=utc),  # a Monday, at its start
        datetime(1970, 1, 1, tzinfo=utc),
    ]
    moments += [datetime(2024, 1, 1, 7, 30, tzinfo=utc) + timedelta(days=13 * i) for i in range(60)]
    times = [int(moment.timestamp() * 1000) for moment in moments]
    assert calendar_boundaries_in_lua(redis_client, times) == [boundaries(t) for t in times]


def test_a_calendar_window_is_a_policy_of_its_own():
    """A calendar day and a fixed 86,400 s window are different policies."""
    fixed_day = RateLimit("chat_daily", 3, per=86_400, algorithm="fixed_window")
    assert DAILY != fixed_day and fixed_day.calendar is None
    assert DAILY == RateLimit("chat_daily", 3, per="day", algorithm="fixed_window")
    assert (DAILY.per, RateLimit("m", 1, per="month").per) == (86_400.0, 31 * 86_400.0)
    assert repr(DAILY) == "RateLimit('chat_daily', 3, per='day', algorithm='fixed_window')"
