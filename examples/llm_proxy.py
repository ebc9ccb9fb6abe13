"""A FastAPI proxy in front of an OpenAI-compatible model, with budgets set the way LLM
platforms set them: in money, at several levels at once. Each API key belongs to a user of a
team of the organisation; a stream must fit

* its team's spend for the day (shared by the team's users),
* its user's own spend for the day and tokens a minute, and 20 starts a minute,
* the organisation's spend on its model for the day,

and 2 streams at once per user. One ``acquire`` checks and reserves every level in one atomic
step: the prompt and ``max_tokens`` (``reserve="auto"``), priced from the model's prices. The
stream is counted chunk by chunk as it streams and settled at the end with the model's own
``usage`` (asked for with ``stream_options.include_usage``, cached prompt tokens at their own
price); when the model sends no usage, the proxy's own count stands. Unused reservation comes
back at once; a client that leaves is charged what it got. ``GET /usage`` tells the caller where
each level stands, and a level that reaches 80 % or 100 % of its limit raises an alert.

Run the story (a fake model and this proxy, on free ports):  .venv/bin/python examples/llm_proxy.py
(``make demo`` runs it after the demo; set REDIS_URL=redis://... for a real Redis). Serve it:
UPSTREAM_URL=http://localhost:8001 .venv/bin/uvicorn examples.llm_proxy:app (and the model:
.venv/bin/uvicorn examples.fake_openai:app --port 8001), then
curl -N -H 'Authorization: Bearer sk-alice' \
     -d '{"model":"fake-large","messages":[{"role":"user","content":"hi"}]}' \
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
    Prices,
    RateLimit,
    StreamLeaseManager,
    ThresholdCrossed,
    install_exception_handler,
)

ORG = "acme"
#: API key -> (user, team). A database in a real proxy.
API_KEYS = {
    "sk-alice": ("alice", "research"),
    "sk-bob": ("bob", "research"),
    "sk-carol": ("carol", "support"),
}
#: Microdollars per million tokens: (prompt, answer, cached prompt).
PRICES = Prices({
    "fake-large": (2_000_000, 8_000_000, 500_000),
    "fake-small": (500_000, 2_000_000, 125_000),
})

# Money budgets count microdollars (unit="cost"), token budgets count tokens.
team_spend_per_day = RateLimit("team_spend_per_day", 20_000, per="day", unit="cost")
user_spend_per_day = RateLimit("user_spend_per_day", 15_000, per="day", unit="cost")
model_spend_per_day = RateLimit("model_spend_per_day", 100_000, per="day", unit="cost")
tokens_per_minute = RateLimit("tokens_per_minute", 2_000, per=60, unit="tokens")
requests_per_minute = RateLimit("requests_per_minute", 20, per=60)
alerts: list[ThresholdCrossed] = []


async def on_threshold(alert: ThresholdCrossed) -> None:
    """A level reached 80 % or 100 % of its limit (once per window): mail or page here. The
    alert names the identity by its keyed hash only."""
    alerts.append(alert)


manager = StreamLeaseManager(
    url=os.environ.get("REDIS_URL", "memory://"),
    config=LeaseConfig(
        max_per_user=2,
        key_prefix="llm-proxy",
        identity_secret=os.environ.get("IDENTITY_SECRET", "example-secret-not-for-production"),
    ),
    prices=PRICES,
    on_threshold=on_threshold,
)
#: The model. Tests point it at the fake in-process (httpx.ASGITransport).
upstream = httpx.AsyncClient(base_url=os.environ.get("UPSTREAM_URL", "http://127.0.0.1:8001"))
app = FastAPI()
# 429/503 with Retry-After, the RateLimit headers, and OpenAI's x-ratelimit-* for SDK clients.
install_exception_handler(app, openai_rate_limit_headers=True)


def caller(request: Request) -> tuple[str, str]:
    """The user and team of the request's API key."""
    key = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
    if key not in API_KEYS:
        raise HTTPException(401, "send Authorization: Bearer <API key>")
    return API_KEYS[key]


def budgets(team: str, model: str) -> list:
    """Every level a stream spends: pairs count their own identity, the rest the user."""
    return [
        (team_spend_per_day, team),
        user_spend_per_day,
        tokens_per_minute,
        (model_spend_per_day, f"{ORG}|{model}"),
    ]


def prompt_tokens(body: dict) -> int:
    """A rough count, as a proxy makes before calling the model (a word is a token here; use
    the model's tokenizer in production). The model's own figure settles it at the end."""
    return sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))


async def relay(lease: Lease, events: AsyncIterator[str]) -> AsyncIterator[str]:
    """The model's events, unchanged; its final ``usage`` chunk, when it sends one, replaces
    the proxy's count (cached prompt tokens priced as such)."""
    async for line in events:
        if line.startswith("data: {"):
            chunk = json.loads(line[len("data: ") :])
            if chunk.get("usage"):
                usage = chunk["usage"]
                lease.report_usage(
                    input_tokens=usage["prompt_tokens"],
                    output_tokens=usage["completion_tokens"],
                    cached_input_tokens=usage.get("prompt_tokens_details", {}).get(
                        "cached_tokens", 0
                    ),
                )
        if line:
            yield line + "\n\n"


def answer_tokens(event: str) -> int:
    """Tokens in one relayed event: a content delta is one token here."""
    return 1 if '"content"' in event else 0


@app.get("/usage")
async def usage(request: Request) -> dict[str, dict[str, int | float | str]]:
    """The caller's standing at every level: ``used``, ``limit``, ``remaining`` and ``reset``
    (seconds until units free up), the running streams' reservations included, in the level's
    ``unit``: microdollars, tokens or requests. The organisation's spend on each model too."""
    user, team = caller(request)
    own = await manager.usage(
        user, (team_spend_per_day, team), user_spend_per_day, tokens_per_minute, requests_per_minute
    )
    levels = dict(own)
    for model in PRICES.models:
        spent = await manager.usage(user, (model_spend_per_day, f"{ORG}|{model}"))
        levels[f"model_spend_per_day:{model}"] = spent["model_spend_per_day"]
    units = {"cost": "microdollars"}
    return {
        name: {
            "unit": units.get(d.policy.unit, d.policy.unit),
            "used": d.used,
            "limit": d.limit,
            "remaining": d.remaining,
            "reset": d.reset,
        }
        for name, d in levels.items()
    }


@app.post("/v1/chat/completions")
async def completions(request: Request) -> StreamingResponse:
    user, team = caller(request)
    body = await request.json()
    model = body.get("model")
    if model not in PRICES:  # before anything is counted: there is no price to guess
        raise HTTPException(400, f"unknown model {model!r}: use one of {sorted(PRICES.models)}")
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    lease = await manager.acquire(
        user,
        request=request,
        rate_limits=[requests_per_minute],
        budgets=budgets(team, model),
        # The prompt and the most the model may answer; without a limit in the request, the
        # model's learned answer size (1,024 until it has 20 answers; at most what the budgets
        # hold). Larger than a budget's whole limit: 400.
        reserve="auto",
        model=model,
        prompt_tokens=prompt_tokens(body),
        max_tokens=body.get("max_tokens") or body.get("max_completion_tokens"),
    )
    answer = upstream.stream("POST", "/v1/chat/completions", json=body)
    response = await answer.__aenter__()

    async def events() -> AsyncIterator[str]:
        try:
            async for line in response.aiter_lines():
                yield line
        finally:
            await answer.__aexit__(None, None, None)

    return StreamingResponse(
        lease.wrap(relay(lease, events()), tokens=answer_tokens), media_type="text/event-stream"
    )


def say(text: str) -> None:
    print(text, flush=True)


async def spent_by(user: str) -> int:
    return (await manager.usage(user, user_spend_per_day))["user_spend_per_day"].used


async def spent(user: str, team: str) -> str:
    levels = await manager.usage(user, (team_spend_per_day, team), user_spend_per_day)
    return f"team {levels['team_spend_per_day'].used}, {user} {levels['user_spend_per_day'].used}"


async def story(base_url: str) -> None:
    def client(key: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=base_url, timeout=30, headers={"authorization": f"Bearer {key}"}
        )

    messages = [
        {"role": "system", "content": "You answer in one sentence."},  # cached by the model
        {"role": "user", "content": "How do leases, rates and budgets differ?"},
    ]
    ask = {"model": "fake-large", "messages": messages}
    async with client("sk-alice") as alice, client("sk-bob") as bob, client("sk-carol") as carol:
        async with alice.stream(
            "POST", "/v1/chat/completions", json={**ask, "max_tokens": 40}
        ) as r:
            limits = {k: v for k, v in r.headers.items() if k.startswith("x-ratelimit")}
            say(f"alice, stream 1: HTTP {r.status_code}, {limits}")
            words = [
                json.loads(line[6:])["choices"][0]["delta"]["content"]
                async for line in r.aiter_lines()
                if line.startswith("data: {") and '"content"' in line
            ]
            say(f"alice, stream 1: {''.join(words).strip()}")
        say(
            f"spent after stream 1 (microdollars): {await spent('alice', 'research')} "
            "(the model's usage: 7 prompt tokens at 2, 5 cached ones at 0.5, 40 answer tokens at 8)"
        )

        unknown = await alice.post("/v1/chat/completions", json={**ask, "model": "gpt-9"})
        say(f"model gpt-9: HTTP {unknown.status_code}, {unknown.json()['detail']}")

        # A slow model (the fake's knob) holds a large reservation while it streams.
        slow = {**ask, "max_tokens": 1_500, "seconds_per_token": 0.25}
        async with alice.stream("POST", "/v1/chat/completions", json=slow) as r:
            lines = r.aiter_lines()  # held: the stream stays open until the block ends
            async for line in lines:
                if '"content"' in line:
                    break  # alice has her first token; her stream holds its reservation
            say(f"alice, stream 2 (max_tokens=1500) running: {await spent('alice', 'research')}")
            big = {**ask, "max_tokens": 1_500}
            refused = await bob.post("/v1/chat/completions", json=big)
            say(
                f"bob, same team, max_tokens=1500: HTTP {refused.status_code}, "
                f"{refused.json()['violated-policies']}"
            )
            assert refused.status_code == 429
        # alice went away after her first token: at its next event the proxy settles her
        # stream at what she got, and her reservation of 12,024 comes back
        while await spent_by("alice") > 400:  # noqa: ASYNC110 (a client sees no event of the proxy's)
            await asyncio.sleep(0.05)
        say(f"alice left stream 2 after one token: {await spent('alice', 'research')}")

        # A model that sends no usage chunk: the proxy's own count settles the stream.
        small = {**ask, "model": "fake-small", "max_tokens": 30}
        async with carol.stream("POST", "/v1/chat/completions", json=small) as r:
            async for _ in r.aiter_lines():
                pass
        say(
            f"carol (support), fake-small, no usage sent: {await spent('carol', 'support')} "
            "(counted here: 12 prompt tokens at 0.5, 30 answer tokens at 2)"
        )

        for name, level in (await alice.get("/usage")).json().items():
            say(f"GET /usage: {name} {level['used']} {level['unit']} used of {level['limit']}")


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
        await manager.drain()  # as at shutdown: the queued alerts are told first
    for alert in alerts:
        say(f"alert: {alert.policy} at {alert.threshold:.0%}, {alert.used} of {alert.limit}")
    say("llm proxy demo done")


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
