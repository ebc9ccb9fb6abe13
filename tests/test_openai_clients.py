"""OpenAI's own Python SDK, and an SSE client, against the LLM proxy example under uvicorn on a
real Redis: every refusal raises with the library's reason, and a stream the library ends raises
instead of ending like a complete answer."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import openai
import pytest
from httpx_sse import aconnect_sse

from fastapi_stream_lease import LeaseConfig, StreamLeaseManager

from support.uvicorn_server import Uvicorn

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
ASK = [{"role": "user", "content": "How do leases, rates and budgets differ?"}]
#: The fake model's own knob: a slow answer, so a stream is still running when the test acts.
SLOW = {"seconds_per_token": 0.25}


@pytest.fixture
def proxy(own_redis) -> Iterator[str]:
    """The example proxy and its fake model, each under uvicorn; the proxy's base URL."""
    model = Uvicorn("fake_openai:app", EXAMPLES)
    env = {"REDIS_URL": own_redis.url, "UPSTREAM_URL": model.base_url}
    server = Uvicorn("llm_proxy:app", EXAMPLES, env)
    yield server.base_url
    server.stop()
    model.stop()


@pytest.fixture
async def sdk(proxy) -> AsyncIterator[openai.AsyncOpenAI]:
    """alice's client, as OpenAI's docs build it, without retries (a refusal is the point)."""
    client = openai.AsyncOpenAI(base_url=f"{proxy}/v1", api_key="sk-alice", max_retries=0)
    yield client
    await client.close()


async def test_a_complete_answer_streams_through_openais_sdk(sdk):
    stream = await sdk.chat.completions.create(
        model="fake-large", messages=ASK, max_tokens=5, stream=True
    )
    words = [c.choices[0].delta.content async for c in stream if c.choices]
    assert len(words) == 5


async def test_a_full_pool_raises_rate_limit_error_with_the_librarys_reason(sdk):
    held = []
    for _ in range(2):  # alice's cap: max_per_user=2
        stream = await sdk.chat.completions.create(
            model="fake-large", messages=ASK, max_tokens=40, stream=True, extra_body=SLOW
        )
        await anext(aiter(stream))
        held.append(stream)
    with pytest.raises(openai.RateLimitError) as refused:
        await sdk.chat.completions.create(model="fake-large", messages=ASK, stream=True)
    assert refused.value.code == "user_limit"
    assert refused.value.type == "rate_limit_error"
    assert refused.value.message.startswith("Error code: 429 - ")
    assert "per_user" in refused.value.message, refused.value.message
    for stream in held:
        await stream.close()


async def test_a_reservation_past_a_budget_raises_bad_request_error_saying_which(sdk):
    with pytest.raises(openai.BadRequestError) as refused:
        await sdk.chat.completions.create(
            model="fake-large", messages=ASK, max_tokens=100_000, stream=True
        )
    assert refused.value.code == "reservation_too_large"
    assert refused.value.type == "invalid_request_error"
    assert "team_spend_per_day" in refused.value.message, refused.value.message


async def test_a_revoke_mid_answer_raises_api_error_instead_of_a_normal_end(sdk, own_redis):
    stream = await sdk.chat.completions.create(
        model="fake-large", messages=ASK, max_tokens=400, stream=True, extra_body=SLOW
    )
    await anext(aiter(stream))
    async with operator(own_redis.url) as manager:
        await manager.revoke("alice")
    with pytest.raises(openai.APIError) as ended:
        async for _ in stream:
            pass
    assert ended.value.code == "lease_revoked"
    assert ended.value.message, "the library's detail, not the SDK's stock sentence"
    assert ended.value.message != "An error occurred during streaming"


async def test_an_sse_client_reads_the_final_error_event_with_both_shapes(proxy, own_redis):
    body = {"model": "fake-large", "messages": ASK, "max_tokens": 400, **SLOW}
    headers = {"authorization": "Bearer sk-alice"}
    async with httpx.AsyncClient(base_url=proxy, timeout=60, headers=headers) as client:
        async with aconnect_sse(client, "POST", "/v1/chat/completions", json=body) as source:
            events = source.aiter_sse()
            first = await anext(events)
            assert first.event == "message" and '"content"' in first.data
            async with operator(own_redis.url) as manager:
                await manager.revoke("alice")
            last = [event async for event in events][-1]
    assert last.event == "error"
    problem = json.loads(last.data)
    assert problem["status"] == 503 and problem["title"] == "Stream lease revoked"
    assert problem["error"] == {
        "message": problem["detail"], "type": "server_error", "param": None,
        "code": "lease_revoked",
    }


def operator(url: str) -> StreamLeaseManager:
    """A manager as an operator's tool builds it: the proxy's prefix and identity secret."""
    secret = "example-secret-not-for-production"
    config = LeaseConfig(key_prefix="llm-proxy", identity_secret=secret)
    return StreamLeaseManager(url=url, config=config)
