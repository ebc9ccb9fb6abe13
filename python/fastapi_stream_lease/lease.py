"""``Lease``: a slot held in every pool of one acquire, and the stream tied to it."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Iterable
from typing import TypeVar

from ._core import LeaseHandle
from ._wrap import wrap_stream

T = TypeVar("T")


class Lease:
    """A slot held in every pool of one acquire, renewed by the manager until released.

    A lease dropped without a release (garbage collected) frees its slot.
    """

    __slots__ = ("_cancel_on_lost", "_handle")

    def __init__(self, handle: LeaseHandle, *, cancel_on_lost: bool) -> None:
        self._handle = handle
        self._cancel_on_lost = cancel_on_lost

    @property
    def lease_id(self) -> str:
        """Random id of this lease (the member stored in each pool)."""
        return self._handle.lease_id

    @property
    def weight(self) -> int:
        """Slots this lease takes in each pool."""
        return self._handle.weight

    @property
    def lost(self) -> bool:
        """True once renewal found the lease gone from the store (expired during an outage,
        evicted)."""
        return self._handle.lost

    @property
    def released(self) -> bool:
        """True once :meth:`release` ran (or the manager was closed)."""
        return self._handle.released

    def release(self) -> Awaitable[bool]:
        """Releases the lease now and returns an awaitable that resolves when the store confirms
        (True if it was still there). Safe to call twice; cancelling the await does not stop it.
        """
        return self._handle.release()

    def release_nowait(self) -> bool:
        """Starts the release without waiting for it; True if this call released the lease."""
        return self._handle.release_nowait()

    def wrap(self, stream: AsyncIterable[T] | Iterable[T]) -> AsyncIterator[T]:
        """Wraps a stream (async or sync iterable) in an async generator that releases this
        lease when the stream ends, raises, is cancelled or is closed (client disconnect).
        Under ``on_lost="cancel"`` a lost lease ends the stream with :class:`LeaseLost`."""
        return wrap_stream(self, stream)

    def __repr__(self) -> str:
        states = [name for name in ("lost", "released") if getattr(self, name)]
        return f"<Lease {self.lease_id} weight={self.weight} {', '.join(states) or 'held'}>"
