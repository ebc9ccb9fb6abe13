"""Budgets in money (``unit="cost"``): a model's tokens priced from a ``Prices`` table at
reservation, top-up and settlement, the stream charged its whole cost rounded up once. Each
behavioural test runs on the embedded store and on a real Redis."""

from __future__ import annotations

import math

import pytest

from fastapi_stream_lease import (
    BudgetExhausted,
    LeaseConfig,
    Prices,
    RateLimit,
    RateLimited,
    ReservationTooLarge,
    StreamLeaseManager,
    openai_rate_limit_headers,
    rate_limit_headers,
)

# In the budget's unit per million tokens: 0.1 a prompt token, 0.4 an answer token, 0.025 a
# prompt token read from the cache.
PRICES = Prices({"gpt-x": (100_000, 400_000, 25_000), "gpt-mini": (10_000, 40_000, 0)})
SPEND = RateLimit("spend", 500, per="day", unit="cost")
TPM = RateLimit("tokens_per_minute", 100_000, per=60, unit="tokens")


async def tokens(count: int):
    for i in range(count):
        yield f"token {i}"


async def used(manager, budget=SPEND, user="alice") -> int:
    return (await manager.usage(user, budget))[budget.name].used


async def test_a_daily_spend_budget_refuses_the_stream_whose_priced_reservation_does_not_fit(
    make_manager,
):
    manager = make_manager(max_per_user=3)
    # 1,000 * 0.1 + 800 * 0.4 = 420 units of 500.
    held = await manager.acquire(
        "alice", budgets=[SPEND], reserve=(1_000, 800), model="gpt-x", prices=PRICES
    )
    assert held.rate_decisions[0].used == 420
    with pytest.raises(RateLimited) as refused:
        # 100 * 0.1 + 200 * 0.4 = 90 units: only 80 are left.
        await manager.acquire(
            "alice", budgets=[SPEND], reserve=(100, 200), model="gpt-x", prices=PRICES
        )
    assert refused.value.policy == "spend"
    assert (
        "budget in money \"spend\" cannot cover the stream's reservation (80 of 500 units per UTC"
        " day left)" in str(refused.value)
    ), "a refusal in money speaks of units, not tokens"
    assert await manager.get_active_count("alice") == 1, "no slot taken"
    # The same tokens of a cheaper model fit: 1 + 8 = 9 units.
    cheap = await manager.acquire(
        "alice", budgets=[SPEND], reserve=(100, 200), model="gpt-mini", prices=PRICES
    )
    await cheap.release()
    async for _ in held.wrap(tokens(100), tokens=lambda _: 1):
        pass
    # Charged 100 + 40 units; the cheap stream, never streamed, its prompt's 1.
    assert await used(manager) == 141


async def test_the_answer_is_charged_its_cost_rounded_up_once_over_the_whole_stream(make_manager):
    """A stream of a thousand one-token chunks, well past its reservation: topped up in units,
    charged the ceiling of 3 * 0.1 + 1,000 * 0.4 = 400.3 (a ceiling per chunk would charge
    1,000), while its token budget counts its tokens."""
    manager = make_manager()
    lease = await manager.acquire(
        "alice", budgets=[TPM, SPEND], reserve=(3, 200), model="gpt-x", prices=PRICES
    )
    assert [d.used for d in lease.rate_decisions] == [203, 81]
    delivered = [item async for item in lease.wrap(tokens(1_000), tokens=lambda _: 1)]
    assert len(delivered) == 1_000
    assert await used(manager) == 401
    assert await used(manager, TPM) == 1_003


async def test_a_stream_past_its_spend_budget_is_cut_within_the_budget(make_manager):
    manager = make_manager()
    small = RateLimit("small_spend", 50, per=60, unit="cost")
    lease = await manager.acquire(
        "alice", budgets=[small], reserve=(0, 100), model="gpt-x", prices=PRICES
    )
    delivered = 0
    with pytest.raises(BudgetExhausted) as cut:
        async for _ in lease.wrap(tokens(10_000), tokens=lambda _: 1):
            delivered += 1
    assert cut.value.budget == "small_spend"
    # 50 units buy 125 tokens; with so little room left the stream has no slack, so at most
    # the token it was on went past.
    assert 125 <= delivered <= 126
    assert await used(manager, small) == math.ceil(delivered * 0.4)


async def test_a_settlement_charges_cached_prompt_tokens_at_the_cached_price(make_manager):
    manager = make_manager()
    async with manager.lease(
        "alice", budgets=[SPEND], reserve=(1_000, 100), model="gpt-x", prices=PRICES
    ) as lease:
        assert lease.rate_decisions[0].used == 140
        lease.consume(100)
        lease.report_usage(input_tokens=1_000, output_tokens=100, cached_input_tokens=800)
    # 200 * 0.1 + 800 * 0.025 + 100 * 0.4 = 80 units.
    assert await used(manager) == 80


async def test_headers_and_usage_tell_the_spend_budget_in_its_unit(backend_url, key_prefix):
    """The manager's price table prices every acquire that names a model."""
    manager = StreamLeaseManager(
        url=backend_url, config=LeaseConfig(key_prefix=key_prefix), prices=PRICES
    )
    try:
        lease = await manager.acquire("alice", budgets=[SPEND], reserve=(1_000, 800), model="gpt-x")
        headers = rate_limit_headers(lease.rate_decisions)
        assert headers["RateLimit-Policy"] == '"spend";q=500;w=86400'
        assert headers["RateLimit"].startswith('"spend";r=80;t=')
        assert openai_rate_limit_headers(lease.rate_decisions) == {}, "money is not tokens"
        usage = (await manager.usage("alice", SPEND))["spend"]
        assert (usage.used, usage.remaining, usage.limit) == (420, 80, 500)
        await lease.release()
        free = Prices({"gpt-x": (0, 0, 0)})
        lease = await manager.acquire(
            "alice", budgets=[SPEND], reserve=(1_000, 800), model="gpt-x", prices=free
        )
        assert lease.rate_decisions[0].used == 100, "the call's prices win over the manager's"
        await lease.release()
    finally:
        await manager.aclose()


async def test_bad_price_input_gets_a_clear_error_and_takes_nothing(make_manager):
    MOST = 1_000_000_000  # per million tokens
    for table, error, message in [
        ({"gpt-x": (0.15, 1, 0)}, TypeError, "whole units per million tokens"),
        ({"gpt-x": (-1, 1, 0)}, ValueError, "input=-1 is out of range"),
        ({"gpt-x": (1, MOST + 1, 0)}, ValueError, f"={MOST + 1} is out of range: use 0 to {MOST}"),
        ({"gpt-x": (1, 2)}, TypeError, r"\(input, output, cached_input\)"),
        ({1: (1, 2, 3)}, TypeError, "model name"),
        ([("gpt-x", (1, 2, 3))], TypeError, "dict of model name"),
    ]:
        with pytest.raises(error, match=message):
            Prices(table)
    assert PRICES["gpt-x"] == (100_000, 400_000, 25_000) and "gpt-mini" in PRICES
    with pytest.raises(TypeError, match="prices must be a Prices table"):
        StreamLeaseManager(prices={"gpt-x": (1, 2, 3)})

    manager = make_manager()
    for kwargs, error, message in [
        ({"budgets": [SPEND]}, ValueError, 'budget "spend" counts cost: name the model'),
        ({"budgets": [SPEND], "model": "gpt-y", "prices": PRICES}, ValueError,
         'no price for model "gpt-y": Prices knows gpt-mini, gpt-x'),
        ({"budgets": [SPEND], "model": "gpt-x", "prices": Prices({})}, ValueError,
         "Prices knows no model"),
        ({"budgets": [SPEND], "model": "gpt-x"}, TypeError, "needs a price table"),
        ({"budgets": [SPEND], "model": "gpt-x", "prices": {"gpt-x": (1, 2, 3)}}, TypeError,
         "prices must be a Prices table"),
    ]:  # fmt: skip
        with pytest.raises(error, match=message):
            await manager.acquire("alice", **kwargs)
    assert await manager.get_active_count("alice") == 0
    assert await used(manager) == 0

    async with manager.lease(
        "alice", budgets=[SPEND], reserve=(100, 10), model="gpt-x", prices=PRICES
    ) as lease:
        with pytest.raises(ValueError, match="cached_input_tokens=200 is more than input_tokens"):
            lease.report_usage(input_tokens=100, output_tokens=10, cached_input_tokens=200)
    assert await used(manager) == 10, "the estimate charged: 100 * 0.1, nothing streamed"


async def test_a_reservation_priced_above_the_budgets_whole_limit_is_refused_as_never_fitting(
    make_manager,
):
    """A reservation whose price is more than a money budget's whole limit was raised as bad
    input (a ValueError) instead of the refusal of a request that could never fit: it is
    ReservationTooLarge (400), counted in the budget's unit, and it takes nothing."""
    manager = make_manager()
    with pytest.raises(ReservationTooLarge) as refused:
        # 1,000 * 0.1 + 1,001 * 0.4 = 500.4 units: 501 of a 500-unit day.
        await manager.acquire(
            "alice", budgets=[SPEND], reserve=(1_000, 1_001), model="gpt-x", prices=PRICES
        )
    assert (refused.value.reservation, refused.value.limit, refused.value.status_code) == (
        501, 500, 400,
    )
    assert "501 units of budget in money \"spend\"" in str(refused.value)
    assert await used(manager) == 0


async def test_reserve_auto_without_max_tokens_is_capped_by_what_the_money_budget_holds(
    make_manager,
):
    """Without max_tokens, reserve="auto" takes the prompt and 1,024 answer tokens, at most
    what the budget's limit pays for after the prompt's price."""
    manager = make_manager()
    # 1,000 prompt tokens cost 100 units; the 400 left buy 1,000 answer tokens, not 1,024.
    lease = await manager.acquire(
        "alice", budgets=[SPEND], reserve="auto", model="gpt-x", prices=PRICES, prompt_tokens=1_000
    )
    assert lease.rate_decisions[0].used == 500
    await lease.release()


async def test_the_default_reservation_of_a_cost_budget_fits_its_limit_at_the_models_price(
    make_manager,
):
    """Left out, a reservation is one top-up increment of answer tokens, at most what the
    smallest budget holds: a cost budget's limit counted as tokens overshot it when a token
    costs more than a unit, and the start was refused as never allowed."""
    manager = make_manager()
    dear = RateLimit("dear_spend", 1_000, per=60, unit="cost")
    prices = Prices({"big": (0, 10_000_000, 0)})  # 10 units an answer token
    lease = await manager.acquire("alice", budgets=[dear], model="big", prices=prices)
    assert lease.rate_decisions[0].used == 1_000, "the 100 tokens the budget can pay for"
    await lease.release()
