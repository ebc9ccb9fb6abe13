"""What OpenTelemetry costs: acquire + release cycles per second at 64 concurrent
coroutines with metrics and tracing off, and on (the SDK's MeterProvider with a periodic reader
at its default interval that exports nowhere, plus one collection at the end of each run so
every value recorded is aggregated within it; a TracerProvider whose batch processor drops the
spans), in alternating runs of one
process against one Redis; also the client process's CPU time per cycle (every thread: the
event loop, the core's runtime, the SDK).

Usage: benchmarks/.venv/bin/python benchmarks/telemetry_cost.py --url redis://127.0.0.1:PORT/0
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from fastapi_stream_lease import LeaseConfig, StreamLeaseManager

from common import machine_info, print_table, write_json

COROUTINES = 64
DEFAULT_OUTPUT = Path(__file__).resolve().parent / "results" / "telemetry_cost.json"


class Dropped(SpanExporter):
    """Exports nowhere: what is measured is the library's and the SDK's work, not a collector."""

    def export(self, spans: Sequence[object]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


class DroppedMetrics(MetricExporter):
    """Exports nowhere: the SDK's collection is measured, not a collector."""

    def export(
        self, metrics_data: object, timeout_millis: float = 0, **_: object
    ) -> MetricExportResult:
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 0) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 0, **_: object) -> None:
        pass


def manager(url: str, telemetry: bool) -> tuple[StreamLeaseManager, MeterProvider | None]:
    config = LeaseConfig(
        key_prefix=f"bench-otel-{uuid.uuid4().hex[:8]}",
        max_per_user=0,
        identity_secret=b"benchmark-secret-16b",
    )
    if not telemetry:
        return StreamLeaseManager(url=url, config=config), None
    tracers = TracerProvider()
    tracers.add_span_processor(BatchSpanProcessor(Dropped()))
    reader = PeriodicExportingMetricReader(DroppedMetrics())
    meters = MeterProvider(metric_readers=[reader])
    leases = StreamLeaseManager(
        url=url, config=config, meter_provider=meters, tracer_provider=tracers
    )
    return leases, meters


async def cycles_per_second(url: str, telemetry: bool, seconds: float) -> tuple[float, float]:
    """Cycles per second, and the client process's CPU microseconds per cycle."""
    leases, meters = manager(url, telemetry)
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker(n: int) -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            lease = await leases.acquire(f"user-{n}")
            await lease.release()
            done += 1

    started, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker(n) for n in range(COROUTINES)))
    if meters is not None:
        # A last collection within the run: every value recorded in it is aggregated.
        await asyncio.to_thread(meters.force_flush)
    rate = done / (time.perf_counter() - started)
    cpu_per_cycle = (time.process_time() - cpu) / done * 1e6
    await leases.aclose()
    if meters is not None:
        meters.shutdown()
    return rate, cpu_per_cycle


async def main(url: str, repeats: int, seconds: float, output: Path) -> None:
    await cycles_per_second(url, False, 1.0)  # warm-up: connections, scripts loaded
    runs: dict[str, list[float]] = {"off": [], "on": []}
    cpu: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(repeats):
        for mode in ("off", "on"):
            rate, cpu_per_cycle = await cycles_per_second(url, mode == "on", seconds)
            runs[mode].append(rate)
            cpu[mode].append(cpu_per_cycle)
    off, on = statistics.median(runs["off"]), statistics.median(runs["on"])
    cost = (off - on) / off * 100
    cpu_off, cpu_on = statistics.median(cpu["off"]), statistics.median(cpu["on"])
    cpu_cost = (cpu_on - cpu_off) / cpu_off * 100
    print(
        f"\nacquire + release, {COROUTINES} coroutines, {repeats} alternating runs of {seconds} s"
    )
    print_table(
        ["telemetry", "cycles/s (median)", "runs", "cost", "client CPU/cycle", "CPU cost"],
        [
            ["off", f"{off:,.0f}", ", ".join(f"{r:,.0f}" for r in runs["off"]), "",
             f"{cpu_off:.0f} us", ""],
            ["on (metrics + traces)", f"{on:,.0f}", ", ".join(f"{r:,.0f}" for r in runs["on"]),
             f"{cost:.1f} %", f"{cpu_on:.0f} us", f"{cpu_cost:.1f} %"],
        ],
    )  # fmt: skip
    write_json(
        output,
        {
            "machine": machine_info(),
            "runs": runs,
            "cpu_us_per_cycle": cpu,
            "cost_percent": cost,
            "cpu_cost_percent": cpu_cost,
        },
    )
    print(f"raw figures: {output}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", required=True, help="Redis URL, e.g. redis://127.0.0.1:6380/0")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    options = parser.parse_args()
    asyncio.run(main(options.url, options.repeats, options.seconds, options.output))
