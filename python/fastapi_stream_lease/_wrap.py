"""``Lease.wrap()``: the async generator that ties a lease to a stream's life."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from typing import TYPE_CHECKING, TypeVar

from starlette.concurrency import iterate_in_threadpool

from ._lost import LostWatch
from .errors import StreamLeaseError

if TYPE_CHECKING:
    from .lease import Lease

T = TypeVar("T")
log = logging.getLogger("fastapi_stream_lease")


async def wrap_stream(lease: Lease, stream: AsyncIterable[T] | Iterable[T]) -> AsyncIterator[T]:
    """Yields ``stream``'s items; releases ``lease`` however the stream ends.

    Starlette's ``StreamingResponse`` cancels or closes this generator when the client goes
    away, so the ``finally`` below is the one place release must happen. The release starts
    synchronously, so a cancellation arriving at the ``await`` cannot undo it. Under
    ``on_lost="cancel"`` a lost lease ends the stream with :class:`LeaseLost`, even while it
    waits for its next item.
    """
    source: AsyncIterable[T] = (
        stream if isinstance(stream, AsyncIterable) else iterate_in_threadpool(iter(stream))
    )
    items = aiter(source)
    watch = LostWatch(lease)
    try:
        while True:
            with watch.guarded():
                try:
                    item = await anext(items)
                except StopAsyncIteration:
                    return
            yield item
    finally:
        watch.close()
        released = lease.release()
        try:
            await released
        except StreamLeaseError as exc:
            # The lease expires by itself; the stream's own outcome matters more.
            log.warning("stream lease release failed, it will expire by itself: %s", exc)
        finally:
            close = getattr(source, "aclose", None)
            if close is not None:
                await close()
