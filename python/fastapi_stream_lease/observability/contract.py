"""The 0.6 API's telemetry contract: the values its adapters are told (operations, outcomes,
why a lease was lost, what kind of Redis error), and the protocols an adapter of one's own
follows. ``StreamLeaseManager(telemetry=adapter)`` tells such an adapter of this manager's
acquires, lost leases and Redis errors (:class:`AdapterTelemetry` says which calls it makes)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from enum import Enum
from typing import Any, Protocol, runtime_checkable

from ..failure_policy import CircuitState

#: Bucket bounds (seconds) for an adapter's histogram of operation durations.
DEFAULT_DURATION_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
)  # fmt: skip


class Operation(str, Enum):
    """What was done."""

    ACQUIRE = "acquire"
    COUNT = "count"
    RENEW = "renew"
    RELEASE = "release"
    VERIFY_CONFIG = "verify_config"


class Outcome(str, Enum):
    """How it ended."""

    SUCCESS = "success"
    REJECTED = "rejected"
    BACKEND_ERROR = "backend_error"
    REVOKED = "revoked"
    FALLBACK = "fallback"


class LostReason(str, Enum):
    """Why a held lease was lost."""

    REDIS_REVOKED = "redis_revoked"
    BACKEND_TIMEOUT = "backend_timeout"
    UNEXPECTED_ERROR = "unexpected_error"


class BackendErrorKind(str, Enum):
    """What kind of Redis error an operation met."""

    CONNECTION = "connection"
    TIMEOUT = "timeout"
    READONLY = "readonly"
    CLUSTERDOWN = "clusterdown"
    UNKNOWN = "unknown"


@runtime_checkable
class TelemetryAdapter(Protocol):
    """An adapter's calls. The manager makes each only if the adapter has the method, and an
    adapter that raises is logged, never the caller's failure."""

    def record_operation(
        self, operation: Operation | str, outcome: Outcome | str, duration: float
    ) -> None:
        """One operation, its outcome and its duration in seconds."""

    def record_lost(self, reason: LostReason | str) -> None:
        """A held lease was lost."""

    def record_backend_error(self, kind: BackendErrorKind | str) -> None:
        """An operation met a Redis error."""

    def record_fallback(self) -> None:
        """A lease was granted without Redis (``failure_mode="open"``)."""

    def record_hook_drop(self) -> None:
        """A lifecycle hook was dropped: its queue was full."""

    def record_hook_error(self) -> None:
        """A lifecycle hook raised."""

    def record_hook_queue_change(self, delta: int) -> None:
        """The lifecycle hooks' queue grew or shrank by ``delta``."""

    def trace_operation(self, operation: Operation | str) -> AbstractContextManager[Any]:
        """A context around one operation (a span, say)."""


@runtime_checkable
class CircuitBreakerTelemetry(Protocol):
    """An adapter told of the circuit breaker in front of Redis."""

    def record_circuit_state(self, state: CircuitState | str, scope: str = "default") -> None:
        """The breaker's state."""

    def record_short_circuit(
        self,
        operation: Operation | str = Operation.ACQUIRE,
        state: CircuitState | str = CircuitState.OPEN,
        scope: str = "default",
    ) -> None:
        """An operation the breaker kept from Redis."""


@runtime_checkable
class ActiveLeasesTelemetry(Protocol):
    """An adapter told how many leases this process holds."""

    def record_active_leases(self, count: int, scope: str = "default") -> None:
        """The leases held now."""


@runtime_checkable
class StreamLeaseTelemetry(
    TelemetryAdapter, CircuitBreakerTelemetry, ActiveLeasesTelemetry, Protocol
):
    """An adapter of every kind above."""
