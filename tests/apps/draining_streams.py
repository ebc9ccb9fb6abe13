"""Streams whose manager is tied to the app's lifespan, the way the deployment recipe does it:
SIGTERM starts the drain."""

import asyncio
import os
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from fastapi_stream_lease import LeaseConfig, StreamLeaseManager, install_exception_handler

manager = StreamLeaseManager(
    url=os.environ["STREAM_LEASE_URL"],
    config=LeaseConfig(
        max_per_user=0,
        max_global=2,
        lease_seconds=30,
        key_prefix=os.environ["STREAM_LEASE_PREFIX"],
    ),
)


@asynccontextmanager
async def lifespan(app: FastAPI):
    async with manager.lifespan(app, drain_timeout=float(os.environ["DRAIN_TIMEOUT"])):
        yield


app = FastAPI(lifespan=lifespan)
install_exception_handler(app)


@app.get("/stream")
async def stream(request: Request, user_id: str, ticks: int = 0, wait: float = 0):
    """``ticks`` events 50 ms apart (0: until the client or the drain ends it)."""
    lease = await manager.acquire(user_id, wait_timeout=wait, request=request)

    async def ticking():
        n = 0
        while not ticks or n < ticks:
            yield f"data: tick {n}\n\n"
            n += 1
            await asyncio.sleep(0.05)

    return StreamingResponse(lease.wrap(ticking()), media_type="text/event-stream")
