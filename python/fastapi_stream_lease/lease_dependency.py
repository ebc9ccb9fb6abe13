"""A lease as a FastAPI dependency (:meth:`StreamLeaseManager.stream_lease`).

FastAPI 0.118 and later runs the exit of a ``yield`` dependency of the request's scope after
the response is sent (before 0.118 it ran before the body streamed, which would leave the
stream without its lease: :func:`lease_dependency` refuses older versions), whatever the
endpoint is: one that ``yield``s Server-Sent Events
(``response_class=EventSourceResponse``) or JSON Lines, one that returns a
``StreamingResponse``, a WebSocket route. That exit also comes after the request's background
tasks, so it is not where the lease ends: the dependency acquires before the endpoint runs and
yields the :class:`Lease`; :class:`~fastapi_stream_lease.stream_end.StreamEndMiddleware`
watches it, ends the response cleanly if it is lost or revoked, and releases it when the
response ends or the client leaves; the exit awaits that release.
``Depends(..., scope="function")`` needs FastAPI 0.121, native Server-Sent Events
(``fastapi.sse``) 0.135.
"""

# No ``from __future__ import annotations``: FastAPI reads the dependency's parameters from
# its annotations, and ``Depends(user)`` there names a local.
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any

from starlette.requests import HTTPConnection, Request
from starlette.websockets import WebSocket

from .lease import Lease
from .stream_end import guard_of

#: The first FastAPI whose ``yield`` dependencies exit after the response is sent.
NEEDS_FASTAPI = (0, 118)

#: What a request without the middleware is told.
NEEDS_MIDDLEWARE = (
    "manager.stream_lease() needs the middleware that ends streams cleanly: call "
    "install_exception_handler(app) once where the app is built"
)


def lease_dependency(
    acquire: Callable[..., Awaitable[Lease]],
    requests: set[Lease],
    user: Callable[..., Any],
    options: dict[str, Any],
) -> Callable[..., AsyncIterator[Lease]]:
    """See :meth:`StreamLeaseManager.stream_lease`; ``acquire`` is the manager's, ``requests``
    the manager's record of the requests not finished yet (a drain waits for them)."""
    import fastapi
    from fastapi import Depends

    found = fastapi.__version__
    if tuple(int(part) for part in re.findall(r"\d+", found)[:2]) < NEEDS_FASTAPI:
        needed = ".".join(map(str, NEEDS_FASTAPI))
        raise RuntimeError(
            f"manager.stream_lease() needs FastAPI {needed} or later, found {found}: before "
            f"{needed} a yield dependency's exit ran before the response was sent, so the "
            f"stream would run without its lease; upgrade with pip install 'fastapi>={needed}'"
        )
    if not callable(user):
        raise TypeError(
            f"user must be a dependency that returns the user id (a function), got {user!r}"
        )

    async def stream_lease(
        connection: HTTPConnection, user_id: Annotated[Any, Depends(user)]
    ) -> AsyncIterator[Lease]:
        guard = guard_of(connection.scope)
        if guard is None:
            raise RuntimeError(NEEDS_MIDDLEWARE)
        # A client that leaves while it waits in line leaves the line (a WebSocket's before its
        # handshake too).
        request = connection if isinstance(connection, Request | WebSocket) else None
        lease = await acquire(user_id, request=request, **options)
        requests.add(lease)
        try:
            async with lease._released_at_end(awaited=False):
                guard.watch(lease)
                yield lease
        finally:
            requests.discard(lease)

    return stream_lease
