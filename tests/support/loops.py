"""The event loops the core is tested on: asyncio's default loop, and uvloop, which uvicorn
runs on whenever it is installed (``--loop auto``, as ``uvicorn[standard]`` has it). The core
settles each call's future through the loop that awaits it, whichever that is."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import uvloop

LOOP_FACTORIES: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}

#: Runs a test, and its async fixtures, once on each of ``LOOP_FACTORIES`` (pytest-asyncio's
#: loop factories, which ``tests/conftest.py`` gives); unmarked tests run on asyncio's loop.
on_every_loop = pytest.mark.asyncio(loop_factories=list(LOOP_FACTORIES))
