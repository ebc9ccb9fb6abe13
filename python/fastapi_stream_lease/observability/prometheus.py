"""``PrometheusMetrics``: this package's OpenTelemetry metrics, exported to a
``prometheus_client`` registry by OpenTelemetry's Prometheus exporter (what
``examples/prometheus_metrics.py`` sets up by hand). Needs ``opentelemetry-sdk`` and
``opentelemetry-exporter-prometheus``."""

from __future__ import annotations

from typing import Any


class PrometheusMetrics:
    """``StreamLeaseManager(telemetry=PrometheusMetrics())``: a meter provider whose reader
    registers with ``registry`` (``prometheus_client.REGISTRY`` by default), so the app's
    ``/metrics`` shows the ``fastapi_stream_lease_*`` series. Build one per registry."""

    def __init__(self, registry: Any = None) -> None:
        try:
            import prometheus_client
            from opentelemetry.exporter.prometheus import PrometheusMetricReader
            from opentelemetry.sdk.metrics import MeterProvider
        except ImportError as missing:
            raise ImportError(
                "PrometheusMetrics exports through OpenTelemetry: install the prometheus extra "
                "(fastapi-stream-lease[prometheus]: opentelemetry-sdk, "
                f"opentelemetry-exporter-prometheus, prometheus-client) ({missing})"
            ) from missing
        self.registry = registry if registry is not None else prometheus_client.REGISTRY
        reader = PrometheusMetricReader(registry=self.registry)
        self.meter_provider = MeterProvider(metric_readers=[reader])
        self.tracer_provider = None
