"""Named resources: shared capacity (a database, the file system, a GPU model) that requests
hold while they use it, across every worker."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Resource:
    """At most ``capacity`` requests use this resource at once, across every worker.

    ``name`` keys it in Redis: give every resource a stable name. A resource built without one
    (``Resource(5)``, as in fastapi-concurrency-limiter) is named by its position when a
    :class:`~fastapi_stream_lease.Limiter` registers it.
    """

    capacity: int
    name: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.capacity, bool) or not isinstance(self.capacity, int):
            raise TypeError(f"capacity must be an int, got {self.capacity!r}")
        if self.capacity < 1:
            raise ValueError(f"capacity={self.capacity} must be at least 1")
        if not isinstance(self.name, str):
            raise TypeError(f"name must be a str, got {self.name!r}")
