"""A fake OpenAI-compatible model server for the LLM proxy example: ``POST
/v1/chat/completions`` with ``"stream": true`` streams the answer one word (one "token") per
Server-Sent Event, as OpenAI's API does, then ``data: [DONE]``. A prompt token is a word of the
messages; the system message's words count as read from the provider's prompt cache.

Two models: ``fake-large`` honours ``stream_options.include_usage`` with a final chunk carrying
``usage`` (``prompt_tokens_details.cached_tokens`` included); ``fake-small`` ignores it and
sends no usage, as some OpenAI-compatible servers do.

Run it alone:  .venv/bin/uvicorn examples.fake_openai:app --port 8001
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

ANSWER = (
    "Leases count streams, rate limits count requests, and budgets count tokens: "
    "together they keep one user from holding the whole model."
).split()
#: The models, and whether each sends a usage chunk when asked.
SENDS_USAGE = {"fake-large": True, "fake-small": False}

app = FastAPI()


def event(payload: object) -> str:
    return f"data: {json.dumps(payload)}\n\n"


def words(messages: list[dict], role: str | None = None) -> int:
    return sum(
        len(str(m.get("content", "")).split()) for m in messages if role in (None, m.get("role"))
    )


@app.post("/v1/chat/completions")
async def completions(request: Request) -> StreamingResponse:
    body = await request.json()
    messages = body.get("messages", [])
    answer = [ANSWER[i % len(ANSWER)] for i in range(int(body.get("max_tokens", len(ANSWER))))]
    pause = float(body.get("seconds_per_token", 0.01))  # the fake's own knob: a slower model
    with_usage = SENDS_USAGE[body["model"]] and body.get("stream_options", {}).get("include_usage")

    async def chunks() -> AsyncIterator[str]:
        for word in answer:
            await asyncio.sleep(pause)
            yield event(
                {"object": "chat.completion.chunk", "choices": [{"delta": {"content": word + " "}}]}
            )
        if with_usage:
            usage = {
                "prompt_tokens": words(messages),
                "completion_tokens": len(answer),
                "total_tokens": words(messages) + len(answer),
                "prompt_tokens_details": {"cached_tokens": words(messages, "system")},
            }
            yield event({"object": "chat.completion.chunk", "choices": [], "usage": usage})
        yield "data: [DONE]\n\n"

    return StreamingResponse(chunks(), media_type="text/event-stream")
