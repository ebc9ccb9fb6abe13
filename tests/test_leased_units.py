"""Leased units (``RateLimit(lease_units=True)``): a process takes units of a busy identity ahead
of its hits and serves hits from them without a round trip; the limit holds across every
process, and what a process does not use goes back. On a real Redis: the embedded store is one
process, where every hit is exact already."""

from __future__ import annotations

import asyncio

import pytest
import redis as redis_py

from fastapi_stream_lease import (
    LeaseConfig,
    RateLimit,
    RateLimited,
    StreamLeaseManager,
    ThresholdCrossed,
)

from support.redis_servers import RedisServer
from support.waiting import eventually

pytestmark = pytest.mark.usefixtures("redis_server")


def hit_calls(server: RedisServer) -> int:
    """Script calls of hit.lua the server has run."""
    client = redis_py.Redis.from_url(server.url)
    try:
        stats = client.info("commandstats")
    finally:
        client.close()
    return sum(v["calls"] for k, v in stats.items() if k.startswith("cmdstat_fcall"))


async def test_a_busy_identity_is_served_mostly_without_a_round_trip(
    make_own_redis_manager, own_redis
):
    manager = make_own_redis_manager()
    policy = RateLimit("api", 100_000, per=3600, algorithm="fixed_window", lease_units=True)
    await manager.hit("warm-up", RateLimit("other", 10, per=60))
    before = hit_calls(own_redis)
    remaining = [(await manager.hit("alice", policy))[0].remaining for _ in range(400)]
    # At most 0.1 round trips per hit (a slab lasts 100 ms of hits; these come far faster).
    assert hit_calls(own_redis) - before <= 40
    # Each hit is told what is left of the identity's limit, the units held here included.
    assert remaining == list(range(100_000 - 1, 100_000 - 401, -1))
    peeked = (await manager.peek("alice", policy)).used
    assert 400 <= peeked <= 400 + 100_000 // 10, "units held ahead count as used"


async def test_a_hit_served_here_is_awaited_as_a_future_of_the_store_would_be(
    make_redis_manager,
):
    manager = make_redis_manager()
    policy = RateLimit("api", 100_000, per=3600, lease_units=True)
    for _ in range(50):
        await manager.hit("alice", policy)  # busy: units held here from now on
    served = manager._core.hit("alice", (policy,), 1, True)
    assert not asyncio.isfuture(served), "decided here, with no call to wait for"
    first, again = await served, await served
    assert first == again and first[0].remaining == 100_000 - 51
    (gathered,) = await asyncio.gather(manager._core.hit("alice", (policy,), 1, True))
    waited = await asyncio.wait_for(manager._core.hit("alice", (policy,), 1, True), 5)
    assert [gathered[0].remaining, waited[0].remaining] == [100_000 - 52, 100_000 - 53]


async def test_a_hit_served_here_reaches_the_forms_as_its_decisions(make_redis_manager):
    """Units held here decide a hit with nothing to wait for: the forms take its decisions
    as they are (no awaitable, no coroutine); a hit that needs the store, as an awaitable."""
    manager = make_redis_manager()
    policy = RateLimit("api", 100_000, per=3600, lease_units=True)
    for _ in range(50):
        await manager.hit("alice", policy)
    served = manager._hit_now("alice", (policy,), 1)
    assert isinstance(served, list) and served[0].remaining == 100_000 - 51
    sent = manager._hit_now("someone-new", (policy,), 1)
    assert not isinstance(sent, list)
    assert (await sent)[0].remaining == 100_000 - 1


async def test_the_middleware_serves_leased_hits_with_their_headers(
    make_own_redis_manager, own_redis
):
    """Through ``RateLimitMiddleware``, hits served from units held here answer as the others:
    each response carries what is left of the limit, units held here counted as used."""
    import httpx
    from fastapi import FastAPI

    from fastapi_stream_lease import RateLimitMiddleware, install_exception_handler

    manager = make_own_redis_manager()
    app = FastAPI()

    @app.get("/")
    async def root() -> str:
        return "ok"

    policy = RateLimit("api", 100_000, per=3600, algorithm="fixed_window", lease_units=True)
    app.add_middleware(RateLimitMiddleware, manager=manager, routes={"/": [policy]})
    install_exception_handler(app)
    await manager.hit("warm-up", RateLimit("other", 10, per=60))
    transport = httpx.ASGITransport(app=app, client=("10.0.0.2", 40000))
    before = hit_calls(own_redis)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        answers = [await http.get("/") for _ in range(200)]
    assert hit_calls(own_redis) - before <= 20
    assert [a.status_code for a in answers] == [200] * 200
    remaining = [int(a.headers["RateLimit"].split(";r=")[1].split(";")[0]) for a in answers]
    assert remaining == list(range(100_000 - 1, 100_000 - 201, -1))


async def test_an_identity_seen_once_asks_for_no_units_ahead(make_redis_manager):
    manager = make_redis_manager()
    policy = RateLimit("api", 1_000, per=60, lease_units=True)
    await manager.hit("bob", policy)
    assert (await manager.peek("bob", policy)).used == 1


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window"])
async def test_the_limit_holds_across_processes_that_lease_units(make_redis_manager, algorithm):
    limit = 50
    policy = RateLimit("burst", limit, per=60, algorithm=algorithm, lease_units=True)
    first, second = make_redis_manager(), make_redis_manager()

    async def hits(manager, n: int) -> int:
        allowed = 0
        for _ in range(n):
            try:
                await manager.hit("carol", policy)
                allowed += 1
            except RateLimited:
                pass
        return allowed

    allowed = sum(await asyncio.gather(*(hits(m, 60) for m in (first, second) for _ in range(4))))
    assert allowed <= limit
    # What neither used goes back when they close: the rest of the limit is there to take.
    await first.aclose()
    await second.aclose()
    third = make_redis_manager()
    assert (await third.peek("carol", policy)).used == allowed
    assert allowed + await hits(third, limit) == limit


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window"])
async def test_unused_units_go_back_after_a_second_without_a_hit(make_redis_manager, algorithm):
    manager = make_redis_manager()
    policy = RateLimit("api", 100_000, per=60, algorithm=algorithm, lease_units=True)
    for _ in range(200):
        await manager.hit("dave", policy)
    assert (await manager.peek("dave", policy)).used > 200, "units are held ahead"

    async def given_back() -> bool:
        return (await manager.peek("dave", policy)).used == 200

    await eventually(given_back, timeout=10, what="the unused units given back")


def test_lease_units_is_a_request_rate_s_and_shows_in_its_repr():
    policy = RateLimit("api", "100/second", lease_units=True)
    assert policy.lease_units and not RateLimit("api", "100/second").lease_units
    assert repr(policy).endswith(", lease_units=True)")
    assert policy != RateLimit("api", "100/second")
    with pytest.raises(ValueError, match=r"lease_units=True is for request rates only"):
        RateLimit("tokens", 10_000, per=60, unit="tokens", lease_units=True)
    with pytest.raises(TypeError, match=r"lease_units must be a boolean \(True or False\)"):
        RateLimit("api", "100/second", lease_units="yes")


async def test_a_hit_that_takes_units_ahead_leaves_half_the_room_to_the_others(make_redis_manager):
    manager = make_redis_manager()
    plain = RateLimit("quota", 30, per=60, algorithm="fixed_window")
    leasing = RateLimit("quota", 30, per=60, algorithm="fixed_window", lease_units=True)
    for _ in range(27):
        await manager.hit("erin", plain)  # the same counter, counted exactly
    await manager.hit("erin", leasing)  # 28: seen once, nothing ahead
    await manager.hit("erin", leasing)  # 29: 1 unit of room after its cost, none of it taken
    assert (await manager.peek("erin", leasing)).used == 29
    await manager.hit("erin", leasing)
    with pytest.raises(RateLimited):
        await manager.hit("erin", leasing)


async def test_a_hit_is_served_here_only_when_every_policy_of_it_leases_units(
    make_own_redis_manager, own_redis
):
    manager = make_own_redis_manager()
    leasing = RateLimit("leasing", 100_000, per=60, lease_units=True)
    plain = RateLimit("plain", 100_000, per=60)
    await manager.hit("warm-up", plain)
    before = hit_calls(own_redis)
    for _ in range(50):
        await manager.hit("frank", leasing, plain)
    assert hit_calls(own_redis) - before == 50


async def test_reset_forgets_the_units_this_process_holds(make_redis_manager):
    manager = make_redis_manager()
    policy = RateLimit("api", 100_000, per=60, algorithm="fixed_window", lease_units=True)
    for _ in range(100):
        await manager.hit("gina", policy)
    await manager.reset("gina", policy)
    assert (await manager.peek("gina", policy)).used == 0
    assert (await manager.hit("gina", policy))[0].remaining == 100_000 - 1
    assert (await manager.peek("gina", policy)).used == 1


async def test_hits_that_come_together_wait_for_one_call_for_their_units(
    make_own_redis_manager, own_redis
):
    manager = make_own_redis_manager()
    policy = RateLimit("api", 100_000, per=60, lease_units=True)
    for _ in range(2):
        await manager.hit("hana", policy)  # seen before: the next call asks for units ahead
    before = hit_calls(own_redis)
    await asyncio.gather(*(manager.hit("hana", policy) for _ in range(200)))
    assert hit_calls(own_redis) - before <= 20
    assert (await manager.peek("hana", policy)).used >= 202


async def test_the_embedded_store_takes_nothing_ahead():
    manager = StreamLeaseManager(url="memory://")
    policy = RateLimit("api", 1_000, per=60, lease_units=True)
    for _ in range(50):
        await manager.hit("ida", policy)
    assert (await manager.peek("ida", policy)).used == 50
    await manager.aclose()


async def test_each_threshold_is_told_once_when_units_are_leased(redis_server, key_prefix):
    told: list[ThresholdCrossed] = []

    async def on_threshold(alert: ThresholdCrossed) -> None:
        told.append(alert)

    manager = StreamLeaseManager(
        url=redis_server.url,
        config=LeaseConfig(key_prefix=key_prefix),
        on_threshold=on_threshold,
    )
    policy = RateLimit("api", 100, per=3600, algorithm="fixed_window", lease_units=True)
    for _ in range(100):
        await manager.hit("jo", policy)
    await eventually(lambda: len(told) >= 2, what="both thresholds told")
    assert sorted(a.threshold for a in told) == [0.8, 1.0]
    assert all(a.used >= a.threshold * a.limit for a in told)
    await manager.aclose()
