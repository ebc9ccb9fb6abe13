"""A page to watch the leases at work: open and close streams for three users with buttons, and
see each stream's tokens arrive, the 429 and 503 answers with their Retry-After, and the pool's
use against its caps, live over Server-Sent Events. Plain HTML and JavaScript (web/index.html),
no build step.

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

from fastapi import FastAPI
from fastapi.responses import FileResponse, StreamingResponse

from fastapi_stream_lease import LeaseConfig, StreamLeaseManager, install_exception_handler

USERS = ("alice", "bob", "carol")
PER_USER, IN_ALL = 2, 4
PAGE = Path(__file__).resolve().parent / "web" / "index.html"

manager = StreamLeaseManager(
    url=os.environ.get("REDIS_URL", "memory://"),
    config=LeaseConfig(max_per_user=PER_USER, max_global=IN_ALL, key_prefix="web-demo"),
)
app = FastAPI()
install_exception_handler(app)  # refusals: 429 / 503 with Retry-After and a JSON detail


@app.get("/")
async def page() -> FileResponse:
    return FileResponse(PAGE)


@app.get("/stream")
async def stream(user: str, tokens: int = 100) -> StreamingResponse:
    """One stream of ``tokens`` words, one every 0.4 s: a slow model."""
    lease = await manager.acquire(user)

    async def words() -> AsyncIterator[str]:
        for n in range(1, tokens + 1):
            await asyncio.sleep(0.4)
            yield f"data: token {n}\n\n"

    return StreamingResponse(lease.wrap(words()), media_type="text/event-stream")


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
