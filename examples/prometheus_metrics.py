"""Prometheus metrics for an app's streams: OpenTelemetry's Prometheus exporter behind a
``/metrics`` endpoint, and the Grafana dashboard in ``examples/grafana/`` that reads them.

Serve it with ``uvicorn examples.prometheus_metrics:app`` and point Prometheus at ``/metrics``.
Run as a script, it tells a short story on a free port (streams admitted, one refused, one
that may wait for the gpu, tokens charged) and prints what two scrapes show: ``python
examples/prometheus_metrics.py`` (on Redis when REDIS_URL is set).
Needs ``pip install opentelemetry-sdk opentelemetry-exporter-prometheus``.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import prometheus_client
from fastapi import FastAPI, Response
from fastapi.responses import StreamingResponse
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider

from fastapi_stream_lease import (
    LeaseConfig,
    RateLimit,
    Resource,
    StreamLeaseManager,
    install_exception_handler,
)

URL = os.environ.get("REDIS_URL", "memory://")
TOKENS_PER_MINUTE = RateLimit("tokens_per_minute", 10_000, per=60, unit="tokens")
GPU = Resource(capacity=1, name="gpu")

# One reader per process: it registers with prometheus_client's default registry.
meters = MeterProvider(metric_readers=[PrometheusMetricReader()])
manager = StreamLeaseManager(
    url=URL,
    config=LeaseConfig(
        max_per_user=2,
        max_global=100,
        key_prefix="prometheus-demo",
        identity_secret=os.environ.get("STREAM_LEASE_IDENTITY_SECRET", "demo-secret-0123456789"),
    ),
    meter_provider=meters,
)


@asynccontextmanager
async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
    yield
    await manager.drain(timeout=5)


app = FastAPI(lifespan=lifespan)
install_exception_handler(app)


@app.get("/chat/stream")
async def chat_stream(user_id: str, words: int = 3, gpu: bool = False):
    lease = await manager.acquire(
        user_id,
        resources=[GPU] if gpu else (),
        wait_timeout=10 if gpu else 0,
        budgets=[TOKENS_PER_MINUTE],
        reserve=words,
    )

    async def tokens():
        for n in range(words):
            await asyncio.sleep(0.1)
            yield f"data: token {n + 1}/{words}\n\n"

    return StreamingResponse(
        lease.wrap(tokens(), tokens=lambda _: 1), media_type="text/event-stream"
    )


@app.get("/metrics")
async def metrics() -> Response:
    # Collected in a worker thread: the shared pools' gauges are then read from Redis for this
    # scrape (on the event loop they would show the previous scrape's figures).
    body = await asyncio.to_thread(prometheus_client.generate_latest)
    return Response(body, media_type=prometheus_client.CONTENT_TYPE_LATEST)


async def story(base_url: str) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:

        async def stream(user: str, **params: object) -> int:
            response = await client.get("/chat/stream", params={"user_id": user, **params})
            return response.status_code

        streams = asyncio.gather(
            stream("alice"), stream("alice"), stream("alice", words=1),
            stream("bob", gpu=True),
        )  # fmt: skip
        await asyncio.sleep(0.15)
        show("while streaming", (await client.get("/metrics")).text, ("active", "pool_used"))
        print("statuses:", *await streams, flush=True)
        await asyncio.sleep(1)  # the shared pools are read from Redis at most once a second
        show("after", (await client.get("/metrics")).text, ("",))


def show(when: str, scrape: str, parts: tuple[str, ...]) -> None:
    """Prints the library's samples of a scrape (histogram buckets left out), scope labels cut."""
    print(f"scrape {when}:", flush=True)
    for line in scrape.splitlines():
        name = line.split("{")[0]
        if name.startswith("fastapi_stream_lease") and "_bucket" not in name:
            if any(part in name for part in parts):
                labels = ",".join(
                    label for label in line.split("{")[1].split("}")[0].split(",")
                    if not label.startswith("otel_scope")
                )  # fmt: skip
                print(f"  {name}{{{labels}}} {line.rsplit(' ', 1)[1]}", flush=True)


async def main() -> None:
    sys.path.insert(0, os.path.dirname(__file__))
    from serving import serving

    async with serving(app) as port:
        await story(f"http://127.0.0.1:{port}")
    await manager.drain(timeout=5)
    print("prometheus demo done", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
