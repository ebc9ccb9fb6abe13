"""A streaming endpoint that never ends by itself, to test client disconnects for real."""

import asyncio
import os

from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from fastapi_stream_lease import LeaseConfig, StreamLeaseManager, install_exception_handler

app = FastAPI()
manager = StreamLeaseManager(
    url=os.environ["STREAM_LEASE_URL"],
    config=LeaseConfig(max_per_user=1, key_prefix=os.environ["STREAM_LEASE_PREFIX"]),
)
install_exception_handler(app)


@app.get("/stream")
async def stream(user_id: str):
    lease = await manager.acquire(user_id)

    async def ticks():
        n = 0
        while True:
            yield f"data: tick {n}\n\n"
            n += 1
            await asyncio.sleep(0.05)

    return StreamingResponse(lease.wrap(ticks()), media_type="text/event-stream")


@app.get("/count")
async def count(user_id: str | None = None) -> int:
    return await manager.get_active_count(user_id)
