"""One random sequence of operations played on two managers at once, one on the embedded store
and one on Redis, with the same configuration: every answer (a grant and its figures, a refusal
and its reason and figures, a rate decision, a count, a budget's usage) must be the same.

The operations: acquire (weights, resources, a start rate, a token budget with a reservation,
waiting in line or not), release, hit and peek, consuming tokens past a reservation (top-ups, a
budget cut), reporting usage and settling, revoke with and without a ban, reset, counts, and
a waiter let in by a release. Windows are an hour long (fixed and sliding) so that no run
crosses one: the two stores keep time on different clocks, and everything else is exact.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi_stream_lease import (
    BudgetExhausted,
    Lease,
    LeaseConfig,
    RateLimit,
    Resource,
    StreamLeaseError,
    StreamLeaseManager,
)

USERS = ("u0", "u1", "u2", "u3")
RESOURCES = (Resource(2, "db"), Resource(1, "gpu"))
STARTS = RateLimit("starts", 4, per=3600)
HITS = RateLimit("hits", 5, per=3600, algorithm="fixed_window")
TOKENS = RateLimit("tokens", 20_000, per=3600, unit="tokens")
SECRET = "agreement-secret-0123456789abcdef"


def config(prefix: str) -> LeaseConfig:
    return LeaseConfig(
        key_prefix=prefix, identity_secret=SECRET, max_per_user=2, max_global=6,
        lease_seconds=600,
    )  # fmt: skip


def answer_of(error: BaseException) -> tuple[Any, ...]:
    """What a refusal says, as both stores must say it (``retry_after`` apart: it is read off
    each store's own clock)."""
    if isinstance(error, ValueError):
        return ("ValueError", str(error))
    if not isinstance(error, StreamLeaseError):
        raise error
    said: tuple[Any, ...] = (type(error).__name__, error.status_code)
    for name in ("limit", "capacity", "current", "budget", "reservation", "policy"):
        value = getattr(error, name, None)
        if value is not None:
            said += (name, getattr(value, "name", value))
    return said


def decisions_of(decisions: Any) -> list[tuple[Any, ...]]:
    return [(d.policy.name, d.limit, d.remaining, d.used, d.would_refuse) for d in decisions]


@dataclass
class Pair:
    """One stream held on both stores, and what it is for."""

    leases: tuple[Lease, Lease]
    user: str | None
    budget: bool


@dataclass
class Disagreement(AssertionError):
    step: int
    operation: str
    embedded: Any
    redis: Any

    def __str__(self) -> str:
        return (
            f"step {self.step}, {self.operation}: the embedded store answered {self.embedded!r}"
            f", Redis {self.redis!r}"
        )


@dataclass
class Play:
    """The sequence of ``seed``, on the embedded store and on ``redis_url``."""

    seed: int
    redis_url: str
    steps_done: int = 0
    #: Operations played, and answers given, by kind (a grant, or the refusal's class and pool).
    counts: dict[str, int] = field(default_factory=dict)
    answers: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.random = random.Random(self.seed)
        prefix = f"agree{uuid.uuid4().hex[:8]}"
        self.managers = (
            StreamLeaseManager(url="memory://", config=config(prefix)),
            StreamLeaseManager(url=self.redis_url, config=config(prefix)),
        )
        self.held: list[Pair] = []
        self.banned: set[str] = set()

    async def close(self) -> None:
        for manager in self.managers:
            await manager.aclose()

    async def both(self, operation: str, call: Callable[[StreamLeaseManager], Any]) -> Any:
        """``call`` on each manager; its answers (or refusals) must be equal. Returns the pair of
        raw results (None where refused)."""
        answers, results = [], []
        for manager in self.managers:
            try:
                result = await call(manager)
            except (StreamLeaseError, ValueError) as error:
                answers.append(answer_of(error))
                results.append(None)
            else:
                answers.append(("ok", self.said(result)))
                results.append(result)
        self.agree(operation, *answers)
        return results

    def agree(self, operation: str, embedded: Any, redis: Any) -> None:
        """Counts ``operation`` and its answer, which must be the same on both stores."""
        if embedded != redis:
            raise Disagreement(self.steps_done, operation, embedded, redis)
        name = operation.partition("(")[0]
        self.counts[name] = self.counts.get(name, 0) + 1
        kind = f"{name}: {' '.join(str(part) for part in embedded[:1] + embedded[2:4])}"
        self.answers[kind] = self.answers.get(kind, 0) + 1

    @staticmethod
    def said(result: Any) -> Any:
        if isinstance(result, Lease):
            return (result.weight, sorted(result.pool_usage), decisions_of(result.rate_decisions))
        if isinstance(result, list):
            return decisions_of(result)
        if isinstance(result, dict):
            return {name: decisions_of([d])[0] for name, d in result.items()}
        if hasattr(result, "policy"):
            return decisions_of([result])
        return result

    async def run(self, steps: int) -> None:
        operations = [
            (self.acquire, 8), (self.release, 5), (self.hit, 3), (self.consume, 3),
            (self.count, 2), (self.wait_then_release, 1), (self.revoke, 1), (self.reset, 1),
        ]  # fmt: skip
        kinds, weights = zip(*operations, strict=True)
        for _ in range(steps):
            (operation,) = self.random.choices(kinds, weights)
            await operation()
            self.steps_done += 1
        while self.held:
            await self.release()
        await self.count()

    def user(self) -> str:
        return self.random.choice(USERS)

    def acquire_options(self) -> dict[str, Any]:
        r = self.random
        options: dict[str, Any] = {"weight": r.choice((1, 1, 1, 2))}
        if r.random() < 0.3:
            options["resources"] = r.sample(RESOURCES, r.randint(1, 2))
        if r.random() < 0.3:
            options["rate_limits"] = [STARTS]
        if r.random() < 0.4:
            options["budgets"] = [TOKENS]
            options["reserve"] = r.choice((100, 400, 1000, 5000, 30_000))
        return options

    async def acquire(self, wait: float = 0) -> None:
        user = None if self.random.random() < 0.1 else self.user()
        options = self.acquire_options()
        if user is None:
            options.pop("rate_limits", None)
            options.pop("budgets", None)
            options.pop("reserve", None)
            options["resources"] = options.get("resources") or [RESOURCES[0]]
        if wait:
            options["wait_timeout"] = wait
        embedded, redis = await self.both(
            f"acquire({user}, {options})", lambda m: m.acquire(user, **options)
        )
        if embedded is not None:
            self.held.append(Pair((embedded, redis), user, "budgets" in options))

    async def release(self) -> None:
        if not self.held:
            return
        pair = self.held.pop(self.random.randrange(len(self.held)))
        if pair.budget and self.random.random() < 0.5:
            tokens = self.random.randint(0, 1500)
            for lease in pair.leases:
                lease.report_usage(input_tokens=0, output_tokens=tokens)
        released = [("ok", await lease.release()) for lease in pair.leases]
        self.agree("release", *released)
        if pair.user is not None and pair.budget:
            await self.both(f"usage({pair.user})", lambda m: m.usage(pair.user, TOKENS))

    async def hit(self) -> None:
        user, cost = self.user(), self.random.choice((1, 1, 2))
        if self.random.random() < 0.2:
            await self.both(f"peek({user})", lambda m: m.peek(user, HITS))
        else:
            await self.both(f"hit({user}, {cost})", lambda m: m.hit(user, HITS, cost=cost))

    async def consume(self) -> None:
        """Counts tokens on a budgeted stream past its reservation: top-ups, or a cut."""
        budgeted = [pair for pair in self.held if pair.budget]
        if not budgeted:
            return
        pair = self.random.choice(budgeted)
        tokens = self.random.randint(50, 2000)
        answers = []
        for lease in pair.leases:
            try:
                lease.consume(tokens)
                await asyncio.wait_for(lease.wait_budget(), 10)
                answers.append(("ok", lease.tokens_used))
            except BudgetExhausted as error:
                answers.append(answer_of(error))
        self.agree(f"consume({tokens})", *answers)

    async def count(self) -> None:
        for user in (None, *USERS):
            await self.both(f"count({user})", lambda m, u=user: m.get_active_count(u))

    async def wait_then_release(self) -> None:
        """A waiter in line on each store, let in (or not) by a release."""
        if not self.held:
            return await self.acquire(wait=0.3)
        user, options = self.user(), {"wait_timeout": 5.0}
        waiters = [
            asyncio.create_task(self._settled(manager.acquire(user, **options)))
            for manager in self.managers
        ]
        await asyncio.sleep(0.05)
        await self.release()
        (embedded, e_lease), (redis, r_lease) = await asyncio.gather(*waiters)
        try:
            self.agree(f"waiter({user})", embedded, redis)
        except Disagreement:
            for lease in (e_lease, r_lease):
                if lease is not None:
                    await lease.release()
            raise
        if e_lease is not None:
            self.held.append(Pair((e_lease, r_lease), user, False))

    async def _settled(self, acquire: Any) -> tuple[Any, Lease | None]:
        try:
            lease = await acquire
        except (StreamLeaseError, ValueError) as error:
            return answer_of(error), None
        return ("ok", self.said(lease)), lease

    async def revoke(self) -> None:
        """Revokes a user's streams; only the last user is ever banned (for the whole run: a
        ban that ended mid-run would end at a different instant on each store's clock)."""
        user = self.user()
        ban = 3600 if user == USERS[-1] and self.random.random() < 0.5 else 0
        await self.both(f"revoke({user}, {ban})", lambda m: m.revoke(user, ban_seconds=ban))
        for pair in [p for p in self.held if p.user == user]:
            self.agree(f"revoked({user})", *[("ok", lease.revoked) for lease in pair.leases])
            self.held.remove(pair)
            for lease in pair.leases:
                await lease.release()

    async def reset(self) -> None:
        """Resets a user's rate counts, and their token budget unless a stream of theirs holds
        a reservation there: the tokens such a stream streamed are moved into the counter
        every top-up period (250 ms, the manager's own timer), so whether those streamed just
        before the reset count in the fresh allowance depends on when each manager's period
        ends, on either store alike."""
        user = self.user()
        policies = [HITS, STARTS]
        if not any(pair.user == user and pair.budget for pair in self.held):
            policies.append(TOKENS)
        await self.both(f"reset({user})", lambda m: m.reset(user, *policies))
