"""``OpenTelemetryMetrics``: this package's OpenTelemetry metrics and traces, with the
providers given, or the app's global ones."""

from __future__ import annotations

from typing import Any


class OpenTelemetryMetrics:
    """``StreamLeaseManager(telemetry=OpenTelemetryMetrics())``: the same as passing
    ``meter_provider`` and ``tracer_provider`` (None: the app's global providers, once set).
    ``meter_name`` is accepted for 0.6's signature; the meter is named
    ``fastapi_stream_lease``."""

    def __init__(
        self,
        meter_provider: Any = None,
        tracer_provider: Any = None,
        meter_name: str = "fastapi_stream_lease",
    ) -> None:
        self.meter_provider = meter_provider
        self.tracer_provider = tracer_provider
