"""Every form of stream a FastAPI endpoint is written in today, each holding its lease through
``manager.stream_lease()``, and the plain ``StreamingResponse(lease.wrap(...))``
(test_stream_forms).

Each stream sends one item, then one every TICK seconds, ``count`` in all; ``idle=1`` makes it
wait an hour after its first item instead (a slow first token): only the library can end it
then. Caps: 2 streams per user. ``/budget`` streams 100 tokens an item against a budget of
300 tokens a minute (``on_budget="cut"``), counted with ``lease.consume()``; ``/budget-jsonl``
the same as JSON Lines, counted with ``lease.wrap(..., tokens=...)``. ``/drainable`` holds its
lease from a manager of its own, which ``POST /drain`` drains (at once: its streams end as
revoked). ``/reserved`` reserves a request's ``prompt_tokens`` and ``max_tokens`` from the
same budget (``reserve="auto"``), then idles like ``idle=1``. The library's log goes to
stderr at INFO, each line after its level.

Environment: STREAM_LEASE_URL, STREAM_LEASE_PREFIX, STREAM_LEASE_SECRET.
"""

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, FastAPI, WebSocket, WebSocketDisconnect
from fastapi.responses import StreamingResponse
from fastapi.sse import EventSourceResponse, ServerSentEvent

from fastapi_stream_lease import (
    Lease,
    RateLimit,
    install_exception_handler,
)

from environment import log_library_to_stderr, manager_from_environment

TICK = 0.05
BUDGET = RateLimit("tokens_per_minute", 300, per=60, unit="tokens")

log_library_to_stderr()
manager = manager_from_environment(max_per_user=2)
drained = manager_from_environment(max_per_user=2)
app = FastAPI()
install_exception_handler(app)


def user_of(user: str) -> str:
    """The user id; a real app reads it from its authentication."""
    return user


Leased = Annotated[Lease, Depends(manager.stream_lease(user=user_of))]
Budgeted = Annotated[
    Lease, Depends(manager.stream_lease(user=user_of, budgets=[BUDGET], reserve=100))
]


async def ticks(count: int, idle: bool) -> AsyncIterator[int]:
    for n in range(count):
        yield n
        await asyncio.sleep(3600 if idle else TICK)


async def sse(
    lease: Leased, count: int = 1_000_000, idle: bool = False
) -> AsyncIterator[ServerSentEvent]:
    async for n in ticks(count, idle):
        yield ServerSentEvent(data={"tick": n}, event="tick")


app.get("/sse", response_class=EventSourceResponse)(sse)  # native SSE, GET and POST
app.post("/sse", response_class=EventSourceResponse)(sse)


@app.get("/jsonl")
async def jsonl(
    lease: Leased, count: int = 1_000_000, idle: bool = False
) -> AsyncIterator[dict[str, int]]:
    async for n in ticks(count, idle):
        yield {"tick": n}


@app.get("/streaming")
async def streaming(
    lease: Leased, count: int = 1_000_000, idle: bool = False
) -> StreamingResponse:
    events = (f"data: tick {n}\n\n" async for n in ticks(count, idle))
    return StreamingResponse(events, media_type="text/event-stream")


@app.get("/bytes")
async def raw_bytes(lease: Leased, idle: bool = False) -> StreamingResponse:
    chunks = (b"tick\n" async for _ in ticks(1_000_000, idle))
    return StreamingResponse(chunks, media_type="application/octet-stream")


@app.get("/wrapped")
async def wrapped(user: str, idle: bool = False) -> StreamingResponse:
    """The seed's form: acquire, then ``StreamingResponse(lease.wrap(...))``."""
    lease = await manager.acquire(user)
    events = (f"data: tick {n}\n\n" async for n in ticks(1_000_000, idle))
    return StreamingResponse(lease.wrap(events), media_type="text/event-stream")


@app.get("/reserved")
async def reserved(user: str, prompt_tokens: int, max_tokens: int) -> StreamingResponse:
    """Reserves the prompt's tokens and ``max_tokens`` from the budget, then streams idly."""
    lease = await manager.acquire(
        user, budgets=[BUDGET], reserve="auto", model="gpt-x",
        prompt_tokens=prompt_tokens, max_tokens=max_tokens,
    )  # fmt: skip
    events = (f"data: tick {n}\n\n" async for n in ticks(1_000_000, idle=True))
    return StreamingResponse(lease.wrap(events), media_type="text/event-stream")


@app.websocket("/ws")
async def websocket(websocket: WebSocket, lease: Leased) -> None:
    await websocket.accept()
    try:
        async for n in ticks(1_000_000, idle=websocket.query_params.get("idle") == "1"):
            await websocket.send_json({"tick": n})
    except WebSocketDisconnect:
        pass  # the client left


@app.get("/budget", response_class=EventSourceResponse)
async def budget(
    lease: Budgeted,
) -> AsyncIterator[ServerSentEvent]:
    async for n in ticks(1_000_000, idle=False):
        await lease.wait_budget()
        lease.consume(100)
        yield ServerSentEvent(data={"tick": n}, event="tick")


@app.get("/budget-jsonl")
async def budget_jsonl(
    lease: Budgeted,
) -> AsyncIterator[dict[str, int]]:
    async for n in lease.wrap(ticks(1_000_000, idle=False), tokens=lambda _: 100):
        yield {"tick": n}


@app.get("/drainable", response_class=EventSourceResponse)
async def drainable(
    lease: Annotated[Lease, Depends(drained.stream_lease(user=user_of))],
) -> AsyncIterator[ServerSentEvent]:
    async for n in ticks(1_000_000, idle=True):
        yield ServerSentEvent(data={"tick": n}, event="tick")


@app.post("/drain")
async def drain() -> dict[str, bool]:
    await drained.drain(timeout=0)
    return {"drained": True}
