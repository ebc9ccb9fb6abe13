"""The story in one run: a FastAPI app lets each user hold 2 streams at once.

Three concurrent streams for one user: two are admitted, the third is refused with 429 and
Retry-After; when one stream finishes, the retry is admitted. Runs on the embedded backend, or
on Redis when REDIS_URL is set. Usage: ``make demo`` (or ``REDIS_URL=redis://host:port make demo``).
"""

from __future__ import annotations

import asyncio
import os
import sys

import httpx
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from serving import serving

from fastapi_stream_lease import LeaseConfig, StreamLeaseManager, install_exception_handler

URL = os.environ.get("REDIS_URL", "memory://")
# A demo's own secret for hashing user ids into keys; an app reads its own from
# STREAM_LEASE_IDENTITY_SECRET.
SECRET = os.environ.get("STREAM_LEASE_IDENTITY_SECRET", "demo-only-identity-secret")
manager = StreamLeaseManager(
    url=URL,
    config=LeaseConfig(max_per_user=2, max_global=100, key_prefix="demo", identity_secret=SECRET),
)
app = FastAPI()
install_exception_handler(app)


@app.get("/chat/stream")
async def chat_stream(user_id: str, words: int = 3):
    lease = await manager.acquire(user_id)

    async def tokens():
        for n in range(words):
            await asyncio.sleep(0.3)  # a slow model
            yield f"data: token {n + 1}/{words}\n\n"

    return StreamingResponse(lease.wrap(tokens()), media_type="text/event-stream")


def say(text: str) -> None:
    print(text, flush=True)


async def story(base_url: str) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:

        async def stream(name: str, words: int, admitted: asyncio.Event | None = None) -> None:
            params = {"user_id": "alice", "words": words}
            async with client.stream("GET", "/chat/stream", params=params) as response:
                say(f"{name}: HTTP {response.status_code}, lease acquired")
                if admitted is not None:
                    admitted.set()
                async for line in response.aiter_lines():
                    if line:
                        say(f"{name}: {line}")
            say(f"{name}: finished, lease released")

        admitted = [asyncio.Event(), asyncio.Event()]
        short = asyncio.create_task(stream("stream 1", words=3, admitted=admitted[0]))
        long = asyncio.create_task(stream("stream 2", words=8, admitted=admitted[1]))
        await asyncio.gather(*(event.wait() for event in admitted))
        say(f"alice holds {await manager.get_active_count('alice')} of 2 streams")

        third = await client.get("/chat/stream", params={"user_id": "alice"})
        say(
            f"stream 3: HTTP {third.status_code}, Retry-After: {third.headers['retry-after']}, "
            f"{third.json()['detail']}"
        )
        assert third.status_code == 429

        await short  # its lease is released before its last byte is sent
        say(f"alice holds {await manager.get_active_count('alice')} of 2 streams; stream 3 retries")
        await stream("stream 3", words=2)
        await long
    say(f"alice holds {await manager.get_active_count('alice')} streams; demo done")


async def main() -> None:
    try:
        async with serving(app) as port:
            say(f"app on http://127.0.0.1:{port}, leases in {manager.backend}, max_per_user=2")
            await story(f"http://127.0.0.1:{port}")
    finally:
        await manager.aclose()


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
