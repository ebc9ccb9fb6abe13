"""The library's HTTP forms, with the collector's findings on demand (test_request_cycles).

Routes: ``/plain`` (no limiter, the baseline), ``/limited`` (two rate policies through a
dependency), ``/behind-middleware`` (the same through ``RateLimitMiddleware``), ``/sse`` (the
quickstart's native Server-Sent Events stream holding a lease), ``/wrapped`` (a
``StreamingResponse`` of ``lease.wrap()``) and the WebSocket ``/ws`` (a lease, one message).
``GET /cycles`` runs the cycle collector and answers what it found since the last call that a
request made: the count of each type among the unreachable ASGI scopes and objects of the
library (the automatic collection is off, so nothing is collected unseen; the server's own
cycles, such as a closed connection's transport, are not counted).

Environment: STREAM_LEASE_URL, STREAM_LEASE_PREFIX, STREAM_LEASE_SECRET.
"""

import collections
import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, FastAPI, WebSocket
from fastapi.responses import StreamingResponse
from fastapi.sse import EventSourceResponse, ServerSentEvent
from starlette.requests import HTTPConnection

from fastapi_stream_lease import Lease, RateLimit, RateLimitMiddleware, install_exception_handler

from environment import manager_from_environment

manager = manager_from_environment(max_per_user=1000)
PER_MINUTE = RateLimit("per_minute", 10**8, per=60)
PER_DAY = RateLimit("per_day", 10**11, per="day")


def user_of(connection: HTTPConnection) -> str:
    return connection.query_params.get("user", "someone")


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection finds stays in gc.garbage to be named
    yield
    await manager.aclose()


app = FastAPI(lifespan=lifespan)
app.add_middleware(
    RateLimitMiddleware, manager=manager, routes={"/behind-middleware": (PER_MINUTE, PER_DAY)}
)
install_exception_handler(app)
Leased = Annotated[Lease, Depends(manager.stream_lease(user=user_of))]


@app.get("/cycles")
def cycles() -> dict[str, int]:
    gc.collect()
    found = collections.Counter(
        type(thing).__qualname__ for thing in gc.garbage if of_a_request(thing)
    )
    gc.garbage.clear()
    gc.set_debug(0)
    gc.collect()  # frees them, so the next call counts only what came after
    gc.set_debug(gc.DEBUG_SAVEALL)
    return dict(found)


def of_a_request(thing: object) -> bool:
    """An ASGI scope, or an object of the library's."""
    if isinstance(thing, dict):
        return "asgi" in thing and "type" in thing
    return type(thing).__module__.startswith("fastapi_stream_lease")


@app.get("/plain")
async def plain() -> dict[str, str]:
    return {"msg": "Hello World"}


@app.get("/limited", dependencies=[Depends(manager.rate_limit(PER_MINUTE, PER_DAY, key=user_of))])
async def limited() -> dict[str, str]:
    return {"msg": "Hello World"}


@app.get("/behind-middleware")
async def behind_middleware() -> dict[str, str]:
    return {"msg": "Hello World"}


@app.get("/sse", response_class=EventSourceResponse)
async def sse(lease: Leased) -> AsyncIterator[ServerSentEvent]:
    for word in ["Hello", "world"]:
        yield ServerSentEvent(data=word)


@app.get("/wrapped")
async def wrapped(user: str = "someone") -> StreamingResponse:
    lease = await manager.acquire(user)

    async def words() -> AsyncIterator[str]:
        yield "Hello "
        yield "world"

    return StreamingResponse(lease.wrap(words()), media_type="text/plain")


@app.websocket("/ws")
async def ws(websocket: WebSocket, lease: Leased) -> None:
    await websocket.accept()
    await websocket.send_text("Hello world")
    await websocket.close()
