"""What ``Lease.wrap()`` closes when its stream ends, and how: an SDK's stream object by
whichever close method it has, the iterator an iterable handed out as well, within 2 seconds
together; a close that fails or hangs is logged and never keeps the stream from ending."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest

from fastapi_stream_lease import stream_source


class Stream:
    """An async stream of ``items`` with the close method ``close`` under ``name``."""

    def __init__(self, name: str, close: Callable[[], Any], items: tuple[str, ...] = ()) -> None:
        self._items = iter(items)
        setattr(self, name, close)

    def __aiter__(self) -> Stream:
        return self

    async def __anext__(self) -> str:
        try:
            return next(self._items)
        except StopIteration:
            raise StopAsyncIteration from None


async def streamed(manager: Any, source: object) -> list[str]:
    lease = await manager.acquire("u1")
    items = [item async for item in lease.wrap(source)]
    assert lease.released
    return items


@pytest.mark.parametrize("name", ["aclose", "close"])
async def test_an_async_close_method_is_awaited_whatever_its_name(make_manager, name):
    closed: list[str] = []

    async def close() -> None:
        closed.append(name)

    assert await streamed(make_manager(), Stream(name, close, ("a",))) == ["a"]
    assert closed == [name]


@pytest.mark.parametrize("name", ["aclose", "close"])
async def test_a_sync_close_method_is_called_and_an_awaitable_it_returns_awaited(
    make_manager, name
):
    closed: list[str] = []

    async def finish() -> None:
        closed.append("awaited")

    def close() -> object:
        closed.append("called")
        return finish()

    await streamed(make_manager(), Stream(name, close))
    assert closed == ["called", "awaited"]


async def test_the_iterator_an_iterable_hands_out_is_closed_as_well(make_manager):
    closed: list[str] = []

    async def close_iterator() -> None:
        closed.append("iterator")

    class Iterable:
        def __aiter__(self) -> Stream:
            return Stream("aclose", close_iterator, ("a",))

        def close(self) -> None:
            closed.append("iterable")

    assert await streamed(make_manager(), Iterable()) == ["a"]
    assert closed == ["iterator", "iterable"]


async def test_a_close_that_fails_is_logged_with_its_type_only_and_the_stream_ends(
    make_manager, caplog
):
    async def close() -> None:
        raise RuntimeError("private words of the upstream")

    with caplog.at_level(logging.WARNING, "fastapi_stream_lease"):
        assert await streamed(make_manager(), Stream("aclose", close, ("a",))) == ["a"]
    assert "RuntimeError" in caplog.text and "private words" not in caplog.text


async def test_a_close_that_hangs_is_left_after_the_time_allowed(make_manager, monkeypatch, caplog):
    monkeypatch.setattr(stream_source, "CLOSE_TIMEOUT", 0.05)
    never = asyncio.Event()

    async def close() -> None:
        await never.wait()

    with caplog.at_level(logging.WARNING, "fastapi_stream_lease"):
        assert await streamed(make_manager(), Stream("aclose", close)) == []
    assert "TimeoutError" in caplog.text


def test_the_sources_of_a_stream_have_2_seconds_to_close():
    assert stream_source.CLOSE_TIMEOUT == 2.0
