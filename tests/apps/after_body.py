"""Requests whose work goes on after their response: each runs a background task that waits
until the test opens its gate (test_after_body).

``/json`` and ``/sse`` hold a lease through ``manager.stream_lease()`` (2 items for SSE);
``/endless`` sends one item under a lease, then nothing until the client leaves; ``/sse-free``
is ``/sse``'s body without a lease; ``task_fails=1`` makes the task raise
``PoolFull`` once its gate opens. ``/drainable`` holds its lease from a manager of its own,
which ``POST /drain?timeout=`` starts draining. Caps: 1 stream per user. The library's log
and the server's go to stderr, each line after its level.

Environment: STREAM_LEASE_URL, STREAM_LEASE_PREFIX, STREAM_LEASE_SECRET.
"""

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import BackgroundTasks, Depends, FastAPI
from fastapi.responses import StreamingResponse
from fastapi.sse import EventSourceResponse, ServerSentEvent

from fastapi_stream_lease import (
    Lease,
    PoolFull,
    install_exception_handler,
)

from environment import log_library_to_stderr, manager_from_environment

log_library_to_stderr()
manager = manager_from_environment(max_per_user=1)
drained = manager_from_environment(max_per_user=1)
app = FastAPI()
install_exception_handler(app)

#: Each task's state: "running", "done", "cancelled" or "failed".
tasks: dict[str, str] = {}
gates: dict[str, asyncio.Event] = {}
drains: list[asyncio.Task[None]] = []


def user_of(user: str) -> str:
    return user


Leased = Annotated[Lease, Depends(manager.stream_lease(user=user_of))]


async def background(task: str, fails: bool) -> None:
    tasks[task] = "running"
    try:
        await gates.setdefault(task, asyncio.Event()).wait()
    except asyncio.CancelledError:
        tasks[task] = "cancelled"
        raise
    if fails:
        tasks[task] = "failed"
        raise PoolFull("global stream limit reached", "global", 6, 6, 1)
    tasks[task] = "done"


def run_after(background_tasks: BackgroundTasks, task: str, task_fails: bool = False) -> None:
    background_tasks.add_task(background, task, task_fails)


After = Annotated[None, Depends(run_after)]


@app.get("/json")
async def json_body(lease: Leased, after: After) -> dict[str, bool]:
    return {"ok": True}


async def two_items() -> AsyncIterator[ServerSentEvent]:
    for n in range(2):
        yield ServerSentEvent(data={"item": n})


@app.get("/sse", response_class=EventSourceResponse)
async def sse(lease: Leased, after: After) -> AsyncIterator[ServerSentEvent]:
    async for item in two_items():
        yield item


@app.get("/endless")
async def endless(lease: Leased, after: After) -> StreamingResponse:
    """One item, then nothing until the client leaves."""

    async def items() -> AsyncIterator[bytes]:
        yield b"data: first\n\n"
        await asyncio.sleep(3600)

    return StreamingResponse(items(), media_type="text/event-stream")


@app.get("/sse-free", response_class=EventSourceResponse)
async def sse_free(after: After) -> AsyncIterator[ServerSentEvent]:
    async for item in two_items():
        yield item


@app.get("/drainable")
async def drainable(
    lease: Annotated[Lease, Depends(drained.stream_lease(user=user_of))], after: After
) -> dict[str, bool]:
    return {"ok": True}


@app.post("/open/{task}")
async def open_gate(task: str) -> dict[str, bool]:
    gates.setdefault(task, asyncio.Event()).set()
    return {"opened": True}


@app.get("/tasks/{task}")
async def task_state(task: str) -> dict[str, str | None]:
    return {"state": tasks.get(task)}


@app.post("/drain")
async def drain(timeout: float) -> dict[str, bool]:
    drains.append(asyncio.create_task(drained.drain(timeout=timeout)))
    return {"started": True}


@app.get("/drained")
async def is_drained() -> dict[str, bool]:
    return {"drained": bool(drains) and drains[0].done()}
