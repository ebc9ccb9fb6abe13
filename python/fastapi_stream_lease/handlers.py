"""Turning library errors into HTTP answers in Starlette and FastAPI apps."""

from __future__ import annotations

import logging
from typing import Any

from starlette.requests import HTTPConnection, Request
from starlette.responses import Response

from .errors import BackendError, StreamLeaseError
from .stream_end import StreamEndMiddleware, guard_of

log = logging.getLogger("fastapi_stream_lease")


async def stream_lease_exception_handler(request: Request, exc: Exception) -> Response:
    """Answers any :class:`StreamLeaseError` with its status, ``Retry-After`` and JSON body.
    A store's error is logged with its message (which names the store); the client's body
    does not carry it. A WebSocket already accepted has no room for an HTTP answer: the error
    goes on to :class:`StreamEndMiddleware`, which closes the socket with a code and reason."""
    if not isinstance(exc, StreamLeaseError) or _accepted(request):
        raise exc
    if isinstance(exc, BackendError):
        log.warning("admission control unavailable, answered 503: %s", exc)
    return exc.as_response()


def _accepted(connection: HTTPConnection) -> bool:
    """Whether ``connection`` is a WebSocket accepted already (its ``WebSocket`` object here
    may be a fresh one, so the middleware's record says)."""
    guard = guard_of(connection.scope)
    return connection.scope["type"] == "websocket" and guard is not None and guard.started


def install_exception_handler(
    app: Any, *, legacy_rate_limit_headers: bool = False, openai_rate_limit_headers: bool = False
) -> None:
    """One line for a whole app: 429/503 with ``Retry-After`` for every library error;
    :class:`StreamEndMiddleware`, so a stream the library ends after its start (a budget cut, a
    revoke, a lost lease, a drain) ends cleanly with a final event that says why, and so the
    rate-limit headers of every hit reach the response, a stream included (what
    :class:`RateLimitHeaders` writes; call it before the app starts).
    ``legacy_rate_limit_headers=True`` adds the ``X-RateLimit-*`` headers some clients expect;
    ``openai_rate_limit_headers=True`` OpenAI's ``x-ratelimit-*-requests`` /
    ``x-ratelimit-*-tokens``, which LLM SDK clients read."""
    if not callable(getattr(app, "add_exception_handler", None)):
        raise TypeError(
            "app must be a FastAPI or Starlette application (one with add_exception_handler), "
            f"got {type(app).__name__}"
        )
    app.add_exception_handler(StreamLeaseError, stream_lease_exception_handler)
    app.add_middleware(
        StreamEndMiddleware,
        rate_limit_headers=True,
        legacy_rate_limit_headers=legacy_rate_limit_headers,
        openai_rate_limit_headers=openai_rate_limit_headers,
    )


def register_exception_handlers(app: Any) -> None:
    """The 0.6 API's name of :func:`install_exception_handler` (its 429 and 503 handlers are
    this one handler, which answers every error of the library)."""
    install_exception_handler(app)
