"""An app that closes its manager in its lifespan, as the README recommends."""

import asyncio
import os
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from fastapi_stream_lease import LeaseConfig, StreamLeaseManager, install_exception_handler

manager = StreamLeaseManager(
    url=os.environ["STREAM_LEASE_URL"],
    config=LeaseConfig(lease_seconds=30, key_prefix=os.environ["STREAM_LEASE_PREFIX"]),
)


@asynccontextmanager
async def lifespan(app: FastAPI):
    yield
    await manager.aclose()  # releases what this worker holds, in one round trip


app = FastAPI(lifespan=lifespan)
install_exception_handler(app)


@app.get("/stream")
async def stream(user_id: str):
    lease = await manager.acquire(user_id)

    async def ticks():
        while True:
            yield "data: tick\n\n"
            await asyncio.sleep(0.05)

    return StreamingResponse(lease.wrap(ticks()), media_type="text/event-stream")
