"""What OpenTelemetry costs: acquire + release cycles per second at 64 concurrent coroutines,
each cycle inside the app's own request span as an instrumented app has it
(``tracer.start_as_current_span("GET /stream")``), in alternating runs of one process against
one Redis; also the client process's CPU time per cycle (every thread: the event loop, the
core's runtime, the SDK).

The modes:

* ``off``: no OpenTelemetry at all, no request span;
* ``app spans 10 %``: the app's request span with the production sampler,
  ``ParentBased(TraceIdRatioBased(0.1))``, and the library without providers: what the app's own
  instrumentation costs;
* ``on, 10 % sampled``: the same, and the library records metrics and traces (the SDK's
  MeterProvider with a periodic reader at its default interval that exports nowhere, plus one
  collection at the end of each run so every value recorded is aggregated within it; a
  TracerProvider whose batch processor drops the spans);
* ``on, 10 %, acquire spans``: the same with ``acquire_spans=True``, a span of the library's
  own per sampled acquire instead of an event on the request's span;
* ``app spans 100 %``, ``on, 100 % sampled`` and ``on, 100 %, acquire spans``: the same three
  with every trace sampled.

The library's cost is ``on`` against ``app spans`` at the same sampling (the app pays for its
own spans with or without the library), and is also shown against ``off``.

Usage: benchmarks/.venv/bin/python benchmarks/telemetry_cost.py --url redis://127.0.0.1:PORT/0
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
import timeit
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, TraceIdRatioBased

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


@dataclass(frozen=True)
class Mode:
    """One way to run the cycles: whether the app traces its requests (and what share of them
    it samples), and whether the library is given the providers."""

    name: str
    sampled: float | None  # the app's share of sampled traces; None: no OpenTelemetry
    library: bool
    acquire_spans: bool = False  # a span of the library's own per sampled acquire


OFF = Mode("off", None, False)
MODES = (
    OFF,
    Mode("app spans 10 %", 0.1, False),
    Mode("on, 10 % sampled", 0.1, True),
    Mode("on, 10 %, acquire spans", 0.1, True, acquire_spans=True),
    Mode("app spans 100 %", 1.0, False),
    Mode("on, 100 % sampled", 1.0, True),
    Mode("on, 100 %, acquire spans", 1.0, True, acquire_spans=True),
)


class Run:
    """A manager and the providers of one run."""

    def __init__(self, url: str, mode: Mode) -> None:
        config = LeaseConfig(
            key_prefix=f"bench-otel-{uuid.uuid4().hex[:8]}",
            max_per_user=0,
            identity_secret=b"benchmark-secret-16b",
        )
        self.tracers: TracerProvider | None = None
        self.meters: MeterProvider | None = None
        if mode.sampled is not None:
            sampler = ALWAYS_ON if mode.sampled >= 1 else ParentBased(TraceIdRatioBased(0.1))
            self.tracers = TracerProvider(sampler=sampler)
            self.tracers.add_span_processor(BatchSpanProcessor(Dropped()))
            self.app_tracer = self.tracers.get_tracer("app")  # once, as an app's module has it
        if mode.library:
            reader = PeriodicExportingMetricReader(DroppedMetrics())
            self.meters = MeterProvider(metric_readers=[reader])
        self.leases = StreamLeaseManager(
            url=url,
            config=config,
            meter_provider=self.meters,
            tracer_provider=self.tracers if mode.library else None,
            acquire_spans=mode.acquire_spans,
        )

    def request_span(self) -> Any:
        """The app's span around one request (none without OpenTelemetry)."""
        if self.tracers is None:
            return contextlib.nullcontext()
        return self.app_tracer.start_as_current_span("GET /stream")

    async def collect(self) -> None:
        """A last collection within the run: every value recorded in it is aggregated."""
        if self.meters is not None:
            await asyncio.to_thread(self.meters.force_flush)

    async def close(self) -> None:
        await self.leases.aclose()
        if self.meters is not None:
            self.meters.shutdown()
        if self.tracers is not None:
            self.tracers.shutdown()


async def cycles_per_second(url: str, mode: Mode, seconds: float) -> tuple[float, float]:
    """Cycles per second, and the client process's CPU microseconds per cycle."""
    run = Run(url, mode)
    leases = run.leases
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker(n: int) -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            with run.request_span():
                lease = await leases.acquire(f"user-{n}")
                await lease.release()
            done += 1

    started, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker(n) for n in range(COROUTINES)))
    await run.collect()
    rate = done / (time.perf_counter() - started)
    cpu_per_cycle = (time.process_time() - cpu) / done * 1e6
    await run.close()
    return rate, cpu_per_cycle


def sdk_micros() -> dict[str, float]:
    """What the SDK's parts of the library's telemetry cost here, in microseconds of one
    thread, the best of 5 timings: a histogram record (one per lease, made when a reader
    collects); a span as the library makes one per acquire in a sampled trace with
    ``acquire_spans=True`` (started with its pools, ended with its result and wait) with the
    event of the lease's end on the request's span; and the same facts as the default puts them
    on the request's span (an event with the facts, the result as an attribute, the lease's end
    as an event), less the request span's own cost."""
    reader = PeriodicExportingMetricReader(DroppedMetrics())
    meters = MeterProvider(metric_readers=[reader])
    histogram = meters.get_meter("bench").create_histogram("duration", unit="s")
    tracers = TracerProvider(sampler=ALWAYS_ON)
    tracers.add_span_processor(BatchSpanProcessor(Dropped()))
    tracer = tracers.get_tracer("bench")

    facts = {"pools": ["per_user", "global"], "result": "acquired", "wait_seconds": 0.001}

    def span() -> None:
        child = tracer.start_span("acquire", attributes={"pools": facts["pools"]})
        child.set_attributes(facts)
        child.end()
        request.add_event("lease.released")

    def event() -> None:
        request.add_event("acquire", dict(facts))
        request.set_attribute("result", "acquired")
        request.add_event("lease.released")

    with tracer.start_as_current_span("GET /stream") as request:
        figures = {
            "histogram_record": min(timeit.repeat(lambda: histogram.record(0.01), number=20_000,
                                                  repeat=5)) / 20_000 * 1e6,
            "sampled_span": min(timeit.repeat(span, number=5_000, repeat=5)) / 5_000 * 1e6,
        }  # fmt: skip
    # An event per acquire on a request span that lives as long as a request does.
    events = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(5_000):
            with tracer.start_as_current_span("GET /stream") as request:
                event()
        events.append(time.perf_counter() - started)
    bare = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(5_000):
            with tracer.start_as_current_span("GET /stream") as request:
                pass
        bare.append(time.perf_counter() - started)
    figures["sampled_event"] = (min(events) - min(bare)) / 5_000 * 1e6
    meters.shutdown()
    tracers.shutdown()
    return figures


def percent_fewer(rate: float, baseline: float) -> str:
    return f"{(baseline - rate) / baseline * 100:.1f} %"


async def main(url: str, repeats: int, seconds: float, output: Path) -> None:
    await cycles_per_second(url, OFF, 1.0)  # warm-up: connections, scripts loaded
    runs: dict[str, list[float]] = {mode.name: [] for mode in MODES}
    cpu: dict[str, list[float]] = {mode.name: [] for mode in MODES}
    for _ in range(repeats):
        for mode in MODES:
            rate, cpu_per_cycle = await cycles_per_second(url, mode, seconds)
            runs[mode.name].append(rate)
            cpu[mode.name].append(cpu_per_cycle)
    rates = {name: statistics.median(r) for name, r in runs.items()}
    cpus = {name: statistics.median(c) for name, c in cpu.items()}
    # The library's cost is read against its telemetry off at the same sampling of the app's
    # spans (the mode of the same share without the library).
    baselines = {
        mode.name: next(m.name for m in MODES if m.sampled == mode.sampled and not m.library)
        for mode in MODES
    }
    print(
        f"\nacquire + release inside the app's request span, {COROUTINES} coroutines, "
        f"{repeats} alternating runs of {seconds} s"
    )
    rows = []
    for mode in MODES:
        name, base = mode.name, baselines[mode.name]
        library = mode.library
        rows.append([
            name, f"{rates[name]:,.0f}", ", ".join(f"{r:,.0f}" for r in runs[name]),
            percent_fewer(rates[name], rates[OFF.name]) if mode is not OFF else "",
            percent_fewer(rates[name], rates[base]) if library else "",
            f"{cpus[name]:.0f} us",
            f"{cpus[name] - cpus[base]:+.0f} us" if library else "",
        ])  # fmt: skip
    print_table(
        ["mode", "cycles/s (median)", "runs", "fewer than off", "library's cost",
         "client CPU/cycle", "library's CPU/cycle"],
        rows,
    )  # fmt: skip
    costs = {
        mode.name: {
            "percent_fewer_than_off": (rates[OFF.name] - rates[mode.name]) / rates[OFF.name] * 100,
            "library_percent": (rates[baselines[mode.name]] - rates[mode.name])
            / rates[baselines[mode.name]]
            * 100,
            "library_cpu_us_per_cycle": cpus[mode.name] - cpus[baselines[mode.name]],
        }
        for mode in MODES
        if mode.library
    }
    sdk = sdk_micros()
    print(
        f"\nthe SDK's parts, one thread: a histogram record (one per lease) "
        f"{sdk['histogram_record']:.1f} us; a span as the library's (one per acquire in a "
        f"sampled trace, with the lease's end as an event) {sdk['sampled_span']:.1f} us; the "
        f"same facts as events and an attribute on the request's span {sdk['sampled_event']:.1f} us"
    )
    write_json(
        output,
        {
            "machine": machine_info(),
            "coroutines": COROUTINES,
            "seconds_per_run": seconds,
            "runs": runs,
            "cpu_us_per_cycle": cpu,
            "costs": costs,
            "sdk_micros": sdk,
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
