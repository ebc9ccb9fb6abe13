"""A WebSocket endpoint per way of reading a message (``/ws/<reader>``: ``receive_text``,
``iter_json``, ``receive``, ...), each guarded by a message rate of its own (the identity is the
reader's name, or the ``as`` query parameter), answering every message it reads with
``"echo"``; ``/ended/<reader>`` says how the reader's last socket ended, as the endpoint saw
it."""

import os

from fastapi import FastAPI, WebSocket
from starlette.websockets import WebSocketDisconnect

from fastapi_stream_lease import LeaseConfig, RateLimit, StreamLeaseManager

MESSAGES = RateLimit("ws_messages", 5, per=60)

manager = StreamLeaseManager(
    url=os.environ["STREAM_LEASE_URL"],
    config=LeaseConfig(key_prefix=os.environ["STREAM_LEASE_PREFIX"]),
)
app = FastAPI()
ended: dict[str, str] = {}


@app.websocket("/ws/{reader}")
async def echo(websocket: WebSocket, reader: str) -> None:
    identity = websocket.query_params.get("as", reader)
    ws = await manager.guard_websocket(websocket, messages=[MESSAGES], key=lambda _: identity)
    await ws.accept()
    try:
        if reader == "receive":
            while (message := await ws.receive())["type"] == "websocket.receive":
                await ws.send_text("echo")
            ended[reader] = f"{message['type']} {message['code']}"
        elif reader.startswith("iter_"):
            async for _ in getattr(ws, reader)():
                await ws.send_text("echo")
            ended[reader] = "loop ended"
        else:
            while True:
                await getattr(ws, reader)()
                await ws.send_text("echo")
    except WebSocketDisconnect as disconnect:
        ended[reader] = f"WebSocketDisconnect {disconnect.code}"


@app.get("/ended/{reader}")
async def how_it_ended(reader: str) -> str | None:
    return ended.get(reader)
