"""Ending work when its lease is lost, the way ``asyncio.timeout`` ends work when time is up.

The core resolves the lease handle's ``wait_lost()`` when the renewal loop finds the lease gone
(or its deadline passes without a renewal). If the task is inside a guarded section at that
moment, it is cancelled, and the cancellation becomes :class:`LeaseLost` at the section's edge.
Outside a section, the next section refuses to start.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from .errors import LeaseLost

if TYPE_CHECKING:
    from .lease import Lease

LOST_MESSAGE = (
    "the stream's lease was lost: Redis no longer held it (an outage longer than lease_seconds, "
    "a restart or an eviction) and its slot was taken meanwhile"
)


class LostWatch:
    """Watches one lease for the task that uses it; inert under ``on_lost="continue"``."""

    def __init__(self, lease: Lease) -> None:
        self._lease = lease
        self._task: asyncio.Task[object] | None = None
        self._cancelled_by_us = False
        self._waiter = lease._handle.wait_lost() if lease._cancel_on_lost else None
        if self._waiter is not None:
            asyncio.ensure_future(self._waiter).add_done_callback(self._on_lost)

    def _on_lost(self, waiter: asyncio.Future[None]) -> None:
        if not waiter.cancelled() and self._task is not None:
            self._cancelled_by_us = True
            self._task.cancel(LOST_MESSAGE)

    @contextmanager
    def guarded(self) -> Iterator[None]:
        """Runs the ``with`` body under the watch; :class:`LeaseLost` if the lease is lost."""
        if self._waiter is None:
            yield
            return
        if self._lease.lost:
            raise LeaseLost(LOST_MESSAGE)
        self._task = asyncio.current_task()
        try:
            yield
        except asyncio.CancelledError:
            if not self._cancelled_by_us:
                raise
            self._cancelled_by_us = False
            uncancel = getattr(self._task, "uncancel", None)  # Python 3.11+
            if uncancel is not None:
                uncancel()
            raise LeaseLost(LOST_MESSAGE) from None
        finally:
            self._task = None

    def close(self) -> None:
        if self._waiter is not None:
            asyncio.ensure_future(self._waiter).cancel()
