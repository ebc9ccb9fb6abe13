"""An ASGI callable that is not a coroutine function (it hands a request on by returning the
app's own awaitable) still has to read as an ASGI 3 app to servers that tell ASGI 2 from 3 by
whether ``__call__`` is a coroutine function (uvicorn's ``interface="auto"``)."""

from __future__ import annotations

import asyncio
import inspect
import sys
from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable[..., object])


def asgi3(function: F) -> F:
    """Marks ``function`` a coroutine function for ``inspect`` and ``asyncio`` alike."""
    if sys.version_info >= (3, 12):
        return inspect.markcoroutinefunction(function)
    function._is_coroutine = asyncio.coroutines._is_coroutine  # type: ignore[attr-defined]
    return function
