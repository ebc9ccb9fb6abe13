"""Hearing the signals that stop a server, besides the server itself: the lifespan starts a
drain at once, as streams still run (servers run the lifespan's shutdown only after every
connection has closed)."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

# The signals that stop a server gracefully (uvicorn's and gunicorn's workers handle both).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def calling_on_stop_signals(
    loop: asyncio.AbstractEventLoop, callback: Callable[[], None]
) -> Iterator[None]:
    """While the block runs, each of :data:`STOP_SIGNALS` that the server handles in Python
    also schedules ``callback`` on ``loop``, besides running the server's own handler. Nothing
    changes off the main thread (where signals cannot be handled) or for a signal left to its
    default action."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    chained: dict[signal.Signals, tuple[Any, Any]] = {}
    for stop_signal in STOP_SIGNALS:
        server_handler = signal.getsignal(stop_signal)
        if not callable(server_handler) or server_handler is signal.default_int_handler:
            continue

        def handler(
            number: int, frame: FrameType | None, server_handler: Any = server_handler
        ) -> None:
            if not loop.is_closed():  # a server that never ran the lifespan's shutdown
                loop.call_soon_threadsafe(callback)
            server_handler(number, frame)

        signal.signal(stop_signal, handler)
        chained[stop_signal] = (server_handler, handler)
    try:
        yield
    finally:
        for stop_signal, (server_handler, handler) in chained.items():
            if signal.getsignal(stop_signal) is handler:  # else another chained after: leave it
                signal.signal(stop_signal, server_handler)
