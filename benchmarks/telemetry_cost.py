"""What OpenTelemetry costs (issue 13): acquire + release cycles per second at 64 concurrent
coroutines with metrics and tracing off, and on (the SDK's MeterProvider with an in-memory
reader, a TracerProvider whose batch processor drops the spans), in alternating runs of one
process against one Redis. Target: under 5 % cost.

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
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
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


def manager(url: str, telemetry: bool) -> StreamLeaseManager:
    config = LeaseConfig(
        key_prefix=f"bench-otel-{uuid.uuid4().hex[:8]}",
        max_per_user=0,
        identity_secret=b"benchmark-secret-16b",
    )
    if not telemetry:
        return StreamLeaseManager(url=url, config=config)
    tracers = TracerProvider()
    tracers.add_span_processor(BatchSpanProcessor(Dropped()))
    meters = MeterProvider(metric_readers=[InMemoryMetricReader()])
    return StreamLeaseManager(
        url=url, config=config, meter_provider=meters, tracer_provider=tracers
    )


async def cycles_per_second(url: str, telemetry: bool, seconds: float) -> float:
    leases = manager(url, telemetry)
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker(n: int) -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            lease = await leases.acquire(f"user-{n}")
            await lease.release()
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker(n) for n in range(COROUTINES)))
    rate = done / (time.perf_counter() - started)
    await leases.aclose()
    return rate


async def main(url: str, repeats: int, seconds: float, output: Path) -> None:
    await cycles_per_second(url, False, 1.0)  # warm-up: connections, scripts loaded
    runs: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(repeats):
        for mode in ("off", "on"):
            runs[mode].append(await cycles_per_second(url, mode == "on", seconds))
    off, on = statistics.median(runs["off"]), statistics.median(runs["on"])
    cost = (off - on) / off * 100
    print(
        f"\nacquire + release, {COROUTINES} coroutines, {repeats} alternating runs of {seconds} s"
    )
    print_table(
        ["telemetry", "cycles/s (median)", "runs", "cost"],
        [
            ["off", f"{off:,.0f}", ", ".join(f"{r:,.0f}" for r in runs["off"]), ""],
            [
                "on (metrics + traces)",
                f"{on:,.0f}",
                ", ".join(f"{r:,.0f}" for r in runs["on"]),
                f"{cost:.1f} %",
            ],
        ],
    )
    write_json(output, {"machine": machine_info(), "runs": runs, "cost_percent": cost})
    print(f"raw figures: {output}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", required=True, help="Redis URL, e.g. redis://127.0.0.1:6380/0")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    options = parser.parse_args()
    asyncio.run(main(options.url, options.repeats, options.seconds, options.output))
