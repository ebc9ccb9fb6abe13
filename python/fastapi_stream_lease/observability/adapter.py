"""A 0.6 telemetry adapter of one's own (an object with 0.6's ``record_*`` methods, see
:mod:`.contract`) driven by a manager's events, in place of this package's OpenTelemetry
instruments. Only what an adapter defines is called; nothing else costs a request."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import BackendError, BackendUnavailable, StreamLeaseRejected
from .contract import BackendErrorKind, LostReason, Operation, Outcome

if TYPE_CHECKING:
    from ..lease import Lease
    from ..rates import PolicyEntry, RateDecision
    from ..resources import Resource

log = logging.getLogger("fastapi_stream_lease")

#: The methods that make an object a 0.6 telemetry adapter (it needs one of them).
ADAPTER_METHODS = (
    "record_operation",
    "record_lost",
    "record_backend_error",
    "trace_operation",
    "record_active_leases",
)


def is_adapter(value: object) -> bool:
    """Whether ``value`` is a 0.6 telemetry adapter: it has one of its methods."""
    return any(callable(getattr(value, name, None)) for name in ADAPTER_METHODS)


def kind_of(error: BackendError) -> BackendErrorKind:
    """The kind of Redis error an operation met, read from the core's message."""
    message = str(error)
    if "READONLY" in message or "read-only" in message:
        return BackendErrorKind.READONLY
    if "CLUSTERDOWN" in message or "cannot serve the call now" in message:
        return BackendErrorKind.CLUSTERDOWN
    if "did not answer" in message:
        return BackendErrorKind.TIMEOUT
    if isinstance(error, BackendUnavailable):
        return BackendErrorKind.CONNECTION
    return BackendErrorKind.UNKNOWN


class AdapterTelemetry:
    """Tells ``adapter`` of each acquire (``trace_operation`` around it, a refusal thrown into
    it as into 0.6's block around the acquire; ``record_operation`` with ``acquire``, its
    outcome, ``success``, ``rejected`` or ``backend_error``, and its seconds; an acquire
    cancelled or given bad arguments is not an operation), of each Redis error
    (``record_backend_error``), of each lease lost or revoked (``record_lost``,
    ``redis_revoked``) and of the leases this process holds after each grant and release
    (``record_active_leases``). An adapter that raises is logged and changes nothing."""

    def __init__(self, adapter: Any, held: Callable[[], int]) -> None:
        def method(name: str) -> Callable[..., Any] | None:
            found = getattr(adapter, name, None)
            return found if callable(found) else None

        self._operation = method("record_operation")
        self._lost = method("record_lost")
        self._backend_error = method("record_backend_error")
        self._trace = method("trace_operation")
        self._active = method("record_active_leases")
        self._held = held

    def _tell(self, call: Callable[..., Any] | None, *args: Any) -> None:
        if call is None:
            return
        try:
            call(*args)
        except Exception as error:  # the adapter's failure is never the request's
            log.warning("telemetry adapter's %s raised %s", call.__name__, type(error).__name__)

    def trace_acquire(
        self, user_id: str | None, resources: Sequence[Resource], policies: Sequence[PolicyEntry]
    ) -> Any:
        """The adapter's context around an acquire, entered (None without one)."""
        if self._trace is None:
            return None
        try:
            context = self._trace(Operation.ACQUIRE)
            context.__enter__()
        except Exception as error:
            log.warning("telemetry adapter's trace_operation raised %s", type(error).__name__)
            return None
        return context

    def admitted(
        self,
        started: float,
        waits: bool,
        traced: Any,
        error: BaseException | None,
        decisions: Sequence[RateDecision] = (),
    ) -> None:
        """An acquire started at ``started`` ended, granted (``error`` None) or not."""
        duration = time.monotonic() - started
        if traced is not None:
            try:  # told of the refusal, as 0.6's block around the acquire was
                if error is None:
                    traced.__exit__(None, None, None)
                else:
                    traced.__exit__(type(error), error, error.__traceback__)
            except Exception as failure:
                log.warning("telemetry adapter's trace_operation raised %s", type(failure).__name__)
        if error is None:
            outcome = Outcome.SUCCESS
        elif isinstance(error, BackendError):
            outcome = Outcome.BACKEND_ERROR
            self._tell(self._backend_error, kind_of(error))
        elif isinstance(error, StreamLeaseRejected):
            outcome = Outcome.REJECTED
        else:
            return  # cancelled, or bad arguments: not an operation
        self._tell(self._operation, Operation.ACQUIRE, outcome, duration)
        if error is None and self._active is not None:
            self._tell(self._active, self._held())

    def granted(
        self,
        started: float,
        waits: bool,
        traced: Any,
        decisions: Sequence[RateDecision],
        budgets: bool,
    ) -> Callable[[Lease], None]:
        """An acquire granted and taken: told as every acquire is; its release is told too."""
        self.admitted(started, waits, traced, None, decisions)
        return self.ended

    def ended(self, lease: Lease) -> None:
        """A lease released (told once, as its release starts): a loss (a revoke's too) is
        told, and the leases still held."""
        if lease.lost:
            self._tell(self._lost, LostReason.REDIS_REVOKED)
        if self._active is not None:
            self._tell(self._active, self._held())

    #: Whether :meth:`rated` and :meth:`threshold_crossed` do anything (the forms' hits skip
    #: the manager's ``hit`` when nothing listens).
    hears_hits = False

    def rated(self, decisions: Sequence[RateDecision]) -> list[str]:
        """Rate decisions are not in 0.6's contract."""
        return []

    def threshold_crossed(self, alert: Any) -> None:
        """Threshold alerts are not in 0.6's contract."""
