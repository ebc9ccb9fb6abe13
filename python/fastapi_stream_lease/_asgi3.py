"""ASGI middleware whose ``__call__`` hands a request on by returning the app's own awaitable,
with no coroutine of its own in between, and still reads as an ASGI 3 app to servers that tell
ASGI 2 (or WSGI) from ASGI 3 by whether ``__call__`` is a coroutine function: uvicorn's
``interface="auto"`` asks ``asyncio.iscoroutinefunction``, Hypercorn ``inspect``'s."""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

Middleware = TypeVar("Middleware")
HandOn = Callable[[Middleware, Any, Any, Any], Awaitable[None]]


def asgi3(hand_on: HandOn[Middleware]) -> HandOn[Middleware]:
    """``hand_on`` as an ASGI 3 ``__call__``: marked a coroutine function where ``inspect`` can
    be told so (Python 3.12 and later); before, wrapped in one (``inspect`` looks only at a
    function's code there), so every server sees ASGI 3 on every Python."""
    if sys.version_info >= (3, 12):
        return inspect.markcoroutinefunction(hand_on)

    @functools.wraps(hand_on)
    async def awaiting(self: Middleware, scope: Any, receive: Any, send: Any) -> None:
        await hand_on(self, scope, receive, send)

    return awaiting
