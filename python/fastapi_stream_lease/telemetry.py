"""OpenTelemetry metrics and traces, shaped after ASP.NET Core's rate-limiting instruments, in
this library's namespace. Nothing here is imported unless a manager is given a provider or the
OpenTelemetry API is installed (FastAPI brings it); without an SDK the API's no-op providers
make every call nearly free.

Privacy: attributes and span events carry pool and policy names, results and durations, never a
user id, a header or a body. With ``trace_identities=True`` a span carries the identity's keyed
hash (the one in the Redis keys), never the identity.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from .errors import (
    BackendError,
    ClientDisconnected,
    ManagerClosed,
    RateLimited,
    StreamLeaseRejected,
)

if TYPE_CHECKING:
    from ._core import Manager
    from .lease import Lease

NAME = "fastapi_stream_lease"

#: Every value the ``result`` attribute of ``fastapi_stream_lease.requests`` takes.
RESULTS = (
    "acquired",
    "per_user",
    "global",
    "resource",
    "rate",
    "budget",
    "backend_unavailable",
    "closed",
    "canceled",
    "invalid",
)


def global_providers_set() -> bool:
    """Whether the app has set OpenTelemetry's global meter or tracer provider (without it,
    the API's proxies record nothing, and a manager skips its instruments altogether)."""
    try:
        from opentelemetry import metrics, trace
    except ImportError:
        return False
    meters = type(metrics.get_meter_provider()).__name__
    return meters not in ("_ProxyMeterProvider", "NoOpMeterProvider") or not isinstance(
        trace.get_tracer_provider(), (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
    )


def result_of(error: BaseException | None) -> str:
    """The ``result`` of an acquire that ended with ``error`` (None: granted)."""
    if error is None:
        return "acquired"
    if isinstance(error, StreamLeaseRejected):
        return error.limit if error.limit in ("per_user", "global") else "resource"
    if isinstance(error, RateLimited):
        units = {d.policy.name: d.policy.unit for d in error.decisions}
        return "rate" if units.get(error.policy, "requests") == "requests" else "budget"
    if isinstance(error, ManagerClosed):
        return "closed"
    if isinstance(error, BackendError):
        return "backend_unavailable"
    if isinstance(error, ClientDisconnected) or not isinstance(error, Exception):
        return "canceled"  # the client left, or asyncio.CancelledError
    return "invalid"


class Telemetry:
    """The instruments and tracer of one manager, and the bookkeeping of its live leases (a
    lease released by any path, or garbage collected, is counted down once)."""

    def __init__(
        self,
        core: Manager,
        meter_provider: Any = None,
        tracer_provider: Any = None,
        trace_identities: bool = False,
    ) -> None:
        from opentelemetry import metrics, trace

        from . import __version__

        meter = (meter_provider or metrics.get_meter_provider()).get_meter(NAME, __version__)
        self.tracer = (tracer_provider or trace.get_tracer_provider()).get_tracer(NAME, __version__)
        self._core = core
        self._trace_identities = trace_identities
        self.active = meter.create_up_down_counter(
            f"{NAME}.leases.active", unit="{lease}", description="Leases held, per pool."
        )
        self.queued = meter.create_up_down_counter(
            f"{NAME}.requests.queued",
            unit="{request}",
            description="Acquires waiting in line for shared capacity.",
        )
        self.requests = meter.create_counter(
            f"{NAME}.requests",
            unit="{request}",
            description="Acquires, by result (acquired, per_user, global, resource, rate, "
            "budget, backend_unavailable, closed, canceled, invalid).",
        )
        self.lease_duration = meter.create_histogram(
            f"{NAME}.lease.duration", unit="s", description="How long leases were held."
        )
        self.time_in_queue = meter.create_histogram(
            f"{NAME}.request.time_in_queue",
            unit="s",
            description="How long acquires that could wait took, whatever their result.",
        )
        self.tokens = meter.create_counter(
            f"{NAME}.tokens", unit="{token}", description="Tokens charged to budgets, by direction."
        )
        for name, key, description in (
            ("leases.lost", "lost", "Leases found lost (gone from Redis, slot taken)."),
            ("leases.reclaimed", "reclaimed", "Leases found gone from Redis and taken back."),
            ("redis.failures", "renew_failures", "Renewal calls to Redis that failed."),
        ):
            meter.create_observable_counter(
                f"{NAME}.{name}", [self._observe(key)], unit="{lease}", description=description
            )
        meter.create_observable_gauge(
            f"{NAME}.breaker.open",
            [self._observe("breaker_open")],
            description="1 while the circuit breaker refuses calls to Redis.",
        )
        # Lease id -> the finalizer that counts it down if it is collected unreleased.
        self._live: dict[str, weakref.finalize[Any, Any]] = {}

    def _observe(self, key: str) -> Any:
        from opentelemetry.metrics import Observation

        def observe(_options: Any) -> list[Any]:
            return [Observation(int(self._core.stats()[key]))]

        return observe

    @contextmanager
    def admission(
        self, user_id: str | None, pools: Sequence[str], policies: Sequence[str], waits: bool
    ) -> Iterator[None]:
        """Around one acquire: a span, the queue gauge while it may wait, and exactly one
        ``requests`` result however it ends."""
        attributes: dict[str, Any] = {f"{NAME}.pools": list(pools)}
        if policies:
            attributes[f"{NAME}.policies"] = list(policies)
        if self._trace_identities and user_id is not None:
            attributes[f"{NAME}.identity_hash"] = self._core.identity_digest(user_id)
        started = time.monotonic()
        with self.tracer.start_as_current_span(
            f"{NAME}.acquire", attributes=attributes, record_exception=False
        ) as span:
            if waits:
                self.queued.add(1)
            error: BaseException | None = None
            try:
                yield
            except BaseException as raised:
                error = raised
                raise
            finally:
                if waits:
                    self.queued.add(-1)
                    self.time_in_queue.record(time.monotonic() - started)
                result = result_of(error)
                self.requests.add(1, {"result": result})
                span.set_attribute(f"{NAME}.result", result)
                span.set_attribute(f"{NAME}.wait_seconds", time.monotonic() - started)

    def held(self, lease: Lease, pools: Sequence[str]) -> None:
        """A lease granted: counted live in each of its pools until :meth:`ended` (or until it
        is garbage collected, which releases it too)."""
        pools = tuple(pools)
        for pool in pools:
            self.active.add(1, {"pool": pool})
        self._live[lease.lease_id] = weakref.finalize(
            lease, self._count_down, pools, time.monotonic()
        )

    def _count_down(self, pools: tuple[str, ...], since: float) -> None:
        for pool in pools:
            self.active.add(-1, {"pool": pool})
        self.lease_duration.record(time.monotonic() - since)

    def ended(self, lease: Lease) -> None:
        """A lease released (however: its stream ended, it was lost or revoked, the manager
        closed), once: the active count, its duration, its tokens, and an event on the current
        span (``...lease.released``, ``.lost``, ``.revoked``, ``.budget_exhausted``)."""
        finalizer = self._live.pop(lease.lease_id, None)
        detached = finalizer.detach() if finalizer is not None else None
        if detached is None:
            return
        pools, since = detached[2]
        self._count_down(pools, since)
        used = lease.tokens_used
        if used is not None:
            self.tokens.add(used[0], {"direction": "input"})
            self.tokens.add(used[1], {"direction": "output"})
        how = (
            "revoked"
            if lease.revoked
            else "lost"
            if lease.lost
            else "budget_exhausted"
            if lease.budget_exhausted
            else "released"
        )
        from opentelemetry import trace

        trace.get_current_span().add_event(f"{NAME}.lease.{how}", {f"{NAME}.pools": list(pools)})

    def end_all(self) -> None:
        """The manager closed: every lease still counted live is released."""
        for finalizer in list(self._live.values()):
            alive = finalizer.peek()
            if alive is not None:
                self.ended(alive[0])
