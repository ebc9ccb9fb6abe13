"""Waiting in line for shared capacity: one line per pool, first come, first served, across
workers, with no polling; waiters that give up, are cancelled or die leave the line."""

from __future__ import annotations

import asyncio
import random
import signal
from collections import Counter

import pytest

from fastapi_stream_lease import LineFull, Resource, StreamLeaseRejected

from support.apps import app_command
from support.loops import on_every_loop
from support.waiting import count_is, eventually


async def in_line(manager, placed: int, name: str) -> None:
    """Waits until ``placed`` of the manager's waiters have their place in a line, the last
    one being ``name``: whatever comes next arrives after it."""
    await eventually(lambda: manager.stats()["waiting"] == placed, what=f"{name} in line")


@on_every_loop
async def test_a_waiter_is_admitted_when_a_slot_frees(make_manager):
    manager = make_manager(max_per_user=0, max_global=1)
    holder = await manager.acquire("alice")
    waiting = asyncio.create_task(manager.acquire("bob", wait_timeout=10))
    await asyncio.sleep(0.1)
    assert not waiting.done()
    await holder.release()
    lease = await asyncio.wait_for(waiting, 5)
    assert await manager.get_active_count() == 1
    await lease.release()


async def test_a_wait_that_runs_out_is_refused_with_503(make_manager):
    manager = make_manager(max_per_user=0, max_global=1, wait_timeout=0.3)
    holder = await manager.acquire("alice")
    with pytest.raises(StreamLeaseRejected) as refused:
        await manager.acquire("bob")
    assert refused.value.limit == "global" and refused.value.status_code == 503
    assert refused.value.retry_after >= 1
    await holder.release()
    late = await manager.acquire("bob")  # the timed-out waiter left the line
    await late.release()


async def test_own_quota_is_refused_at_once_even_with_a_wait(make_manager):
    manager = make_manager(max_per_user=1, max_global=10, wait_timeout=30)
    lease = await manager.acquire("alice")
    with pytest.raises(StreamLeaseRejected) as refused:
        await asyncio.wait_for(manager.acquire("alice"), 5)
    assert refused.value.status_code == 429
    await lease.release()


async def test_waiters_are_served_in_arrival_order(make_manager):
    manager = make_manager(max_per_user=0, max_global=1)
    holder = await manager.acquire("first")
    order: list[str] = []

    async def wait_then_hold(name: str) -> None:
        lease = await manager.acquire(name, wait_timeout=20)
        order.append(name)
        await asyncio.sleep(0.05)
        await lease.release()

    names = [f"w{i}" for i in range(8)]
    tasks = []
    for placed, name in enumerate(names, start=1):
        tasks.append(asyncio.create_task(wait_then_hold(name)))
        await in_line(manager, placed, name)  # a known arrival order
    await holder.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 30)
    assert order == names


async def test_newcomers_do_not_jump_the_line(make_manager):
    manager = make_manager(max_per_user=0, max_global=1)
    holder = await manager.acquire("alice")
    waiter = asyncio.create_task(manager.acquire("bob", wait_timeout=10))
    await eventually(lambda: manager.stats()["waiting"] == 1, what="bob in line")
    await holder.release()
    # bob is woken; a newcomer that will not wait does not take bob's slot meanwhile
    results = await asyncio.gather(manager.acquire("carol"), waiter, return_exceptions=True)
    granted = [r for r in results if not isinstance(r, BaseException)]
    assert len(granted) == 1
    for lease in granted:
        await lease.release()


async def test_cancelled_waiters_leave_the_line(make_manager):
    manager = make_manager(max_per_user=0, max_global=1)
    holder = await manager.acquire("alice")
    early = asyncio.create_task(manager.acquire("early", wait_timeout=30))
    await eventually(lambda: manager.stats()["waiting"] == 1, what="early in line")
    late = asyncio.create_task(manager.acquire("late", wait_timeout=30))
    await eventually(lambda: manager.stats()["waiting"] == 2, what="late in line")
    early.cancel()  # the first in line gives up (its client went away)
    with pytest.raises(asyncio.CancelledError):
        await early
    await holder.release()
    lease = await asyncio.wait_for(late, 5)  # not blocked behind the cancelled waiter
    await lease.release()
    await count_is(manager, 0)


async def test_capacity_3_and_300_waiters_never_more_than_3(make_manager):
    manager = make_manager(max_per_user=0, max_global=3)
    peak = 0
    inside = 0

    async def one(i: int) -> None:
        nonlocal peak, inside
        lease = await manager.acquire(f"user{i}", wait_timeout=60)
        inside += 1
        peak = max(peak, inside)
        await asyncio.sleep(0.005)
        inside -= 1
        await lease.release()

    await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(300))), 120)
    assert peak == 3
    await count_is(manager, 0)


async def start_waiter(url: str, prefix: str, name: str, hold: float):
    process = await asyncio.create_subprocess_exec(
        *app_command("wait_in_line", url, prefix, name, str(hold)),
        stdout=asyncio.subprocess.PIPE,
    )
    assert await asyncio.wait_for(process.stdout.readline(), 30) == b"waiting\n"
    return process


async def test_fifo_across_processes_and_a_killed_waiter_leaves(redis_server, redis_client,
                                                              key_prefix, make_manager,
                                                              backend_url):
    if backend_url == "memory://":
        pytest.skip("the embedded store serves one process")
    manager = make_manager(max_per_user=0, max_global=1)
    holder = await manager.acquire("holder")
    line = f"{{{key_prefix}}}:global|line"

    async def in_line(name: str, placed: int):
        process = await start_waiter(redis_server.url, key_prefix, name, 0.2)
        # in line before the next one comes
        await eventually(lambda: redis_client.zcard(line) == placed, what=f"{name} in line")
        return process

    first = await in_line("first", 1)
    doomed = await in_line("doomed", 2)
    last = await in_line("last", 3)
    doomed.send_signal(signal.SIGKILL)  # dies in line
    await doomed.wait()
    await holder.release()
    assert await asyncio.wait_for(first.stdout.readline(), 10) == b"admitted\n"
    # "last" is admitted after "first" without waiting for anything of the dead waiter's
    assert await asyncio.wait_for(last.stdout.readline(), 10) == b"admitted\n"
    assert await first.wait() == 0 and await last.wait() == 0
    await count_is(manager, 0)


async def test_300_waiters_from_3_processes_never_exceed_capacity_3(redis_server, redis_client,
                                                                   key_prefix):
    crowd = [
        await asyncio.create_subprocess_exec(
            *app_command("crowd_of_waiters", redis_server.url, key_prefix, f"p{n}"),
            stdout=asyncio.subprocess.PIPE,
        )
        for n in range(3)
    ]
    key = f"{{{key_prefix}}}:global"
    peak = 0
    while any(process.returncode is None for process in crowd):
        seconds, micros = redis_client.time()
        now_ms = seconds * 1000 + micros // 1000
        peak = max(peak, redis_client.zcount(key, f"({now_ms}", "+inf"))
        await asyncio.sleep(0.002)
    assert peak <= 3
    for process in crowd:
        assert await process.stdout.read() == b"done\n"
        assert process.returncode == 0


async def test_a_stray_waiter_of_a_live_process_is_taken_out(make_redis_manager, redis_client,
                                                             key_prefix):
    manager = make_redis_manager(max_per_user=0, max_global=1)
    held = await manager.acquire("alice")
    (holder,) = redis_client.zrange(f"{{{key_prefix}}}:holders", 0, -1)
    line = f"{{{key_prefix}}}:line"
    # First in line, a waiter this process no longer has (a cancelled call that re-entered the
    # line after leaving it). The process stays alive, so only its heartbeat can take it out.
    redis_client.zadd(line, {"stray": 0})
    pool = f"{{{key_prefix}}}:global"
    # one global slot, first in line (weight, process, user, pools)
    redis_client.hset(f"{line}:needs", "stray", f"1 {holder.decode()} stray {pool}")
    redis_client.zadd(f"{pool}|line", {"stray": 0})
    redis_client.sadd(f"{line}:alive:{holder.decode()}", "stray")
    waiting = asyncio.create_task(manager.acquire("bob", wait_timeout=20))

    await eventually(lambda: manager.stats()["waiting"] == 1, what="bob to wait")
    await held.release()
    lease = await asyncio.wait_for(waiting, 20)
    assert redis_client.zrange(line, 0, -1) == [] and not redis_client.exists(f"{line}:needs")
    assert not redis_client.exists(f"{pool}|line", f"{pool}|turns")
    await lease.release()


async def test_waiters_arriving_during_a_heartbeat_keep_their_place(make_redis_manager,
                                                                    redis_client):
    # An empty script cache slows every first call (NOSCRIPT, load, call again), so many waiters'
    # first calls run between a heartbeat listing this process's waiters and its script.
    redis_client.script_flush()
    manager = make_redis_manager(max_per_user=0, max_global=1)
    current = await manager.acquire("first")
    admitted: asyncio.Queue = asyncio.Queue()

    async def wait(n: int) -> None:
        await admitted.put(await manager.acquire(f"waiter{n}", wait_timeout=60))

    waiters = [asyncio.create_task(wait(n)) for n in range(200)]

    await eventually(lambda: manager.stats()["waiting"] == 200, what="200 waiters in line")
    for _ in range(200):  # each release admits the next waiter, none is lost from the line
        await current.release()
        current = await asyncio.wait_for(admitted.get(), 10)
    await current.release()
    await asyncio.gather(*waiters)


async def waiting(manager, user: str, **kwargs) -> asyncio.Task:
    """An acquire that waits up to 30 s, started and in its line when this returns."""
    placed = manager.stats()["waiting"] + 1
    task = asyncio.create_task(manager.acquire(user, wait_timeout=30, **kwargs))
    await eventually(lambda: task.done() or manager.stats()["waiting"] == placed,
                     what=f"{user} in line")
    assert not task.done()
    return task


async def test_a_waiter_for_one_pool_delays_no_one_elses(make_manager):
    """One request waiting for a full Resource(1, "db") made every acquire that did not wait
    fail with 503 "global stream limit reached (0 of 1000 in use)", and a waiter for "fs" wait
    behind the one for "db"."""
    manager = make_manager(max_per_user=0, max_global=1000)
    db, fs = Resource(capacity=1, name="db"), Resource(capacity=1, name="fs")
    holder = await manager.acquire("alice", resources=[db])
    bob = await waiting(manager, "bob", resources=[db])

    plain = await manager.acquire("carol")  # a plain stream, not waiting
    for_fs = await asyncio.wait_for(manager.acquire("dave", resources=[fs], wait_timeout=30), 5)
    with pytest.raises(StreamLeaseRejected) as refused:
        await manager.acquire("erin", resources=[db])  # db's room is bob's, and there is none
    assert refused.value.limit == "db" and "db stream limit reached (1 of 1" in str(refused.value)
    assert refused.value.status_code == 503
    await for_fs.release()
    fs_alone = await manager.acquire(None, resources=[fs])  # resources only, no wait
    assert not bob.done()

    await holder.release()
    granted = await asyncio.wait_for(bob, 5)
    for lease in (granted, plain, fs_alone):
        await lease.release()
    await count_is(manager, 0)


async def test_a_heavy_waiter_is_passed_by_one_pool_of_slots_at_most(make_manager):
    """A waiter that does not fit (weight 2, one slot free) neither blocks its line for its
    whole wait nor starves: later requests that fit take slots past it until a pool's worth
    (3 here) went by; from then on the room that frees is kept for it."""
    manager = make_manager(max_per_user=0, max_global=1000)
    gpu = Resource(capacity=3, name="gpu")
    long_ones = [await manager.acquire(f"long{i}", resources=[gpu]) for i in range(2)]
    heavy = await waiting(manager, "heavy", resources=[gpu], weight=2)
    for i in range(3):  # each takes the free slot past the heavy waiter, and gives it back
        light = await manager.acquire(f"light{i}", resources=[gpu])
        await light.release()
    with pytest.raises(StreamLeaseRejected) as refused:
        await manager.acquire("light3", resources=[gpu])  # the free slot is now kept for it
    assert (refused.value.limit, refused.value.current) == ("gpu", 3)
    assert not heavy.done()
    await long_ones[0].release()
    lease = await asyncio.wait_for(heavy, 5)
    assert lease.weight == 2
    for held in (lease, long_ones[1]):
        await held.release()
    await count_is(manager, 0)


async def served_in_order(manager, holder, waiters: list[tuple[str, dict]]) -> list[str]:
    """Starts the waiters one by one, each once the one before has its place in the line (a
    known arrival order, however slow the machine), frees the holder's slot, and returns the
    order in which they were served (each gives its slot back at once)."""
    served: list[str] = []

    async def wait_then_pass_on(name: str, user: str, options: dict) -> None:
        lease = await manager.acquire(user, wait_timeout=60, **options)
        served.append(name)
        await lease.release()

    tasks = []
    for placed, (name, options) in enumerate(waiters, start=1):
        user = options.pop("user", name.rstrip("0123456789"))
        tasks.append(asyncio.create_task(wait_then_pass_on(name, user, options)))
        await in_line(manager, placed, name)
    await holder.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 60)
    return served


async def test_users_take_turns_in_a_pools_line(make_manager):
    """The issue's case: user A with 50 waiters, user B with 1 arriving after them: B is served
    within the next two grants (round robin by user, first come first served within a user)."""
    manager = make_manager(max_per_user=0, max_global=1)
    holder = await manager.acquire("holder")
    alice = [(f"alice{i}", {}) for i in range(50)]
    served = await served_in_order(manager, holder, [*alice, ("bob0", {})])
    assert served.index("bob0") <= 1, served[:5]
    assert [n for n in served if n.startswith("alice")] == [n for n, _ in alice], "FIFO within"


async def test_arrival_order_is_kept_as_an_option(make_manager):
    manager = make_manager(max_per_user=0, max_global=1, line_order="arrival")
    assert manager.config.line_order == "arrival"
    holder = await manager.acquire("holder")
    waiters = [("alice0", {}), ("alice1", {}), ("alice2", {}), ("bob0", {})]
    assert await served_in_order(manager, holder, waiters) == [n for n, _ in waiters]


async def test_higher_priority_is_served_first_and_fair_within(make_manager):
    """Paid tier before free tier under saturation: priority 5 before 0, whatever the arrival
    order; within a priority, users take turns."""
    manager = make_manager(max_per_user=0, max_global=1)
    gpu = Resource(capacity=1, name="gpu")
    holder = await manager.acquire(None, resources=[gpu])
    free = [(f"free{i}", {"user": "free", "resources": [gpu]}) for i in range(3)]
    paid = [
        ("paidA0", {"user": "paidA", "resources": [gpu], "priority": 5}),
        ("paidA1", {"user": "paidA", "resources": [gpu], "priority": 5}),
        ("paidB0", {"user": "paidB", "resources": [gpu], "priority": 5}),
    ]
    served = await served_in_order(manager, holder, [*free, *paid])
    assert served == ["paidA0", "paidB0", "paidA1", "free0", "free1", "free2"]


@pytest.mark.parametrize("priority", [-1, 10, 1.5, "high", True])
async def test_a_bad_priority_says_what_was_wrong(make_manager, priority):
    manager = make_manager()
    with pytest.raises((TypeError, ValueError), match="priority"):
        await manager.acquire("alice", priority=priority)


async def test_a_full_line_refuses_at_once_with_an_estimated_retry_after(make_manager):
    manager = make_manager(max_per_user=0, max_global=1, max_waiting=2, retry_after=60)
    holder = await manager.acquire("holder")
    first = await waiting(manager, "a")
    second = await waiting(manager, "b")
    with pytest.raises(LineFull) as refused:
        await manager.acquire("c", wait_timeout=30)
    full = refused.value
    assert isinstance(full, StreamLeaseRejected) and full.status_code == 503
    assert (full.limit, full.waiting, full.max_waiting) == ("global", 2, 2)
    assert "line for global is full (2 waiting, max_waiting=2)" in str(full)
    assert 1 <= full.retry_after <= 60 and "Retry-After" in full.headers()
    plain = asyncio.create_task(manager.acquire("d"))  # not waiting: refused for room, as before
    with pytest.raises(StreamLeaseRejected):
        await plain
    await holder.release()
    (await asyncio.wait_for(first, 5)).release_nowait()
    # Served twice at a measured pace: the estimate is the line's times its mean gap.
    await (await asyncio.wait_for(second, 5)).release()
    await count_is(manager, 0)


async def test_waiting_for_ones_own_quota_is_an_option(make_manager):
    manager = make_manager(max_per_user=1, wait_for_own_quota=True)
    assert manager.config.wait_for_own_quota
    mine = await manager.acquire("alice")
    with pytest.raises(StreamLeaseRejected) as refused:
        await manager.acquire("alice")  # not waiting: 429 at once, as by default
    assert refused.value.status_code == 429
    second = await waiting(manager, "alice")  # waits in alice's own line
    other = await manager.acquire("bob")  # nobody else waits behind alice
    await mine.release()
    await (await asyncio.wait_for(second, 5)).release()
    await other.release()
    default = make_manager(max_per_user=1)
    held = await default.acquire("carol")
    with pytest.raises(StreamLeaseRejected):
        await default.acquire("carol", wait_timeout=5)  # the default: 429 at once
    await held.release()


@pytest.mark.parametrize(
    "waits",
    [{"wait_for_own_quota": True, "wait_timeout": 0.3}, {"acquire_timeout": 0.3}],
    ids=["wait_for_own_quota", "acquire_timeout"],
)
@pytest.mark.parametrize("max_global", [500, 0])
async def test_a_wait_for_ones_own_quota_that_runs_out_is_refused_for_that_quota(
    make_manager, waits, max_global
):
    """Regression: a user at their own cap whose wait ran out was told 503 "global stream
    limit reached (500 of 500 in use)" (with no global cap: "0 of 0"), not 429 for their own
    quota with its true count."""
    manager = make_manager(max_per_user=1, max_global=max_global, **waits)
    mine = await manager.acquire("alice")
    with pytest.raises(StreamLeaseRejected) as refused:
        await manager.acquire("alice")
    assert (refused.value.status_code, refused.value.reason) == (429, "user_limit")
    assert (refused.value.limit, refused.value.capacity, refused.value.current) == (
        "per_user", 1, 1
    )
    assert str(refused.value).startswith("per_user stream limit reached (1 of 1 in use)")
    await mine.release()


async def test_a_wait_for_a_full_shared_pool_that_runs_out_names_that_pool(make_manager):
    """The pool that had no room is the one named, with its count: a resource, not the global
    pool that had room."""
    manager = make_manager(max_per_user=0, max_global=10, wait_timeout=0.3)
    db = Resource(capacity=1, name="db")
    held = await manager.acquire("alice", resources=[db])
    with pytest.raises(StreamLeaseRejected) as refused:
        await manager.acquire("bob", resources=[db])
    assert (refused.value.limit, refused.value.capacity, refused.value.current) == ("db", 1, 1)
    assert refused.value.status_code == 503
    await held.release()


async def test_without_a_global_pool_resources_still_have_lines(make_manager):
    manager = make_manager(global_pool=False, max_per_user=1)
    db = Resource(capacity=1, name="db")
    held = await manager.acquire(None, resources=[db])
    waiter = await waiting(manager, None, resources=[db])
    await held.release()
    await (await asyncio.wait_for(waiter, 5)).release()
    mine = await manager.acquire("alice", wait_timeout=5)  # a user's own tag: no line there
    with pytest.raises(StreamLeaseRejected) as refused:
        await manager.acquire("alice", wait_timeout=5)
    assert refused.value.status_code == 429, "refused at once, as with a global pool"
    await mine.release()


async def test_a_resource_can_have_a_line_limit_of_its_own(make_manager):
    manager = make_manager(max_per_user=0, max_global=1000, max_waiting=0)
    db = Resource(capacity=1, name="db", max_waiting=1)
    holder = await manager.acquire(None, resources=[db])
    first = await waiting(manager, "a", resources=[db])
    with pytest.raises(LineFull) as refused:
        await manager.acquire("b", resources=[db], wait_timeout=30)
    assert (refused.value.limit, refused.value.max_waiting) == ("db", 1)
    await holder.release()
    await (await asyncio.wait_for(first, 5)).release()
    with pytest.raises((TypeError, ValueError), match="max_waiting"):
        Resource(capacity=1, name="x", max_waiting=-1)


async def test_a_line_that_never_empties_forgets_the_users_it_served(make_redis_manager,
                                                                     redis_client, key_prefix):
    """Fair order remembers each user's last turn in a pool's line; a line that always has a
    waiter is never deleted, so the users whose last turn was served are swept as others come."""
    manager = make_redis_manager(max_global=1)
    current = await manager.acquire("holder")
    turns = f"{{{key_prefix}}}:global|turns"
    following = asyncio.create_task(manager.acquire("user0", wait_timeout=30))
    await in_line(manager, 1, "user0")
    for i in range(1, 200):
        next_one = asyncio.create_task(manager.acquire(f"user{i}", wait_timeout=30))
        await in_line(manager, 2, f"user{i}")  # the line never empties
        await current.release()
        current = await asyncio.wait_for(following, 10)
        following = next_one
    assert redis_client.hlen(turns) <= 100, "about the line's current users, not all 200 served"
    following.cancel()
    await current.release()



async def all_served(waiters: list[asyncio.Task]) -> None:
    """Waits until every waiter is granted, each giving its slot back at once."""

    async def pass_on(waiter: asyncio.Task) -> None:
        await (await waiter).release()

    await asyncio.wait_for(asyncio.gather(*map(pass_on, waiters)), 30)


async def test_one_user_cannot_fill_a_line_with_waiters_its_quota_could_never_serve(
    make_manager,
):
    """With max_per_user=2 one user queued 50 waiters and took every place of a 50-place line:
    every other user, a priority-5 one included, got LineFull at once, and 48 of the 50 were
    refused for the user's own cap at their turn anyway. Its waiters count against its quota
    when they enter: the 48 are refused at once (429, its own cap), and the others find places."""
    manager = make_manager(max_per_user=2, max_global=1, max_waiting=50)
    holder = await manager.acquire("holder")
    flood = [asyncio.create_task(manager.acquire("flood", wait_timeout=30)) for _ in range(50)]
    await eventually(lambda: sum(t.done() for t in flood) == 48, what="48 of the flood refused")
    for task in (t for t in flood if t.done()):
        refused = task.exception()
        assert isinstance(refused, StreamLeaseRejected) and not isinstance(refused, LineFull)
        assert (refused.limit, refused.status_code) == ("per_user", 429), refused
    await in_line(manager, 2, "the flood's two")
    floods_two = [t for t in flood if not t.done()]
    bob = await waiting(manager, "bob")
    carol = await waiting(manager, "carol", priority=5)
    with pytest.raises(StreamLeaseRejected) as refused:
        await manager.acquire("flood")  # not waiting: its two waiters keep its quota
    assert refused.value.limit == "per_user"
    await holder.release()
    lease = await asyncio.wait_for(carol, 10)  # the paid tier first, then users take turns
    await lease.release()
    await all_served([bob, *floods_two])
    await count_is(manager, 0)


async def test_a_full_line_gives_another_users_first_waiter_a_place(make_manager):
    """A full line turned away every other user's first waiter while one user held all its
    places. Such a waiter takes the place of the last waiter of the user with the most places,
    which is refused with a LineFull that says so; a user who has a place already is refused as
    before, and so is everyone once each user has only one place."""
    manager = make_manager(max_per_user=0, max_global=1, max_waiting=3)
    holder = await manager.acquire("holder")
    flood = [await waiting(manager, "flood") for _ in range(3)]
    bob = asyncio.create_task(manager.acquire("bob", wait_timeout=30))
    await eventually(lambda: flood[2].done(), what="the flood's last waiter to give way")
    given_up = flood[2].exception()
    assert isinstance(given_up, LineFull) and given_up.displaced, given_up
    assert given_up.status_code == 503 and "went to another user's first waiter" in str(given_up)
    await in_line(manager, 3, "bob")
    with pytest.raises(LineFull) as full:
        await manager.acquire("bob", wait_timeout=30)  # bob has a place already
    assert not full.value.displaced and "line for global is full" in str(full.value)
    carol = await waiting(manager, "carol", priority=5)  # flood still has two places
    await eventually(lambda: flood[1].done(), what="the flood's next waiter to give way")
    assert flood[1].exception().displaced
    with pytest.raises(LineFull):
        await manager.acquire("dave", wait_timeout=30)  # one place each: nobody gives way
    await holder.release()
    await all_served([carol, flood[0], bob])
    await count_is(manager, 0)


async def settled(manager, tasks: list[asyncio.Task], arrival: int) -> None:
    """Waits until each of the tasks has ended or has its place in this process's line, and
    the waiters displaced by the last arrival have ended: the line holds at most 6 again."""

    def done() -> bool:
        in_line = sum(not t.done() for t in tasks)
        return in_line == manager.stats()["waiting"] <= 6

    await eventually(done, what=f"arrival {arrival} to settle")


@pytest.mark.parametrize("max_per_user", [0, 3])
async def test_users_flooding_a_line_keep_to_their_share(make_manager, max_per_user):
    """Random arrivals of 8 users (weights 1 and 2, priorities 0 and 5) into a line of 6
    that never moves: after each one settles, no user has more slots held and waiting than its
    quota, the line holds at most 6, a waiter refused for a full line had a place for its user
    already or found no user with two places, and a displaced waiter's user had the most."""
    rng = random.Random(max_per_user)
    manager = make_manager(max_per_user=max_per_user, max_global=2, max_waiting=6)
    holder = await manager.acquire("holder", weight=2)
    waiters: dict[asyncio.Task, tuple[str, int]] = {}
    outcomes: Counter[str] = Counter()
    for arrival in range(30):
        user, weight = f"u{rng.randrange(8)}", rng.choice([1, 2])
        before = Counter(user for task, (user, _) in waiters.items() if not task.done())
        task = asyncio.create_task(
            manager.acquire(user, weight=weight, priority=rng.choice([0, 5]), wait_timeout=60)
        )
        waiters[task] = (user, weight)

        await settled(manager, list(waiters), arrival)
        places = Counter(user for task, (user, _) in waiters.items() if not task.done())
        for who in places:
            weight_waiting = sum(w for t, (u, w) in waiters.items() if u == who and not t.done())
            assert not max_per_user or weight_waiting <= max_per_user, (who, weight_waiting)
        if task.done():
            refused = task.exception()
            assert isinstance(refused, StreamLeaseRejected), refused
            if isinstance(refused, LineFull):
                outcomes["line full"] += 1
                assert sum(before.values()) == 6
                assert before[user] > 0 or max(before.values()) <= 1, (user, before)
            else:
                outcomes["over quota"] += 1
                assert max_per_user and refused.limit == "per_user", refused
        for gone in [t for t in waiters if t.done() and t is not task]:
            refused = gone.exception()
            assert isinstance(refused, LineFull) and refused.displaced, refused
            outcomes["displaced"] += 1
            victim = waiters[gone][0]
            assert before[victim] == max(before.values()) >= 2, (victim, before)
            assert places[user] == 1, "the place went to a user's first waiter"
        waiters = {t: w for t, w in waiters.items() if not t.done()}
    assert outcomes["displaced"] and outcomes["line full"], outcomes
    assert outcomes["over quota"] or not max_per_user, outcomes
    await holder.release()
    for task in list(waiters):
        task.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
    await count_is(manager, 0)


@pytest.mark.parametrize("own_waits", [False, True])
async def test_a_users_streams_and_waiters_together_keep_to_its_quota(make_manager, own_waits):
    """With max_per_user=2, a user holding one stream has at most one waiter; with
    wait_for_own_quota=True, one holding two streams may have two waiters."""
    manager = make_manager(max_per_user=2, max_global=3, wait_for_own_quota=own_waits)
    held = [await manager.acquire("alice") for _ in range(2 if own_waits else 1)]
    others = [await manager.acquire("holder") for _ in range(3 - len(held))]  # global is full
    waiters = [await waiting(manager, "alice") for _ in range(2 if own_waits else 1)]
    with pytest.raises(StreamLeaseRejected) as refused:
        await manager.acquire("alice", wait_timeout=30)
    assert (refused.value.limit, refused.value.status_code) == ("per_user", 429)
    assert not isinstance(refused.value, LineFull)
    for lease in held + others:
        await lease.release()
    await all_served(waiters)
    await count_is(manager, 0)
