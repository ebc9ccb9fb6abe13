"""The 0.6 API's telemetry adapters, for ``StreamLeaseManager(telemetry=...)``.
:class:`OpenTelemetryMetrics` and :class:`PrometheusMetrics` give the manager the OpenTelemetry
providers it records with (:mod:`fastapi_stream_lease.telemetry` says what it records; the
names are this package's, ``fastapi_stream_lease_*``, not 0.6's). An adapter of one's own, with
0.6's methods (:class:`TelemetryAdapter`), is told of acquires, lost leases and Redis errors
instead (:class:`~.adapter.AdapterTelemetry` says which calls it gets)."""

from .contract import (
    DEFAULT_DURATION_BUCKETS,
    ActiveLeasesTelemetry,
    BackendErrorKind,
    CircuitBreakerTelemetry,
    LostReason,
    Operation,
    Outcome,
    StreamLeaseTelemetry,
    TelemetryAdapter,
)
from .otel import OpenTelemetryMetrics
from .prometheus import PrometheusMetrics

__all__ = [
    "DEFAULT_DURATION_BUCKETS",
    "ActiveLeasesTelemetry",
    "BackendErrorKind",
    "CircuitBreakerTelemetry",
    "LostReason",
    "OpenTelemetryMetrics",
    "Operation",
    "Outcome",
    "PrometheusMetrics",
    "StreamLeaseTelemetry",
    "TelemetryAdapter",
]
