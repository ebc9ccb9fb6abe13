"""The article's chat endpoint, on this library: an authenticated user may start 10 chats a
minute and 200 a day (both counted in one atomic step, headers on every answer), and hold at
most 2 streams at once.

Run it:  REDIS_URL=redis://localhost:6379 .venv/bin/uvicorn examples.rate_limited_chat:app
(without REDIS_URL it uses the embedded store), then
         curl -N -H 'Authorization: Bearer alice' localhost:8000/api/chat/stream
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import StreamingResponse

from fastapi_stream_lease import (
    LeaseConfig,
    RateLimit,
    StreamLeaseManager,
    install_exception_handler,
)

chat_per_minute = RateLimit("chat_per_minute", 10, per=60)
chat_per_day = RateLimit("chat_per_day", 200, per=86_400)

manager = StreamLeaseManager(
    url=os.environ.get("REDIS_URL", "memory://"),
    config=LeaseConfig(
        max_per_user=2,
        # From your secret store in production; the same on every worker.
        identity_secret=os.environ.get("IDENTITY_SECRET", "example-secret-not-for-production"),
    ),
)
app = FastAPI()
install_exception_handler(app)  # 429/503 with Retry-After, and the RateLimit headers


async def current_user(request: Request) -> str:
    """Stands in for real authentication: the bearer token is the user id."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise HTTPException(status_code=401, detail="send Authorization: Bearer <user>")
    return token


async def tokens(prompt: str) -> AsyncIterator[str]:
    for word in f"You said: {prompt}".split():
        await asyncio.sleep(0.05)  # an LLM producing tokens
        yield f"data: {word}\n\n"


@app.get("/api/chat/stream")
async def chat_stream(
    request: Request, prompt: str = "hello", user: str = Depends(current_user)
) -> StreamingResponse:
    # One atomic step: a slot among the user's 2 streams, and one start from each policy.
    lease = await manager.acquire(
        user, request=request, rate_limits=[chat_per_minute, chat_per_day]
    )
    return StreamingResponse(lease.wrap(tokens(prompt)), media_type="text/event-stream")


@app.get("/api/chat/quota")
async def quota(user: str = Depends(current_user)) -> dict[str, int]:
    """What the user has left, without spending any."""
    minute = await manager.peek(user, chat_per_minute)
    day = await manager.peek(user, chat_per_day)
    return {"per_minute": minute.remaining, "per_day": day.remaining}
