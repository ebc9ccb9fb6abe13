"""Waiting on conditions with a deadline (tests never assert on timings)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


def wait_until(
    condition: Callable[[], T], timeout: float = 10.0, interval: float = 0.02,
    what: str = "condition",
) -> T:
    """Blocks, polling ``condition`` until it returns a truthy value (returned) or ``timeout``
    seconds pass. Outside an event loop only: in a coroutine, await :func:`eventually`."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


async def eventually(
    condition: Callable[[], bool | Awaitable[bool]], timeout: float = 10.0,
    what: str = "condition",
) -> None:
    """Checks ``condition``, a plain or an async predicate, until it holds, failing after
    ``timeout`` seconds; the event loop runs between checks."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await _holds(condition):
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.02)


async def _holds(condition: Callable[[], bool | Awaitable[bool]]) -> bool:
    outcome = condition()
    if inspect.isawaitable(outcome):
        return await outcome
    return outcome


async def count_is(manager, expected: int, user_id: str | None = None) -> None:
    """Waits until the store reports ``expected`` slots in use."""

    async def check() -> bool:
        return await manager.get_active_count(user_id) == expected

    await eventually(check, what=f"active count {expected} for {user_id or 'global'}")


async def renewals_ran(manager, calls: int = 2, timeout: float = 10.0) -> None:
    """Waits until ``manager`` has finished ``calls`` more Redis calls than it had: with nothing
    else going on, its renewal rounds' keep-alives (one per round, or one per hash tag on a
    cluster), but for one call right after its first lease, when its subscription to the
    revocations looks for revokes it missed (so ``calls=2`` holds a keep-alive either way).
    Tests wait on this, not on a sleep that a slow machine may outlast."""
    start = manager.stats()["redis_calls"]
    await eventually(
        lambda: manager.stats()["redis_calls"] >= start + calls, timeout,
        what=f"{calls} renewal calls",
    )


async def admits_again(manager: Any, what: str = "admissions to resume once Redis answers") -> None:
    """Waits until an acquire (released at once) works again after an outage."""
    from fastapi_stream_lease import BackendUnavailable

    async def admitted() -> bool:
        try:
            await (await manager.acquire("probe")).release()
        except BackendUnavailable:
            return False
        return True

    await eventually(admitted, what=what)
