"""Type stubs of the Rust core (checked against it with ``mypy.stubtest``)."""

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Literal, final

__all__ = [
    "TOP_UP_INCREMENT",
    "AcquireArgs",
    "LeaseConfig",
    "LeaseHandle",
    "LoopBridge",
    "Manager",
    "Prices",
    "ProxyRule",
    "RateDecision",
    "RateLimit",
    "__version__",
    "_acquire_call",
    "_release_call",
    "_script_source",
    "_settle_call",
    "check_rate_limits",
    "checked_thresholds",
    "monotonic",
    "rate_limit_header_fields",
    "rate_limit_header_values",
    "redact_url",
    "sentinel_url",
]
__version__: str
TOP_UP_INCREMENT: int
"""Tokens a budgeted stream's top-up reserves ahead of what it has streamed (256): it asks for
one when less than half of this is left, and may run this far past its reservation while the
top-up is on its way (see the token budgets guide)."""

@final
class AcquireArgs:
    """The arguments of one acquire, checked; the wait is the manager's default unless given."""

    def __new__(
        cls,
        *,
        user_id: str | None = None,
        weight: int | None = None,
        max_per_user: int | None = None,
        wait_timeout: float | None = None,
        resources: list[tuple[str, int, int | None]] | None = None,
        rate_limits: Iterable[RateLimit | tuple[RateLimit, str]] | None = None,
        budgets: Iterable[RateLimit | tuple[RateLimit, str]] | None = None,
        reserve: int | tuple[int, int] | Literal["auto"] | None = None,
        on_budget: str | None = None,
        priority: int | None = None,
        model: str | None = None,
        prices: Prices | None = None,
        prompt_tokens: int | None = None,
        max_tokens: int | None = None,
    ) -> AcquireArgs: ...

@final
class LeaseConfig:
    """Limits and timings of a ``StreamLeaseManager``. Immutable; validated when built, with an
    error that says what to change. Every argument is optional, with the default its
    constructor names (``LeaseConfig()`` shows them all)."""

    def __new__(
        cls,
        lease_seconds: float | None = None,
        max_per_user: int | None = None,
        max_global: int | None = None,
        key_prefix: str | None = None,
        *,
        global_pool: bool | None = None,
        lease_global_slots: bool | None = None,
        renew_every: float | None = None,
        redis_timeout: float | None = None,
        wait_timeout: float | None = None,
        line_order: Literal["fair", "arrival"] | None = None,
        max_waiting: int | None = None,
        wait_for_own_quota: bool | None = None,
        retry_after: float | None = None,
        on_lost: Literal["cancel", "continue"] | Callable[..., Any] | None = None,
        failure_mode: Literal["closed", "open"] | None = None,
        fallback_workers: int | None = None,
        identity_secret: str | bytes | None = None,
        disclose_usage: bool | None = None,
        enforce_rate_limits: bool | None = None,
        fencing_tokens: bool | None = None,
        trusted_proxies: Iterable[str] | None = None,
        proxy_header: str | None = None,
        fail_open: bool | None = None,
        retry_after_seconds: float | None = None,
        acquire_timeout: float | None = None,
        failure_policy: Any = None,
        include_lease_headers: bool | None = None,
        on_acquired: Callable[..., Any] | None = None,
        on_rejected: Callable[..., Any] | None = None,
        on_released: Callable[..., Any] | None = None,
        on_backend_error: Callable[..., Any] | None = None,
        hook_queue_size: int | None = None,
    ) -> LeaseConfig:
        """A configuration: a value left out takes the default below.

        Args:
            lease_seconds: A dead holder's slots free after this long (default 30.0).
            max_per_user: Streams one user holds at once, across every worker (default 3; 0: no
                limit).
            max_global: Streams across every worker at once (default 1000; 0: no limit).
            key_prefix: The Redis keys' prefix, without braces (default ``"stream_lease"``).
            global_pool: False: no ``max_global`` and no global count, so users spread over a
                Redis Cluster's shards (default True).
            lease_global_slots: True: each process takes the global pool's slots in slabs and
                starts streams from them, and each user's keys spread over a Redis Cluster's
                shards (default False; needs a ``max_global`` above 0).
            renew_every: The renewal period in seconds (default ``lease_seconds / 3``).
            redis_timeout: Bound on every Redis call, connecting included (default 1.0).
            wait_timeout: Seconds a request waits in line for shared capacity (default 0.0: refused
                at once).
            line_order: ``"fair"`` (users take turns, the default) or ``"arrival"``.
            max_waiting: Waiters a pool's line holds at most (default 0: no limit); more get
                ``LineFull`` (503).
            wait_for_own_quota: True: a waiting request over ``max_per_user`` waits too (default
                False: 429 at once).
            retry_after: The longest ``Retry-After`` told to a refused client (default 5.0).
            on_lost: ``"cancel"`` (a lost lease ends its stream, the default), ``"continue"`` (only
                ``lease.lost`` says), or a 0.6 callable ``on_lost(lease, reason)``.
            failure_mode: Redis down: ``"closed"`` refuses with 503 (the default); ``"open"``
                admits within a local floor of the caps.
            fallback_workers: Workers sharing the caps, for the local floor (cap / workers; default
                1).
            identity_secret: The HMAC key (str or bytes, 16 or more random bytes, the same on
                every worker) that hides user ids in Redis keys (default:
                ``$STREAM_LEASE_IDENTITY_SECRET``; on Redis without either, a
                ``StreamLeaseWarning``).
            disclose_usage: False: refusals by shared pools (global, resources) tell no usage
                (default True).
            enforce_rate_limits: False: every request rate is a dry run, counted, never refusing
                (default True).
            fencing_tokens: True: each grant takes a fencing token, ``lease.fencing_token`` (one
                Redis ``INCR`` each; default False).
            trusted_proxies: Reverse proxies (addresses, CIDR networks) whose ``proxy_header`` is
                read for the client's address (default: none).
            proxy_header: The header those proxies write the client's address into (default
                ``"X-Forwarded-For"``).
            fail_open: 0.6's name: True is ``failure_mode="open"``; must agree with it.
            retry_after_seconds: 0.6's name of ``retry_after`` (pass one of the two).
            acquire_timeout: 0.6's name of ``wait_timeout``; above 0 with the global pool,
                ``wait_for_own_quota=True`` too.
            failure_policy: A ``BackendFailurePolicy`` (0.6): its ``fallback_mode`` sets
                ``failure_mode``.
            include_lease_headers: ``X-Stream-Lease-*`` headers on 0.6's streaming responses
                (default False).
            on_acquired: A lifecycle hook (sync or async), run off the hot path (default None).
            on_rejected: A lifecycle hook, as ``on_acquired``.
            on_released: A lifecycle hook, as ``on_acquired``.
            on_backend_error: A lifecycle hook, as ``on_acquired``.
            hook_queue_size: Hook events queued at most; more are dropped, with a warning (default
                1024).
        """

    @property
    def lease_seconds(self) -> float: ...
    @property
    def max_per_user(self) -> int: ...
    @property
    def max_global(self) -> int: ...
    @property
    def global_pool(self) -> bool: ...
    @property
    def lease_global_slots(self) -> bool: ...
    @property
    def key_prefix(self) -> str: ...
    @property
    def renew_every(self) -> float: ...
    @property
    def redis_timeout(self) -> float: ...
    @property
    def wait_timeout(self) -> float: ...
    @property
    def line_order(self) -> str: ...
    @property
    def max_waiting(self) -> int: ...
    @property
    def wait_for_own_quota(self) -> bool: ...
    @property
    def retry_after(self) -> float: ...
    @property
    def on_lost(self) -> str | Callable[..., Any]: ...
    @property
    def failure_mode(self) -> str: ...
    @property
    def fallback_workers(self) -> int: ...
    @property
    def disclose_usage(self) -> bool: ...
    @property
    def enforce_rate_limits(self) -> bool: ...
    @property
    def fencing_tokens(self) -> bool: ...
    @property
    def trusted_proxies(self) -> list[str]: ...
    @property
    def proxy_header(self) -> str: ...
    @property
    def fail_open(self) -> bool: ...
    @property
    def retry_after_seconds(self) -> float: ...
    @property
    def acquire_timeout(self) -> float: ...
    @property
    def failure_policy(self) -> Any: ...
    @property
    def include_lease_headers(self) -> bool: ...
    @property
    def hook_queue_size(self) -> int: ...
    @property
    def on_acquired(self) -> Callable[..., Any] | None: ...
    @property
    def on_rejected(self) -> Callable[..., Any] | None: ...
    @property
    def on_released(self) -> Callable[..., Any] | None: ...
    @property
    def on_backend_error(self) -> Callable[..., Any] | None: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __ne__(self, value: object, /) -> bool: ...
    __hash__: None  # type: ignore[assignment]

@final
class LeaseHandle:
    """A slot held in every pool of one acquire, renewed by the manager until released."""

    def _take(self) -> None: ...
    @property
    def lease_id(self) -> str: ...
    @property
    def weight(self) -> int: ...
    @property
    def fencing_token(self) -> int: ...
    @property
    def deadline(self) -> float | None: ...
    @property
    def lost(self) -> bool: ...
    @property
    def released(self) -> bool: ...
    @property
    def revoked(self) -> bool: ...
    @property
    def revoked_ban_seconds(self) -> int: ...
    @property
    def rate_decisions(self) -> list[RateDecision]: ...
    @property
    def pool_usage(self) -> list[tuple[str, int, int]]: ...
    def release(self) -> Awaitable[bool]: ...
    def release_nowait(self) -> bool: ...
    def release_at_end(self) -> None: ...
    def consume(self, tokens: int) -> None: ...
    def report_usage(
        self, input_tokens: int, output_tokens: int, cached_input_tokens: int
    ) -> None: ...
    @property
    def tokens_used(self) -> tuple[int, int] | None: ...
    @property
    def tokens_references(self) -> tuple[tuple[int, int], int] | None: ...
    @property
    def budget_exhausted(self) -> bool: ...
    @property
    def budget_waiting(self) -> bool: ...
    def budget_ready(self) -> Awaitable[None]: ...
    def wait_lost(self) -> asyncio.Future[None]: ...

@final
class Manager:
    def __new__(cls, url: str, config: LeaseConfig, tls_ca_file: str | None = None) -> Manager: ...
    @property
    def config(self) -> LeaseConfig: ...
    @property
    def backend(self) -> str: ...
    def acquire(self, arguments: AcquireArgs) -> Awaitable[LeaseHandle]: ...
    def hit(
        self,
        user_id: str,
        policies: Iterable[RateLimit | tuple[RateLimit, str]],
        cost: int,
        consume: bool,
    ) -> Awaitable[list[RateDecision]]: ...
    def hit_now(
        self,
        user_id: str,
        policies: Iterable[RateLimit | tuple[RateLimit, str]],
        cost: int,
    ) -> list[RateDecision] | Awaitable[list[RateDecision]]: ...
    def alert_thresholds(self, alert_at: Sequence[float]) -> None: ...
    def forget_rates(
        self, user_id: str, policies: Iterable[RateLimit | tuple[RateLimit, str]]
    ) -> Awaitable[None]: ...
    def count(self, user_id: str | None = None) -> Awaitable[int]: ...
    def aclose(self) -> Awaitable[None]: ...
    def answer_estimate(self, model: str, user_id: str | None = None) -> Awaitable[int]: ...
    def identity_digest(self, user_id: str) -> str: ...
    def slots_by_pool(self) -> list[tuple[str, int]]: ...
    def time_leases(self) -> None: ...
    def collect_lease_times(self) -> tuple[int, list[float], int]: ...
    def shared_usage(self) -> Awaitable[list[tuple[str, int, int]]]: ...
    def refuse_new(self) -> None: ...
    def revoke(self, user_id: str, ban_seconds: float | None = None) -> Awaitable[int]: ...
    def revoke_held(self) -> int: ...
    def stats(self) -> dict[str, int | bool]: ...

@final
class LoopBridge:
    def _drain(self) -> None: ...
    def _send_calls(self) -> None: ...

@final
class ProxyRule:
    """Which peers are reverse proxies, and the header they write the client's address into."""

    def __new__(
        cls, trusted_proxies: Iterable[str] | None = None, proxy_header: str | None = None
    ) -> ProxyRule: ...
    @property
    def header(self) -> str: ...
    def client(self, peer: str | None, lines: list[str]) -> str: ...

@final
class RateDecision:
    """What one policy said about a hit: its ``limit`` (the policy's, or this process's share of
    it while Redis is down under ``failure_mode="open"``), ``remaining`` units in its window
    after the hit (before it, when refused or only looked at), ``reset``, seconds until its next
    units free up (0 when nothing is in use), ``used``, the units in its window (above the limit
    when a token budget's stream finished past it, or a dry run counted past it), and
    ``would_refuse``: the policy had no room for the hit's cost, so it refused, or, a dry run
    (``RateLimit(enforce=False)``, ``LeaseConfig(enforce_rate_limits=False)``), would have.
    ``thresholds_reached``: the policy's ``alert_at`` fractions (its own, else the manager's)
    this hit or start brought the use to first in the window, across every worker (empty
    unless the manager has ``on_threshold`` or telemetry). Immutable; equal when every field
    is."""

    def __new__(
        cls,
        policy: RateLimit,
        limit: int,
        remaining: int,
        reset: float,
        used: int,
        would_refuse: bool = False,
        thresholds_reached: Sequence[float] = (),
    ) -> RateDecision: ...
    @property
    def policy(self) -> RateLimit: ...
    @property
    def limit(self) -> int: ...
    @property
    def remaining(self) -> int: ...
    @property
    def reset(self) -> float: ...
    @property
    def used(self) -> int: ...
    @property
    def would_refuse(self) -> bool: ...
    @property
    def thresholds_reached(self) -> tuple[float, ...]: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class RateLimit:
    """At most ``limit`` hits per ``per`` seconds for each identity, across every worker.

    ``per`` is seconds, or a window as text: ``"second"``, ``"minute"``, ``"hour"``, with a
    count (``"30 seconds"``); ``"day"``, ``"week"`` or ``"month"`` makes a calendar window: a
    fixed window that ends at the next UTC midnight, Monday 00:00 or 1st of the month 00:00
    (``calendar`` names it). Or the limit is a rate that names its window, ``per`` left out:
    ``RateLimit("chat", "5/minute")``, ``"100 per hour"``, ``"10/30 seconds"`` (the notation of
    ``limits`` and slowapi)."""

    def __new__(
        cls,
        name: str,
        limit: int | str,
        per: float | str | None = None,
        algorithm: str | None = None,
        unit: str | None = None,
        *,
        enforce: bool = True,
        alert_at: Sequence[float] | None = None,
        lease_units: bool = False,
    ) -> RateLimit: ...
    @property
    def name(self) -> str: ...
    @property
    def limit(self) -> int: ...
    @property
    def per(self) -> float: ...
    @property
    def calendar(self) -> str | None: ...
    @property
    def algorithm(self) -> str: ...
    @property
    def unit(self) -> str: ...
    @property
    def enforce(self) -> bool: ...
    @property
    def alert_at(self) -> tuple[float, ...] | None: ...
    @property
    def lease_units(self) -> bool: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class Prices:
    """A price table for the budgets in money (``RateLimit(..., unit="cost")``):
    ``Prices({"gpt-x": (input, output, cached_input)})``, each price a non-negative int in the
    budgets' unit (cents, microdollars: the app chooses) per million tokens, for the prompt's
    tokens, the answer's, and the prompt's tokens read from the provider's cache. Give it to
    ``acquire(..., model=..., prices=...)`` or once to ``StreamLeaseManager(..., prices=...)``;
    a model the table lacks is refused with a ``ValueError``."""

    def __new__(cls, table: dict[str, tuple[int, int, int]]) -> Prices: ...
    @property
    def models(self) -> list[str]: ...
    def __getitem__(self, model: str, /) -> tuple[int, int, int]: ...
    def __contains__(self, model: str, /) -> bool: ...
    def __len__(self) -> int: ...

def check_rate_limits(policies: Iterable[RateLimit], cost: int) -> None:
    """Checks the policies of a hit of ``cost`` as every hit does."""

def rate_limit_header_fields(
    decisions: Iterable[RateDecision],
    pools: Iterable[tuple[str, int, int]],
    headers: Iterable[Sequence[bytes]],
) -> list[tuple[bytes, bytes]]:
    """The ``ratelimit-policy`` and ``ratelimit`` fields of ``decisions`` and ``pools`` as an
    ASGI response start lists its headers, less those its own ``headers`` name already."""

def rate_limit_header_values(
    decisions: Iterable[RateDecision], pools: Iterable[tuple[str, int, int]]
) -> tuple[str, str] | None:
    """The ``RateLimit-Policy`` and ``RateLimit`` values of ``decisions`` and of a stream's
    capped ``pools`` (name, capacity, slots in use); None when both are empty."""

def checked_thresholds(alert_at: Sequence[float]) -> tuple[float, ...]:
    """``alert_at`` checked as every manager and policy checks it: the fractions kept,
    ascending, each to a millionth."""

def monotonic() -> float:
    """Seconds on the core's monotonic clock (``LeaseHandle.deadline`` is on it)."""

def redact_url(url: str) -> str:
    """A store URL with its credentials hidden (``redis://:***@host:6379/0``)."""

def sentinel_url(
    url: str,
) -> tuple[list[tuple[str, int]], str, int, str | None, str | None, str | None, str | None]:
    """The parts of a ``redis+sentinel://`` URL as the manager reads them: sentinels, master,
    db, user, password, sentinel user, sentinel password (``ValueError`` naming what is wrong)."""

def _settle_call(
    settlement_id: str, answers_key: str, own_key: str, answer_tokens: int
) -> tuple[list[bytes], list[bytes]]:
    """The keys and arguments of the ``settle`` script's call that settles ``settlement_id`` by
    counting an answer of ``answer_tokens`` tokens in the identity's histogram ``own_key`` and
    so in its model's ``answers_key`` (its bucket computed as the store computes it), with
    nothing to charge or give back."""

def _acquire_call(
    holder: int,
    ttl_ms: int,
    leases: list[tuple[str, int, list[tuple[str, int]]]],
    *,
    fencing_tokens: bool = False,
) -> tuple[list[bytes], list[bytes]]:
    """The keys and arguments of the ``acquire`` script's call that decides ``leases`` in order,
    as the Redis store sends it for holder ``holder``, leases of ``ttl_ms`` ms, without a waiting
    line or rate limits, renewed every third of a lease (the default); each grant takes a fencing
    token when ``fencing_tokens``. Each lease is ``(lease id, weight, [(pool key, capacity),
    ...])``: an id as the core makes them (32 lowercase hex digits, ``uuid4().hex``), capacity 0
    for unlimited; all pools are in one hash tag, whose holders key leads the keys."""

def _release_call(
    holder: int,
    leases: list[tuple[str, int, list[tuple[str, int]]]],
) -> tuple[list[bytes], list[bytes]]:
    """The keys and arguments of the ``release`` script's call that releases ``leases``, as the
    Redis store sends it for holder ``holder``, with no waiting line to wake. Each lease is given
    as to ``_acquire_call`` (capacities unused)."""

def _script_source(name: str) -> str:
    """The code of the core's Lua script ``name`` (``"acquire"``, ``"release"``...) as a script
    of its own, to the byte as the core sends it to a server without functions: the prelude, the
    start of a call, the script. For tests and benchmarks that call a script alone. Raises
    ValueError for a name that is not one of the core's scripts."""
