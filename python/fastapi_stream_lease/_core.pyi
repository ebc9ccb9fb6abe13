"""Type stubs of the Rust core (checked against it with ``mypy.stubtest``)."""

from collections.abc import Awaitable, Iterable
from typing import final

from .rates import RateDecision

__all__ = [
    "LeaseConfig",
    "LeaseHandle",
    "LoopBridge",
    "Manager",
    "RateLimit",
    "__version__",
    "check_rate_limits",
]
__version__: str

@final
class LeaseConfig:
    """Limits and timings of a ``StreamLeaseManager``. Immutable; validated when built."""

    @property
    def lease_seconds(self) -> float: ...
    @property
    def max_per_user(self) -> int: ...
    @property
    def max_global(self) -> int: ...
    @property
    def global_pool(self) -> bool: ...
    @property
    def key_prefix(self) -> str: ...
    @property
    def renew_every(self) -> float: ...
    @property
    def redis_timeout(self) -> float: ...
    @property
    def wait_timeout(self) -> float: ...
    @property
    def retry_after(self) -> float: ...
    @property
    def on_lost(self) -> str: ...
    @property
    def failure_mode(self) -> str: ...
    @property
    def fallback_workers(self) -> int: ...
    @property
    def disclose_usage(self) -> bool: ...
    @property
    def trusted_proxies(self) -> list[str]: ...
    def __new__(
        cls,
        lease_seconds: float | None = None,
        max_per_user: int | None = None,
        max_global: int | None = None,
        key_prefix: str | None = None,
        *,
        global_pool: bool = True,
        renew_every: float | None = None,
        redis_timeout: float | None = None,
        wait_timeout: float | None = None,
        retry_after: float | None = None,
        on_lost: str | None = None,
        failure_mode: str | None = None,
        fallback_workers: int | None = None,
        identity_secret: str | bytes | None = None,
        disclose_usage: bool = True,
        trusted_proxies: Iterable[str] | None = None,
    ) -> LeaseConfig: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __ne__(self, value: object, /) -> bool: ...
    __hash__: None  # type: ignore[assignment]

@final
class LeaseHandle:
    """A slot held in every pool of one acquire, renewed by the manager until released."""

    @property
    def lease_id(self) -> str: ...
    @property
    def weight(self) -> int: ...
    @property
    def lost(self) -> bool: ...
    @property
    def released(self) -> bool: ...
    @property
    def rate_decisions(self) -> list[RateDecision]: ...
    @property
    def pool_usage(self) -> list[tuple[str, int, int]]: ...
    def release(self) -> Awaitable[bool]: ...
    def release_nowait(self) -> bool: ...
    def wait_lost(self) -> Awaitable[None]: ...

@final
class Manager:
    def __new__(cls, url: str, config: LeaseConfig, tls_ca_file: str | None = None) -> Manager: ...
    @property
    def config(self) -> LeaseConfig: ...
    @property
    def backend(self) -> str: ...
    def acquire(
        self,
        user_id: str | None,
        weight: int | None = None,
        max_per_user: int | None = None,
        wait_timeout: float | None = None,
        resources: list[tuple[str, int]] | None = None,
        rate_limits: Iterable[RateLimit] | None = None,
    ) -> Awaitable[LeaseHandle]: ...
    def hit(
        self,
        user_id: str,
        policies: Iterable[RateLimit | tuple[RateLimit, str]],
        cost: int,
        consume: bool,
    ) -> Awaitable[list[RateDecision]]: ...
    def forget_rates(self, user_id: str, policies: Iterable[RateLimit]) -> Awaitable[None]: ...
    def count(self, user_id: str | None = None) -> Awaitable[int]: ...
    def aclose(self) -> Awaitable[None]: ...
    def stats(self) -> dict[str, int | bool]: ...

@final
class LoopBridge:
    def _drain(self) -> None: ...

@final
class RateLimit:
    """At most ``limit`` hits per ``per`` seconds for each identity, across every worker."""

    def __new__(
        cls, name: str, limit: int, per: float, algorithm: str | None = None
    ) -> RateLimit: ...
    @property
    def name(self) -> str: ...
    @property
    def limit(self) -> int: ...
    @property
    def per(self) -> float: ...
    @property
    def algorithm(self) -> str: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

def check_rate_limits(policies: Iterable[RateLimit], cost: int) -> None:
    """Checks the policies of a hit of ``cost`` as every hit does."""
