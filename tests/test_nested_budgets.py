"""Several identities in one admission: each entry of ``rate_limits`` and ``budgets`` counts
the user, or the identity paired with it (a team, an API key, a model), all checked, reserved,
topped up, settled and refunded against their own identity in one atomic step. Each
behavioural test runs on the embedded store and on a real Redis."""

from __future__ import annotations

import pytest
from fastapi import Depends, FastAPI, Header
from starlette.testclient import TestClient

from fastapi_stream_lease import (
    Lease,
    LeaseConfig,
    RateLimit,
    RateLimited,
    StreamLeaseManager,
    install_exception_handler,
    rate_limit_headers,
)

from support.waiting import eventually

TEAM = RateLimit("team_tokens", 1_000, per=60, unit="tokens")
KEY = RateLimit("key_tokens", 5_000, per=60, unit="tokens")
USER = RateLimit("user_tokens", 5_000, per=60, unit="tokens")
STARTS = RateLimit("team_starts", 100, per=60)


async def used(manager, identity: str, budget: RateLimit | tuple[RateLimit, str]) -> int:
    """The tokens ``budget`` holds for ``identity`` (or, paired with one, for its own)."""
    (decision,) = (await manager.usage(identity, budget)).values()
    return decision.used


async def test_a_team_budget_shared_by_two_users_is_charged_by_both_and_refuses_the_third(
    make_manager,
):
    """The team's budget counts the team, whoever streams: two users' reservations fill it,
    and a third user, with room in their own budget, is refused by the team's."""
    manager = make_manager(max_per_user=0)
    levels = [(TEAM, "team-a"), USER]
    alice = await manager.acquire("alice", budgets=levels, reserve=400)
    bob = await manager.acquire("bob", budgets=levels, reserve=400)
    team, user = bob.rate_decisions
    assert (team.policy.name, team.used, team.remaining) == ("team_tokens", 800, 200)
    assert (user.policy.name, user.used) == ("user_tokens", 400), "bob's own budget"
    with pytest.raises(RateLimited) as refused:
        await manager.acquire("carol", budgets=levels, reserve=400)
    assert refused.value.policy == "team_tokens"
    # The headers name each level by its policy.
    states = rate_limit_headers(bob.rate_decisions)["RateLimit"].split(", ")
    assert [state.rsplit(";", 1)[0] for state in states] == [
        '"team_tokens";r=200',
        '"user_tokens";r=4600',
    ]
    assert await used(manager, "carol", USER) == 0
    await alice.release()
    await bob.release()
    # Released unused: each reservation came back to the team and to its user.
    assert await used(manager, "any", (TEAM, "team-a")) == 0
    assert await used(manager, "alice", USER) == 0


async def test_a_refusal_at_one_level_counts_nothing_at_the_others(make_manager):
    """All or nothing: a start the team's budget refuses takes nothing from the key's and the
    user's budgets, nor from the team's request rate, nor a slot."""
    manager = make_manager()
    filler = await manager.acquire("dave", budgets=[(TEAM, "team-b")], reserve=900)
    with pytest.raises(RateLimited):
        await manager.acquire(
            "erin",
            rate_limits=[(STARTS, "team-b")],
            budgets=[(KEY, "key-1"), USER, (TEAM, "team-b")],
            reserve=200,
        )
    assert await used(manager, "erin", USER) == 0
    assert await used(manager, "erin", (KEY, "key-1")) == 0
    assert await used(manager, "erin", (TEAM, "team-b")) == 900
    (starts,) = await manager.hit("erin", (STARTS, "team-b"), cost=0)
    assert starts.used == 0
    assert await manager.get_active_count("erin") == 0
    await filler.release()


async def test_top_ups_and_settlement_charge_each_level_its_own_identity(make_manager):
    """A stream past its reservation is topped up at every level, and at release each level's
    identity is charged what the stream used, the rest given back to each."""
    manager = make_manager()
    levels = [(TEAM, "team-c"), (KEY, "key-2"), USER]
    lease = await manager.acquire("frank", budgets=levels, reserve=(100, 50))
    assert [d.used for d in lease.rate_decisions] == [150, 150, 150]
    lease.consume(300)  # past the reservation: due a top-up at every level

    async def every_level(expected: int) -> bool:
        figures = [
            await used(manager, "frank", (TEAM, "team-c")),
            await used(manager, "frank", (KEY, "key-2")),
            await used(manager, "frank", USER),
        ]
        return figures == [expected] * 3

    # Topped up to one increment ahead of what it streamed: 100 + 300 + 256.
    await eventually(lambda: every_level(656), what="the top-ups at every level")
    await lease.release()
    assert await every_level(400), "settled to the prompt and the 300 streamed"
    assert await used(manager, "team-c", USER) == 0, "the team's id as a user is untouched"
    await manager.reset("frank", (TEAM, "team-c"), (KEY, "key-2"), USER)
    assert await every_level(0)


@pytest.mark.parametrize(
    ("entry", "error", "message"),
    [
        ("team_tokens", TypeError, "RateLimit values or \\(RateLimit, identity\\) pairs"),
        ((TEAM, "t", "x"), TypeError, "is a \\(RateLimit, identity\\) pair, got a tuple of 3"),
        ((TEAM, ""), ValueError, 'identity paired with rate limit "team_tokens" is empty'),
        ((TEAM, 42), TypeError, 'paired with rate limit "team_tokens" must be a str, got int'),
        (("t", TEAM), TypeError, "RateLimit values or \\(RateLimit, identity\\) pairs, got str"),
        ((USER, "u2"), ValueError, '"user_tokens" is given twice.*each level its own'),
    ],
)
async def test_a_bad_entry_is_refused_clearly_before_anything_is_counted(
    make_manager, entry, error, message
):
    manager = make_manager()
    with pytest.raises(error, match=message):
        await manager.acquire("gina", budgets=[USER, entry], reserve=10)
    with pytest.raises(error, match=message):
        await manager.usage("gina", USER, entry)
    assert await used(manager, "gina", USER) == 0
    assert await manager.get_active_count("gina") == 0


def test_the_dependency_charges_the_team_level_of_every_user_and_refuses_the_third():
    """``stream_lease(budgets=[(budget, team), ...])``: each response's start reserves from the
    team's budget and its user's, and the third user's is refused (429) by the team's."""
    manager = StreamLeaseManager(url="memory://", config=LeaseConfig(max_per_user=0))
    app = FastAPI()
    install_exception_handler(app)

    def user(x_user: str = Header()) -> str:
        return x_user

    leased = Depends(manager.stream_lease(user=user, budgets=[(TEAM, "team-d"), USER], reserve=400))

    @app.get("/answer")
    async def answer(lease: Lease = leased) -> list[int]:
        lease.consume(400)  # the whole reservation, charged at release
        return [decision.used for decision in lease.rate_decisions]

    with TestClient(app) as client:
        used_by = [client.get("/answer", headers={"x-user": who}) for who in ("ann", "ben")]
        assert [r.json() for r in used_by] == [[400, 400], [800, 400]]
        refused = client.get("/answer", headers={"x-user": "cat"})
        assert refused.status_code == 429
        assert refused.json()["violated-policies"] == ["team_tokens"]
