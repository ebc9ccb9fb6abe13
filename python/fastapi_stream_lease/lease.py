"""``Lease``: a slot held in every pool of one acquire, and the work tied to it.

A lease ties a stream (``wrap()``) or a block (``StreamLeaseManager.lease()``) to its slot: the
slot is released however the work ends, and under ``on_lost="cancel"`` a lost lease ends the
work the way ``asyncio.timeout`` ends work when time is up. The core resolves the handle's
``wait_lost()`` when the renewal loop finds the lease gone (or its deadline passes without a
renewal); if the task is inside a guarded section at that moment, it is cancelled, and the
cancellation becomes :class:`LeaseLost` at the section's edge. Outside a section, the next
section refuses to start.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Mapping,
)
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from starlette.concurrency import iterate_in_threadpool
from starlette.responses import StreamingResponse

from . import _core
from ._core import LeaseHandle
from .errors import LeaseLost, LeaseRevoked, StreamLeaseError
from .stream_source import close_sources

if TYPE_CHECKING:
    from .rates import RateDecision

T = TypeVar("T")
log = logging.getLogger("fastapi_stream_lease")


def release_failed(error: StreamLeaseError) -> None:
    """Logs a release that failed: the keep-alive releases it again, or it expires by itself."""
    log.warning("stream lease release failed, it will expire by itself: %s", error)


class LeaseEvents(Protocol):
    """Who hears how a lease ended (the manager's 0.6 hooks, ``lifecycle.Lifecycle``)."""

    def lost(self, lease: Lease, reason: str) -> None: ...

    def released(self, lease: Lease, reason: str) -> None: ...


#: A model's reported usage more than this factor above what the stream expected (its count,
#: or its estimate at admission; for short streams, more than ``USAGE_SLACK`` tokens above) is
#: taken as a bug upstream: it is logged and brought back within the bound, so one bad figure
#: cannot wreck a user's budget. With nothing to compare with (no estimate, nothing counted),
#: the bound is ``USAGE_CEILING``, more than any model's context. A reported answer below the
#: tokens counted as streamed is logged and charged as counted: what streamed is never given
#: back.
USAGE_FACTOR = 4
USAGE_SLACK = 4096
USAGE_CEILING = 2_000_000

LOST_MESSAGE = (
    "the stream's lease was lost: Redis no longer held it (an outage longer than lease_seconds, "
    "a restart or an eviction) and its slot was taken meanwhile"
)
RELEASED_MESSAGE = "the lease was released already: acquire a new one for this work"
REVOKED_MESSAGE = "the stream's lease was revoked: its worker is draining, or an operator ended it"


@functools.cache
def _clock_offset() -> float:
    """What to add to the core's clock to read ``time.monotonic()``: measured once, so a
    deadline the core gives reads the same every time."""
    return time.monotonic() - _core.monotonic()


class Lease:
    """A slot held in every pool of one acquire, renewed by the manager until released.

    A lease dropped without a release (garbage collected) frees its slot.
    """

    __slots__ = (
        "__weakref__", "_block", "_cancel_on_lost", "_handle", "_lease_headers", "_lease_seconds",
        "_lifecycle", "_loss_logged", "_on_release", "_releasing", "user_id",
    )  # fmt: skip

    def __init__(
        self,
        handle: LeaseHandle,
        *,
        user_id: str | None,
        lease_seconds: float,
        cancel_on_lost: bool,
        on_release: Callable[[Lease], None] | None = None,
        lifecycle: LeaseEvents | None = None,
        lease_headers: bool = False,
    ) -> None:
        self._handle = handle
        #: The user the lease was acquired for (None: resources only).
        self.user_id = user_id
        self._lease_seconds = lease_seconds
        # The block of ``async with lease:``, while one runs.
        self._block: AbstractAsyncContextManager[Lease] | None = None
        self._cancel_on_lost = cancel_on_lost
        # Told once the release starts (the manager's telemetry counts the lease down).
        self._on_release = on_release
        # The manager's 0.6 hooks, and whether as_streaming_response() sends X-Stream-Lease-*.
        self._lifecycle = lifecycle
        self._lease_headers = lease_headers
        # Its loss is logged once, by whichever watch learns of it first.
        self._loss_logged = False
        # The release (with its settlement) its response's end started, awaited where the
        # lease's block ends.
        self._releasing: Awaitable[bool] | None = None

    @property
    def lease_id(self) -> str:
        """Random id of this lease (the member stored in each pool)."""
        return self._handle.lease_id

    @property
    def weight(self) -> int:
        """Slots this lease takes in each pool."""
        return self._handle.weight

    @property
    def fencing_token(self) -> int:
        """A number larger than every token given before to a lease that shares a pool with this
        one, in every worker: send it with each write to a downstream, which remembers the
        largest it saw and refuses a smaller one (a holder whose lease was lost, and then given
        to another). Given when the manager's ``LeaseConfig(fencing_tokens=True)`` asks for them;
        otherwise raises RuntimeError. See the guide, "Fencing tokens", for what a failover does
        to it."""
        return self._handle.fencing_token

    @property
    def expires_at(self) -> float:
        """When the store drops this lease unless the manager renews it, on ``time.monotonic()``'s
        clock (0.6's name): every lease of this process in a hash tag shares its holder's
        deadline, pushed on at each renewal and grant. ``inf`` on the embedded store, which
        drops nothing while the process lives; ``time.monotonic()`` (no time left) once the
        lease is released or lost."""
        deadline = self._handle.deadline
        return time.monotonic() if deadline is None else deadline + _clock_offset()

    @property
    def lost(self) -> bool:
        """True once renewal found the lease gone from the store (expired during an outage,
        evicted)."""
        return self._handle.lost

    @property
    def revoked(self) -> bool:
        """True once the lease was revoked: its worker is draining
        (:meth:`~StreamLeaseManager.drain`) or an operator ended its user's streams. A revoked
        lease is also :attr:`lost`."""
        return self._handle.revoked

    @property
    def released(self) -> bool:
        """True once :meth:`release` ran (or the manager was closed)."""
        return self._handle.released

    @property
    def rate_decisions(self) -> list[RateDecision]:
        """What each of the acquire's ``rate_limits`` said, the start counted (empty without
        them): for the ``RateLimit`` headers of the response (:func:`rate_limit_headers`)."""
        return self._handle.rate_decisions

    @property
    def pool_usage(self) -> list[tuple[str, int, int]]:
        """The capped pools of this lease the client may be told about (its own quota always,
        shared pools unless ``disclose_usage=False``): ``(name, capacity, slots in use)`` right
        after the grant, for the ``concurrent-requests`` entries of the ``RateLimit`` headers."""
        return self._handle.pool_usage

    @property
    def tokens_used(self) -> tuple[int, int] | None:
        """Tokens this stream used so far, ``(prompt, answer)``: the prompt's as reserved and
        the answer's as counted, or the model's figures once :meth:`report_usage` gave them (the
        answer never below its count); None without ``budgets``."""
        return self._handle.tokens_used

    @property
    def budget_exhausted(self) -> bool:
        """True once the stream ran past its reservation with no budget left to top it up
        (``on_budget="cut"``): its next :meth:`consume` raises :class:`BudgetExhausted`."""
        return self._handle.budget_exhausted

    def consume(self, tokens: int) -> None:
        """Counts ``tokens`` of the answer as streamed: synchronous, no I/O, cheap enough to
        call per chunk. The manager tops the reservation up ahead of need, all streams of the
        process together. Under ``on_budget="cut"`` it raises :class:`BudgetExhausted` once the
        budget ran out (the stream should end there: :meth:`wrap` does)."""
        self._handle.consume(tokens)

    async def wait_budget(self) -> None:
        """Returns at once, unless the stream ran past its reservation while its top-up is
        under way: then when the top-up answers. Raises :class:`BudgetExhausted` if the budget
        ran out (``on_budget="cut"``). Await it before each chunk when counting with
        :meth:`consume` (:meth:`wrap` does): that is what bounds a stream's overshoot."""
        if self._handle.budget_exhausted:
            self._handle.consume(0)  # raises BudgetExhausted, as the next consume() would
        if self._handle.budget_waiting:
            await self._handle.budget_ready()

    def report_usage(
        self, *, input_tokens: int, output_tokens: int, cached_input_tokens: int = 0
    ) -> None:
        """The model's own figures for the whole stream (an OpenAI-style final chunk's
        ``usage``, with ``stream_options.include_usage``): the settlement charges them in place
        of the estimate and the count, except that the answer is never charged less than the
        tokens counted as streamed (:meth:`consume`, :meth:`wrap`): a lower report is logged
        as a warning and the count is charged. Figures far above what was expected (see
        ``USAGE_FACTOR``) are logged and bounded. ``cached_input_tokens`` are the part of
        ``input_tokens`` read from the provider's cache (OpenAI's
        ``prompt_tokens_details.cached_tokens``): a budget in money charges them at the
        model's cached price; more than ``input_tokens`` raises ``ValueError``."""
        references = self._handle.tokens_references
        if references is not None:
            (input_estimate, output_estimate), counted = references
            bounded = _bounded("input_tokens", input_tokens, 0, input_estimate)
            if type(cached_input_tokens) is int and cached_input_tokens <= input_tokens:
                cached_input_tokens = min(cached_input_tokens, bounded)  # a part of the bounded
            input_tokens = bounded
            output_tokens = _bounded("output_tokens", output_tokens, counted, output_estimate)
        self._handle.report_usage(input_tokens, output_tokens, cached_input_tokens)

    async def renew(self) -> bool:
        """The 0.6 API's renewal: the manager renews every lease it holds by itself (one call
        per period for all of them), so this only says whether the lease is still held
        (neither lost nor released)."""
        return not (self._handle.lost or self._handle.released)

    def release(self) -> Awaitable[bool]:
        """Releases the lease now and returns an awaitable that resolves when the store confirms
        (True if it was still there). Safe to call twice: a lease released already (a second
        call, a revoke, its stream's end) resolves to False once that release's call ended.
        Cancelling the await does not stop it.
        """
        return self._release("manual")

    def release_nowait(self) -> bool:
        """Starts the release without waiting for it; True if this call released the lease."""
        released = self._handle.release_nowait()
        self._told_released("manual")
        return released

    def _release(self, reason: str) -> Awaitable[bool]:
        released = self._handle.release()
        self._told_released(reason)
        return released

    def _told_released(self, reason: str) -> None:
        """``reason`` (for the 0.6 ``on_released`` hook): ``"completed"``, ``"cancelled"``,
        ``"error"``, ``"lost"`` or ``"manual"``."""
        on_release, self._on_release = self._on_release, None  # once
        if on_release is not None:
            on_release(self)
        lifecycle, self._lifecycle = self._lifecycle, None
        if lifecycle is not None:
            # Told here, once, whichever way the loss was noticed (its stream has ended).
            if self._handle.lost:
                lifecycle.lost(self, "revoked" if self._handle.revoked else "lost")
            lifecycle.released(self, reason)

    async def wrap(
        self,
        stream: AsyncIterable[T] | Iterable[T],
        *,
        tokens: Callable[[T], int] | None = None,
        close_source: bool = True,
        auto_renew: bool = True,
        renew_interval: float | None = None,
    ) -> AsyncIterator[T]:
        """Yields ``stream``'s items (an async or sync iterable); releases this lease when the
        stream ends, raises, is cancelled or is closed (client disconnect), without waiting for
        the store's answer (a failed release is logged when it comes) unless the lease has
        budgets, which its release settles. Under
        ``on_lost="cancel"`` a lost lease ends the stream with :class:`LeaseLost`, even while it
        waits for its next item.

        ``tokens(item)`` counts each item's answer tokens against the lease's budgets
        (:meth:`consume`). A stream that ran past its reservation waits for its top-up before
        the next item; one whose budget ran out (``on_budget="cut"``) ends with
        :class:`BudgetExhausted` there, after the item that used it up.

        The stream is closed at the end too, unless ``close_source=False`` (the caller owns
        it): an async one and the iterator it handed out by their ``aclose()`` or ``close()``
        (awaited when it returns an awaitable), within 2 seconds together, a failure or a
        hang logged, not raised; a sync one by its ``close()`` in a worker thread, as its
        iteration ran.

        Starlette's ``StreamingResponse`` cancels or closes this generator when the client goes
        away, so its ``finally`` is the one place release must happen.

        ``auto_renew`` and ``renew_interval`` are the 0.6 API's: the manager renews every lease
        it holds (``LeaseConfig.renew_every``), so they change nothing, but a ``renew_interval``
        that is not above 0 and below ``lease_seconds`` ends the stream with ``ValueError``
        before its first item, its lease released, as in 0.6.
        """
        iterator = None if isinstance(stream, AsyncIterable) else iter(stream)
        source: AsyncIterable[T] = (
            cast("AsyncIterable[T]", stream)
            if iterator is None
            else iterate_in_threadpool(iterator)
        )
        items = aiter(source)
        try:
            async with self._released_at_end(awaited=False):
                # A lost or revoked lease is released too: its watch says which, below.
                if self._handle.released and not self._handle.lost:
                    raise LeaseLost(RELEASED_MESSAGE)
                if renew_interval is not None:
                    check_renew_interval(renew_interval, self._lease_seconds)
                watch = LostWatch(self)
                try:
                    while True:
                        with watch:
                            if tokens is not None:
                                await self.wait_budget()
                            try:
                                item = await anext(items)
                            except StopAsyncIteration:
                                return
                        if tokens is not None:
                            self.consume(tokens(item))
                        yield item
                finally:
                    watch.close()
        finally:
            if iterator is None:
                if close_source:
                    await close_sources(items, stream)
            else:
                # The thread pool's generator, ours.
                await cast("AsyncGenerator[T, None]", source).aclose()
                # A sync iterator's own close() (a generator's runs its finally), off the loop
                # thread as its iteration was; the thread pool has finished its last step now.
                close_sync = getattr(iterator, "close", None)
                if close_sync is not None and (close_source or iterator is not stream):
                    await asyncio.to_thread(close_sync)

    async def __aenter__(self) -> Lease:
        """``async with lease:`` holds the lease for the block and releases it however the
        block ends, as :meth:`StreamLeaseManager.lease` does (the 0.6 API's form). A lease
        holds one block at a time (``RuntimeError``), and a released one none
        (:class:`LeaseLost`)."""
        if self._block is not None:
            raise RuntimeError("a lease cannot enter a second async with block while in one")
        if self._handle.released and not self._handle.lost:
            raise LeaseLost(RELEASED_MESSAGE)
        self._block = self._held()
        return await self._block.__aenter__()

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: Any
    ) -> bool | None:
        block, self._block = self._block, None
        if block is None:
            raise RuntimeError("__aexit__ of a lease outside its async with block")
        return await block.__aexit__(kind, error, traceback)

    @asynccontextmanager
    async def _held(self) -> AsyncIterator[Lease]:
        """Holds the lease for an ``async with`` block (``StreamLeaseManager.lease()``)."""
        async with self._released_at_end():
            watch = LostWatch(self)
            try:
                with watch:
                    yield self
            finally:
                watch.close()

    @asynccontextmanager
    async def _released_at_end(self, *, awaited: bool = True) -> AsyncIterator[None]:
        """Releases the lease when the block ends, telling the 0.6 ``on_released`` hook how:
        ``"completed"`` (it ran to its end), ``"lost"`` (:class:`LeaseLost` or
        :class:`LeaseRevoked`, or any other end of a lease found lost: a loss that ends work
        does so by cancelling the task), ``"error"`` (an exception) or ``"cancelled"`` (a
        cancellation, a generator closed early). The block ends when the store confirmed the
        release, unless not ``awaited`` (a stream's end): then the release is sent and the
        block ends at once, but for a lease with budgets, whose release settles them: the
        budget holds exactly what the stream used once it ended."""
        ended = "cancelled"
        try:
            yield
            ended = "completed"
        except LeaseLost:
            ended = "lost"
            raise
        except Exception:
            ended = "error"
            raise
        finally:
            if ended != "completed" and self._handle.lost:
                ended = "lost"
            if awaited or self._settled_by_release:
                await self._release_quietly(ended)
            else:
                self._end_stream(ended)

    def as_streaming_response(
        self,
        stream: AsyncIterable[Any] | Iterable[Any],
        media_type: str | None = "text/event-stream",
        status_code: int = 200,
        headers: Mapping[str, str] | None = None,
        auto_renew: bool = True,
        renew_interval: float | None = None,
        close_source: bool = True,
        include_lease_headers: bool | None = None,
        **response_options: Any,
    ) -> ProtectedStreamingResponse:
        """The 0.6 API's response: a ``StreamingResponse`` of :meth:`wrap` over ``stream``
        (released when it ends or the client leaves; ``close_source=False`` leaves the stream
        open), as Server-Sent Events unless ``media_type`` says otherwise.
        ``include_lease_headers`` (default: ``LeaseConfig.include_lease_headers``) adds
        ``X-Stream-Lease-Id`` and, for the capped pools the client may be told about,
        ``X-Stream-Lease-User-Limit`` and ``X-Stream-Lease-Global-Limit``; headers given in
        ``headers`` win. ``auto_renew`` and ``renew_interval`` are accepted and not used: the
        manager renews every lease it holds (``LeaseConfig.renew_every``)."""
        if include_lease_headers is not None and not isinstance(include_lease_headers, bool):
            raise TypeError(
                f"include_lease_headers must be a boolean or None, got {include_lease_headers!r}"
            )
        sent = dict(headers or {})
        if self._lease_headers if include_lease_headers is None else include_lease_headers:
            given = {name.lower() for name in sent}
            for name, value in self._lease_header_values():
                if name.lower() not in given:
                    sent[name] = value
        response = ProtectedStreamingResponse(
            self.wrap(stream, close_source=close_source),
            status_code=status_code,
            headers=sent,
            media_type=media_type,
            **response_options,
        )
        response.lease = self
        return response

    def _lease_header_values(self) -> list[tuple[str, str]]:
        caps = {pool: capacity for pool, capacity, _ in self.pool_usage}
        values = [("X-Stream-Lease-Id", self.lease_id)]
        for pool, name in (("per_user", "User"), ("global", "Global")):
            if pool in caps:
                values.append((f"X-Stream-Lease-{name}-Limit", str(caps[pool])))
        return values

    def _end_with_response(self, how: str) -> None:
        """Releases the lease when the response that holds it ends (``how``: ``"completed"``,
        or ``"cancelled"`` when the client left), before the last message goes: a client that
        reads the end and comes straight back finds its slot free. A lease with budgets starts
        the release that settles them, and the block that holds it awaits it when it ends."""
        if self._handle.released:
            return
        if self._settled_by_release:
            self._releasing = self._release(how)
        else:
            self._end_stream(how)

    @property
    def _settled_by_release(self) -> bool:
        """Whether the release settles budgets: then whoever ends the stream waits for it."""
        return self._handle.tokens_used is not None

    def _end_stream(self, how: str) -> None:
        """Releases the lease where the stream that holds it ends (``how``, for the 0.6 hook),
        without waiting for the store's answer: the stream's task has nothing left to do with
        it, and a failure is logged when it comes (:func:`release_failed`)."""
        if not self._handle.released:
            self._handle.release_at_end()
        self._told_released(how)

    async def _release_quietly(self, reason: str) -> None:
        # The release starts before the first await, so a cancellation cannot undo it; a failed
        # one only logs: the lease expires by itself, and the work's own outcome matters more.
        released, self._releasing = self._releasing or self._release(reason), None
        try:
            await released
        except StreamLeaseError as error:
            release_failed(error)

    def __repr__(self) -> str:
        states = [name for name in ("lost", "released") if getattr(self, name)]
        return f"<Lease {self.lease_id} weight={self.weight} {', '.join(states) or 'held'}>"


def check_renew_interval(renew_interval: float, lease_seconds: float) -> None:
    """Refuses a 0.6 ``renew_interval`` outside (0, ``lease_seconds``), as 0.6 did."""
    if isinstance(renew_interval, bool) or not isinstance(renew_interval, (int, float)):
        raise TypeError(
            "renew_interval must be a number of seconds (int or float), got "
            f"{type(renew_interval).__name__} {renew_interval!r}"
        )
    if not 0 < renew_interval < lease_seconds:
        raise ValueError(
            f"renew_interval must be positive and shorter than lease_seconds={lease_seconds}, "
            f"got {renew_interval!r}; it can be left out: the manager renews every lease every "
            "LeaseConfig.renew_every seconds"
        )


def _bounded(name: str, reported: int, counted: int, estimate: int) -> int:
    """``reported`` (a model's usage figure), no lower than ``counted`` (tokens counted as
    streamed) and no higher than the count or the estimate allows (see ``USAGE_FACTOR``)."""
    if isinstance(reported, bool) or not isinstance(reported, int):
        raise TypeError(f"{name} must be an int, got {type(reported).__name__}")
    if reported < 0:
        raise ValueError(f"{name}={reported} is negative: pass the model's reported token count")
    if reported < counted:
        log.warning(
            "reported %s=%d is below the %d tokens counted as streamed; charging %d: tokens "
            "that streamed are never given back (check what the stream's tokens= counts)",
            name,
            reported,
            counted,
            counted,
            extra={"usage_reported": reported, "usage_counted": counted},
        )
        return counted
    expected = max(counted, estimate)
    high = max(expected * USAGE_FACTOR, expected + USAGE_SLACK) if expected else USAGE_CEILING
    if reported <= high:
        return reported
    log.warning(
        "reported %s=%d is far from the stream's own count (%d); charging %d instead",
        name,
        reported,
        counted,
        high,
    )
    return high


class LostWatch:
    """Watches one lease for the task that uses it: a lost lease ends the work under
    ``on_lost="cancel"``, a revoked one (a drain, an operator) always.

    ``with watch:`` runs its body under the watch, raising :class:`LeaseLost`
    (:class:`LeaseRevoked`) if the lease is lost (revoked). A class of its own rather than a
    ``@contextmanager``: ``wrap()`` enters it once per item, and a generator-based context
    manager cost more than the rest of the item's way through ``wrap()``.
    """

    __slots__ = ("_cancelled_by_us", "_loop", "_task", "_waiter", "lease")

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self._task: asyncio.Task[object] | None = None
        self._cancelled_by_us = False
        self._waiter: asyncio.Future[None] = lease._handle.wait_lost()
        self._loop = self._waiter.get_loop()
        self._waiter.add_done_callback(self._on_lost)

    def _ends_work(self) -> bool:
        return self.lease._cancel_on_lost or self.lease.revoked

    def _on_lost(self, waiter: asyncio.Future[None]) -> None:
        if waiter.cancelled():
            return
        self._log_loss()
        if self._task is not None and self._ends_work():
            self._cancelled_by_us = True
            self._task.cancel(str(self._ended()))

    def __enter__(self) -> None:
        # With the loop given, current_task() does not look the running loop up.
        self.cover(asyncio.current_task(self._loop))

    def __exit__(self, kind: type[BaseException] | None, error: object, traceback: object) -> None:
        ended = self.settle()
        if ended is not None and kind is not None and issubclass(kind, asyncio.CancelledError):
            raise ended from None

    def cover(self, task: asyncio.Task[Any] | None) -> None:
        """Starts watching for ``task``: a loss that ends work cancels it until :meth:`settle`.
        Raises at once if the lease is already lost that way."""
        if self.lease.lost and self._ends_work():
            self._log_loss()
            raise self._ended()
        self._task = task

    def _log_loss(self) -> None:
        """Logs the lease's loss, once for the lease however many watches it has (a
        ``manager.lease()`` block around ``lease.wrap()``, a dependency's lease streamed with
        ``wrap()``)."""
        lease = self.lease
        if lease._loss_logged:
            return
        lease._loss_logged = True
        how = "revoked" if lease.revoked else "lost"
        log.log(
            logging.INFO if lease.revoked else logging.WARNING,
            "stream lease %s %s; its stream %s",
            lease.lease_id,
            how,
            "ends" if self._ends_work() else "goes on (on_lost='continue')",
            extra={"lease_id": lease.lease_id, "lease_end": how},
        )

    @property
    def fired(self) -> bool:
        """True once the watch cancelled its task, until :meth:`settle`."""
        return self._cancelled_by_us

    def settle(self) -> LeaseLost | None:
        """Stops watching for the task; if the watch cancelled it, takes that cancellation back
        and returns the error the work ended with (:class:`LeaseLost` or
        :class:`LeaseRevoked`), else None."""
        task, self._task = self._task, None
        if not self._cancelled_by_us:
            return None
        self._cancelled_by_us = False
        uncancel = getattr(task, "uncancel", None)  # Python 3.11+
        if uncancel is not None:
            uncancel()
        return self._ended()

    def _ended(self) -> LeaseLost:
        if not self.lease.revoked:
            return LeaseLost(LOST_MESSAGE)
        ban = self.lease._handle.revoked_ban_seconds
        if not ban:
            return LeaseRevoked(REVOKED_MESSAGE)
        # The wait its user's new streams are refused for (UserBanned's), told the same.
        ended = LeaseRevoked(f"{REVOKED_MESSAGE}; new streams are refused for {ban} s")
        ended.retry_after = ban
        return ended

    def close(self) -> None:
        self._waiter.cancel()


class ProtectedStreamingResponse(StreamingResponse):
    """What :meth:`Lease.as_streaming_response` and ``StreamLeaseManager.stream()`` return: a
    ``StreamingResponse`` over :meth:`Lease.wrap`, whose ``lease`` is the lease it holds."""

    lease: Lease | None = None


#: The 0.6 API's name of :class:`Lease`.
StreamLease = Lease
