"""Cancellation never leaks a slot: hundreds of acquires and streams cancelled at random moments,
then the store must hold nothing."""

from __future__ import annotations

import asyncio
import random
import threading

from fastapi_stream_lease import RateLimit, _core

from support.loops import on_every_loop
from support.waiting import count_is, eventually


@on_every_loop
async def test_cancelled_acquires_leave_no_ghost_lease(make_manager):
    manager = make_manager(max_per_user=0, max_global=0)
    rng = random.Random(2026)
    kept = []

    async def one(i: int) -> None:
        task = asyncio.create_task(manager.acquire(f"user{i % 17}"))
        await asyncio.sleep(rng.random() * 0.003)
        task.cancel()
        try:
            kept.append(await task)  # finished before the cancel landed
        except asyncio.CancelledError:
            pass

    await asyncio.gather(*(one(i) for i in range(400)))
    # Acquires cancelled after their script ran give their slot back as their results land.
    await count_is(manager, len(kept))
    for lease in kept:
        await lease.release()
    await count_is(manager, 0)
    assert manager.stats()["held"] == 0


async def test_waiters_cancelled_mid_call_strand_nobody(make_manager):
    """A waiting acquire is aborted when cancelled, also while its call is in flight, and calls
    go in batches: a cancelled caller must not take the others' answers (or the queue) along.
    Otherwise a worker's stop could hang on an acquire that never answered."""
    manager = make_manager(max_per_user=0, max_global=0)
    rng = random.Random(15)
    kept = []

    async def one(i: int) -> None:
        task = asyncio.create_task(manager.acquire(f"user{i % 13}", wait_timeout=5))
        await asyncio.sleep(rng.random() * 0.003)
        if i % 2:
            task.cancel()
        try:
            kept.append(await asyncio.wait_for(task, 10))
        except asyncio.CancelledError:
            pass

    for _ in range(3):
        await asyncio.gather(*(one(i) for i in range(200)))
    # Every acquire not cancelled was answered (wait_for above), and one more still is.
    kept.append(await asyncio.wait_for(manager.acquire("after"), 10))
    for lease in kept:
        await lease.release()
    await count_is(manager, 0)


async def test_acquires_timed_out_by_wait_for_leave_no_ghost_lease(make_manager):
    manager = make_manager(max_per_user=0, max_global=0)
    rng = random.Random(7)
    kept = []

    async def one(i: int) -> None:
        try:
            kept.append(await asyncio.wait_for(manager.acquire(f"u{i}"), rng.random() * 0.002))
        except TimeoutError:
            pass

    await asyncio.gather(*(one(i) for i in range(300)))
    for lease in kept:
        lease.release_nowait()
    await count_is(manager, 0)


async def test_cancelled_streams_release_their_leases(make_manager):
    manager = make_manager(max_per_user=0, max_global=0)
    rng = random.Random(11)

    async def endless():
        while True:
            yield "token"
            await asyncio.sleep(0)

    async def consume(i: int) -> None:
        lease = await manager.acquire(f"user{i % 5}")
        async for _ in lease.wrap(endless()):
            pass

    tasks = [asyncio.create_task(consume(i)) for i in range(300)]
    await asyncio.sleep(0.01)
    for task in rng.sample(tasks, len(tasks)):
        task.cancel()
        await asyncio.sleep(rng.random() * 0.001)
    await asyncio.gather(*tasks, return_exceptions=True)
    await count_is(manager, 0)
    assert manager.stats()["held"] == 0


async def test_a_grant_for_a_loop_that_went_away_is_released(own_redis, make_own_redis_manager):
    manager = make_own_redis_manager(redis_timeout=5)
    assert await manager.get_active_count() == 0  # connected
    own_redis.pause()

    def acquire_then_close_the_loop() -> None:
        async def start() -> None:
            manager._core.acquire(_core.AcquireArgs(user_id="alice"))  # abandoned with its loop

        # A loop of its own (in a thread, as asyncio.run needs), closed before Redis answers.
        threading.Thread(target=asyncio.run, args=(start(),)).start()

    acquire_then_close_the_loop()
    await asyncio.sleep(0.2)
    own_redis.resume()
    # Redis runs one connection's calls in order: once bob is in, alice's script has run.
    bob = await manager.acquire("bob")
    # Alice's grant arrived for a loop that is gone: released, not kept until another loop starts.
    await count_is(manager, 0, "alice")
    await bob.release()


async def test_cancelled_acquires_give_back_their_reservations_and_rate_units(make_manager):
    """An acquire cancelled while it waits, while its call is in flight or after its grant
    came back but before its caller took it gives back its slot, and must give back all else
    the grant took: its token reservation and its start's request-rate unit, at every level
    (the team's, paired with the team's id, as the user's). A stream that never started is
    charged nothing; one that started and streamed nothing, only its start. Guards the bug
    where a grant whose future had resolved, its task cancelled before it ran again (seen about
    one run in ten on uvloop), gave back its slot and reservation but kept its start charged."""
    manager = make_manager(max_per_user=0, max_global=10)
    starts = RateLimit("starts", 10**6, per=3600)
    tokens = RateLimit("tokens", 10**9, per=3600, unit="tokens")
    team_starts = RateLimit("team_starts", 10**6, per=3600)
    team_tokens = RateLimit("team_tokens", 10**9, per=3600, unit="tokens")
    users = [f"user{i}" for i in range(7)]
    rng = random.Random(5)
    started = dict.fromkeys(users, 0)

    async def one(i: int) -> None:
        user = users[i % len(users)]
        task = asyncio.create_task(
            manager.acquire(
                user,
                wait_timeout=5,
                rate_limits=[starts, (team_starts, "team")],
                budgets=[tokens, (team_tokens, "team")],
                reserve=(0, 1000),
            )
        )
        await asyncio.sleep(rng.random() * 0.01)
        task.cancel()
        try:
            lease = await task  # finished before the cancel landed
        except asyncio.CancelledError:
            return
        started[user] += 1
        await lease.release()  # nothing streamed: its reservation comes back whole

    for _ in range(3):
        await asyncio.gather(*(one(i) for i in range(150)))
    await count_is(manager, 0)
    await eventually(
        lambda: manager.stats()["unsettled"] == 0 and manager.stats()["budget_streams"] == 0,
        what="the budgets to settle",
    )

    async def charged() -> dict[str, tuple[int, int]]:
        levels = [(user, starts, tokens) for user in users] + [("team", team_starts, team_tokens)]
        return {
            who: ((await manager.peek(who, rate)).used, (await manager.peek(who, budget)).used)
            for who, rate, budget in levels
        }

    async def only_starts_charged() -> bool:
        team = {"team": (sum(started.values()), 0)}
        return await charged() == {**{user: (started[user], 0) for user in users}, **team}

    try:
        await eventually(only_starts_charged, what="only the streams started to stay charged")
    except AssertionError:
        raise AssertionError(f"charged {await charged()}, started {started}") from None
