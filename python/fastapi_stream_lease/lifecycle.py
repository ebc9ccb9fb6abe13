"""The 0.6 API's lifecycle hooks (``LeaseConfig(on_acquired=..., on_rejected=..., on_lost=...,
on_released=..., on_backend_error=...)``) and ``StreamLeaseManager(on_threshold=...)``, run off
the hot path: an event is queued (a deque
append) where it happens, and one task per event loop runs the hooks in order, a coroutine
function awaited there, a plain function in a worker thread. No acquire, stream or release
waits for a hook; a full queue (``hook_queue_size``) drops new events, with a warning now and
then, and a hook that raises is logged."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._core import LeaseConfig
    from .alerts import ThresholdCrossed
    from .errors import StreamLeaseError
    from .lease import Lease

log = logging.getLogger("fastapi_stream_lease")

Hook = Callable[..., Any]


class Lifecycle:
    """One manager's hooks, their queue and its runner."""

    def __init__(self, config: LeaseConfig, on_threshold: Hook | None = None) -> None:
        self.on_acquired: Hook | None = config.on_acquired
        self.on_rejected: Hook | None = config.on_rejected
        self.on_lost: Hook | None = config.on_lost if callable(config.on_lost) else None
        self.on_released: Hook | None = config.on_released
        self.on_backend_error: Hook | None = config.on_backend_error
        self.on_threshold = on_threshold
        self._events: deque[tuple[Hook, tuple[Any, ...]]] = deque()
        self._capacity = config.hook_queue_size
        self._runner: asyncio.Task[None] | None = None
        #: Events dropped because the queue was full (logged now and then).
        self.dropped = 0

    @staticmethod
    def wanted(config: LeaseConfig, on_threshold: Hook | None = None) -> bool:
        """Whether there is any hook (without one, the manager keeps no lifecycle)."""
        hooks = (config.on_acquired, config.on_rejected, config.on_released, on_threshold)
        given = any(hook is not None for hook in (*hooks, config.on_backend_error))
        return given or callable(config.on_lost)

    def acquired(self, lease: Lease) -> None:
        self._queue(self.on_acquired, lease)

    def refused(self, user_id: object, error: StreamLeaseError) -> None:
        from .errors import BackendError, StreamLeaseRejected

        if isinstance(error, BackendError):
            self._queue(self.on_backend_error, error)
        elif isinstance(error, StreamLeaseRejected):
            self._queue(self.on_rejected, user_id, error.reason)

    def lost(self, lease: Lease, reason: str) -> None:
        self._queue(self.on_lost, lease, reason)

    def released(self, lease: Lease, reason: str) -> None:
        self._queue(self.on_released, lease, reason)

    def threshold_crossed(self, alert: ThresholdCrossed) -> None:
        self._queue(self.on_threshold, alert)

    def _queue(self, hook: Hook | None, *args: Any) -> None:
        if hook is None:
            return
        if len(self._events) >= self._capacity:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning(
                    "lifecycle hook queue full (hook_queue_size=%d): %d event(s) dropped so "
                    "far; the hooks are slower than the events",
                    self._capacity, self.dropped,
                )  # fmt: skip
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # an event outside a loop (a lease collected at exit): none runs it
            self.dropped += 1
            return
        self._events.append((hook, args))
        runner = self._runner
        if runner is None or runner.done() or runner.get_loop() is not loop:
            self._runner = loop.create_task(self._run())

    async def _run(self) -> None:
        while self._events:
            hook, args = self._events.popleft()
            try:
                if inspect.iscoroutinefunction(hook):
                    await hook(*args)
                else:
                    outcome = await asyncio.to_thread(hook, *args)
                    if inspect.isawaitable(outcome):  # a plain function that returned one
                        await outcome
            except Exception:
                log.exception("lifecycle hook %s raised", getattr(hook, "__name__", hook))

    async def flush(self, timeout: float) -> None:
        """Waits up to ``timeout`` seconds for the queued events to be run."""
        runner = self._runner
        if runner is not None and not runner.done():
            await asyncio.wait({runner}, timeout=timeout)
