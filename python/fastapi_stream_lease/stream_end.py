"""Clean ends for the streams the library stops: a budget cut, a revoke, a lost lease, a drain.

Such an end is a :class:`StreamLeaseError` raised after the response started, when no status
can be sent any more. :class:`StreamEndMiddleware` remembers how the response started and ends
it the way its kind allows.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from typing import TYPE_CHECKING

import anyio

from .errors import LeaseRevoked, ManagerClosed, StreamLeaseError
from .lease import LostWatch
from .web import with_rate_limit_headers

if TYPE_CHECKING:
    from collections.abc import Awaitable, Sequence

    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from .lease import Lease

log = logging.getLogger("fastapi_stream_lease")

#: RFC 6455's close code for a temporary condition on the server's side (try again later).
WS_TRY_AGAIN_LATER = 1013
#: RFC 6455's close code for a policy violation: the client's own limits (a 4xx).
WS_POLICY_VIOLATION = 1008
#: RFC 6455's close code for a server fault (a 5xx other than 503).
WS_INTERNAL_ERROR = 1011


def ws_close_code(status: int) -> int:
    """The WebSocket close code that stands for an HTTP ``status``: 1013 for 503, 1011 for any
    other 5xx, 1008 for a 4xx (the client's own limits)."""
    if status == 503:
        return WS_TRY_AGAIN_LATER
    return WS_INTERNAL_ERROR if status >= 500 else WS_POLICY_VIOLATION


#: Media types of JSON Lines bodies, which end with an error line.
JSON_LINES = frozenset(
    {"application/jsonl", "application/x-ndjson", "application/ndjson", "application/jsonlines"}
)

#: Where the request's :class:`StreamEndGuard` waits in the scope for the lease dependency.
GUARD_KEY = "fastapi_stream_lease.stream_end"


class StreamEndGuard:
    """A request served by :class:`StreamEndMiddleware`: how far its response went (whether it
    started, with which media type, and whether it ended), and the leases it holds through its
    dependency, watched for the task that serves the request (a loss that ends work cancels
    that task) until the response ends. When it ends (its last body message goes out, or the
    client leaves), those leases are released: the work that runs after the body (the
    request's background tasks, a dependency's exit) holds no slot, and no revoke, lost lease
    or drain cancels it.

    FastAPI runs a ``yield`` endpoint's Server-Sent Events generator in a task of its own; when
    that task fails, the task group around it is cancelled and the body may still end normally
    before the failure reaches the middleware. So the empty last message of such a body, sent
    in a cancelled scope, is held until the app returns: a final event can go before it. A body
    that ended in a scope not cancelled is complete, and its last message goes at once (the
    request's background tasks run after it).

    The scope holds it while the app runs (and it the scope, for the rate-limit headers the
    request's hits recorded there); the app gets its bound ``send`` and ``receive``."""

    __slots__ = (
        "_headers",
        "_rate_limit_headers",
        "_receive",
        "_scope",
        "_send",
        "_task",
        "_watches",
        "closed",
        "held",
        "started",
    )

    def __init__(
        self,
        task: asyncio.Task[object] | None,
        scope: Scope,
        send: Send,
        receive: Receive,
        rate_limit_headers: tuple[bool, bool] | None,
    ) -> None:
        self._task = task
        self._watches: list[LostWatch] = []
        self._scope = scope
        self._send = send
        self._receive = receive
        self._rate_limit_headers = rate_limit_headers
        self._headers: Sequence[tuple[bytes, bytes]] = ()
        self.started = False
        self.closed = False
        self.held: Message | None = None

    def watch(self, lease: Lease) -> None:
        """Ends the request when ``lease`` is lost (``on_lost="cancel"``) or revoked; raises at
        once if it already is. Releases ``lease`` when the response ends."""
        watch = LostWatch(lease)
        try:
            watch.cover(self._task)
        except BaseException:
            watch.close()
            raise
        self._watches.append(watch)

    def _response_ended(self, how: str) -> None:
        """The response ended (``how``: ``"completed"``, or ``"cancelled"`` when the client
        left): stops watching the leases and releases them. A watch that has already
        cancelled the request stays, for :meth:`settle` to take that cancellation back."""
        if not self._watches:
            return
        fired = []
        for watch in self._watches:
            if watch.fired:
                fired.append(watch)
                continue
            watch.close()
            watch.lease._end_with_response(how)
        self._watches = fired

    def settle(self) -> StreamLeaseError | None:
        """Stops watching; the error of the first lease whose loss cancelled the request, or
        None (that cancellation taken back)."""
        ended = None
        for watch in self._watches:
            watch.close()
            ended = watch.settle() or ended
        self._watches.clear()
        return ended

    @property
    def media_type(self) -> str:
        """The response's media type, read from its start only when asked (an error to end it
        with, an empty last SSE message): most responses never need it."""
        for name, value in self._headers:
            if name.lower() == b"content-type":
                return value.decode("latin-1").split(";")[0].strip().lower()
        return ""

    def send(self, message: Message) -> Awaitable[None]:
        """The app's ``send``: notes the response's start and end on the way. Not a coroutine:
        what it awaits is the server's ``send`` of the message, handed back as it is."""
        kind = message["type"]
        if kind == "http.response.body":
            if not message.get("more_body", False):
                if (
                    not message.get("body")
                    and self.media_type == "text/event-stream"
                    and anyio.current_effective_deadline() == -math.inf
                ):
                    self.held = message
                    return _nothing_to_send()
                self._ended("completed")
        elif kind == "http.response.start":
            self.started = True
            if self._rate_limit_headers is not None:
                legacy, openai = self._rate_limit_headers
                message = with_rate_limit_headers(
                    message, self._scope, legacy=legacy, openai=openai
                )
            self._headers = message.get("headers", ())
        elif kind == "websocket.accept":
            self.started = True
        elif kind in ("websocket.close", "websocket.http.response.start"):
            self._ended("completed")
        return self._send(message)

    async def receive(self) -> Message:
        """The app's ``receive``: a disconnect ends the response."""
        message = await self._receive()
        if message["type"] in ("http.disconnect", "websocket.disconnect"):
            self._response_ended("cancelled")
        return message

    def _ended(self, how: str) -> None:
        # The releases start before the last message goes, so a client that reads the end and
        # comes straight back finds its slot free.
        self.closed = True
        if self._watches:
            self._response_ended(how)

    async def finish(self) -> None:
        """Sends the held last message, if any."""
        held, self.held = self.held, None
        if held is not None:
            self.closed = True
            await self._send(held)

    async def end(self, scope: Scope, receive: Receive, error: StreamLeaseError) -> None:
        """Ends the response for ``error`` and logs it."""
        name = type(error).__name__
        if self.closed:
            how = "after its response ended"
        elif scope["type"] == "websocket":
            code = ws_close_code(error.status_code)
            how = f"closed with {code}"
            await self._send({"type": "websocket.close", "code": code, "reason": error.title})
        elif not self.started:
            how = f"answered {error.status_code}"
            await error.as_response()(scope, receive, self.send)  # with the rate-limit headers
        else:
            final, how = _final_chunk(self.media_type, error)
            if final:
                await self._send({"type": "http.response.body", "body": final, "more_body": True})
            await self._send({"type": "http.response.body", "body": b"", "more_body": False})
        # Never the identity: the messages name pools, policies and causes only.
        on_purpose = isinstance(error, (LeaseRevoked, ManagerClosed))
        level = logging.INFO if on_purpose else logging.WARNING
        log.log(level, "stream ended %s: %s: %s", how, name, error, extra={"stream_end": name})


async def _nothing_to_send() -> None:
    """What the app awaits for a last message held back."""


def guard_of(scope: Scope) -> StreamEndGuard | None:
    """The request's guard, when :class:`StreamEndMiddleware` serves the app."""
    return scope.get(GUARD_KEY)


def end_in(error: BaseException | None) -> StreamLeaseError | None:
    """The library error that ``error`` stands for: itself; what Starlette's "response already
    started" ``RuntimeError`` was raised from; the one in an exception group (a task group's,
    such as FastAPI's around a Server-Sent Events endpoint) holding only library errors and
    cancellations. None for anything else: the app's own failures stay failures."""
    if isinstance(error, StreamLeaseError):
        return error
    if type(error) is RuntimeError:
        return end_in(error.__cause__)
    # BaseExceptionGroup, or the exceptiongroup backport on Python 3.10.
    members = getattr(error, "exceptions", None)
    if isinstance(members, tuple):
        ends = [end_in(e) for e in members if not isinstance(e, asyncio.CancelledError)]
        if ends and all(ends):
            return ends[0]
    return None


class StreamEndMiddleware:
    """ASGI middleware that ends a stream the library stopped after its start (a
    :class:`StreamLeaseError` escaping the app: a budget cut, a revoke, a lost lease, a drain)
    the way its kind allows, so the client learns why and the body ends normally:

    * ``text/event-stream``: a final ``event: error`` whose ``data`` is the problem JSON (type,
      title, status, detail, retry_after, and an ``error`` member in OpenAI's shape, which
      OpenAI's SDKs raise ``APIError`` with) and whose ``retry`` is ``retry_after`` in
      milliseconds;
    * JSON Lines (``application/jsonl``, ``application/x-ndjson``): a final line
      ``{"error": <the problem JSON>}``;
    * any other body: nothing more;
    * a WebSocket: a close with 1013 (Try Again Later) for a 503 (a lost or revoked lease, a
      drain), 1011 (Internal Error) for another 5xx, or 1008 (Policy Violation) for a 4xx, the
      client's own limits (a budget cut), the problem's title as the reason
      (:func:`ws_close_code`);
    * a response not started yet: the error's own answer (:meth:`StreamLeaseError.as_response`).

    It logs one line saying how the stream ended and why (INFO for a revoke or a drain, WARNING
    otherwise), never the identity, and lets no traceback reach the server's log. A lease held
    by :meth:`StreamLeaseManager.stream_lease` is watched for the whole request: when it is
    lost (under ``on_lost="cancel"``) or revoked, the request's work is cancelled at once, even
    while the endpoint waits for its next item, and the response ends as above.
    With ``rate_limit_headers=True`` it also writes what
    :class:`~fastapi_stream_lease.RateLimitHeaders` writes, on the same pass over the response's
    start (``legacy_rate_limit_headers`` and ``openai_rate_limit_headers`` as that one's
    ``legacy`` and ``openai``).
    :func:`~fastapi_stream_lease.install_exception_handler` adds this middleware so."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        rate_limit_headers: bool = False,
        legacy_rate_limit_headers: bool = False,
        openai_rate_limit_headers: bool = False,
    ) -> None:
        self.app = app
        self._rate_limit_headers = (
            (legacy_rate_limit_headers, openai_rate_limit_headers) if rate_limit_headers else None
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        guard = StreamEndGuard(
            asyncio.current_task(), scope, send, receive, self._rate_limit_headers
        )
        scope[GUARD_KEY] = guard
        try:
            await self.app(scope, guard.receive, guard.send)
        except BaseException as error:
            # A loss that cancelled the request; else a library error the work ended with,
            # unless the response had ended (a background task's error is the app's own).
            ended = guard.settle()
            if ended is None and not guard.closed:
                ended = end_in(error)
            if ended is None:
                # The server reports the app's own failures as it reports any other.
                await guard.finish()
                raise
            await guard.end(scope, receive, ended)
        else:
            # Most requests watched no lease and hold no message: nothing more to do.
            if guard._watches:
                guard.settle()
            if guard.held is not None:
                await guard.finish()
        finally:
            # The guard holds the scope, and the server's send, which an outer middleware's
            # closure may tie to it: out of the scope, the request's objects are freed when it
            # ends, without the cycle collector.
            scope.pop(GUARD_KEY, None)


def _final_chunk(media_type: str, error: StreamLeaseError) -> tuple[bytes, str]:
    """The last chunk a started body of ``media_type`` gets for ``error`` (empty: none), and
    how the log says it ended."""
    problem = error.body()
    if media_type == "text/event-stream":
        data = json.dumps(problem, separators=(",", ":"))
        retry = f"retry: {error.retry_after * 1000}\n" if error.retry_after is not None else ""
        return f"event: error\ndata: {data}\n{retry}\n".encode(), "with a final error event"
    if media_type in JSON_LINES:
        # The line's own `error` member is the problem (its OpenAI-shaped one would repeat it).
        del problem["error"]
        line = json.dumps({"error": problem}, separators=(",", ":"))
        return f"{line}\n".encode(), "with a final error line"
    return b"", "at its last chunk"
