"""Reservations learned from usage: ``reserve="auto"`` without ``max_tokens`` reserves the bound
of the size bucket that holds the 95th percentile of the model's settled answers, once it has
20 of them, else 1,024. Each behavioural test runs on the embedded store and on a real Redis."""

from __future__ import annotations

import asyncio

import pytest

from fastapi_stream_lease import BudgetExhausted, RateLimit, StreamLeaseManager, _core

from support.waiting import eventually

TPM = RateLimit("tokens_per_minute", 10_000_000, per=60, unit="tokens")
# The bucket of a 300-token answer is (292, 418]: its bound is what the model learns.
BOUND_ABOVE_300 = 418
# The bucket of an 8,000-token answer is (7,331, 10,484].
BOUND_ABOVE_8000 = 10_484
DEFAULT_ANSWER = 1_024
MIN_SAMPLES = 20
WEEK_MS = 7 * 86_400_000
# The most a model's histogram takes in Redis, all 32 buckets counted (MEMORY USAGE).
MAX_HISTOGRAM_BYTES = 300


async def settled(manager: StreamLeaseManager) -> None:
    await eventually(lambda: manager.stats()["unsettled"] == 0, what="the settlements")


async def answer(manager: StreamLeaseManager, user: str, tokens: int, model: str = "gpt-x") -> int:
    """Streams an answer of ``tokens`` tokens under ``reserve="auto"`` without ``max_tokens``,
    settled; returns the answer tokens its reservation took (no prompt: all of it)."""
    lease = await manager.acquire(user, budgets=[TPM], reserve="auto", model=model)
    reserved = lease.rate_decisions[0].used
    lease.consume(tokens)
    await lease.release()
    await settled(manager)
    return reserved


def reader_of(manager: StreamLeaseManager, make_manager) -> StreamLeaseManager:
    """A manager that reads what ``manager``'s streams taught: the same one on the embedded
    store (its histograms live in the process), a fresh one on Redis (``manager`` keeps the
    figure it read for 10 s)."""
    return manager if manager.backend == "memory://" else make_manager()


async def test_a_model_reserves_1024_until_20_answers_then_the_bound_above_its_95th_percentile(
    make_manager,
):
    manager = make_manager(max_per_user=0)
    reserved = [await answer(manager, f"u{i}", 300) for i in range(MIN_SAMPLES - 1)]
    assert reserved == [DEFAULT_ANSWER] * (MIN_SAMPLES - 1), "fewer than 20 answers"
    assert await reader_of(manager, make_manager).answer_estimate("gpt-x") == DEFAULT_ANSWER
    await answer(manager, "u19", 300)
    reader = reader_of(manager, make_manager)
    assert await reader.answer_estimate("gpt-x") == BOUND_ABOVE_300
    assert await answer(reader, "next", 300) == BOUND_ABOVE_300, "not 1,024"
    assert await reader.answer_estimate("gpt-mini") == DEFAULT_ANSWER, "each model its own"
    # Capped by what the budgets hold after the prompt, as the default is.
    small = RateLimit("small_tokens", 400, per=60, unit="tokens")
    lease = await reader.acquire(
        "capped", budgets=[small], reserve="auto", model="gpt-x", prompt_tokens=100
    )
    assert lease.rate_decisions[0].used == 400
    await lease.release()
    # max_tokens, when given, is the reservation still.
    lease = await reader.acquire(
        "exact", budgets=[TPM], reserve="auto", model="gpt-x", max_tokens=2_000
    )
    assert lease.rate_decisions[0].used == 2_000
    await lease.release()


async def test_the_estimate_is_the_bound_of_the_bucket_holding_the_95th_percentile(
    make_manager,
):
    """With 20 answers the 95th percentile is the 19th smallest: one long answer among them
    moves nothing; with a second long one among 21, the 20th smallest is long."""
    manager = make_manager(max_per_user=0)
    for user in range(MIN_SAMPLES - 1):
        await answer(manager, f"short{user}", 300)
    await answer(manager, "long0", 5_000)
    assert await reader_of(manager, make_manager).answer_estimate("gpt-x") == BOUND_ABOVE_300
    await answer(manager, "long1", 5_000)
    assert await reader_of(manager, make_manager).answer_estimate("gpt-x") == 5_126, (
        "5,000 is in the bucket (3,584, 5,126]"
    )


async def test_a_stream_cut_or_revoked_teaches_nothing(make_manager):
    """An answer cut short (its budget ran out, an operator revoked it, a drain or a loss
    ended it) is not the model's answer size: it is not counted."""
    manager = make_manager(max_per_user=0)
    tight = RateLimit("tight_tokens", 400, per=60, unit="tokens")

    async def chunks():
        for _ in range(40):
            yield "chunk"

    auto = {"reserve": "auto", "model": "gpt-x"}
    for user in range(MIN_SAMPLES):
        lease = await manager.acquire(f"cut{user}", budgets=[tight], **auto)
        with pytest.raises(BudgetExhausted):
            async for _ in lease.wrap(chunks(), tokens=lambda _: 50):
                pass
        lease = await manager.acquire(f"revoked{user}", budgets=[TPM], **auto)
        lease.consume(300)
        await manager.revoke(f"revoked{user}")
        await lease.release()
    await settled(manager)
    assert await reader_of(manager, make_manager).answer_estimate("gpt-x") == DEFAULT_ANSWER


async def test_a_retried_settlement_counts_its_answer_once(redis_client, key_prefix):
    settle = redis_client.register_script(_core._script_source("settle"))
    histogram = f"{{{key_prefix}}}:answers:digest"
    own = f"{histogram}:alice"
    keys, args = _core._settle_call("lease-1", histogram, own, 300)
    for _ in range(2):  # the answer of the first call lost: sent again
        settle(keys=keys, args=args)
    assert redis_client.hgetall(own) == {b"9": b"1", b"r": b"9"}, "bucket 9: (292, 418]"
    assert redis_client.hgetall(histogram) == {b"9": b"1"}, "alice, once, at her size"
    keys, args = _core._settle_call("lease-2", histogram, own, 300)
    settle(keys=keys, args=args)
    assert redis_client.hgetall(own) == {b"9": b"2", b"r": b"9"}
    assert redis_client.hgetall(histogram) == {b"9": b"1"}, "still one count for alice"


async def test_a_models_histogram_is_bounded_expires_in_a_week_and_never_names_it(
    make_redis_manager, redis_client, key_prefix
):
    manager = make_redis_manager(max_per_user=0)
    model = "gpt-secret-model"
    await answer(manager, "alice", 300, model=model)
    keys = [key.decode() for key in redis_client.keys(f"*{key_prefix}*")]
    assert not any(model in key for key in keys), keys
    histogram = f"{{{key_prefix}}}:answers:{manager._core.identity_digest(model)}"
    own = f"{histogram}:{manager._core.identity_digest('alice')}"
    assert histogram in keys and own in keys
    assert not any("alice" in key for key in keys), keys
    settle = redis_client.register_script(_core._script_source("settle"))
    tokens = 1.0
    while tokens < 3_000_000:  # answers of every size, 1.2 times apart: every bucket counted
        call_keys, args = _core._settle_call(f"size-{tokens}", histogram, own, int(tokens))
        settle(keys=call_keys, args=args)
        tokens *= 1.2
    assert redis_client.hlen(own) == 32 + 1, "a fixed count of buckets, and the user's size"
    assert sum(int(count) for count in redis_client.hvals(histogram)) == 1, "one per user"
    for key in (histogram, own):
        assert 0 < redis_client.pttl(key) <= WEEK_MS
        assert redis_client.pttl(key) > WEEK_MS - 60_000, "a week from the last answer"
        assert redis_client.memory_usage(key) <= MAX_HISTOGRAM_BYTES


async def test_a_workers_first_stream_of_a_model_reserves_the_default_while_it_reads(
    make_redis_manager,
):
    teaching = make_redis_manager(max_per_user=0)
    for user in range(MIN_SAMPLES):
        await answer(teaching, f"t{user}", 300)
    worker = make_redis_manager(max_per_user=0)
    assert await answer(worker, "first", 300) == DEFAULT_ANSWER, "no stream waits for a read"
    reserved = []

    async def learned() -> bool:
        reserved.append(await answer(worker, f"next{len(reserved)}", 300))
        return reserved[-1] == BOUND_ABOVE_300

    await eventually(learned, what="the first read's figure in use")


async def test_a_percentile_that_moved_is_in_use_within_10_s_and_one_read(make_redis_manager):
    """A process reads a model's histogram at the first stream of the model and again at the
    first stream 10 s or more after the last read, beside it: a percentile moved by another
    process's settlements is in use within 10 s and one read while the model streams."""
    watching = make_redis_manager(max_per_user=0, redis_timeout=1.0)
    teaching = make_redis_manager(max_per_user=0)
    assert await answer(watching, "w0", 300) == DEFAULT_ANSWER  # read now: no answers yet
    for user in range(MIN_SAMPLES):
        await answer(teaching, f"t{user}", 300)
    loop = asyncio.get_running_loop()
    taught = loop.time()
    streams = 0
    while await answer(watching, f"w{streams + 1}", 300) != BOUND_ABOVE_300:
        streams += 1
        assert loop.time() - taught <= 10 + 1.0 + 1.0, "10 s, one read, one stream between"
        await asyncio.sleep(0.1)


async def test_a_bad_answer_estimate_call_says_what_to_pass(make_manager):
    manager = make_manager()
    with pytest.raises(TypeError, match="model must be a str"):
        await manager.answer_estimate(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="model is empty"):
        await manager.answer_estimate("")
    with pytest.raises(ValueError, match="empty"):
        await manager.answer_estimate("gpt-x", user_id="")
    spread = make_manager(global_pool=False)
    with pytest.raises(ValueError, match="pass the user_id"):
        await spread.answer_estimate("gpt-x")
    assert await spread.answer_estimate("gpt-x", user_id="alice") == DEFAULT_ANSWER


async def test_one_users_answers_never_size_another_users_reservations(make_manager):
    """Regression: the learned size was one histogram per model for all users: one user's 20
    answers of 8,000 tokens raised everyone's reservation from 1,024 to 10,484. Each user is
    sized by their own answers once they have 20; before that by the model's figure, which
    counts each user once and needs 20 users: one user cannot set it."""
    manager = make_manager(max_per_user=0)
    for _ in range(MIN_SAMPLES):
        await answer(manager, "victim", 300)
        await answer(manager, "heavy", 8_000)
    reader = reader_of(manager, make_manager)
    assert await reader.answer_estimate("gpt-x", user_id="victim") == BOUND_ABOVE_300
    assert await reader.answer_estimate("gpt-x", user_id="heavy") == BOUND_ABOVE_8000
    assert await reader.answer_estimate("gpt-x", user_id="newcomer") == DEFAULT_ANSWER, (
        "two users are too few for the model's figure"
    )
    assert await reader.answer_estimate("gpt-x") == DEFAULT_ANSWER


@pytest.mark.parametrize("extreme", [8_000, 1], ids=["long", "short"])
async def test_one_user_moves_the_models_figure_by_at_most_one_rank(make_manager, extreme):
    """Nineteen users who each answered 300 tokens once, and one who answered ``extreme``
    tokens a hundred times: the model's figure is the 95th percentile of the 20 users' sizes,
    the 19th smallest, so a newcomer reserves 418 either way (one user's 100 answers of 1
    token used to drop it to 16, admitting streams their budget could not serve)."""
    manager = make_manager(max_per_user=0)
    for user in range(MIN_SAMPLES - 1):
        await answer(manager, f"u{user}", 300)
    for _ in range(100):
        await answer(manager, "extreme", extreme)
    reader = reader_of(manager, make_manager)
    assert await reader.answer_estimate("gpt-x", user_id="newcomer") == BOUND_ABOVE_300
    assert await answer(reader, "newcomer", 300) == BOUND_ABOVE_300
    own = BOUND_ABOVE_8000 if extreme > 1 else 16
    assert await reader.answer_estimate("gpt-x", user_id="extreme") == own, "its own, only"
