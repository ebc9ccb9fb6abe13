"""The app ``load.py`` serves with uvicorn's workers: Server-Sent Events and WebSocket streams
with a slow first token, and, with ``LOAD_PROTECTED=1``, a lease for each (``LOAD_PER_USER``
per user, ``LOAD_IN_ALL`` in all, on the Redis at ``REDIS_URL``). Every worker writes each
stream's start and end, stamped with the wall clock, to ``LOAD_AUDIT_DIR/<pid>.jsonl``: the
server side's own count of live streams, which ``load.py`` audits. A stream counts as live
from its first line of code to its last, inside its lease."""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, contextmanager, suppress
from pathlib import Path

from fastapi import FastAPI, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import StreamingResponse

from fastapi_stream_lease import (
    LeaseConfig,
    StreamLeaseError,
    StreamLeaseManager,
    install_exception_handler,
)

PROTECTED = os.environ.get("LOAD_PROTECTED") == "1"

manager = StreamLeaseManager(
    url=os.environ["REDIS_URL"],
    config=LeaseConfig(
        max_per_user=int(os.environ["LOAD_PER_USER"]),
        max_global=int(os.environ["LOAD_IN_ALL"]),
        lease_seconds=float(os.environ["LOAD_LEASE_SECONDS"]),
        key_prefix="load",
        identity_secret="load-test-secret-16b",
    ),
)
app = FastAPI()
install_exception_handler(app)
audit_file = (Path(os.environ["LOAD_AUDIT_DIR"]) / f"{os.getpid()}.jsonl").open("a", buffering=1)


@contextmanager
def live(user: str, kind: str) -> Iterator[None]:
    """Writes the stream's start, and its end however it ends."""
    audit_file.write(json.dumps({"t": time.time(), "d": 1, "u": user, "k": kind}) + "\n")
    try:
        yield
    finally:
        audit_file.write(json.dumps({"t": time.time(), "d": -1, "u": user, "k": kind}) + "\n")


async def model(rng: random.Random) -> AsyncIterator[str]:
    """A slow first token (0.2 to 1.5 s), then 20 to 120 tokens 50 ms apart."""
    await asyncio.sleep(rng.uniform(0.2, 1.5))
    for n in range(rng.randint(20, 120)):
        yield f"token {n}"
        await asyncio.sleep(0.05)


@app.get("/sse")
async def sse(request: Request, user: str) -> StreamingResponse:
    lease = await manager.acquire(user, request=request) if PROTECTED else None

    async def events() -> AsyncIterator[str]:
        with live(user, "sse"):
            async for token in model(random.Random()):
                yield f"data: {token}\n\n"

    body = lease.wrap(events()) if lease is not None else events()
    return StreamingResponse(body, media_type="text/event-stream")


@app.websocket("/ws")
async def ws(websocket: WebSocket, user: str) -> None:
    try:
        async with AsyncExitStack() as stack:
            if PROTECTED:  # before accept(): a refusal is an HTTP 403 to the client
                await stack.enter_async_context(manager.lease(user))
            await websocket.accept()
            with live(user, "ws"):
                async for token in model(random.Random()):
                    await websocket.send_text(token)
            await websocket.close()
    except StreamLeaseError:  # refused, or the lease was lost mid-stream
        with suppress(RuntimeError):  # the client may have gone already
            await websocket.close(code=1013)
    except WebSocketDisconnect:
        pass  # the client hung up
