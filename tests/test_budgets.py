"""Token budgets for LLM streams: reserved at admission with the lease, charged as
the stream runs, topped up ahead of need, settled at release. Each behavioural test runs on the
embedded store and on a real Redis."""

from __future__ import annotations

import asyncio
import json
import random
import time

import pytest

from fastapi_stream_lease import (
    TOP_UP_INCREMENT,
    BackendUnavailable,
    BudgetExhausted,
    LeaseLost,
    RateLimit,
    RateLimited,
    ReservationTooLarge,
    StreamLeaseRejected,
    openai_rate_limit_headers,
    rate_limit_headers,
)
from fastapi_stream_lease.lease import USAGE_CEILING

from support.apps import app_command
from support.calendar import COUNTDOWN_SLACK_MS, DAY, boundaries, clock_ms
from support.waiting import eventually

TPM = RateLimit("tokens_per_minute", 10_000, per=60, unit="tokens")
TPD = RateLimit("tokens_per_day", 1_000_000, per=86_400, algorithm="fixed_window", unit="tokens")
CHUNK = 5


async def chunks(count: int, pause: float = 0.0):
    for i in range(count):
        yield f"chunk {i}"
        if pause:
            await asyncio.sleep(pause)


async def used(manager, user="alice", budget=TPM) -> int:
    return (await manager.usage(user, budget))[budget.name].used


async def test_a_reservation_counts_at_once_and_the_rest_comes_back_at_release(make_manager):
    manager = make_manager()
    lease = await manager.acquire("alice", budgets=[TPM, TPD], reserve=(300, 700))
    minute, day = lease.rate_decisions
    assert (minute.used, minute.remaining, day.used) == (1000, 9000, 1000)
    streamed = [item async for item in lease.wrap(chunks(40), tokens=lambda _: CHUNK)]
    assert len(streamed) == 40
    usage = await manager.usage("alice", TPM, TPD)
    # Charged the prompt as estimated and the answer as counted; the unused 500 came back.
    assert usage["tokens_per_minute"].used == usage["tokens_per_day"].used == 300 + 40 * CHUNK
    assert manager.stats()["budget_streams"] == 0


async def test_a_calendar_day_budget_counts_to_midnight_utc_and_gives_back_the_unused_rest(
    make_manager, backend_url
):
    """A budget per UTC day takes a reservation into the day ending at the next midnight, and
    the unused rest comes back to that day's counter at release (a bucket named by another end
    would find nothing to give back to)."""
    manager = make_manager()
    per_day = RateLimit("tokens_per_utc_day", 100_000, per="day", unit="tokens")
    before = clock_ms(backend_url)
    lease = await manager.acquire("alice", budgets=[per_day], reserve=(300, 700))
    midnight = boundaries(clock_ms(backend_url))[DAY]
    if boundaries(before)[DAY] != midnight:
        pytest.skip("the admission straddled midnight UTC")
    (day,) = lease.rate_decisions
    assert day.used == 1000
    assert round(day.reset * 1000) <= midnight - before
    streamed = [item async for item in lease.wrap(chunks(40), tokens=lambda _: CHUNK)]
    assert len(streamed) == 40
    usage = (await manager.usage("alice", per_day))["tokens_per_utc_day"]
    assert usage.used == 300 + 40 * CHUNK
    countdown = round(usage.reset * 1000)
    assert midnight - clock_ms(backend_url) - COUNTDOWN_SLACK_MS <= countdown <= midnight - before


async def test_a_stream_beyond_its_reservation_is_topped_up_ahead_of_need(make_manager):
    manager = make_manager()
    lease = await manager.acquire("alice", budgets=[TPM], reserve=50)
    count = 0
    async for _ in lease.wrap(chunks(600, pause=0.001), tokens=lambda _: CHUNK):
        count += 1
    assert count == 600
    assert await used(manager) == 600 * CHUNK


async def test_a_reservation_that_does_not_fit_is_refused_and_takes_nothing(make_manager):
    manager = make_manager(max_per_user=3)
    per_minute = RateLimit("starts_per_minute", 10, per=60)
    held = await manager.acquire("alice", budgets=[TPM], reserve=9_000)
    with pytest.raises(RateLimited) as refused:
        await manager.acquire("alice", rate_limits=[per_minute], budgets=[TPM], reserve=2_000)
    assert refused.value.policy == "tokens_per_minute"
    assert 0 < refused.value.retry_after <= 66
    assert "cannot cover the stream's reservation" in str(refused.value)
    assert await manager.get_active_count("alice") == 1, "no slot taken"
    assert (await manager.peek("alice", per_minute)).remaining == 10, "no start counted"
    assert await used(manager) == 9_000
    await held.release()
    assert await used(manager) == 0, "never started: the whole reservation comes back"


async def test_a_cut_stream_ends_at_its_next_item_after_the_budget_runs_out(make_manager):
    manager = make_manager()
    small = RateLimit("small", 1_000, per=60, unit="tokens")
    lease = await manager.acquire("alice", budgets=[small], reserve=100)
    delivered = 0
    with pytest.raises(BudgetExhausted) as cut:
        async for _ in lease.wrap(chunks(10_000), tokens=lambda _: CHUNK):
            delivered += 1
    assert cut.value.budget == "small" and cut.value.status_code == 429
    assert lease.released and lease.budget_exhausted
    # Every token of the budget went out, and at most one increment (the slack a stream has
    # while its top-up is on its way) and the item it was on beyond.
    assert 1_000 <= delivered * CHUNK <= 1_000 + TOP_UP_INCREMENT + CHUNK
    assert await used(manager, budget=small) == delivered * CHUNK


async def test_consume_raises_once_the_budget_is_gone(make_manager):
    manager = make_manager()
    small = RateLimit("small", 600, per=60, unit="tokens")
    async with manager.lease("alice", budgets=[small], reserve=500) as lease:
        for _ in range(10):
            lease.consume(100)  # past the reservation: the top-up finds 100 left, then none
        with pytest.raises(BudgetExhausted):
            await lease.wait_budget()  # waits for the top-up's answer
        assert lease.budget_exhausted
        with pytest.raises(BudgetExhausted):
            lease.consume(1)
    assert await used(manager, budget=small) == 1_000, "charged what it streamed"


async def test_finish_lets_the_stream_end_and_carries_the_overage(make_manager):
    manager = make_manager()
    small = RateLimit("small", 1_000, per=60, unit="tokens")
    lease = await manager.acquire("alice", budgets=[small], reserve=100, on_budget="finish")
    delivered = [item async for item in lease.wrap(chunks(400), tokens=lambda _: CHUNK)]
    assert len(delivered) == 400
    assert await used(manager, budget=small) == 2_000
    with pytest.raises(RateLimited):  # the next stream waits for the overage to leave
        await manager.acquire("alice", budgets=[small], reserve=1)


async def test_a_cancelled_stream_is_charged_what_it_streamed(make_manager):
    manager = make_manager()
    lease = await manager.acquire("alice", budgets=[TPM], reserve=2_000)
    stream = lease.wrap(chunks(1_000), tokens=lambda _: CHUNK)
    for _ in range(30):
        await anext(stream)
    await stream.aclose()  # what Starlette does when the client goes away
    assert lease.released
    assert await used(manager) == 30 * CHUNK


async def test_the_models_reported_usage_replaces_the_count(make_manager, caplog):
    manager = make_manager()
    split = [
        RateLimit("input", 5_000, per=60, unit="input_tokens"),
        RateLimit("output", 5_000, per=60, unit="output_tokens"),
        TPM,
    ]
    async with manager.lease("alice", budgets=split, reserve=(120, 800)) as lease:
        for _ in range(50):
            lease.consume(2)
        assert lease.tokens_used == (120, 100)
        lease.report_usage(input_tokens=131, output_tokens=103)
    usage = await manager.usage("alice", *split)
    assert [usage[b.name].used for b in split] == [131, 103, 234]
    async with manager.lease("bob", budgets=[TPM], reserve=100) as lease:
        lease.consume(100)
        lease.report_usage(input_tokens=0, output_tokens=10_000_000)  # a bug upstream
    assert "far from the stream's own count" in caplog.text
    assert await used(manager, "bob") == 100 + 4096, "bounded, and logged"


async def test_a_reservation_above_a_whole_limit_is_refused_as_never_fitting(make_manager):
    """A reservation larger than a budget's whole limit, which no window could ever hold, was
    raised as bad input (a ValueError, answered 500) instead of a refusal the client can act
    on: it is ReservationTooLarge (400, no Retry-After), distinct from the 429 of a budget with
    too little left now, and it takes nothing."""
    manager = make_manager()
    with pytest.raises(ReservationTooLarge) as refused:
        await manager.acquire("alice", budgets=[TPD, TPM], reserve=(1, 10_000))
    too_large = refused.value
    assert (too_large.budget, too_large.reservation, too_large.limit) == (TPM.name, 10_001, 10_000)
    assert isinstance(too_large, StreamLeaseRejected)
    assert too_large.status_code == 400 and too_large.headers() == {}
    assert too_large.body()["violated-policies"] == [TPM.name]
    assert "could never be admitted" in str(too_large) and "max_tokens" in str(too_large)
    assert await used(manager, "alice") == 0, "nothing taken"
    lease = await manager.acquire("alice", budgets=[TPM], reserve=(1, 9_999))
    with pytest.raises(RateLimited) as later:
        await manager.acquire("alice", budgets=[TPM], reserve=2)
    assert later.value.status_code == 429 and later.value.retry_after >= 1, "try later"
    await lease.release()


async def test_reserve_auto_takes_the_prompt_and_max_tokens_or_a_default_within_the_budget(
    make_manager,
):
    """reserve="auto" sizes the reservation from the request: the prompt's tokens and its
    max_tokens when given, else the prompt and 1,024 answer tokens, capped by what the smallest
    budget holds after the prompt; a max_tokens no budget window could hold never fits."""
    manager = make_manager()
    small = RateLimit("small_tokens", 600, per=60, unit="tokens")
    request = {"reserve": "auto", "model": "gpt-x", "prompt_tokens": 100}
    reserved = []
    cases = [([TPM], 400), ([TPM], None), ([TPM, small], None)]
    for user, (budgets, max_tokens) in enumerate(cases):
        lease = await manager.acquire(f"u{user}", budgets=budgets, **request, max_tokens=max_tokens)
        reserved.append([d.used for d in lease.rate_decisions])
        await lease.release()
    assert reserved == [[500], [100 + 1_024], [600, 600]]
    with pytest.raises(ReservationTooLarge):
        await manager.acquire("alice", budgets=[TPM], **request, max_tokens=9_901)
    assert await used(manager, "alice") == 0


async def test_bad_budget_input_gets_a_clear_error_and_takes_nothing(make_manager):
    manager = make_manager()
    requests = RateLimit("per_minute", 10, per=60)
    cases = [
        ({"budgets": [requests]}, ValueError, "a budget counts tokens"),
        ({"rate_limits": [TPM]}, ValueError, "pass it in budgets="),
        ({"budgets": [TPM], "reserve": -1}, ValueError, "reserve"),
        ({"budgets": [TPM], "reserve": 1.5}, TypeError, "reserve must be an int"),
        ({"budgets": [TPM], "reserve": (1, 2, 3)}, TypeError, "pair"),
        ({"budgets": [TPM], "on_budget": "stop"}, ValueError, "unknown on_budget"),
        ({"budgets": [TPM], "reserve": "auto"}, ValueError, 'reserve="auto" needs model='),
        ({"budgets": [TPM], "reserve": "more"}, ValueError, """reserve='more' is not a size"""),
        ({"budgets": [TPM], "max_tokens": 10}, ValueError, 'size reserve="auto"'),
        ({"budgets": [TPM], "reserve": 5, "prompt_tokens": 10}, ValueError, 'size reserve="auto"'),
        ({"budgets": [TPM], "reserve": "auto", "model": "m", "max_tokens": -1}, ValueError,
         "max_tokens"),
        ({"reserve": 10}, ValueError, "need budgets="),
        ({"budgets": ["tpm"]}, TypeError, "RateLimit values"),
    ]
    for kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            await manager.acquire("alice", **kwargs)
    with pytest.raises(ValueError, match="unknown unit"):
        RateLimit("x", 1, per=1, unit="bytes")
    assert await manager.get_active_count("alice") == 0
    assert await used(manager) == 0

    plain = await manager.acquire("alice")
    with pytest.raises(RuntimeError, match="no token budget"):
        plain.consume(1)
    await plain.release()
    lease = await manager.acquire("alice", budgets=[TPM], reserve=10)
    for value, error in ((-1, ValueError), (1.5, TypeError), (True, TypeError)):
        with pytest.raises(error):
            lease.consume(value)
    with pytest.raises(ValueError, match="negative"):
        lease.report_usage(input_tokens=-5, output_tokens=1)
    await lease.release()
    with pytest.raises(RuntimeError, match="after the lease was released"):
        lease.consume(1)
    assert await used(manager) == 0


async def test_headers_tell_the_budget_left_after_the_reservation(make_manager):
    manager = make_manager()
    per_minute = RateLimit("per_minute", 10, per=60)
    lease = await manager.acquire("alice", rate_limits=[per_minute], budgets=[TPM], reserve=4_000)
    headers = rate_limit_headers(lease.rate_decisions)
    assert '"tokens_per_minute";q=10000;w=60' in headers["RateLimit-Policy"]
    assert '"tokens_per_minute";r=6000;t=' in headers["RateLimit"]
    openai = openai_rate_limit_headers(lease.rate_decisions)
    assert openai["x-ratelimit-limit-tokens"] == "10000"
    assert openai["x-ratelimit-remaining-tokens"] == "6000"
    assert openai["x-ratelimit-remaining-requests"] == "9"
    assert openai["x-ratelimit-reset-tokens"].endswith("s")
    await lease.release()


async def test_three_workers_stay_within_the_budget_plus_one_increment_per_stream(
    redis_server, key_prefix, make_redis_manager
):
    workers = [
        await asyncio.create_subprocess_exec(
            *app_command("budget_streams", redis_server.url, key_prefix, "6", "4"),
            stdout=asyncio.subprocess.PIPE,
        )
        for _ in range(3)
    ]
    outputs = [await asyncio.wait_for(w.communicate(), 120) for w in workers]
    assert all(w.returncode == 0 for w in workers)
    figures = [tuple(map(int, out.split())) for out, _ in outputs]
    streamed = sum(tokens for tokens, _ in figures)
    concurrent = sum(most for _, most in figures)
    bound = 10_000 + (TOP_UP_INCREMENT + CHUNK) * concurrent
    assert 10_000 <= streamed <= bound, "the streams used the whole budget, and no more"
    assert await used(make_redis_manager()) == streamed, "every stream settled to what it streamed"


async def test_a_killed_workers_stream_stays_charged_its_reservation(
    redis_server, key_prefix, make_redis_manager
):
    holder = await asyncio.create_subprocess_exec(
        *app_command("hold_one_lease", redis_server.url, key_prefix, "budget"),
        stdout=asyncio.subprocess.PIPE,
    )
    assert (await asyncio.wait_for(holder.stdout.readline(), 30)).startswith(b"held")
    holder.kill()  # SIGKILL: no settlement, no release
    await holder.wait()
    manager = make_redis_manager(max_per_user=1, lease_seconds=2)
    await eventually(lambda: _count_is(manager, 0), what="the dead holder's lease to expire")
    # Settled by expiry: the slot is free, and the budget keeps the reservation (1,000 tokens,
    # of which it streamed 300) until the window lets it go.
    assert await used(manager) == 1_000
    async with manager.lease("alice", budgets=[TPM], reserve=9_000):
        pass


async def _count_is(manager, expected: int) -> bool:
    return await manager.get_active_count("alice") == expected


@pytest.mark.parametrize("failure_mode", ["closed", "open"])
async def test_a_stream_survives_a_redis_restart(own_redis, make_own_redis_manager, failure_mode):
    manager = make_own_redis_manager(failure_mode=failure_mode, redis_timeout=0.5)
    lease = await manager.acquire("alice", budgets=[TPM], reserve=100)
    stream = lease.wrap(chunks(10_000), tokens=lambda _: CHUNK)
    for _ in range(40):
        await anext(stream)
    own_redis.restart()  # same port, empty data: the reservation and its counter are gone
    for _ in range(200):  # the stream goes on past its reservation: top-ups reach the new server
        await anext(stream)
    await stream.aclose()

    # The settlement goes after the stream ends; a call that met the restart may have opened
    # the circuit breaker for a moment, and under failure_mode="open" usage() is then answered
    # by this process's floor: wait for Redis's own answer.
    async def settled_in_redis() -> bool:
        stats = manager.stats()
        return not stats["unsettled"] and not stats["breaker_open"] and await used(manager) > 0

    await eventually(settled_in_redis, what="the settlement to reach the new server")
    # What the new server saw: the top-ups after the restart, settled to what was streamed
    # (the refund of a bucket the restart took is nothing to give).
    assert await used(manager) <= 240 * CHUNK, str(manager.stats())


@pytest.mark.parametrize(
    "seed, per", [(1, 60), (2, 60), (3, 60), (4, "day"), (5, "week"), (6, "month")]
)
async def test_random_streams_settle_exactly_and_never_pass_the_bound(
    make_manager, backend_url, seed, per
):
    """Streams of three managers (three holders on Redis; the embedded store is one process's,
    so one there) with random reservations, chunk sizes and
    pauses, some cut by their budget and some closed by their client at random: once all have
    ended, the budget holds exactly what they streamed, and that is at most the budget plus one
    increment and the chunk it was on per stream; in a sliding minute and in a calendar day,
    week and month alike (a calendar window holds the fixed window's bound)."""
    rng = random.Random(seed)
    budget = RateLimit("tokens_per_window", 5_000, per=per, unit="tokens")
    managers = [make_manager(max_per_user=0) for _ in range(1 if backend_url == "memory://" else 3)]
    streamed: list[int] = []
    largest: list[int] = []

    async def one_stream(manager) -> None:
        sizes = [rng.randint(1, 256) for _ in range(rng.randint(1, 60))]
        leaves_after = rng.choice([None, rng.randint(0, len(sizes))])
        try:
            lease = await manager.acquire("alice", budgets=[budget], reserve=rng.randint(0, 800))
        except RateLimited:
            return
        mine = 0
        stream = lease.wrap(
            chunks(len(sizes), pause=rng.choice([0, 0.001, 0.01])),
            tokens=lambda item: sizes[int(item.split()[1])],
        )
        try:
            async for item in stream:
                mine += sizes[int(item.split()[1])]
                if leaves_after is not None and mine >= leaves_after * 100:
                    break
        except BudgetExhausted:
            pass
        finally:
            await stream.aclose()
            streamed.append(mine)
            largest.append(max(sizes))

    before = clock_ms(backend_url)
    await asyncio.gather(*(one_stream(managers[i % len(managers)]) for i in range(40)))
    if budget.calendar and boundaries(before) != boundaries(clock_ms(backend_url)):
        pytest.skip("the streams straddled a calendar boundary")
    assert await used(managers[0], budget=budget) == sum(streamed)
    assert sum(streamed) <= 5_000 + sum(TOP_UP_INCREMENT + chunk for chunk in largest)


async def test_random_streams_through_a_redis_stall_never_undercount(
    own_redis, make_own_redis_manager
):
    """The same random streams while Redis stops answering for a second (calls time out, some
    after they ran): nothing streamed goes uncharged, grants never pass the bound, and every
    settlement lands once Redis is back."""
    rng = random.Random(7)
    budget = RateLimit("tokens_per_minute", 5_000, per=60, unit="tokens")
    managers = [make_own_redis_manager(max_per_user=0, redis_timeout=0.3) for _ in range(2)]
    streamed: list[int] = []
    largest: list[int] = []

    async def one_stream(manager) -> None:
        await asyncio.sleep(rng.uniform(0, 1.5))
        sizes = [rng.randint(1, 64) for _ in range(rng.randint(1, 80))]
        try:
            lease = await manager.acquire("alice", budgets=[budget], reserve=rng.randint(0, 300))
        except (RateLimited, BackendUnavailable):
            return
        mine = 0
        stream = lease.wrap(
            chunks(len(sizes), pause=0.01), tokens=lambda item: sizes[int(item.split()[1])]
        )
        try:
            async for item in stream:
                mine += sizes[int(item.split()[1])]
        except (BudgetExhausted, LeaseLost):
            pass
        finally:
            await stream.aclose()
            streamed.append(mine)
            largest.append(max(sizes))

    async def stall() -> None:
        await asyncio.sleep(0.5)
        own_redis.pause()
        await asyncio.sleep(1.0)
        own_redis.resume()

    await asyncio.gather(stall(), *(one_stream(managers[i % 2]) for i in range(30)))
    for manager in managers:
        await eventually(lambda m=manager: m.stats()["unsettled"] == 0, what="the settlements")
    charged = await used(managers[0], budget=budget)
    assert charged >= sum(streamed), "a call that timed out after it ran only over-counts"
    assert sum(streamed) <= 5_000 + sum(TOP_UP_INCREMENT + chunk for chunk in largest)


# A refund must never land in a counter made again since its charge, a name must not join a
# request rate and a budget, reported figures are bounded even with nothing counted, and a
# settlement given up is counted.

TEN_MIN = RateLimit("tokens_per_10_minutes", 10_000, per=600, unit="tokens")


@pytest.mark.parametrize(
    "window",
    [
        RateLimit("tokens_per_day", 10_000_000, per="day", unit="tokens"),
        RateLimit(
            "tokens_per_10_minutes", 10_000_000, per=600, algorithm="fixed_window", unit="tokens"
        ),
    ],
    ids=["calendar", "fixed"],
)
async def test_reservations_given_back_in_a_big_batch_all_come_back_to_their_window(
    make_redis_manager, redis_server, window
):
    """A fixed window's refund (a calendar period's too) found its window by the time its
    counter had left, read after the script had read its clock: in a big batch, read late, it
    missed by more than the clocks allow and a reservation given back stayed charged to the
    window. A counter keeps its window's end on the scripts' clock, and every reservation comes
    back."""
    manager = make_redis_manager(max_per_user=0, max_global=0)
    users = [f"user-{n}" for n in range(4)]

    async def reserve_and_give_back(user: str) -> None:
        lease = await manager.acquire(user, budgets=[window], reserve=1_000)
        await lease.release()  # nothing streamed: the whole reservation comes back

    before = clock_ms(redis_server.url)
    await asyncio.gather(*(reserve_and_give_back(users[n % 4]) for n in range(1_500)))
    if window.algorithm != "fixed_window" and (
        boundaries(before)[DAY] != boundaries(clock_ms(redis_server.url))[DAY]
    ):
        pytest.skip("the reservations straddled midnight UTC")
    assert [await used(manager, user, window) for user in users] == [0, 0, 0, 0]


async def test_a_refund_never_erases_charges_made_after_a_reset(make_manager):
    manager = make_manager(max_per_user=0)
    early = await manager.acquire("alice", budgets=[TEN_MIN], reserve=5_000)
    await manager.reset("alice", TEN_MIN)  # the same slice, a new counter
    late = await manager.acquire("alice", budgets=[TEN_MIN], reserve=1_000)
    async for _ in late.wrap(chunks(200), tokens=lambda _: CHUNK):
        pass
    early.consume(10)
    await early.release()  # its 4,990 unused belong to the counter the reset dropped
    assert await used(manager, budget=TEN_MIN) == 1_000 + 10, "its 10 streamed tokens count now"


async def test_a_refund_never_erases_charges_made_after_a_redis_restart(
    own_redis, make_own_redis_manager
):
    manager = make_own_redis_manager(max_per_user=0, redis_timeout=0.5)
    early = await manager.acquire("alice", budgets=[TEN_MIN], reserve=5_000)
    own_redis.restart()
    late = None
    for _ in range(100):
        try:
            late = await manager.acquire("alice", budgets=[TEN_MIN], reserve=1_000)
            break
        except BackendUnavailable:
            await asyncio.sleep(0.1)
    assert late is not None
    async for _ in late.wrap(chunks(200), tokens=lambda _: CHUNK):
        pass
    early.consume(10)
    await early.release()
    assert await used(manager, budget=TEN_MIN) == 1_000 + 10, "its 10 streamed tokens count now"


async def test_a_request_rate_and_a_budget_of_one_name_count_apart(make_manager):
    manager = make_manager(max_per_user=0)
    starts = RateLimit("chat", 10, per=60)
    tokens = RateLimit("chat", 10_000, per=60, unit="tokens")
    lease = await manager.acquire("alice", rate_limits=[starts])
    await lease.release()
    lease = await manager.acquire("alice", budgets=[tokens], reserve=500)
    lease.consume(100)
    await lease.release()
    assert (await manager.peek("alice", starts)).used == 1
    assert (await manager.usage("alice", tokens))["chat"].used == 100
    with pytest.raises(ValueError, match="through acquire"):
        await manager.hit("alice", tokens, cost=5)


async def test_a_report_with_nothing_to_compare_with_is_bounded_too(make_manager, caplog):
    manager = make_manager(max_per_user=0)
    async with manager.lease("bob", budgets=[TEN_MIN], reserve=100) as lease:
        lease.consume(100)
        lease.report_usage(input_tokens=10**12, output_tokens=100)  # no prompt estimate
        lease.report_usage(input_tokens=10**12, output_tokens=100)  # never against a report
    assert "far from" in caplog.text
    assert await used(manager, "bob", budget=TEN_MIN) == 100 + USAGE_CEILING


async def test_settlements_still_failing_at_close_are_counted_as_dropped(
    own_redis, make_own_redis_manager
):
    manager = make_own_redis_manager(max_per_user=0, failure_mode="open", redis_timeout=0.3)
    lease = await manager.acquire("alice", budgets=[TEN_MIN], reserve=100)
    own_redis.pause()
    try:
        async for _ in lease.wrap(chunks(400), tokens=lambda _: CHUNK):
            pass  # top-ups granted in the process during the outage
        assert manager.stats()["unsettled"] == 1
        await manager.aclose()  # a deploy during the outage
    finally:
        own_redis.resume()
    assert manager.stats()["settlements_dropped"] == 1, "an under-count, and it says so"


async def test_a_stream_that_outlives_the_window_stays_counted_in_it(make_manager):
    """A reservation is charged to the bucket of its acquire; a stream still using it after that
    bucket left the window would stream uncounted while new streams are admitted against the
    same tokens. Its unused reservation is rolled into the current bucket before that, so in
    every window the streams' own counts stay within the bound."""
    manager = make_manager(max_per_user=0)
    budget = RateLimit("tokens_per_2s", 10_000, per=2, unit="tokens")
    loop = asyncio.get_running_loop()
    start = loop.time()
    stamps: list[tuple[float, int]] = []

    async def stream(reserve: int, count: int, pause: float) -> None:
        try:
            lease = await manager.acquire("alice", budgets=[budget], reserve=reserve)
        except RateLimited:
            return
        try:
            async for _ in lease.wrap(chunks(count, pause=pause), tokens=lambda _: 100):
                stamps.append((loop.time() - start, 100))
        except BudgetExhausted:
            pass

    async def late() -> None:
        await asyncio.sleep(2.5)
        await stream(10_000, 100, 0.0)

    await asyncio.gather(stream(10_000, 100, 0.06), late())
    worst = max(sum(n for t, n in stamps if s <= t < s + 2.0) for s, _ in stamps)
    assert worst <= 10_000 + 2 * (TOP_UP_INCREMENT + 100), f"{worst} tokens in one 2 s window"
    assert await used(manager, budget=budget) <= 10_000 + 2 * (TOP_UP_INCREMENT + 100)


async def test_a_report_below_the_count_never_gives_back_streamed_tokens(make_manager, caplog):
    """A model's usage report replaces the count at settlement; a report of fewer answer tokens
    than were counted as streamed would give back tokens that went out (a quarter of the count
    was accepted, so three quarters of what streamed left the budget while still streaming
    budgets filled again). The count is charged, and the low report is logged as a warning."""
    manager = make_manager(max_per_user=0)
    async with manager.lease("alice", budgets=[TPM], reserve=(100, 500)) as lease:
        for _ in range(100):
            lease.consume(10)
        lease.report_usage(input_tokens=100, output_tokens=250)
        assert lease.tokens_used == (100, 1_000)
    assert "reported output_tokens=250 is below the 1000 tokens counted as streamed" in caplog.text
    assert await used(manager) == 100 + 1_000


# The bound by the streams' own counts. Each token counts in the window of the time it streamed:
# the top-up round moves the tokens streamed since the last round out of their reservation's
# bucket into the current one, and the settlement moves the rest. A sliding window then holds,
# in every interval of its length, at most the budget plus one top-up increment and the chunk it
# was on per concurrent stream; a fixed window the same in each of its windows, counting a token
# streamed in the first round after a window ended in the window before (its reservation's).

#: A top-up round (TOP_UP_EVERY, 0.25 s) and its call, with room for a loaded machine.
ONE_ROUND = 0.5


def most_open(streams: list[dict]) -> int:
    """The most streams open at once."""
    edges = sorted([(s["opened"], 1) for s in streams] + [(s["closed"], -1) for s in streams])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def bound(limit: int, streams: list[dict]) -> int:
    """The budget plus one top-up increment and the largest chunk per concurrent stream."""
    largest = max((s["largest"] for s in streams), default=0)
    return limit + (TOP_UP_INCREMENT + largest) * most_open(streams)


def events_of(streams: list[dict]) -> list[tuple[float, int]]:
    return sorted((t, n) for s in streams for t, n in s["events"])


def worst_interval(events: list[tuple[float, int]], length: float) -> tuple[int, float]:
    """The most tokens streamed within any ``length`` seconds, and when the first of them
    streamed."""
    worst, at, total, first = 0, 0.0, 0, 0
    for t, n in events:
        total += n
        while events[first][0] <= t - length:
            total -= events[first][1]
            first += 1
        if total > worst:
            worst, at = total, events[first][0]
    return worst, at


def worst_fixed_window(streams: list[dict], ends: list[float], length: float) -> tuple[int, float]:
    """The most tokens streamed in one fixed window [end - length, end), and its end, leaving
    out what streams opened in an earlier window streamed in its first round."""

    def in_window(stream: dict, t: float, end: float) -> bool:
        start = end - length
        carried = stream["opened"] < start and t < start + ONE_ROUND
        return start <= t < end and not carried

    return max(
        (
            (sum(n for s in streams for t, n in s["events"] if in_window(s, t, end)), end)
            for end in ends
        ),
        default=(0, 0.0),
    )


async def stream_timed(lease, chunks_: list[int], pause: float) -> dict:
    """Streams ``chunks_`` through ``lease.wrap()``, recording each chunk's time and tokens."""
    record = {"opened": time.time(), "events": [], "cut": False, "largest": max(chunks_)}

    async def source():
        for size in chunks_:
            yield size
            if pause:
                await asyncio.sleep(pause)

    try:
        async for size in lease.wrap(source(), tokens=int):
            record["events"].append((time.time(), size))
    except BudgetExhausted:
        record["cut"] = True
    record["closed"] = time.time()
    return record


async def answer_then_the_next(manager, budget, *, first_after: float, pause: float) -> list[dict]:
    """An answer reserves the whole budget and streams it (after ``first_after`` s, ``pause``
    s between its 100 chunks); the next answer asks for 9,000 tokens from then on until it is
    admitted, and streams them at once."""
    lease = await manager.acquire("alice", budgets=[budget], reserve=budget.limit)
    await asyncio.sleep(first_after)
    streams = [await stream_timed(lease, [budget.limit // 100] * 100, pause)]
    late = await the_next_answer(manager, budget)
    streams.append(await stream_timed(late, [100] * 90, 0))
    return streams


async def the_next_answer(manager, budget: RateLimit):
    """An answer of 9,000 tokens, asked for from now on until it is admitted."""
    deadline = time.monotonic() + 4 * budget.per
    while True:
        try:
            return await manager.acquire("alice", budgets=[budget], reserve=9_000)
        except RateLimited:
            assert time.monotonic() < deadline, "the next answer was never admitted"
            await asyncio.sleep(0.05)


FOUR_SECONDS = RateLimit("tokens_per_4s", 10_000, per=4, unit="tokens")


async def test_tokens_streamed_late_from_an_early_reservation_count_when_they_stream(
    make_manager,
):
    """A stream that reserved the budget and streamed it all a while later left its tokens in
    the bucket of the reservation, which left the window early: the next answer took the whole
    budget again while those tokens were still inside the window (20,000 in one window of a
    10,000 budget)."""
    manager = make_manager(max_per_user=0)
    streams = await answer_then_the_next(manager, FOUR_SECONDS, first_after=1.5, pause=0)
    worst, at = worst_interval(events_of(streams), FOUR_SECONDS.per)
    assert worst <= bound(10_000, streams), f"{worst} tokens in the 4 s from {at}"


async def test_an_answer_streamed_over_a_window_keeps_the_next_one_waiting(make_manager):
    """An answer streamed evenly over a window counted in its reservation's bucket, and only
    the part not yet streamed rolled: the next answer took the whole budget again while most of
    the first was still inside the window (19,000 in one window of a 10,000 budget)."""
    manager = make_manager(max_per_user=0)
    streams = await answer_then_the_next(manager, FOUR_SECONDS, first_after=0, pause=0.04)
    worst, at = worst_interval(events_of(streams), FOUR_SECONDS.per)
    assert worst <= bound(10_000, streams), f"{worst} tokens in the 4 s from {at}"


async def test_a_stream_opened_after_its_process_had_none_open_is_still_counted_as_it_streams(
    make_manager,
):
    """The top-up loop, finding no stream open in its process, slept until a stream needed a
    top-up; a stream opened then that streamed within its reservation was never moved nor
    rolled by a round, so its reservation's bucket left the window while it streamed and
    another answer was admitted over its tokens (12,800 in one second of a 10,000 budget)."""
    manager = make_manager(max_per_user=0)
    budget = RateLimit("tokens_per_second", 10_000, per=1, unit="tokens")
    async with manager.lease("alice", budgets=[budget], reserve=10) as lease:
        lease.consume(10)
    await asyncio.sleep(1.5)  # the reservation leaves the window; the loop finds nothing open
    lease = await manager.acquire("alice", budgets=[budget], reserve=7_000)
    first = asyncio.create_task(stream_timed(lease, [200] * 30, 0.05))
    late = await the_next_answer(manager, budget)
    streams = [await first, await stream_timed(late, [100] * 90, 0)]
    worst, at = worst_interval(events_of(streams), budget.per)
    assert worst <= bound(10_000, streams), f"{worst} tokens in the second from {at}"


async def test_a_reservation_carried_into_the_next_fixed_window_is_taken_again_there(
    make_manager,
):
    """A reservation counted in a fixed window kept covering its stream after that window
    ended, where nothing counted it: the next answer took the whole budget in the new window
    while the first streamed on. The first round after the end takes the rest of the
    reservation again in the new window, so the next answer waits for the one after."""
    manager = make_manager(max_per_user=0)
    budget = RateLimit("tokens_per_2s", 10_000, per=2, algorithm="fixed_window", unit="tokens")
    lease = await manager.acquire("alice", budgets=[budget], reserve=10_000)
    end = time.time() + lease.rate_decisions[0].reset
    await asyncio.sleep(max(0.0, end - 0.3 - time.time()))
    first = asyncio.create_task(stream_timed(lease, [100] * 100, 0.012))  # across the end
    late = await the_next_answer(manager, budget)
    streams = [await first, await stream_timed(late, [100] * 90, 0)]
    worst, at = worst_fixed_window(streams, [end + 2 * i for i in range(4)], 2)
    assert worst <= bound(10_000, streams), f"{worst} tokens in the window ending {at}"


async def run_timelines(
    url: str, key_prefix: str, tmp_path, budget: dict, workers: list
) -> tuple[list[dict], int]:
    """Runs one ``budget_timeline`` process per entry of ``workers`` (its lanes of streams),
    all starting together; returns every stream they admitted, and how many starts the budget
    refused."""
    start = time.time() + 2  # time for the processes to start
    processes = []
    for i, lanes in enumerate(workers):
        spec = tmp_path / f"worker{i}.json"
        spec.write_text(json.dumps({"budget": budget, "start": start, "lanes": lanes}))
        processes.append(
            await asyncio.create_subprocess_exec(
                *app_command("budget_timeline", url, key_prefix, str(spec)),
                stdout=asyncio.subprocess.PIPE,
            )
        )
    outputs = [await asyncio.wait_for(p.communicate(), 120) for p in processes]
    assert all(p.returncode == 0 for p in processes)
    reports = [json.loads(out) for out, _ in outputs]
    return [s for report in reports for s in report["streams"]], sum(r["refused"] for r in reports)


async def test_short_streams_that_outrun_their_reservation_stay_within_the_bound(
    redis_server, key_prefix, tmp_path
):
    """Three workers run streams shorter than a top-up round that outrun their reservation
    (reserve 500, stream 1,000 in 20 chunks of 50 over 0.2 s): a stream that ends before any
    round ran is settled where it ended, and one that runs out of its slack waits for its top-up
    and is cut when the window is full, so no window holds more than the budget plus one
    increment and a chunk per concurrent stream."""
    short = {"at": 0, "reserve": 500, "delay": 0, "chunks": [50] * 20, "pause": 0.01, "until": 6}
    workers = [[[short] * 60] for _ in range(3)]
    budget = {"limit": 10_000, "per": 2, "algorithm": "sliding_window"}
    streams, refused = await run_timelines(redis_server.url, key_prefix, tmp_path, budget, workers)
    worst, at = worst_interval(events_of(streams), 2)
    assert refused and any(stream["cut"] for stream in streams), "the streams ran the budget out"
    assert worst <= bound(10_000, streams), f"{worst} tokens in the 2 s from {at}"


def random_lanes(rng: random.Random, limit: int, per: float, seconds: float) -> list[list[dict]]:
    """Two lanes of streams with random starts, reservations, first-token delays, lengths, chunk
    sizes and pauses: some stream at once, some slowly over a window or longer, some a while
    after their admission; some stream less than they reserved and some more."""
    lanes = []
    for _ in range(2):
        lane, at = [], 0.0
        while at < seconds:
            reserve, size = rng.randint(100, limit // 2), rng.randint(1, 60)
            count = max(1, int(reserve * rng.uniform(0.8, 1.2)) * 2 // (size + 1))
            lane.append(
                {
                    "at": at,
                    "reserve": reserve,
                    "delay": rng.choice([0, rng.uniform(0, per / 2)]),
                    "chunks": [rng.randint(1, size) for _ in range(count)],
                    "pause": rng.choice([0, 0, per / count]),
                    "until": at + 2 * per,
                }
            )
            at += rng.uniform(0, per / 2)
        lanes.append(lane)
    return lanes


@pytest.mark.parametrize(
    "algorithm, per, seed",
    [("sliding_window", 2, 1), ("sliding_window", 3, 4), ("fixed_window", 2, 3)],
)
async def test_every_window_holds_the_bound_by_the_streams_own_counts(
    redis_server, redis_client, key_prefix, tmp_path, algorithm, per, seed
):
    """Random streams of three worker processes (random starts, reservations, lengths, chunk
    sizes and pauses) against one budget: in every window, the tokens the streams themselves
    counted as streamed at their times stay within the bound; sliding: every interval of the
    window's length; fixed: every window the server kept, after its first round."""
    rng = random.Random(seed)
    limit, seconds = 10_000, 3 * per
    workers = [random_lanes(rng, limit, per, seconds) for _ in range(3)]
    budget = {"limit": limit, "per": per, "algorithm": algorithm}
    ends: list[float] = []

    async def watch_fixed_windows() -> None:
        # The server's fixed windows: where each ends, on the server's clock (the machine's).
        while True:
            for key in redis_client.keys(f"{{{key_prefix}}}:rate:*"):
                seconds_, micros = redis_client.time()
                left = redis_client.pttl(key)
                end = seconds_ + micros / 1e6 + left / 1000
                if left > 0 and all(abs(end - seen) > 0.05 for seen in ends):
                    ends.append(end)
            await asyncio.sleep(0.02)

    watcher = asyncio.create_task(watch_fixed_windows())
    try:
        streams, refused = await run_timelines(
            redis_server.url, key_prefix, tmp_path, budget, workers
        )
    finally:
        watcher.cancel()
    if algorithm == "sliding_window":
        worst, at = worst_interval(events_of(streams), per)
    else:
        worst, at = worst_fixed_window(streams, ends, per)
    assert refused, "the streams ran the budget out"
    assert worst <= bound(limit, streams), f"{worst} tokens in the window at {at}"


async def test_a_start_refused_for_room_that_reservations_hold_retries_when_they_end(
    make_manager,
):
    """Regression: a stream refused because another stream's reservation held the team's
    daily budget got ``Retry-After: 23736`` (the window's reset, 6.6 h) though the reservation
    came back seconds later. Room held by reservations of streams running here comes back
    when they end: the hint is a full pool's (``retry_after``, 5 s by default). Room spent is
    the window's."""
    daily = RateLimit("team_tokens", 20_000, per=86_400, algorithm="fixed_window", unit="tokens")
    manager = make_manager(max_per_user=0)
    running = await manager.acquire("alice", budgets=[(daily, "team")], reserve=17_000)
    with pytest.raises(RateLimited) as held:
        await manager.acquire("bob", budgets=[(daily, "team")], reserve=5_000)
    assert held.value.retry_after == 5
    assert held.value.headers()["Retry-After"] == "5"
    running.consume(17_000)
    await running.release()
    with pytest.raises(RateLimited) as spent:
        await manager.acquire("bob", budgets=[(daily, "team")], reserve=5_000)
    assert spent.value.retry_after > 3_600, "spent tokens come back when the window ends"


async def test_a_budgeted_streams_end_waits_for_its_settlement(
    own_redis, make_own_redis_manager
):
    """Regression: a stream's end that sent its release without waiting for the answer let a
    read right after the stream (through another worker) find the reservation rather than what
    the stream used. A lease with budgets waits, since its release settles them: with Redis
    stopped, its stream does not end until Redis answers."""
    streaming, reading = (make_own_redis_manager(redis_timeout=5.0) for _ in range(2))
    lease = await streaming.acquire("alice", budgets=[TPM], reserve=(0, 800))

    async def stream() -> None:
        async for _ in lease.wrap(chunks(3), tokens=lambda _: 7):
            await asyncio.sleep(0)

    own_redis.pause()
    try:
        streamed = asyncio.create_task(stream())
        await eventually(lambda: lease.released, what="the stream's end to send its release")
        assert not streamed.done(), "the stream ended before its settlement's answer"
    finally:
        own_redis.resume()
    await streamed
    assert await used(reading) == 21
