"""The 0.6 API's telemetry adapters, for ``StreamLeaseManager(telemetry=...)``: each gives the
manager the OpenTelemetry providers it records with (:mod:`fastapi_stream_lease.telemetry` says
what it records; the names are this package's, ``fastapi_stream_lease_*``, not 0.6's)."""

from .otel import OpenTelemetryMetrics
from .prometheus import PrometheusMetrics

__all__ = ["OpenTelemetryMetrics", "PrometheusMetrics"]
