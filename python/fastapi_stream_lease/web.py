"""Rate limits in FastAPI and Starlette apps: a dependency, a route decorator, an ASGI middleware
with per-route policies, a WebSocket guard, and the middleware that puts the headers on every
response (streams included, before their first byte).

The forms record each hit's decisions in the request's scope; the middleware that
:func:`~fastapi_stream_lease.install_exception_handler` adds (or :class:`RateLimitHeaders`
alone) writes them as ``RateLimit-Policy`` / ``RateLimit`` headers when the response starts,
so they reach a ``StreamingResponse`` that the endpoint returns itself (FastAPI drops a
dependency's headers there).
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, TypeAlias

from starlette.requests import HTTPConnection, Request
from starlette.websockets import WebSocket, WebSocketDisconnect

from ._asgi3 import asgi3
from ._core import check_rate_limits, rate_limit_header_fields
from .errors import RateLimited
from .rates import (
    PolicyEntry,
    RateDecision,
    RateLimit,
    openai_rate_limit_headers,
)

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send


#: How a form finds the identity a request counts against: a function (sync or async) of the
#: request or WebSocket. Left out: the client's IP address (``StreamLeaseManager.client_ip``).
KeyFunction: TypeAlias = Callable[[HTTPConnection], str | Awaitable[str]]


class RateCounter(Protocol):
    """What the forms need of a :class:`~fastapi_stream_lease.StreamLeaseManager` (named by its
    shape, so this module does not import the manager, which builds the forms)."""

    def client_ip(self, connection: HTTPConnection) -> str: ...

    async def hit(
        self, identity: str, *policies: PolicyEntry, cost: int = 1
    ) -> list[RateDecision]: ...

    def _hit_now(
        self, identity: str, policies: Sequence[PolicyEntry], cost: int
    ) -> list[RateDecision] | Awaitable[list[RateDecision]]: ...


#: Where a hit's decisions, and a stream's capped pools, wait in the scope for the headers.
_DECISIONS = "fastapi_stream_lease.rate_decisions"
_POOLS = "fastapi_stream_lease.pool_usage"

#: The close code for a WebSocket over its limits (RFC 6455: policy violation).
POLICY_VIOLATION = 1008


def remember(
    scope: Scope,
    decisions: Sequence[RateDecision],
    pools: Sequence[tuple[str, int, int]] = (),
) -> None:
    """Records a hit's decisions (and a stream's capped pools: name, capacity, slots in use) for
    the response's headers; several hits add up."""
    state = scope.setdefault("state", {})
    state.setdefault(_DECISIONS, []).extend(decisions)
    if pools:
        state.setdefault(_POOLS, []).extend(pools)


def legacy_headers(decisions: Sequence[RateDecision]) -> dict[str, str]:
    """The article's ``X-RateLimit-Scope/Limit/Remaining/Reset`` for the most restrictive
    policy (fewest units left); ``Reset`` is in seconds from now, not a timestamp."""
    if not decisions:
        return {}
    tightest = min(decisions, key=lambda d: (d.remaining, -d.reset))
    return {
        "X-RateLimit-Scope": tightest.policy.name,
        "X-RateLimit-Limit": str(tightest.limit),
        "X-RateLimit-Remaining": str(tightest.remaining),
        "X-RateLimit-Reset": str(math.ceil(tightest.reset)),
    }


def with_rate_limit_headers(
    start: Message, scope: Scope, *, legacy: bool = False, openai: bool = False
) -> Message:
    """A response's ``start`` with the headers of the hits the request made and the streams it
    acquired with ``request=`` (recorded in ``scope``) added, but none the response set itself;
    ``start`` itself when there is nothing to add."""
    state = scope.get("state")
    if not state:
        return start
    decisions, pools = state.get(_DECISIONS, ()), state.get(_POOLS, ())
    if not decisions and not pools:
        return start
    own = start.get("headers", [])
    added = rate_limit_header_fields(decisions, pools, own)
    if legacy or openai:
        present = {name.lower() for name, _ in own}
        headers = legacy_headers(decisions) if legacy else {}
        if openai:
            headers.update(openai_rate_limit_headers(decisions))
        added += [
            (encoded, value.encode("latin-1"))
            for name, value in headers.items()
            if (encoded := name.lower().encode("latin-1")) not in present
        ]
    return {**start, "headers": [*own, *added]}


class RateLimitHeaders:
    """ASGI middleware: adds the ``RateLimit-Policy`` and ``RateLimit`` headers of the hits a
    request made (through :meth:`StreamLeaseManager.rate_limit` and the other forms) and of the
    streams it acquired with ``request=`` to its response when it starts, unless the response
    set them itself; with ``legacy=True`` also the article's ``X-RateLimit-*`` headers, with
    ``openai=True`` OpenAI's ``x-ratelimit-*-requests`` / ``x-ratelimit-*-tokens``.
    :class:`~fastapi_stream_lease.StreamEndMiddleware` writes them too when asked
    (``rate_limit_headers=True``, as :func:`~fastapi_stream_lease.install_exception_handler`
    adds it): this middleware is for apps without that one."""

    def __init__(self, app: ASGIApp, *, legacy: bool = False, openai: bool = False) -> None:
        self.app = app
        self.legacy = legacy
        self.openai = openai

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = with_rate_limit_headers(
                    message, scope, legacy=self.legacy, openai=self.openai
                )
            await send(message)

        await self.app(scope, receive, send_with_headers)


async def identity_of(
    connection: HTTPConnection, key: KeyFunction | None, manager: RateCounter
) -> str:
    """The identity ``connection`` counts against: ``key(connection)``, or its client's IP."""
    if key is None:
        return manager.client_ip(connection)
    identity = key(connection)
    # A str first: most key functions are plain, and an awaitable's check costs more.
    if not isinstance(identity, str) and inspect.isawaitable(identity):
        identity = await identity
    return identity


def hit_for(
    connection: HTTPConnection,
    manager: RateCounter,
    policies: Sequence[RateLimit],
    key: KeyFunction | None,
    cost: int,
) -> list[RateDecision] | Awaitable[list[RateDecision]]:
    """One hit for the connection; its decisions (or the refusal's) go to the headers. The
    decisions themselves when the hit is allowed without waiting and nothing listens for it
    (a plain key function; units leased to this worker, or the embedded store; no telemetry,
    no ``on_threshold``): the forms then await nothing for it. Otherwise an awaitable of
    them."""
    identity = manager.client_ip(connection) if key is None else key(connection)
    if not isinstance(identity, str) and inspect.isawaitable(identity):
        return _recorded(connection.scope, _hit_of_awaited(manager, identity, policies, cost))
    decided = manager._hit_now(identity, policies, cost)
    if isinstance(decided, list):
        remember(connection.scope, decided)
        return decided
    return _recorded(connection.scope, decided)


async def _hit_of_awaited(
    manager: RateCounter, identity: Awaitable[str], policies: Sequence[RateLimit], cost: int
) -> list[RateDecision]:
    """The hit of an async key function's identity."""
    return await manager.hit(await identity, *policies, cost=cost)


async def _recorded(scope: Scope, decided: Awaitable[list[RateDecision]]) -> list[RateDecision]:
    """The decisions of a hit that waits, recorded for the headers (a refusal's too)."""
    try:
        decisions = await decided
    except RateLimited as refused:
        remember(scope, refused.decisions)
        raise
    remember(scope, decisions)
    return decisions


def rate_limit_dependency(
    manager: RateCounter,
    policies: Sequence[RateLimit],
    key: KeyFunction | None,
    cost: int,
) -> Callable[[Request], Awaitable[list[RateDecision]]]:
    """See :meth:`StreamLeaseManager.rate_limit`."""
    _check(policies, cost)

    async def rate_limit(request: Request) -> list[RateDecision]:
        decided = hit_for(request, manager, policies, key, cost)
        return decided if isinstance(decided, list) else await decided

    return rate_limit


def rate_limit_decorator(
    manager: RateCounter,
    policies: Sequence[RateLimit],
    key: KeyFunction | None,
    cost: int,
) -> Callable[[Callable[..., Any]], Callable[..., Awaitable[Any]]]:
    """See :meth:`StreamLeaseManager.rate_limited`."""
    _check(policies, cost)

    def decorate(endpoint: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
        signature = inspect.signature(endpoint)
        own = next(
            (
                name
                for name, p in signature.parameters.items()
                if p.annotation in (Request, "Request")
            ),
            None,
        )
        # FastAPI passes the request to a parameter annotated Request: add one if the endpoint
        # has none, and keep it from the endpoint.
        added = "_rate_limited_request"
        if own is None:
            parameters = [
                *signature.parameters.values(),
                inspect.Parameter(added, inspect.Parameter.KEYWORD_ONLY, annotation=Request),
            ]
            signature = signature.replace(parameters=parameters)
        is_async = inspect.iscoroutinefunction(endpoint)

        @functools.wraps(endpoint)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            request = kwargs[own] if own is not None else kwargs.pop(added)
            decided = hit_for(request, manager, policies, key, cost)
            if not isinstance(decided, list):
                await decided
            if is_async:
                return await endpoint(*args, **kwargs)
            from starlette.concurrency import run_in_threadpool

            return await run_in_threadpool(endpoint, *args, **kwargs)

        wrapper.__signature__ = signature  # type: ignore[attr-defined]
        return wrapper

    return decorate


class RateLimitMiddleware:
    """ASGI middleware with per-route policies: ``routes`` maps a path to the policies its
    requests count against (a path also covers the paths below it: ``"/api/chat"`` covers
    ``"/api/chat/stream"``; the longest match wins). A refused request is answered with 429 and
    the headers without reaching the app; WebSocket connects are refused before ``accept()``
    (HTTP 403). Add the headers' middleware outside it (``install_exception_handler`` does) for
    the headers of admitted responses."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        manager: RateCounter,
        routes: Mapping[str, Sequence[RateLimit]],
        key: KeyFunction | None = None,
    ) -> None:
        for path, policies in routes.items():
            if not path.startswith("/"):
                raise ValueError(f"route {path!r} must be a path starting with '/'")
            _check(policies, 1)
        self.app = app
        self.manager = manager
        self.key = key
        # Longest first, so the most specific route wins.
        self.routes = sorted(
            ((path.rstrip("/") or "/", tuple(p)) for path, p in routes.items()),
            key=lambda route: -len(route[0]),
        )

    def _policies(self, path: str) -> tuple[RateLimit, ...]:
        for prefix, policies in self.routes:
            if prefix == "/" or path == prefix or path.startswith(prefix + "/"):
                return policies
        return ()

    @asgi3
    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        # Not a coroutine (on Python 3.12 and later): a hit allowed without waiting hands the
        # request on as the app's own awaitable, with no coroutine of this middleware's.
        policies = self._policies(scope.get("path", "")) if scope["type"] != "lifespan" else ()
        if policies:
            decided = hit_for(HTTPConnection(scope), self.manager, policies, self.key, 1)
            if not isinstance(decided, list):
                return self._after_hit(decided, scope, receive, send)
        return self.app(scope, receive, send)

    async def _after_hit(
        self,
        decided: Awaitable[list[RateDecision]],
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        """The request, once its hit that waits is decided: the app's, or the refusal."""
        try:
            await decided
        except RateLimited as refused:
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": POLICY_VIOLATION})
                return
            await refused.as_response()(scope, receive, send)
            return
        await self.app(scope, receive, send)


async def guard_websocket(
    manager: RateCounter,
    websocket: WebSocket,
    connects: Sequence[RateLimit],
    messages: Sequence[RateLimit],
    key: KeyFunction | None,
) -> WebSocket:
    """See :meth:`StreamLeaseManager.guard_websocket`."""
    for policies in (connects, messages):
        if policies:
            _check(policies, 1)
    identity = await identity_of(websocket, key, manager)
    if connects:
        try:
            await manager.hit(identity, *connects)
        except RateLimited as refused:
            await _refuse(websocket, refused)  # before accept(): HTTP 403
    if messages:
        _count_messages(websocket, manager, identity, tuple(messages))
    return websocket


def _count_messages(
    websocket: WebSocket, manager: RateCounter, identity: str, policies: tuple[RateLimit, ...]
) -> None:
    """Counts each message from the client where every reader of the socket takes it from (its
    ASGI ``receive``), so ``receive_text()``, ``iter_json()``, ``receive()`` and the readers of
    later Starlette versions alike are counted. The message over a limit closes the socket with
    1008 and reaches the reader as the client's disconnect."""
    receive = websocket._receive

    async def counted_receive() -> Message:
        message = await receive()
        if message["type"] == "websocket.receive":
            try:
                await manager.hit(identity, *policies)
            except RateLimited as refused:
                reason = _close_reason(refused)
                await websocket.close(code=POLICY_VIOLATION, reason=reason)
                return {"type": "websocket.disconnect", "code": POLICY_VIOLATION, "reason": reason}
        return message

    websocket._receive = counted_receive


async def _refuse(websocket: WebSocket, refused: RateLimited) -> NoReturn:
    """Closes with 1008 and ends the endpoint as a disconnect does (apps handle that already)."""
    reason = _close_reason(refused)
    await websocket.close(code=POLICY_VIOLATION, reason=reason)
    raise WebSocketDisconnect(code=POLICY_VIOLATION, reason=reason) from refused


def _close_reason(refused: RateLimited) -> str:
    return str(refused)[:120]  # a close frame's reason is at most 123 bytes


def _check(policies: Sequence[RateLimit], cost: int) -> None:
    """Fails at start-up, not per request (the core's checks of a hit)."""
    check_rate_limits(policies, cost)


__all__ = [
    "KeyFunction",
    "RateLimitHeaders",
    "RateLimitMiddleware",
    "legacy_headers",
    "with_rate_limit_headers",
]
