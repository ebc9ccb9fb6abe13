"""Watching a waiting request's client without taking its body away from the app.

ASGI tells an app that its client went away only through ``receive()``, and a client still
uploading has body messages queued before that ``http.disconnect``. So while a request (or a
WebSocket before its handshake: ``websocket.connect``, then ``websocket.disconnect`` when the
client leaves) waits in line, the watch receives for it: a disconnect ends the wait at once; a
message is held, untouched, and handed back to the app first when it reads the body (or accepts
the WebSocket) after admission. The watch never parses, joins or caches the body
(Starlette's ``request.body()`` would buffer all of it, and a waiter is exactly the request that
has not been admitted to cost memory). It holds at most
``HELD_BODY_LIMIT`` bytes, then stops receiving: the server stops reading the socket and TCP
slows the client down; such a client that goes away is noticed when its wait ends.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable
from typing import TYPE_CHECKING, TypeVar

from .errors import ClientDisconnected

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.types import Message, Receive
    from starlette.websockets import WebSocket

#: The most body a waiting request's watch holds for the app (one read of a typical server:
#: uvicorn pauses a connection at 64 KiB it was not asked for).
HELD_BODY_LIMIT = 64 * 1024

T = TypeVar("T")

#: What a server sends when the client of a request or of a WebSocket went away.
DISCONNECTS = ("http.disconnect", "websocket.disconnect")


async def unless_disconnected(request: Request | WebSocket, acquired: Awaitable[T]) -> T:
    """Awaits ``acquired`` while the client is there; cancels it (leaving the line) and raises
    :class:`ClientDisconnected` as soon as the client goes away, also while it is still
    sending its body, and cancels it if this call is cancelled."""
    waiting = asyncio.ensure_future(acquired)
    held: deque[Message] = deque()
    # Starlette keeps the receive its reads go through on the request; the held messages must
    # come first through it, whoever reads the body (the app's request.stream(), a form).
    receive: Receive = request._receive
    watching = asyncio.ensure_future(_disconnect_of(receive, held))
    try:
        await asyncio.wait({waiting, watching}, return_when=asyncio.FIRST_COMPLETED)
        if not waiting.done() and watching.result():
            raise ClientDisconnected("the client went away while waiting in line")
        return await waiting
    finally:
        watching.cancel()
        waiting.cancel()  # a no-op once it is done
        if held:
            request._receive = _replaying(held, receive)


async def _disconnect_of(receive: Receive, held: deque[Message]) -> bool:
    """Receives until the client goes away (True), keeping what it receives in ``held`` (the
    disconnect too: whoever reads the request next learns it); False once it holds
    ``HELD_BODY_LIMIT`` bytes of a body that goes on (it stops receiving)."""
    size = 0
    while size < HELD_BODY_LIMIT:
        message = await receive()
        held.append(message)
        if message["type"] in DISCONNECTS:
            return True
        size += len(message.get("body", b""))
    return False


def _replaying(held: deque[Message], receive: Receive) -> Receive:
    """A receive that gives the held messages first, then goes on with ``receive``."""

    async def replay() -> Message:
        return held.popleft() if held else await receive()

    return replay
