"""A FastAPI proxy in front of an OpenAI-compatible model: each user holds at most 2 streams,
starts at most 20 a minute, and has 2,000 tokens a minute and 50,000 a day. A stream reserves
its prompt and ``max_tokens`` at admission (with its slot and its start, in one atomic step),
counts what it streams chunk by chunk, and is settled at the end with the model's own
``usage``: unused reservation comes back at once, a client that leaves is charged what it got.
``GET /usage`` tells the caller where they stand in each period.

Run the story (a fake model and this proxy, on free ports):  .venv/bin/python examples/llm_proxy.py
(``make demo`` runs it after the demo; set REDIS_URL=redis://... for a real Redis). Serve it:
UPSTREAM_URL=http://localhost:8001 .venv/bin/uvicorn examples.llm_proxy:app (and the model:
.venv/bin/uvicorn examples.fake_openai:app --port 8001), then
curl -N -H 'Authorization: Bearer alice' -d '{"messages":[{"role":"user","content":"hi"}]}' \
     localhost:8000/v1/chat/completions
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator

import httpx
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import StreamingResponse

from fastapi_stream_lease import (
    Lease,
    LeaseConfig,
    RateLimit,
    StreamLeaseManager,
    install_exception_handler,
)

requests_per_minute = RateLimit("requests_per_minute", 20, per=60)
tokens_per_minute = RateLimit("tokens_per_minute", 2_000, per=60, unit="tokens")
tokens_per_day = RateLimit("tokens_per_day", 50_000, per=86_400, unit="tokens")
DEFAULT_MAX_TOKENS = 256

manager = StreamLeaseManager(
    url=os.environ.get("REDIS_URL", "memory://"),
    config=LeaseConfig(
        max_per_user=2,
        key_prefix="llm-proxy",
        identity_secret=os.environ.get("IDENTITY_SECRET", "example-secret-not-for-production"),
    ),
)
#: The model. Tests point it at the fake in-process (httpx.ASGITransport).
upstream = httpx.AsyncClient(base_url=os.environ.get("UPSTREAM_URL", "http://127.0.0.1:8001"))
app = FastAPI()
# 429/503 with Retry-After, the RateLimit headers, and OpenAI's x-ratelimit-* for SDK clients.
install_exception_handler(app, openai_rate_limit_headers=True)


def prompt_tokens(body: dict) -> int:
    """A rough count, as a proxy makes before calling the model (a word is a token here; use
    the model's tokenizer in production). The model's own figure settles it at the end."""
    return sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))


async def relay(lease: Lease, events: AsyncIterator[str]) -> AsyncIterator[str]:
    """The model's events, unchanged; its final ``usage`` chunk replaces the proxy's count."""
    async for line in events:
        if line.startswith("data: {"):
            chunk = json.loads(line[len("data: ") :])
            if chunk.get("usage"):
                usage = chunk["usage"]
                lease.report_usage(
                    input_tokens=usage["prompt_tokens"], output_tokens=usage["completion_tokens"]
                )
        if line:
            yield line + "\n\n"


def answer_tokens(event: str) -> int:
    """Tokens in one relayed event: a content delta is one token here."""
    return 1 if '"content"' in event else 0


def caller(request: Request) -> str:
    """The user the request is from (a bearer token here; verify a real one)."""
    user = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
    if not user:
        raise HTTPException(401, "send Authorization: Bearer <user>")
    return user


@app.get("/usage")
async def usage(request: Request) -> dict[str, dict[str, int | float]]:
    """The caller's use of each period's limit: ``used``, ``limit``, ``remaining`` and
    ``reset`` (seconds until units free up), the running streams' reservations included."""
    periods = (requests_per_minute, tokens_per_minute, tokens_per_day)
    decisions = await manager.usage(caller(request), *periods)
    return {
        name: {"used": d.used, "limit": d.limit, "remaining": d.remaining, "reset": d.reset}
        for name, d in decisions.items()
    }


@app.post("/v1/chat/completions")
async def completions(request: Request) -> StreamingResponse:
    user = caller(request)
    body = await request.json()
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    body.setdefault("max_tokens", DEFAULT_MAX_TOKENS)
    lease = await manager.acquire(
        user,
        request=request,
        rate_limits=[requests_per_minute],
        budgets=[tokens_per_minute, tokens_per_day],
        reserve=(prompt_tokens(body), body["max_tokens"]),
    )
    model = upstream.stream("POST", "/v1/chat/completions", json=body)
    response = await model.__aenter__()

    async def events() -> AsyncIterator[str]:
        try:
            async for line in response.aiter_lines():
                yield line
        finally:
            await model.__aexit__(None, None, None)

    return StreamingResponse(
        lease.wrap(relay(lease, events()), tokens=answer_tokens), media_type="text/event-stream"
    )


def say(text: str) -> None:
    print(text, flush=True)


async def story(base_url: str) -> None:
    alice = {"authorization": "Bearer alice"}
    ask = {"messages": [{"role": "user", "content": "How do leases, rates and budgets differ?"}]}
    async with httpx.AsyncClient(base_url=base_url, timeout=30, headers=alice) as client:
        async with client.stream(
            "POST", "/v1/chat/completions", json={**ask, "max_tokens": 40}
        ) as r:
            limits = {k: v for k, v in r.headers.items() if k.startswith("x-ratelimit")}
            say(f"stream 1: HTTP {r.status_code}, {limits}")
            words = [
                json.loads(line[6:])["choices"][0]["delta"]["content"]
                async for line in r.aiter_lines()
                if line.startswith("data: {") and '"content"' in line
            ]
            say(f"stream 1: {''.join(words).strip()}")
        usage = await manager.usage("alice", tokens_per_minute)
        say(
            f"after stream 1: {usage['tokens_per_minute'].used} tokens used this minute "
            "(the model's usage: prompt 7 + answer 40)"
        )

        # A slow model (the fake's knob): the client is gone long before a second token, however
        # busy the machine.
        slow = {**ask, "max_tokens": 1_000, "seconds_per_token": 0.25}
        async with client.stream("POST", "/v1/chat/completions", json=slow) as r:
            async for line in r.aiter_lines():
                if '"content"' in line:
                    break  # the client goes away after its first token
        await asyncio.sleep(0.2)
        usage = await manager.usage("alice", tokens_per_minute)
        say(
            f"stream 2 (max_tokens=1000) left after one token: {usage['tokens_per_minute'].used} "
            "tokens used this minute, not 1,047"
        )

        too_big = await client.post("/v1/chat/completions", json={**ask, "max_tokens": 1_950})
        say(
            f"stream 3 (max_tokens=1950): HTTP {too_big.status_code}, "
            f"Retry-After: {too_big.headers['retry-after']}, {too_big.json()['detail']}"
        )
        assert too_big.status_code == 429

        periods = (await client.get("/usage")).json()
        for name, period in periods.items():
            say(f"GET /usage: {name} {period['used']} used of {period['limit']}")
    say("llm proxy demo done")


async def main() -> None:
    global upstream
    from fake_openai import app as model
    from serving import serving

    try:
        async with serving(model) as model_port, serving(app) as port:
            upstream = httpx.AsyncClient(base_url=f"http://127.0.0.1:{model_port}")
            say(f"fake model on :{model_port}, proxy on :{port}, budgets in {manager.backend}")
            await story(f"http://127.0.0.1:{port}")
            await upstream.aclose()
    finally:
        await manager.aclose()


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
