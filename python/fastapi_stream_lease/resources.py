"""Named resources: shared capacity (a database, the file system, a GPU model) that requests
hold while they use it, across every worker."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Resource:
    """At most ``capacity`` requests use this resource at once, across every worker.

    ``name`` keys it in Redis: give every resource a stable name. A resource built without one
    (``Resource(5)``, as in fastapi-concurrency-limiter) is named by its position when a
    :class:`~fastapi_stream_lease.Limiter` registers it. ``max_waiting`` caps the waiters of
    its line (0: no limit), in place of ``LeaseConfig.max_waiting``.
    """

    capacity: int
    name: str = ""
    max_waiting: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.capacity, bool) or not isinstance(self.capacity, int):
            raise TypeError(f"capacity must be an int, got {self.capacity!r}")
        if self.capacity < 1:
            raise ValueError(f"capacity={self.capacity} must be at least 1")
        if not isinstance(self.name, str):
            raise TypeError(f"name must be a str, got {self.name!r}")
        if self.max_waiting is not None:
            if isinstance(self.max_waiting, bool) or not isinstance(self.max_waiting, int):
                raise TypeError(f"max_waiting must be an int or None, got {self.max_waiting!r}")
            if self.max_waiting < 0:
                raise ValueError(f"max_waiting={self.max_waiting} must be 0 (no limit) or more")
