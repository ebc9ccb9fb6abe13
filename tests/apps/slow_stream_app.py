"""A streaming endpoint that never ends by itself, to test client disconnects for real."""

import asyncio
import hashlib
import os
from typing import Annotated

from fastapi import Depends, FastAPI, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import StreamingResponse

from fastapi_stream_lease import (
    Lease,
    LeaseConfig,
    StreamLeaseManager,
    install_exception_handler,
)

app = FastAPI()
manager = StreamLeaseManager(
    url=os.environ["STREAM_LEASE_URL"],
    config=LeaseConfig(
        max_per_user=1,
        max_global=int(os.environ.get("STREAM_LEASE_MAX_GLOBAL", "1000")),
        key_prefix=os.environ["STREAM_LEASE_PREFIX"],
    ),
)
install_exception_handler(app)


@app.get("/stream")
async def stream(request: Request, user_id: str, wait: float = 0):
    lease = await manager.acquire(user_id, wait_timeout=wait, request=request)

    async def ticks():
        n = 0
        while True:
            yield f"data: tick {n}\n\n"
            n += 1
            await asyncio.sleep(0.05)

    return StreamingResponse(lease.wrap(ticks()), media_type="text/event-stream")


def user_of(user_id: str) -> str:
    return user_id


@app.websocket("/ws")
async def websocket_ticks(
    websocket: WebSocket,
    lease: Annotated[Lease, Depends(manager.stream_lease(user=user_of, wait_timeout=30))],
) -> None:
    """Waits in line (up to 30 s) before the handshake, then ticks until the client leaves."""
    await websocket.accept()
    try:
        n = 0
        while True:
            await websocket.send_text(f"tick {n}")
            n += 1
            await asyncio.sleep(0.05)
    except WebSocketDisconnect:
        pass


@app.post("/upload")
async def upload(request: Request, user_id: str, wait: float = 0) -> dict[str, int | str]:
    """Reads the body only once admitted (after a wait in line): its size and SHA-256."""
    lease = await manager.acquire(user_id, wait_timeout=wait, request=request)
    try:
        digest, size = hashlib.sha256(), 0
        async for chunk in request.stream():
            digest.update(chunk)
            size += len(chunk)
        return {"size": size, "sha256": digest.hexdigest()}
    finally:
        await lease.release()


@app.get("/count")
async def count(user_id: str | None = None) -> int:
    return await manager.get_active_count(user_id)


@app.get("/stats")
async def stats() -> dict[str, int | bool]:
    return manager.stats()
