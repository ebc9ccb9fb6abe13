"""An app of tests/apps/ under a real uvicorn, configured through the environment, its log in a
file the test reads as it goes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi_stream_lease import LeaseConfig, StreamLeaseManager

from .apps import APPS_DIR
from .uvicorn_server import Uvicorn


class AppServer:
    """``tests/apps/<module>.py``'s ``app`` under uvicorn, told its store by ``STREAM_LEASE_URL``,
    ``STREAM_LEASE_PREFIX`` and ``STREAM_LEASE_SECRET``; ``args`` go to uvicorn."""

    def __init__(
        self, module: str, redis_url: str, log: Path, prefix: str, secret: str, *args: str
    ) -> None:
        env = {
            "STREAM_LEASE_URL": redis_url,
            "STREAM_LEASE_PREFIX": prefix,
            "STREAM_LEASE_SECRET": secret,
        }
        self.log_path = log
        self.uvicorn = Uvicorn(f"{module}:app", APPS_DIR, env, *args, log=log)
        self.base_url = self.uvicorn.base_url
        self._read = 0

    def new_log(self) -> str:
        """What the server logged since the last call."""
        text = self.log_path.read_text()
        new, self._read = text[self._read :], len(text)
        return new

    def stop(self) -> None:
        self.uvicorn.stop()


@asynccontextmanager
async def store_of(redis_url: str, prefix: str, secret: str) -> AsyncIterator[StreamLeaseManager]:
    """Another process's view of an app's leases (its prefix and secret): counts them, revokes
    them."""
    manager = StreamLeaseManager(
        url=redis_url, config=LeaseConfig(key_prefix=prefix, identity_secret=secret)
    )
    try:
        yield manager
    finally:
        await manager.aclose()
