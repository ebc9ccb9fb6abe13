"""``Limiter``: the API of fastapi-concurrency-limiter, distributed.

Requests wait in line (first come, first served, across every worker) for the resources they
need, up to ``timeout`` seconds, then get 503 with ``Retry-After``: FastAPI answers
``{"detail": "Server busy, please retry later"}``, a Starlette app that text.
Several resources are taken in one atomic step, so no order of acquisition can deadlock: the
seed's rule to list them in registration order still works, and is no longer required.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, ParamSpec, Protocol, TypeVar, overload

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request

from .errors import StreamLeaseError
from .manager import StreamLeaseManager
from .resources import Resource

P = ParamSpec("P")
R = TypeVar("R")
BUSY = "Server busy, please retry later"


class EndpointDecorator(Protocol):
    """What :meth:`Limiter.resources` returns: it makes an endpoint, sync or async, an async one
    with the same parameters and result."""

    @overload
    def __call__(self, endpoint: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]: ...
    @overload
    def __call__(self, endpoint: Callable[P, R]) -> Callable[P, Awaitable[R]]: ...


class Limiter:
    """Caps how many requests use each resource at once.

    ``manager`` holds the leases (Redis for several workers); without one, an embedded store
    serves this process, as the original in-process limiter did.
    """

    def __init__(
        self,
        manager: StreamLeaseManager | None = None,
        *,
        resources: Sequence[Resource] = (),
        timeout: float = 5.0,
    ) -> None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
            raise ValueError(f"timeout must be a number of seconds >= 0, got {timeout!r}")
        self.manager = manager or StreamLeaseManager(url="memory://")
        self.timeout = float(timeout)
        self._registered: dict[int, Resource] = {}
        for position, resource in enumerate(resources):
            named = (
                resource
                if resource.name
                else dataclasses.replace(resource, name=f"resource{position}")
            )
            if any(r.name == named.name for r in self._registered.values()):
                raise ValueError(f"two resources are named {named.name!r}: names must be unique")
            self._registered[id(resource)] = named

    def _resolve(self, resources: Sequence[Resource]) -> list[Resource]:
        unknown = [r for r in resources if id(r) not in self._registered]
        if unknown:
            raise ValueError(
                f"{unknown!r} not registered: pass every resource to Limiter(resources=[...])"
            )
        return [self._registered[id(r)] for r in resources]

    @asynccontextmanager
    async def hold(
        self, *resources: Resource, request: Request | None = None
    ) -> AsyncIterator[None]:
        """Holds ``resources`` for the block; raises 503 (Starlette's ``HTTPException``, which
        FastAPI answers with ``{"detail": ...}``) if the wait runs out or the store is
        unreachable. With the ``request``, a client that goes away while waiting leaves the
        line."""
        named = self._resolve(resources)
        entered = False
        lease = self.manager.lease(
            None, resources=named, wait_timeout=self.timeout, request=request
        )
        try:
            async with lease:
                entered = True
                yield
        except StreamLeaseError as error:
            if entered:  # the endpoint's own failure, not the limiter's
                raise
            headers = {"Retry-After": str(error.retry_after or 1)}
            raise HTTPException(status_code=503, detail=BUSY, headers=headers) from error

    def resources(self, resources: Sequence[Resource]) -> EndpointDecorator:
        """Route decorator: holds ``resources`` while the endpoint runs (a sync one in the
        thread pool, as Starlette runs sync endpoints)."""
        named = list(resources)
        self._resolve(named)  # unknown resources fail at startup, not per request

        def decorate(endpoint: Callable[P, Any]) -> Callable[P, Awaitable[Any]]:
            is_async = inspect.iscoroutinefunction(endpoint)

            @functools.wraps(endpoint)
            async def wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
                async with self.hold(*named):
                    if is_async:
                        return await endpoint(*args, **kwargs)
                    return await run_in_threadpool(endpoint, *args, **kwargs)

            return wrapper

        return decorate

    def depends(self, *resources: Resource) -> Callable[[Request], AsyncIterator[None]]:
        """For ``Depends(limiter.depends(db, fs))``: holds the resources for the request (and
        leaves the line if its client goes away while waiting)."""
        named = list(resources)
        self._resolve(named)

        async def dependency(request: Request) -> AsyncIterator[None]:
            async with self.hold(*named, request=request):
                yield

        return dependency
