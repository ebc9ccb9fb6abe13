# The quickstart and the WebSocket example of the original fastapi-stream-lease README,
# exactly as written there (only the WebSocket import, which that snippet assumes, is added).
# tests/test_http.py runs it under uvicorn against a Redis it starts itself.
from fastapi import FastAPI, Depends, Request
from fastapi import WebSocket
from fastapi.responses import StreamingResponse
import redis.asyncio as redis

from fastapi_stream_lease import (
    StreamLeaseManager,
    LeaseConfig,
    StreamLeaseRejected,
)

app = FastAPI()
redis_client = redis.from_url("redis://localhost:6379")

# Configure lease boundaries:
# Each user can hold at most 2 concurrent streams; cluster max is 500.
lease_manager = StreamLeaseManager(
    redis=redis_client,
    config=LeaseConfig(
        max_per_user=2,
        max_global=500,
        lease_seconds=30.0,
    ),
)


# Convert lease rejections into clean HTTP 429 Too Many Requests responses:
@app.exception_handler(StreamLeaseRejected)
async def lease_rejected_handler(request: Request, exc: StreamLeaseRejected):
    return exc.as_response()


@app.get("/api/chat/stream")
async def chat_stream(user_id: str = "user_123"):
    # 1. Acquire lease (raises StreamLeaseRejected if limit reached)
    lease = await lease_manager.acquire(user_id)

    async def token_generator():
        # Example: streaming tokens from an LLM
        for word in ["Hello", "world", "this", "is", "streamed!"]:
            yield f"data: {word}\n\n"

    # 2. Wrap generator: guarantees background auto-renewal and release on disconnect
    return StreamingResponse(
        lease.wrap(token_generator()),
        media_type="text/event-stream",
    )


@app.websocket("/ws/chat/{user_id}")
async def websocket_chat(websocket: WebSocket, user_id: str):
    await websocket.accept()
    # Acquires lease on enter, automatically releases when socket closes or disconnects
    async with lease_manager.lease(user_id):
        while True:
            msg = await websocket.receive_text()
            await websocket.send_text(f"Echo: {msg}")
