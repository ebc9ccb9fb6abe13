"""A page to watch the leases at work: open and close streams for three users with buttons, and
see each stream's tokens arrive, the 429 and 503 answers with their Retry-After, the pool's use
against its caps, live over Server-Sent Events, and an operator's revoke end a user's streams
with a final event that says why. Plain HTML and JavaScript (web/index.html), no build step.

Each stream is a native Server-Sent Events endpoint holding its lease through
``manager.stream_lease()``. The page reads it two ways: with ``fetch`` (which shows a refusal's
status and Retry-After) and with a browser ``EventSource`` (which cannot read a refusal's status,
and reconnects whenever a stream ends unless it is closed: the page closes it on the stream's
final event, ``done`` at its natural end or ``error`` when the library ended it).

Caps: 2 streams per user, 4 in all, so a third stream of one user gets 429 and a fifth stream
of anyone 503 (a browser opens at most 6 connections to one host over HTTP/1.1, the pool's
updates included, so the caps stay below that). Runs on the embedded backend, or on Redis when
REDIS_URL is set:

    make demo-web     (or: .venv/bin/uvicorn --app-dir examples web_demo:app)

then open http://127.0.0.1:8000. Several workers on one Redis share the caps:
``REDIS_URL=redis://localhost:6379 .venv/bin/uvicorn --app-dir examples --workers 4 web_demo:app``.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated

from fastapi import Depends, FastAPI
from fastapi.responses import FileResponse, StreamingResponse
from fastapi.sse import EventSourceResponse, ServerSentEvent

from fastapi_stream_lease import (
    Lease,
    LeaseConfig,
    StreamLeaseManager,
    install_exception_handler,
)

USERS = ("alice", "bob", "carol")
PER_USER, IN_ALL = 2, 4
PAGE = Path(__file__).resolve().parent / "web" / "index.html"

manager = StreamLeaseManager(
    url=os.environ.get("REDIS_URL", "memory://"),
    config=LeaseConfig(
        max_per_user=PER_USER,
        max_global=IN_ALL,
        key_prefix="web-demo",
        # A demo's own secret for hashing user ids into keys; an app reads its own from
        # STREAM_LEASE_IDENTITY_SECRET.
        identity_secret=os.environ.get("STREAM_LEASE_IDENTITY_SECRET", "demo-only-identity-secret"),
    ),
)
app = FastAPI()
# Refusals: 429 / 503 with Retry-After and a JSON detail; a revoked stream's final event.
install_exception_handler(app)


def visitor(user: str) -> str:
    """The user a stream is for: the page says (a real app reads it from its authentication)."""
    return user


StreamLease = Annotated[Lease, Depends(manager.stream_lease(user=visitor))]


@app.get("/")
async def page() -> FileResponse:
    return FileResponse(PAGE)


@app.get("/stream", response_class=EventSourceResponse)
async def stream(lease: StreamLease, tokens: int = 100) -> AsyncIterator[ServerSentEvent]:
    """One stream of ``tokens`` words, one every 0.4 s (a slow model), then a ``done`` event."""
    for n in range(1, tokens + 1):
        await asyncio.sleep(0.4)
        yield ServerSentEvent(raw_data=f"token {n}")
    yield ServerSentEvent(raw_data="finished", event="done")


@app.post("/revoke")
async def revoke(user: str) -> dict[str, int]:
    """An operator ends every stream of ``user``, on every worker (no ban: they may start
    again at once)."""
    return {"revoked": await manager.revoke(user)}


@app.get("/pool")
async def pool() -> StreamingResponse:
    """The pool's use against its caps, four times a second, as Server-Sent Events."""

    async def updates() -> AsyncIterator[str]:
        while True:
            users = {user: await manager.get_active_count(user) for user in USERS}
            figures = {
                "in_all": await manager.get_active_count(),
                "cap_in_all": IN_ALL,
                "cap_per_user": PER_USER,
                "users": users,
            }
            yield f"data: {json.dumps(figures)}\n\n"
            await asyncio.sleep(0.25)

    return StreamingResponse(updates(), media_type="text/event-stream")
