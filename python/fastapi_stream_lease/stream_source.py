"""Closing what a wrapped stream read from, once the stream ends: the object given to
``Lease.wrap()`` and the iterator it handed out, each by the method it has (``aclose()``, or
``close()``, awaited when either is a coroutine function or returns an awaitable, as an SDK's
stream object's may), within ``CLOSE_TIMEOUT`` seconds. A close that fails or hangs is logged
and left: the stream has ended, and its lease is released whatever the source does."""

from __future__ import annotations

import asyncio
import inspect
import logging
import sys
from collections.abc import Callable
from typing import cast

log = logging.getLogger("fastapi_stream_lease")

#: Seconds the sources of one stream may take to close, together.
CLOSE_TIMEOUT = 2.0


async def close_sources(*sources: object) -> None:
    """Closes each of ``sources`` once (the iterator first), by its own method."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + CLOSE_TIMEOUT
    seen: set[int] = set()
    for source in sources:
        if id(source) in seen:
            continue
        seen.add(id(source))
        if inspect.isasyncgen(source) and source.ag_frame is None:
            continue  # an async generator that ran to its end, or was closed: nothing to close
        close = _close_method(source)
        if close is None:
            continue
        try:
            await _closed(close, max(deadline - loop.time(), 0.001))
        except (Exception, asyncio.TimeoutError) as error:
            # The type only: a message may carry the stream's data.
            log.warning(
                "closing the stream's source %s raised %s; the stream ended anyway",
                type(source).__name__,
                type(error).__name__,
            )


def _close_method(source: object) -> Callable[[], object] | None:
    for name in ("aclose", "close"):
        method = getattr(source, name, None)
        if callable(method):
            return cast("Callable[[], object]", method)
    return None


async def _closed(close: Callable[[], object], seconds: float) -> None:
    # Called on the loop's thread, sync or not: an async stream's close() may touch the loop's
    # objects, which is unsafe from another thread. Only an awaitable is timed, with a timer
    # handle where asyncio has one (3.11+) rather than the task wait_for adds to each stream.
    result = close()
    if not inspect.isawaitable(result):
        return
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(seconds):
            await result
    else:
        await asyncio.wait_for(result, seconds)
