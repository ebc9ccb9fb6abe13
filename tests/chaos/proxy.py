"""A TCP proxy between the chaos workers and Redis, one listening port per worker slot, so the
fault schedule can cut one worker's network while the others run on.

Commands on stdin, one a line, each answered ``ok`` on stdout:

* ``cut SLOT stall``: the slot's bytes stop flowing both ways, connections stay open and new
  ones are accepted (a black hole: calls time out); what was held back flows on ``heal``, as TCP
  delivers it once a partition ends.
* ``cut SLOT reset``: the slot's connections are closed at once and new ones closed as they come
  (calls fail fast).
* ``heal SLOT``: the slot's traffic flows again.

Prints ``ports P1 P2 ...`` once listening. Usage: python -m chaos.proxy REDIS_PORT SLOTS
"""

from __future__ import annotations

import asyncio
import contextlib
import sys


class Slot:
    def __init__(self) -> None:
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.refusing = False
        self.writers: set[asyncio.StreamWriter] = set()

    def reset(self) -> None:
        self.refusing = True
        for writer in list(self.writers):
            writer.transport.abort()  # RST, not a polite close
        self.writers.clear()


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, slot: Slot) -> None:
    try:
        while data := await reader.read(65536):
            await slot.flowing.wait()
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.transport.abort()


async def serve(redis_port: int, slots: int) -> None:
    state = [Slot() for _ in range(slots)]

    def handler(slot: Slot):  # type: ignore[no-untyped-def]
        async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
            if slot.refusing:
                client_w.transport.abort()
                return
            try:
                server_r, server_w = await asyncio.open_connection("127.0.0.1", redis_port)
            except OSError:
                client_w.transport.abort()
                return
            if slot.refusing:
                client_w.transport.abort()
                server_w.transport.abort()
                return
            slot.writers.update((client_w, server_w))
            try:
                await asyncio.gather(
                    pipe(client_r, server_w, slot), pipe(server_r, client_w, slot)
                )
            finally:
                slot.writers.discard(client_w)
                slot.writers.discard(server_w)

        return handle

    servers = [
        await asyncio.start_server(handler(slot), "127.0.0.1", 0) for slot in state
    ]
    ports = [server.sockets[0].getsockname()[1] for server in servers]
    print("ports", *ports, flush=True)
    loop = asyncio.get_running_loop()
    commands = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(commands), sys.stdin)
    while line := (await commands.readline()).decode().split():
        verb, slot = line[0], state[int(line[1])]
        if verb == "cut" and line[2] == "stall":
            slot.flowing.clear()
        elif verb == "cut":
            slot.reset()
        elif verb == "heal":
            slot.refusing = False
            slot.flowing.set()
        print("ok", flush=True)
    for server in servers:
        server.close()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(int(sys.argv[1]), int(sys.argv[2])))
