"""A fake OpenAI-compatible model server for the LLM proxy example: ``POST
/v1/chat/completions`` with ``"stream": true`` streams the answer one word (one "token") per
Server-Sent Event, as OpenAI's API does, and, when ``stream_options.include_usage`` is on, a
final chunk with ``usage``; then ``data: [DONE]``. A prompt token is a word of the messages.

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

app = FastAPI()


def event(payload: object) -> str:
    return f"data: {json.dumps(payload)}\n\n"


@app.post("/v1/chat/completions")
async def completions(request: Request) -> StreamingResponse:
    body = await request.json()
    prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
    words = [ANSWER[i % len(ANSWER)] for i in range(int(body.get("max_tokens", len(ANSWER))))]
    pause = float(body.get("seconds_per_token", 0.01))  # the fake's own knob: a slower model
    with_usage = bool(body.get("stream_options", {}).get("include_usage"))

    async def chunks() -> AsyncIterator[str]:
        for word in words:
            await asyncio.sleep(pause)
            yield event(
                {"object": "chat.completion.chunk", "choices": [{"delta": {"content": word + " "}}]}
            )
        if with_usage:
            usage = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": len(words),
                "total_tokens": prompt_tokens + len(words),
            }
            yield event({"object": "chat.completion.chunk", "choices": [], "usage": usage})
        yield "data: [DONE]\n\n"

    return StreamingResponse(chunks(), media_type="text/event-stream")
