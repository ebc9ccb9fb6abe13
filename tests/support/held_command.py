"""A TCP proxy, in the test's event loop, in front of a Redis server that holds back a client's
bytes from the first time they carry a given command until the test lets them go: a step that
is "on its way" for as long as a test needs (a subscription made while something else happens)."""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType


class HeldCommand:
    """``async with HeldCommand(port, b"SUBSCRIBE") as proxy``: connect to ``proxy.url``;
    ``await proxy.held.wait()`` until a client sent the command, ``proxy.release()`` to let it
    (and whatever that connection sends after it) through."""

    def __init__(self, redis_port: int, command: bytes) -> None:
        self.redis_port = redis_port
        # The command as RESP sends its name (a bulk string), so a script's text that names it
        # in passing is not taken for it.
        self.command = b"$%d\r\n%s\r\n" % (len(command), command.upper())
        self.held = asyncio.Event()
        #: Connections that sent the command before the release (each held back until then).
        self.holding = 0
        self._released = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        assert self._server is not None, "use it in `async with`"
        return f"redis://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    def release(self) -> None:
        self._released.set()

    async def __aenter__(self) -> HeldCommand:
        self._server = await asyncio.start_server(self._connect, "127.0.0.1", 0)
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _connect(
        self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", self.redis_port)
        except OSError:
            self._tasks.discard(task)
            client_w.transport.abort()
            return
        try:
            await asyncio.gather(
                self._pipe(client_r, server_w, holding=True),
                self._pipe(server_r, client_w, holding=False),
            )
        finally:
            self._tasks.discard(task)
            client_w.transport.abort()
            server_w.transport.abort()

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, holding: bool
    ) -> None:
        # The end of what came before, so a command split over two reads is still found.
        tail = b""
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                if holding and not self._released.is_set():
                    seen = tail + data.upper()
                    if self.command in seen:
                        self.holding += 1
                        self.held.set()
                        await self._released.wait()
                    tail = seen[-len(self.command) :]
                writer.write(data)
                await writer.drain()
        writer.transport.abort()
