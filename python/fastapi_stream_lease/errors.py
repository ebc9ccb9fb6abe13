"""The exception hierarchy. Every error the library raises at run time is a
:class:`StreamLeaseError`, so one Starlette exception handler serves a whole app; every refusal
(a full pool or line, a rate or token limit, a ban, a drain, an unreachable store) is a
:class:`StreamLeaseRejected`, so the seed README's handler of that one class answers each.

Each exception knows its HTTP answer: :meth:`StreamLeaseError.as_response`. Its body is RFC 9457
problem details with an ``error`` member in OpenAI's shape, so OpenAI's SDKs raise with the
library's reason as the message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from starlette.exceptions import HTTPException
    from starlette.responses import Response

    from .rates import RateDecision

# Problem types of draft-ietf-httpapi-ratelimit-headers (RFC 9457 problem details).
_QUOTA_EXCEEDED = "https://iana.org/assignments/http-problem-types#quota-exceeded"
_REDUCED_CAPACITY = "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"

# The client's sentence of an app's own refusal raised the 0.6 way, by reason (0.6's).
_DETAILS_0_6 = {
    "user_limit": "User stream limit reached",
    "global_limit": "Global stream limit reached",
}

# The `type` of the OpenAI-shaped `error` member, by status (OpenAI's SDKs pick the exception
# class by status, and carry `type` and `code` on it).
_OPENAI_TYPES = {400: "invalid_request_error", 403: "permission_error", 429: "rate_limit_error"}


class StreamLeaseError(Exception):
    """Base class of every run-time error of fastapi_stream_lease."""

    status_code: int = 500
    title: ClassVar[str] = "Stream lease error"
    problem_type: ClassVar[str] = "about:blank"
    #: Seconds a client should wait before retrying, when retrying can help.
    retry_after: int | None = None
    #: Why, in one word: the ``code`` of the body's ``error`` member (and what a 0.6
    #: ``on_rejected`` hook is given).
    reason: str = "error"

    def headers(self) -> dict[str, str]:
        """HTTP headers for the response that reports this error."""
        if self.retry_after is None:
            return {}
        return {"Retry-After": str(self.retry_after)}

    def body(self) -> dict[str, object]:
        """The JSON body of the response: RFC 9457 problem details (``type``, ``title``,
        ``status``, ``detail``, ``retry_after`` and the error's own members) and an ``error``
        member in OpenAI's shape, ``{"message", "type", "param", "code"}``: the ``detail``, the
        kind of error by status (``invalid_request_error``, ``permission_error``,
        ``rate_limit_error``, ``server_error``), and :attr:`reason`. OpenAI's SDKs raise with
        that message, at admission and at a stream's final ``error`` event."""
        detail = self._client_detail()
        body: dict[str, object] = {
            "type": self.problem_type,
            "title": self.title,
            "status": self.status_code,
            "detail": detail,
        }
        if self.retry_after is not None:
            body["retry_after"] = self.retry_after
        body.update(self._members())
        status = self.status_code
        other = "server_error" if status >= 500 else "invalid_request_error"
        kind = _OPENAI_TYPES.get(status, other)
        body["error"] = {"message": detail, "type": kind, "param": None, "code": self.reason}
        return body

    def _client_detail(self) -> str:
        """What the client is told (the message, unless it may name the store)."""
        return str(self)

    def _members(self) -> dict[str, object]:
        """The problem's members of this kind of error beyond the standard ones."""
        return {}

    def as_response(self) -> Response:
        """A Starlette ``JSONResponse`` with the status, headers and body for this error."""
        from starlette.responses import JSONResponse

        return JSONResponse(
            self.body(),
            status_code=self.status_code,
            headers=self.headers(),
            media_type="application/problem+json",
        )

    def as_http_exception(self) -> HTTPException:
        """The 0.6 API's other form: a Starlette ``HTTPException`` with the status, the
        headers and the body's ``detail``, to ``raise`` where a handler of those answers."""
        from starlette.exceptions import HTTPException

        return HTTPException(self.status_code, self._client_detail(), self.headers())


class StreamLeaseRejected(StreamLeaseError):
    """Base class of every refusal: :class:`PoolFull` (and :class:`LineFull`),
    :class:`RateLimited`, :class:`BudgetExhausted`, :class:`ReservationTooLarge`,
    :class:`UserBanned`, :class:`ManagerClosed` (a draining worker) and :class:`BackendError`
    (the store failed or is unreachable). An ``@app.exception_handler(StreamLeaseRejected)``
    returning ``exc.as_response()`` answers each with its own status (400, 403, 429 or 503),
    ``Retry-After`` where waiting helps, and problem body; ``except RateLimited`` and the others
    still pick out one kind."""

    status_code = 503
    title: ClassVar[str] = "Stream refused"
    problem_type: ClassVar[str] = _REDUCED_CAPACITY
    retry_after: int | None = 1
    reason: str = "refused"
    #: The kind of refusal, as the 0.6 API's bodies named it.
    code: ClassVar[str] = "stream_connection_limit"

    #: The client's sentence when it is not the message (an app's refusal raised the 0.6 way).
    _detail: str | None = None

    def __init__(
        self, *args: object, reason: str | None = None, retry_after: int | None = None,
        detail: str | None = None,
    ) -> None:  # fmt: skip
        """The library raises its refusals with a message. An app may raise its own the 0.6
        way: ``StreamLeaseRejected("user_limit", retry_after=7)`` (the reason first or as
        ``reason=``, ``detail=`` the client's sentence) answers 429 as 0.6 did, with 0.6's
        sentence unless ``detail`` is given and ``Retry-After: 5`` unless ``retry_after`` is;
        ``StreamLeaseUnavailable(retry_after=12, detail="Redis down")`` answers 503."""
        if type(self) is StreamLeaseRejected and (args or reason is not None):
            self.reason = str(args[0]) if reason is None else reason
            self.status_code = 429
            detail = detail or _DETAILS_0_6.get(self.reason, "Stream limit reached")
            args = (f"Stream lease rejected: {self.reason} - {detail}",)
            retry_after = 5 if retry_after is None else retry_after
        elif type(self) is StreamLeaseUnavailable and not args:
            detail = detail or "Stream lease coordination backend is temporarily unavailable"
            args = (detail,)
        super().__init__(*args)
        self._detail = detail
        if retry_after is not None:
            self.retry_after = retry_after

    def _client_detail(self) -> str:
        return self._detail or super()._client_detail()

    @property
    def detail(self) -> str:
        """The ``detail`` of the problem body: what the client is told."""
        return self._client_detail()

    def body(self) -> dict[str, object]:
        """:meth:`StreamLeaseError.body`, with the members clients of the 0.6 API read:
        ``code`` (``"stream_connection_limit"``, or ``"stream_lease_backend_unavailable"`` for
        :class:`StreamLeaseUnavailable`) and ``reason``."""
        body = super().body()
        body["code"] = self.code
        body["reason"] = self.reason
        return body


class PoolFull(StreamLeaseRejected):
    """A pool is full. ``limit`` names it: ``"per_user"`` answers 429 (the client's own quota),
    ``"global"`` or a resource answers 503 (shared capacity is saturated). Both carry
    ``Retry-After``. ``capacity`` and ``current`` are the pool's; both are None for a shared pool
    under ``LeaseConfig(disclose_usage=False)``, and the answer then tells no usage (no
    RateLimit headers, no figures in the body)."""

    def __init__(
        self,
        message: str,
        limit: str,
        capacity: int | None,
        current: int | None,
        retry_after: int,
    ) -> None:
        super().__init__(message)
        self.limit = limit
        self.capacity = capacity
        self.current = current
        self.retry_after = retry_after

    @property
    def status_code(self) -> int:  # type: ignore[override]
        return 429 if self.limit == "per_user" else 503

    @property
    def title(self) -> str:  # type: ignore[override]
        return "Too many concurrent streams" if self.limit == "per_user" else "Server busy"

    @property
    def problem_type(self) -> str:  # type: ignore[override]
        return _QUOTA_EXCEEDED if self.limit == "per_user" else _REDUCED_CAPACITY

    @property
    def reason(self) -> str:  # type: ignore[override]
        """``"user_limit"`` or ``"global_limit"`` (0.6's words), else ``"resource_limit"``."""
        return {"per_user": "user_limit", "global": "global_limit"}.get(
            self.limit, "resource_limit"
        )

    def headers(self) -> dict[str, str]:
        if self.capacity is None or self.current is None:
            return super().headers()
        remaining = max(self.capacity - self.current, 0)
        return {
            "Retry-After": str(self.retry_after),
            "RateLimit-Policy": f'"{self.limit}";q={self.capacity};qu="concurrent-requests"',
            "RateLimit": f'"{self.limit}";r={remaining};t={self.retry_after}',
        }

    def _members(self) -> dict[str, object]:
        members: dict[str, object] = {"limit": self.limit}
        if self.capacity is not None and self.current is not None:
            members.update(capacity=self.capacity, current=self.current)
        return members

    def __reduce__(self) -> tuple[object, ...]:
        return (
            type(self),
            (str(self), self.limit, self.capacity, self.current, self.retry_after),
        )


class LineFull(PoolFull):
    """The line of the pool named ``limit`` holds ``LeaseConfig.max_waiting`` waiters already:
    refused at once (503 for a shared pool, 429 for the user's own under
    ``wait_for_own_quota``), with ``Retry-After`` from the line's recent service rate.
    ``waiting`` and ``max_waiting`` are the line's figures; ``capacity`` and ``current`` are
    None. ``displaced`` is True for a waiter that had a place there and lost it to another
    user's first waiter, its own user having the most places in that line."""

    title: ClassVar[str] = "Waiting line full"
    reason = "line_full"

    def __init__(
        self,
        message: str,
        limit: str,
        max_waiting: int,
        waiting: int,
        retry_after: int,
        displaced: bool = False,
    ) -> None:
        super().__init__(message, limit, None, None, retry_after)
        self.max_waiting = max_waiting
        self.waiting = waiting
        self.displaced = displaced

    def __reduce__(self) -> tuple[object, ...]:
        return (
            type(self),
            (
                str(self), self.limit, self.max_waiting, self.waiting, self.retry_after,
                self.displaced,
            ),
        )  # fmt: skip


class RateLimited(StreamLeaseRejected):
    """A request-rate policy refused the hit (429); nothing was consumed from any policy.
    ``policy`` names the first that refused; ``decisions`` are every policy's, for the
    ``RateLimit-Policy`` and ``RateLimit`` headers; ``retry_after`` is when the hit's cost fits
    again (never earlier than the window allows)."""

    status_code = 429
    title: ClassVar[str] = "Too many requests"
    problem_type: ClassVar[str] = _QUOTA_EXCEEDED
    reason = "rate_limit"

    def __init__(
        self,
        message: str,
        policy: str,
        decisions: Sequence[RateDecision],
        retry_after: int,
    ) -> None:
        super().__init__(message)
        self.policy = policy
        self.decisions = tuple(decisions)
        self.retry_after = retry_after

    def headers(self) -> dict[str, str]:
        from .rates import rate_limit_headers

        return {**super().headers(), **rate_limit_headers(self.decisions)}

    def _members(self) -> dict[str, object]:
        return {"violated-policies": [self.policy]}

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (str(self), self.policy, self.decisions, self.retry_after))


class BudgetExhausted(StreamLeaseRejected):
    """A stream ran past its token reservation and its ``budget`` (a policy's name) had no
    tokens left to top it up (``on_budget="cut"``): the stream ended after its last item. It has
    already started, so the status (429) only reaches a client that reads the error in the
    stream or in logs."""

    status_code = 429
    title: ClassVar[str] = "Token budget exhausted"
    problem_type: ClassVar[str] = _QUOTA_EXCEEDED
    retry_after = 1
    reason = "budget_exhausted"

    def __init__(self, message: str, budget: str) -> None:
        super().__init__(message)
        self.budget = budget

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (str(self), self.budget))


class ReservationTooLarge(StreamLeaseRejected):
    """A stream's reservation (the prompt's tokens and ``max_tokens``, or their price) is more
    than the whole limit of its ``budget`` (a policy's name): no window could ever hold it, so
    the answer is 400 without ``Retry-After``, as OpenAI answers a ``max_tokens`` above what a
    model allows; the client must ask for fewer tokens. ``reservation`` and ``limit`` are in the
    budget's unit. A budget with too little left now refuses with :class:`RateLimited` (429 and
    ``Retry-After``) instead."""

    status_code = 400
    title: ClassVar[str] = "Reservation larger than the budget"
    problem_type: ClassVar[str] = "about:blank"
    reason = "reservation_too_large"
    retry_after = None  # waiting never helps

    def __init__(self, message: str, budget: str, reservation: int, limit: int) -> None:
        super().__init__(message)
        self.budget = budget
        self.reservation = reservation
        self.limit = limit

    def _members(self) -> dict[str, object]:
        return {"violated-policies": [self.budget]}

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (str(self), self.budget, self.reservation, self.limit))


class StreamLeaseUnavailable(StreamLeaseRejected):
    """Admission control cannot decide now (503, ``Retry-After``): the store failed or is
    unreachable (:class:`BackendError`), or this worker is shutting down
    (:class:`ManagerClosed`). The 0.6 API's name for both."""

    status_code = 503
    problem_type: ClassVar[str] = _REDUCED_CAPACITY
    retry_after = 1
    code: ClassVar[str] = "stream_lease_backend_unavailable"


class BackendError(StreamLeaseUnavailable):
    """The store (Redis) answered with an error: wrong password, a key of another type, a
    read-only replica. The message says what to fix; it names the store's address, so it goes
    to the app's log (:func:`stream_lease_exception_handler` logs it), never to the client,
    whose problem body says only that admission control is unavailable."""

    status_code = 503
    title: ClassVar[str] = "Admission control unavailable"
    problem_type: ClassVar[str] = _REDUCED_CAPACITY
    retry_after = 1
    reason = "backend_unavailable"

    def _client_detail(self) -> str:
        return "Streams cannot be admitted right now; retry after Retry-After seconds."


class BackendUnavailable(BackendError):
    """The store could not be reached, or did not answer within ``redis_timeout``."""


class LeaseLost(StreamLeaseError):
    """A held lease was found gone from the store (it expired during an outage, or was evicted)."""

    status_code = 503
    title: ClassVar[str] = "Stream lease lost"
    problem_type: ClassVar[str] = _REDUCED_CAPACITY
    retry_after = 1
    reason = "lease_lost"


class LeaseRevoked(LeaseLost):
    """The lease was ended on purpose: its worker is draining for a deploy
    (:meth:`StreamLeaseManager.drain`), or an operator revoked its user's streams. The stream ends
    the way a lost lease's does, at its edge."""

    title: ClassVar[str] = "Stream lease revoked"
    reason = "lease_revoked"


class UserBanned(StreamLeaseRejected):
    """An operator ended this user's streams and refuses new ones for a while
    (:meth:`StreamLeaseManager.revoke` with ``ban_seconds``): 403, with ``Retry-After`` saying
    when the ban ends."""

    status_code = 403
    title: ClassVar[str] = "Streams suspended"
    problem_type: ClassVar[str] = "about:blank"
    reason = "banned"

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (str(self), self.retry_after))


class ClientDisconnected(StreamLeaseError):
    """The client went away while its request waited in line; it left the line. Nobody is
    left to read an answer, so the status (499, nginx's "client closed request") is moot."""

    status_code = 499
    title: ClassVar[str] = "Client closed request"
    retry_after = 1
    reason = "client_closed_request"


class ManagerClosed(StreamLeaseUnavailable):
    """The manager was closed with ``aclose()`` (the app is shutting down)."""

    status_code = 503
    title: ClassVar[str] = "Shutting down"
    problem_type: ClassVar[str] = _REDUCED_CAPACITY
    retry_after = 1
    reason = "closing"


class ConfigurationMismatchError(StreamLeaseError):
    """The 0.6 API's error for workers whose configurations disagree, kept for ``except``
    clauses: here it is never raised, since every call carries its own caps and timings to
    Redis and no configuration is registered there (see
    :meth:`StreamLeaseManager.verify_cluster_config`)."""

    def __init__(
        self, message: str, existing_config: dict[str, object], current_config: dict[str, object]
    ) -> None:
        super().__init__(message)
        self.existing_config = existing_config
        self.current_config = current_config


#: The 0.6 API's name of :class:`LeaseLost`.
StreamLeaseLost = LeaseLost


class StreamLeaseWarning(UserWarning):
    """A setting that works but weakens a guarantee. Emitted by ``StreamLeaseManager`` on Redis
    without ``identity_secret`` (nor ``STREAM_LEASE_IDENTITY_SECRET``): user ids are then hashed
    with an empty HMAC key, so anyone who can read the keys can test guessed ids against them."""
