"""Every form that counts per client address, 3 requests a minute each: the dependency
(``/dependency``), the decorator (``/decorator``), the middleware (``/middleware``) and the
WebSocket guard's connects (``/ws``). The proxies it trusts and the header they write come from
``TRUSTED_PROXIES`` (comma-separated) and ``PROXY_HEADER``."""

import os

from fastapi import Depends, FastAPI, WebSocket

from fastapi_stream_lease import (
    LeaseConfig,
    RateLimit,
    RateLimitMiddleware,
    StreamLeaseManager,
    install_exception_handler,
)

manager = StreamLeaseManager(
    url=os.environ["STREAM_LEASE_URL"],
    config=LeaseConfig(
        key_prefix=os.environ["STREAM_LEASE_PREFIX"],
        trusted_proxies=[p for p in os.environ.get("TRUSTED_PROXIES", "").split(",") if p],
        proxy_header=os.environ.get("PROXY_HEADER") or None,
    ),
)
MIDDLEWARE = RateLimit("middleware", 3, per=60)
DEPENDENCY = RateLimit("dependency", 3, per=60)
DECORATOR = RateLimit("decorator", 3, per=60)
CONNECTS = RateLimit("ws_connects", 3, per=60)

app = FastAPI()
app.add_middleware(RateLimitMiddleware, manager=manager, routes={"/middleware": [MIDDLEWARE]})
install_exception_handler(app)


@app.get("/dependency", dependencies=[Depends(manager.rate_limit(DEPENDENCY))])
async def dependency() -> str:
    return "ok"


@app.get("/decorator")
@manager.rate_limited(DECORATOR)
async def decorator() -> str:
    return "ok"


@app.get("/middleware")
async def middleware() -> str:
    return "ok"


@app.websocket("/ws")
async def websocket(websocket: WebSocket) -> None:
    ws = await manager.guard_websocket(websocket, connects=[CONNECTS])
    await ws.accept()
    await ws.send_text("ok")
    await ws.close()
