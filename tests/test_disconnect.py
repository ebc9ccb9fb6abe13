"""What the waiting code takes from a request's ASGI receive channel while it watches for a
disconnect: at most one server read of body, all of it handed back to the app."""

from __future__ import annotations

import asyncio

import pytest
from starlette.requests import Request

from fastapi_stream_lease import ClientDisconnected
from fastapi_stream_lease.disconnect import HELD_BODY_LIMIT

from support.waiting import count_is, eventually

CHUNK = 16 * 1024


class Upload:
    """An ASGI receive channel for a body sent in chunks as fast as asked for; it records how
    many bytes were taken, and reports a disconnect after ``hang_up_after`` chunks if given."""

    def __init__(self, size: int, hang_up_after: int | None = None) -> None:
        self.body = bytes(i % 251 for i in range(size))
        self.taken = 0
        self.chunks = 0
        self.hang_up_after = hang_up_after

    async def receive(self) -> dict:
        if self.chunks == self.hang_up_after:
            return {"type": "http.disconnect"}
        if self.taken == len(self.body):  # all sent: the client stays, like a server's receive
            await asyncio.Event().wait()
        chunk = self.body[self.taken : self.taken + CHUNK]
        self.taken += len(chunk)
        self.chunks += 1
        return {"type": "http.request", "body": chunk, "more_body": self.taken < len(self.body)}

    def request(self) -> Request:
        scope = {"type": "http", "method": "POST", "path": "/", "headers": [], "query_string": b""}
        return Request(scope, self.receive)


async def read_all(request: Request) -> bytes:
    return b"".join([chunk async for chunk in request.stream()])


@pytest.mark.parametrize("size", [1000, 10 * HELD_BODY_LIMIT])
async def test_a_waiter_takes_at_most_one_read_of_body_and_the_app_gets_it_all(make_manager,
                                                                              size):
    manager = make_manager(max_per_user=0, max_global=1)
    holder = await manager.acquire("holder")
    upload = Upload(size)
    request = upload.request()
    waiting = asyncio.create_task(manager.acquire("uploader", wait_timeout=30, request=request))
    await eventually(lambda: manager.stats()["waiting"] == 1, what="the uploader in line")
    await eventually(lambda: upload.taken >= min(size, HELD_BODY_LIMIT), what="the watch to read")
    await asyncio.sleep(0.1)  # room to take more, if it would
    assert upload.taken == min(size, HELD_BODY_LIMIT)
    await holder.release()
    lease = await asyncio.wait_for(waiting, 10)
    assert await read_all(request) == upload.body  # whole and in order
    await lease.release()


async def test_a_client_that_hangs_up_mid_upload_leaves_the_line(make_manager):
    manager = make_manager(max_per_user=0, max_global=1)
    holder = await manager.acquire("holder")
    upload = Upload(10 * HELD_BODY_LIMIT, hang_up_after=2)
    waiting = asyncio.create_task(
        manager.acquire("uploader", wait_timeout=30, request=upload.request())
    )
    with pytest.raises(ClientDisconnected):
        await asyncio.wait_for(waiting, 10)
    await eventually(lambda: manager.stats()["waiting"] == 0, what="the uploader to leave")
    await holder.release()
    await count_is(manager, 0)
