"""One worker process of the chaos run: a StreamLeaseManager on the URL it is given, and
``concurrency`` runners, each opening one stream after another with a random user, weight,
resources and length; some wait in line (at a random priority), some are cancelled while they
acquire or while they stream. It tells the auditor, one JSON line on stdout per event:

* ``{"e": "start", ...}``: a stream began. ``t_req`` is the monotonic time just before the
  acquire was called, ``t_start`` just after it returned: Redis granted the lease in between.
  ``rate`` says whether the acquire counted the per-user start rate (the hit happened in
  between too), ``budget`` whether the stream spends the budgets (its user's tokens, its
  team's money).
* ``{"e": "tok", ...}``: a budgeted stream sent ``n`` tokens at ``t``, stamped as the chunk
  leaves the library (counted, and past any wait for a top-up).
* ``{"e": "end", ...}``: a stream ended. ``t_end`` is taken inside the stream's own code as it
  stops (before the library starts the release), ``how`` says why: ``ok``, ``cancelled`` (by
  this program), ``lost`` (``LeaseLost``: the library ended it), ``cut`` (``BudgetExhausted``).
* ``{"e": "refused" | "limited" | "unavailable" | "cancelled_acquire" | "error", ...}``: an
  acquire that gave no stream (``limited``: the start rate or the budget refused it).
* ``{"e": "hit", ...}``: a hit of a hot ``user`` against the leased request rate was allowed:
  asked at ``t_req``, answered at ``t_done`` (served from units the worker held, or by Redis,
  in between). Refused hits are counted in ``bye``'s ``hits_refused``.
* ``{"e": "bye", "stats": ...}``: on SIGTERM, once every runner finished its stream and the
  manager is closed.

The stamps are ``time.monotonic()``, one clock for every process of the machine (Linux's
CLOCK_MONOTONIC), taken in this process where the stream begins and ends, so a late pipe
cannot make a stream look longer or shorter than it was.

Usage: python -m chaos.worker URL NAME SEED SETTINGS_JSON
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import signal
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi_stream_lease import (
    BackendUnavailable,
    BudgetExhausted,
    LeaseConfig,
    LeaseLost,
    PoolFull,
    Prices,
    RateLimit,
    RateLimited,
    Resource,
    StreamLeaseManager,
)

from chaos.settings import Settings

now = time.monotonic


@dataclass
class Plan:
    """One stream: what it asks for, how long it lasts, whether it is cancelled and when."""

    sid: str
    user: str | None
    resources: list[str]
    weight: int
    wait: float  # wait_timeout: seconds it may wait in line
    priority: int  # its place among waiters: higher first (0 to 9)
    style: str  # "wrap" (lease.wrap of a generator) or "block" (async with manager.lease())
    cancel_acquire: float | None  # cancelled this long after it asked, if still acquiring
    cancel_stream: float | None  # cancelled this long after it asked, if still running
    length: float
    rate: bool  # counts the per-user start rate
    budget: bool  # spends its user's token budget and its team's money budget
    reserve: int  # tokens reserved at admission (with a budget)


def emit(event: str, **fields: object) -> None:
    # One write per line, straight to the pipe: a worker killed after a stream began has told it.
    sys.stdout.write(json.dumps({"e": event, **fields}, separators=(",", ":")) + "\n")
    sys.stdout.flush()


class Worker:
    def __init__(self, url: str, name: str, seed: int, settings: Settings) -> None:
        self.settings = settings
        self.name = name
        self.rng = random.Random(seed)
        self.stop = asyncio.Event()
        self.streams = 0
        # Streams whose start was told (a cancelled acquire's is not one).
        self._started: set[str] = set()
        self.manager = StreamLeaseManager(
            url=url,
            config=LeaseConfig(
                key_prefix=settings.key_prefix,
                identity_secret=settings.identity_secret,
                lease_seconds=settings.lease_seconds,
                renew_every=settings.renew_every,
                redis_timeout=settings.redis_timeout,
                max_per_user=settings.max_per_user,
                max_global=settings.max_global,
                lease_global_slots=settings.lease_global_slots,
                on_lost="cancel",
                failure_mode="closed",
                retry_after=1.0,
            ),
        )
        self.resources = {
            name: Resource(capacity, name) for name, capacity in settings.resources.items()
        }
        self.start_rate = RateLimit("starts", settings.rate_limit, per=settings.rate_per)
        self.hit_rate = RateLimit(
            "hits", settings.hit_limit, per=settings.hit_per, lease_units=True)
        self.hits_refused = 0
        self.budget_levels = [
            (level, RateLimit(level.name, level.limit, per=settings.budget_per, unit=level.unit))
            for level in settings.budget_levels()]
        # The model's prompt and cached prompt prices are never charged: a chaos stream reserves
        # answer tokens only.
        price = settings.answer_price
        self.prices = Prices({settings.model: (price, price, price)})

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self.stop.set)
        emit("hello", t=now())
        runners = [asyncio.create_task(self.runner(i)) for i in range(self.settings.concurrency)]
        runners += [asyncio.create_task(self.hitter()) for _ in range(self.settings.hitters)]
        watch = asyncio.create_task(self.watch_stats())
        await asyncio.gather(*runners)
        watch.cancel()
        await self.manager.aclose()
        emit("bye", t=now(), stats={**self.manager.stats(), "hits_refused": self.hits_refused})

    async def hitter(self) -> None:
        """Hits of the hot users, one after another, against the rate whose units this worker
        leases; each allowed hit is told."""
        settings = self.settings
        while not self.stop.is_set():
            user = settings.user_name(self.rng.randrange(settings.hit_users))
            t_req = now()
            try:
                await self.manager.hit(user, self.hit_rate)
            except RateLimited:
                self.hits_refused += 1
            except BackendUnavailable:
                pass
            except Exception as error:  # anything else is for the auditor to report
                emit("error", id=f"{self.name}.hits", error=f"{type(error).__name__}: {error}",
                     t=now())
            else:
                emit("hit", user=user, t_req=t_req, t_done=now())
            await asyncio.sleep(self.rng.uniform(0, settings.hit_pause))

    async def watch_stats(self) -> None:
        """Tells the auditor when the library finds leases lost or takes them back, or prunes
        (polled every 0.1 s: when it happened, give or take that)."""
        told: dict[str, object] = {}
        while True:
            stats = self.manager.stats()
            now_told = {k: stats[k] for k in ("lost", "reclaimed", "pruned")}  # type: ignore[literal-required]
            if now_told != told:
                emit("stats", t=now(), **now_told)
                told = now_told
            await asyncio.sleep(0.1)

    async def runner(self, index: int) -> None:
        # Runners start spread out, not all at once.
        await asyncio.sleep(self.rng.uniform(0, 0.5))
        while not self.stop.is_set():
            pause = await self.one_stream(f"{self.name}.{index}.{self.streams}")
            self.streams += 1
            if pause:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), pause)

    def choose(self, sid: str) -> Plan:
        """What the next stream asks for."""
        rng = self.rng
        resources = rng.choices([[], ["gpu"], ["db"], ["gpu", "db"]], weights=[60, 15, 15, 10])[0]
        user: str | None = self.settings.user_name(rng.randrange(self.settings.users))
        if resources and rng.random() < 0.2:
            user = None  # resources only: neither the user's pool nor the global one
        elif self.settings.lease_global_slots:
            resources = []  # a user's tag holds none (the option refuses them with a user)
        length = (rng.uniform(0.05, self.settings.short_stream) if rng.random() < 0.8
                  else rng.uniform(self.settings.short_stream, self.settings.long_stream))
        wait = rng.uniform(0.2, 2.0) if rng.random() < 0.35 else 0.0
        priority = rng.choices([0, 5, 9], weights=[70, 20, 10])[0] if wait else 0
        cancel_acquire = rng.uniform(0.0, 0.3) if rng.random() < 0.08 else None
        cancel_stream = wait + length * rng.uniform(0.1, 0.9) if rng.random() < 0.1 else None
        rate = user is not None and rng.random() < self.settings.rate_share
        budget = user is not None and rng.random() < self.settings.budget_share
        return Plan(
            sid, user, resources, rng.choices([1, 2, 3], weights=[75, 18, 7])[0], wait, priority,
            "wrap" if rng.random() < 0.7 else "block", cancel_acquire, cancel_stream, length,
            rate, budget, rng.randrange(50, 400),
        )

    async def one_stream(self, sid: str) -> float:
        """Opens one stream and holds it until it ends; returns how long to pause after it."""
        plan = self.choose(sid)
        t_req = now()
        stream = self.wrap_stream if plan.style == "wrap" else self.block_stream
        task = asyncio.create_task(stream(plan, t_req))
        try:
            if plan.cancel_acquire is not None:
                # Cancelled while it acquires, if it has not got its lease by then.
                await asyncio.wait({task}, timeout=plan.cancel_acquire)
                if not task.done() and not self.started(sid):
                    task.cancel()
            elif plan.cancel_stream is not None:
                await asyncio.wait({task}, timeout=plan.cancel_stream)
                if not task.done():
                    task.cancel()  # while it streams (or still waits in line)
            await task
        except asyncio.CancelledError:
            if not task.cancelled():
                raise
            if not self.started(sid):
                emit("cancelled_acquire", id=sid, t=now())
        except PoolFull as refusal:
            emit("refused", id=sid, limit=refusal.limit, waited=plan.wait > 0, t=now())
            return self.rng.uniform(0.05, 0.4)
        except RateLimited as refusal:
            emit("limited", id=sid, policy=refusal.policy, t=now())
            return self.rng.uniform(0.05, 0.4)
        except BackendUnavailable:
            emit("unavailable", id=sid, t=now())
            return self.rng.uniform(0.1, 0.5)
        except Exception as error:  # anything else is for the auditor to report
            emit("error", id=sid, error=f"{type(error).__name__}: {error}", t=now())
            return 0.2
        finally:
            self._started.discard(sid)
        return self.rng.uniform(0.0, 0.15)

    def started(self, sid: str) -> bool:
        return sid in self._started

    def began(self, plan: Plan, t_req: float, lease_id: str) -> None:
        self._started.add(plan.sid)
        emit("start", id=plan.sid, t_req=t_req, t_start=now(), lease=lease_id, user=plan.user,
             weight=plan.weight, res=plan.resources, rate=plan.rate, budget=plan.budget,
             reserve=plan.reserve if plan.budget else 0)

    def acquire_args(self, plan: Plan) -> dict[str, Any]:
        args: dict[str, Any] = {
            "weight": plan.weight, "wait_timeout": plan.wait, "priority": plan.priority,
            "resources": [self.resources[name] for name in plan.resources]}
        if plan.rate:
            args["rate_limits"] = [self.start_rate]
        if plan.budget:
            assert plan.user is not None
            args["budgets"] = [
                policy if level.identity_of(plan.user) == plan.user
                else (policy, level.identity_of(plan.user))
                for level, policy in self.budget_levels]
            args["reserve"] = plan.reserve
            args["model"] = self.settings.model
            args["prices"] = self.prices
        return args

    def chunk(self) -> int:
        return self.rng.randint(1, self.settings.max_chunk)

    async def wrap_stream(self, plan: Plan, t_req: float) -> None:
        lease = await self.manager.acquire(plan.user, **self.acquire_args(plan))
        self.began(plan, t_req, lease.lease_id)
        ended: list[float] = []

        async def body() -> AsyncIterator[int]:
            try:
                deadline = now() + plan.length
                while now() < deadline:
                    await asyncio.sleep(min(self.rng.uniform(0.02, 0.3), deadline - now()))
                    yield self.chunk()  # its tokens, for a budgeted stream
            finally:
                ended.append(now())  # before the library starts the release

        # A cut ends the stream in wrap() right after it counts an item, and wrap() releases
        # before it closes the body: the stream's end is the count's moment.
        counted: list[float] = []

        def count(n: int) -> int:
            counted.append(now())
            return n

        how = "ok"
        # The end, if the library ends the stream before its body ever ran (the lease lost at
        # once): this stamp still comes before the release.
        entered = now()
        try:
            async for n in lease.wrap(body(), tokens=count if plan.budget else None):
                # Nothing awaited here: every other exit goes through the body first.
                if plan.budget:
                    emit("tok", id=plan.sid, t=now(), n=n)
        except LeaseLost:
            how = "lost"
        except BudgetExhausted:
            how = "cut"
            ended.insert(0, counted[-1] if counted else entered)
        except asyncio.CancelledError:
            how = "cancelled"
            raise
        finally:
            emit("end", id=plan.sid, t_end=ended[0] if ended else entered, how=how,
                 lost=lease.lost)

    async def block_stream(self, plan: Plan, t_req: float) -> None:
        ended: list[float] = []
        how = "ok"
        lost = False
        began = False
        try:
            async with self.manager.lease(plan.user, **self.acquire_args(plan)) as lease:
                began = True
                self.began(plan, t_req, lease.lease_id)
                try:
                    if plan.budget:
                        await self.spend(lease, plan)
                    else:
                        await asyncio.sleep(plan.length)
                finally:
                    ended.append(now())  # before the release
                    lost = lease.lost
        except LeaseLost:
            how = "lost"
            lost = True
            if not began:  # lost before the block ran: no stream to tell of
                emit("lost_at_once", id=plan.sid, t=now())
        except BudgetExhausted:
            how = "cut"
        except asyncio.CancelledError:
            how = "cancelled"
            raise
        finally:
            if began:
                emit("end", id=plan.sid, t_end=ended[0], how=how, lost=lost)


    async def spend(self, lease: Any, plan: Plan) -> None:
        """A budgeted stream counted by hand: wait for the top-up, count, send, as the token
        budgets guide asks of code that does not use ``wrap()``."""
        deadline = now() + plan.length
        while now() < deadline:
            await asyncio.sleep(min(self.rng.uniform(0.02, 0.3), deadline - now()))
            await lease.wait_budget()
            n = self.chunk()
            lease.consume(n)
            emit("tok", id=plan.sid, t=now(), n=n)


class ToAuditor(logging.Handler):
    """The library's log records (a failed release, say) go to the auditor as events."""

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        emit("log", level=record.levelname, kind=message.split(":")[0], t=now())


async def main(url: str, name: str, seed: int, settings: Settings) -> None:
    library_log = logging.getLogger("fastapi_stream_lease")
    library_log.addHandler(ToAuditor())
    library_log.propagate = False
    await Worker(url, name, seed, settings).run()


if __name__ == "__main__":
    url, name, seed, settings_json = sys.argv[1:5]
    asyncio.run(main(url, name, int(seed), Settings.from_json(json.loads(settings_json))))
