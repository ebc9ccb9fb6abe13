"""Waiting on conditions with a deadline (tests never assert on timings)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


async def eventually(
    condition: Callable[[], Awaitable[bool]], timeout: float = 10.0, what: str = "condition"
) -> None:
    """Awaits ``condition`` until it holds, failing after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.02)


async def count_is(manager, expected: int, user_id: str | None = None) -> None:
    """Waits until the store reports ``expected`` slots in use."""

    async def check() -> bool:
        return await manager.get_active_count(user_id) == expected

    await eventually(check, what=f"active count {expected} for {user_id or 'global'}")
