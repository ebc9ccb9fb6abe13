"""``StreamLeaseManager``: the API of the seed README, over the Rust core."""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Mapping,
    Sequence,
)
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, TypedDict, cast

from . import _core
from ._core import LeaseConfig
from ._environment import (
    FALLBACK_URL_VARIABLE,
    backend_url_from_environment,
    named_in_errors,
    say_fallback_once,
)
from ._redis_client import connection_of_redis_client
from ._server_workers import warn_about_the_local_floor, warn_if_several_workers
from ._stop_signals import calling_on_stop_signals
from .alerts import ThresholdCrossed, crossed, identities_of
from .client_ip import client_of
from .disconnect import unless_disconnected
from .errors import BackendError, RateLimited, StreamLeaseError
from .failure_policy import CircuitState
from .handlers import install_exception_handler
from .lease import Lease, ProtectedStreamingResponse, check_renew_interval, log
from .lifecycle import Lifecycle
from .observability.adapter import ADAPTER_METHODS, is_adapter
from .rates import PolicyEntry, Prices, RateDecision, RateLimit
from .resources import Resource
from .telemetry import global_providers_set, result_of
from .web import (
    KeyFunction,
    guard_websocket,
    rate_limit_decorator,
    rate_limit_dependency,
    remember,
)

if TYPE_CHECKING:
    from starlette.requests import HTTPConnection, Request
    from starlette.websockets import WebSocket

    from .observability.adapter import AdapterTelemetry
    from .telemetry import Telemetry

# How often a drain checks whether the worker's streams have ended (no Redis involved).
DRAIN_CHECK_SECONDS = 0.05

# Whose pool the startup check reads when the manager keeps no global pool.
STARTUP_CHECK_IDENTITY = "stream-lease-startup-check"

#: What a stream that runs out of token budget does (:meth:`StreamLeaseManager.acquire`).
OnBudget: TypeAlias = Literal["cut", "finish"]
#: A stream's reservation: answer tokens, ``(prompt_tokens, answer_tokens)``, or ``"auto"``
#: (sized from the request's ``prompt_tokens`` and ``max_tokens``).
Reserve: TypeAlias = int | tuple[int, int] | Literal["auto"] | None

#: What :meth:`StreamLeaseManager.lease` returns: ``async with`` it to hold a lease for a block.
LeaseScope: TypeAlias = AbstractAsyncContextManager[Lease]


class ManagerStats(TypedDict):
    """What :meth:`StreamLeaseManager.stats` reports (that method says what each key counts)."""

    held: int
    lost: int
    reclaimed: int
    revoked: int
    renew_failures: int
    unremoved: int
    unreleasable: int
    tags: int
    pruned: int
    closed: bool
    breaker_open: bool
    redis_calls: int
    redis_call_failures: int
    redis_call_micros: int
    waiting: int
    budget_streams: int
    unsettled: int
    settlements_dropped: int


class StreamLeaseManager:
    """Hands out leases: slots in capacity-limited pools (per user and global) that expire by
    themselves if their holder dies, are renewed while held, and are freed when released.

    Pass one of:

    * ``redis=<client>``: a ``redis.asyncio`` ``Redis``, ``RedisCluster`` or Sentinel
      ``master_for()`` client; the core reads its connection settings and opens its own
      multiplexed connection (the client itself is not used);
    * ``url="redis://host:port/db"``, ``"rediss://..."`` (TLS), ``"unix:///path"``,
      ``"redis+cluster://host:port,host:port"`` (``rediss+cluster://`` for TLS),
      ``"redis+sentinel://host:port,host:port/master_name"`` (following failovers);
    * neither: the URL in the environment variable ``STREAM_LEASE_URL``, else in ``REDIS_URL``
      (said once in the log), else ``memory://``: an embedded store for a single process.

    Build it at import time; it connects on first use. Tie it to the app's lifespan with
    :meth:`lifespan` (a drain when the server is told to stop, closed at shutdown), or close it
    with :meth:`aclose` there to release what this process holds.

    Metrics and traces (OpenTelemetry, :mod:`fastapi_stream_lease.telemetry`) are recorded
    with ``meter_provider`` / ``tracer_provider``, or with the app's global providers once it
    has set them; never a user id (``trace_identities=True`` adds its keyed hash to spans).
    In a sampled trace an acquire's facts are an event on the request's span; with
    ``acquire_spans=True`` each acquire is a span of its own, the request's child.

    ``tls_ca_file`` is the PEM file of a private CA that signed Redis' certificate (the system's
    trusted roots are used otherwise); a ``redis=`` client's ``ssl_ca_certs`` is taken over.

    ``on_threshold`` is told (a :class:`ThresholdCrossed`, run off the hot path as the
    lifecycle hooks are) when a hit or a stream start brings an identity's use of a rate policy
    or budget to one of the ``alert_at`` fractions of its limit (80 % and 100 % by default):
    once per policy, identity and threshold in each window across every worker (a sliding
    window's: again once the units that reached it have left the window), with the identity's
    keyed hash, never the identity. A policy built with ``RateLimit(..., alert_at=...)`` is told
    at its own fractions instead (``()``: never).
    With telemetry on, each is counted in ``fastapi_stream_lease.rate.threshold_crossed``.

    ``prices`` (a :class:`Prices` table) prices the budgets in money (``unit="cost"``) of every
    :meth:`acquire` that names its ``model`` and gives no ``prices`` of its own.

    ``telemetry`` (0.6's ``metrics``) is one of :mod:`fastapi_stream_lease.observability`'s
    adapters, which give the providers: ``OpenTelemetryMetrics()`` or ``PrometheusMetrics()``;
    or an adapter of one's own with 0.6's methods (``record_operation``, ``record_lost``, ...),
    told of acquires, lost leases and Redis errors instead.
    A ``fakeredis`` client given as ``redis=`` is served by the embedded store (for tests of an
    app, without a Redis server).
    """

    def __init__(
        self,
        redis: Any = None,
        config: LeaseConfig | None = None,
        telemetry: Any = None,
        metrics: Any = None,
        *,
        url: str | None = None,
        tls_ca_file: str | None = None,
        meter_provider: Any = None,
        tracer_provider: Any = None,
        trace_identities: bool = False,
        acquire_spans: bool = False,
        on_threshold: Callable[[ThresholdCrossed], Any] | None = None,
        alert_at: Sequence[float] = (0.8, 1.0),
        prices: Prices | None = None,
    ) -> None:
        if prices is not None and not isinstance(prices, Prices):
            raise TypeError(
                "prices must be a Prices table, Prices({'gpt-x': (input, output, cached_input)}),"
                f" got {type(prices).__name__}"
            )
        self._prices = prices
        if on_threshold is not None and not callable(on_threshold):
            raise TypeError(
                f"on_threshold must be a callable taking a ThresholdCrossed, got {on_threshold!r}"
            )
        if redis is not None and url is not None:
            raise TypeError("pass either redis=<client> or url=..., not both")
        self._redis = redis
        if url is None and redis is not None:
            url, client_ca_file = connection_of_redis_client(redis)
            tls_ca_file = tls_ca_file or client_ca_file
        from_variable = None  # the environment variable the URL came from
        if url is None and redis is None and (found := backend_url_from_environment()):
            url, from_variable = found
        defaulted = url is None
        if url is None:
            url = "memory://"
        elif not isinstance(url, str):
            raise TypeError(f"url must be a str such as 'redis://localhost:6379/0', got {url!r}")
        if config is None:
            config = LeaseConfig()
        elif not isinstance(config, LeaseConfig):
            raise TypeError(f"config must be a LeaseConfig, got {type(config).__name__}")
        adapter = telemetry if telemetry is not None else metrics
        own_adapter = None  # an adapter of 0.6's kind, told of events instead of the providers
        if adapter is not None:
            if telemetry is not None and metrics is not None:
                raise TypeError("pass telemetry= or its 0.6 name metrics=, not both")
            if meter_provider is not None or tracer_provider is not None:
                raise TypeError("pass telemetry= or meter_provider=/tracer_provider=, not both")
            if hasattr(adapter, "meter_provider"):
                meter_provider, tracer_provider = adapter.meter_provider, adapter.tracer_provider
            elif is_adapter(adapter):
                own_adapter = adapter
            else:
                raise TypeError(
                    "telemetry must be OpenTelemetryMetrics(), PrometheusMetrics() or an adapter "
                    f"with 0.6's methods ({', '.join(ADAPTER_METHODS)}), "
                    f"got {type(adapter).__name__}"
                )
        try:
            self._core = _core.Manager(url, config, tls_ca_file)
        except ValueError as error:
            if from_variable is None:
                raise
            raise named_in_errors(from_variable, error) from None
        if from_variable == FALLBACK_URL_VARIABLE:
            say_fallback_once(self._core.backend)
        if self._core.backend.startswith("memory://"):
            warn_if_several_workers(defaulted)
        elif config.failure_mode == "open":
            warn_about_the_local_floor(config)
        self._config = config
        self._adapter = adapter
        # Anything but "continue": "cancel", or a 0.6 on_lost hook (0.6 ended the stream).
        self._cancel_on_lost = config.on_lost != "continue"
        self._wait_timeout = config.wait_timeout
        self._proxy_rule = _core.ProxyRule(config.trusted_proxies, config.proxy_header)
        self._alert_at = _core.checked_thresholds(alert_at)
        # Whether the core reports thresholds reached (to on_threshold, or the metric): without
        # a listener, no hit looks for them.
        self._alerting = on_threshold is not None
        if self._alerting:
            self._core.alert_thresholds(self._alert_at)
        wanted = Lifecycle.wanted(config, on_threshold)
        self._lifecycle = Lifecycle(config, on_threshold) if wanted else None
        self._lease_headers = config.include_lease_headers
        self._leases: weakref.WeakSet[Lease] = weakref.WeakSet()
        # The requests of stream_lease() not finished yet, their leases released or not (their
        # background tasks run after the response): a drain waits for them too.
        self._requests: set[Lease] = set()
        self._closing = False
        for name, flag in (
            ("trace_identities", trace_identities),
            ("acquire_spans", acquire_spans),
        ):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be True or False, got {flag!r}")
        self._telemetry_settings = (
            meter_provider,
            tracer_provider,
            trace_identities,
            acquire_spans,
            own_adapter,
        )
        self._telemetry: Telemetry | AdapterTelemetry | None = None
        self._telemetry_resolved = False

    @property
    def config(self) -> LeaseConfig:
        """The limits and timings in force."""
        return self._config

    def client_ip(self, connection: HTTPConnection) -> str:
        """The address of the client of ``connection`` (a request or a WebSocket): the peer,
        or what ``LeaseConfig.proxy_header`` says when the peer is one of
        ``LeaseConfig.trusted_proxies`` (:func:`~fastapi_stream_lease.client_ip` says how).
        What the forms count when they are given no ``key``."""
        return client_of(connection, self._proxy_rule)

    @property
    def redis(self) -> Any:
        """The redis-py client given as ``redis=`` (None otherwise). The manager connects where
        it does, with its settings, over connections of its own: commands sent through this
        client neither reach nor see the manager's calls."""
        return self._redis

    @property
    def backend(self) -> str:
        """Where the leases live (``memory://`` or the Redis URL without its password)."""
        return self._core.backend

    async def acquire(
        self,
        user_id: str | None,
        *,
        weight: int = 1,
        max_per_user: int | None = None,
        wait_timeout: float | None = None,
        resources: Sequence[Resource] = (),
        request: Request | WebSocket | None = None,
        rate_limits: Sequence[PolicyEntry] = (),
        budgets: Sequence[PolicyEntry] = (),
        reserve: Reserve = None,
        on_budget: OnBudget = "cut",
        priority: int = 0,
        timeout: float | None = None,
        model: str | None = None,
        prices: Prices | None = None,
        prompt_tokens: int | None = None,
        max_tokens: int | None = None,
    ) -> Lease:
        """Takes ``weight`` slots for ``user_id`` in its per-user pool and the global pool, and in
        each of ``resources``, atomically: all or nothing, so no acquisition order can deadlock.
        ``user_id=None`` takes the resources only. ``max_per_user`` overrides the configured
        per-user cap for this call (a paid tier, say; 0 = no limit). When a shared pool (the
        global pool, a resource) has no room beyond what its earlier waiters need, waits in that
        pool's line, across every worker, up to ``wait_timeout`` seconds (default:
        ``LeaseConfig.wait_timeout``); a user over their own cap, counting their requests
        already waiting, is refused at once. Each
        pool's line serves higher ``priority`` first (0 to 9), then users in turn (round robin,
        first come first served within a user; ``LeaseConfig(line_order="arrival")`` for first
        come, first served). Pass the ``request`` (or the ``WebSocket``, before ``accept()``) so
        that a client that goes away while waiting leaves the line at once
        (:class:`ClientDisconnected`).

        ``rate_limits`` count the start against the user's request-rate policies in the same
        atomic step: a stream refused a slot consumes no rate, and a start refused for rate
        (:class:`RateLimited`, 429) takes no slot; ``lease.rate_decisions`` holds what each
        policy said.

        An entry of ``rate_limits`` or ``budgets`` paired with an identity of its own,
        ``(RateLimit, identity)``, counts that identity instead of the user: a team's, an API
        key's, a model's budget (``(team_tokens, team_id)``), every level checked, reserved,
        topped up, settled and refunded against its own identity in the same atomic step. Each
        policy in one call has a name of its own: the name says the level in the decisions, the
        headers and :meth:`usage`. On a Redis Cluster the levels share the global pool's slot
        (``global_pool=True``, the default).

        ``budgets`` are the user's token budgets (``RateLimit(..., unit="tokens")``, or
        ``"input_tokens"`` / ``"output_tokens"``, or ``"cost"``: see below). The stream reserves
        ``reserve`` tokens from each in the same atomic step (the prompt's tokens plus the
        request's ``max_tokens``; an int counts as answer tokens, a pair is ``(prompt_tokens,
        answer_tokens)``; left out, one top-up increment, 256): a reservation that does not fit
        is refused with :class:`RateLimited` (429, ``Retry-After`` when enough frees) and takes
        nothing; one larger than a budget's whole limit, which could never fit, with
        :class:`ReservationTooLarge` (400). ``reserve="auto"`` sizes it from the request:
        ``model`` (required), ``prompt_tokens`` and ``max_tokens`` (OpenAI's
        ``max_completion_tokens`` is passed as ``max_tokens``) reserve the prompt and
        ``max_tokens``; without ``max_tokens``, the prompt and the model's learned answer size
        (:meth:`answer_estimate`: 1,024 until 20 of its answers are settled), at most what
        the smallest budget holds after the prompt. A stream that names its ``model`` and ends
        on its own teaches the model its answer's size at settlement. Count
        the stream's tokens with ``lease.wrap(stream, tokens=...)`` or :meth:`Lease.consume`;
        when it runs past its budget mid-stream, ``on_budget="cut"`` (the default) ends it with
        :class:`BudgetExhausted`, ``"finish"`` lets it finish and charges the overage. On
        release it is charged what it used and the rest is given back at once.

        A budget in money, ``RateLimit(..., unit="cost")``, counts the price of the tokens in
        its unit: ``model`` names the model, priced by ``prices`` (a :class:`Prices` table;
        left out, the manager's): the reservation is the price of the prompt's tokens and the
        answer's, top-ups and settlement are priced the same way, and the stream is charged the
        whole cost rounded up once. A model the table lacks raises ``ValueError``.

        Raises :class:`PoolFull` (a :class:`StreamLeaseRejected`, as is every refusal) when a
        pool is full, :class:`BackendUnavailable` when Redis cannot be reached within
        ``redis_timeout``. Cancelling the call never leaves a slot taken, nor a place in line; a
        grant its cancelled caller never took gives back its token reservation and its start's
        ``rate_limits`` units too.

        ``timeout`` is 0.6's name of ``wait_timeout``.
        """
        if timeout is not None:
            if wait_timeout is not None:
                raise TypeError("pass wait_timeout or its 0.6 name timeout, not both")
            wait_timeout = timeout
        arguments = (
            user_id, weight, max_per_user, wait_timeout, resources, request,
            rate_limits, budgets, reserve, on_budget, priority,
            model, self._prices if prices is None else prices, prompt_tokens, max_tokens,
        )  # fmt: skip
        # The start's policies, in the order of its decisions, and whose each counted (the
        # user's, or the identity paired with it), for the threshold alerts.
        policies = (*rate_limits, *budgets)
        counted = (user_id, policies) if policies and user_id is not None else None
        telemetry = self._instruments()
        if telemetry is not None:
            traced = telemetry.trace_acquire(user_id, resources, policies)
            waits = (self._wait_timeout if wait_timeout is None else wait_timeout) > 0
            started = time.monotonic()
        try:
            # The core's awaitable itself, without a coroutine around it (at 64 streams at
            # once, each layer shows in the event loop's CPU); started inside the try, so that
            # arguments refused at once count as the acquire's result.
            handle = await self._start_acquire(*arguments)
        except BaseException as error:
            if telemetry is not None:
                telemetry.admitted(started, waits, traced, error)
            if isinstance(error, StreamLeaseError):
                # The message names pools and policies, never the identity.
                log.debug("acquire refused: %s", error, extra={"result": result_of(error)})
                if self._lifecycle is not None:
                    self._lifecycle.refused(user_id, error)
            raise
        # Taken: its start counts. A grant that came back but was never taken (this task
        # cancelled before it ran again) gives its start back when dropped.
        handle._take()
        if telemetry is None:
            return self._granted(handle, user_id, counted)
        decisions = handle.rate_decisions if policies else ()
        ended = telemetry.granted(started, waits, traced, decisions, bool(budgets))
        return self._granted(handle, user_id, counted, on_release=ended)

    def _granted(
        self,
        handle: _core.LeaseHandle,
        user_id: str | None,
        counted: tuple[str, Sequence[PolicyEntry]] | None,
        on_release: Callable[[Lease], None] | None = None,
    ) -> Lease:
        """The lease of a grant, tracked (:attr:`active_leases`) and told to the 0.6 hooks;
        the thresholds its start brought the ``counted`` (user, policies) to are told too."""
        if counted is not None and self._alerting:
            self._tell_thresholds(*counted, handle.rate_decisions)
        lease = Lease(
            handle,
            user_id=user_id,
            lease_seconds=self._config.lease_seconds,
            cancel_on_lost=self._cancel_on_lost,
            on_release=on_release,
            lifecycle=self._lifecycle,
            lease_headers=self._lease_headers,
        )
        self._leases.add(lease)
        if self._lifecycle is not None:
            self._lifecycle.acquired(lease)
        return lease

    def _tell_thresholds(
        self,
        identity: str,
        policies: Sequence[PolicyEntry],
        decisions: Sequence[RateDecision],
    ) -> None:
        """Tells ``on_threshold`` and the metric of the thresholds that the decisions of a
        consuming hit or start reached first in their window (``policies`` pair some with
        identities of their own). Its callers call it only while somebody listens
        (``_alerting``)."""
        if not any(decision.thresholds_reached for decision in decisions):
            return  # none reached: no digest
        telemetry = self._instruments()
        identities = identities_of(identity, policies)
        for alert in crossed(identities, decisions, self._core.identity_digest):
            if telemetry is not None:
                telemetry.threshold_crossed(alert)
            if self._lifecycle is not None:
                self._lifecycle.threshold_crossed(alert)

    def _instruments(self) -> Telemetry | AdapterTelemetry | None:
        """This manager's instruments, made on first use: a 0.6 adapter of one's own, told of
        events; else OpenTelemetry's with the providers it was given, or the app's global ones
        once set; None (no cost) otherwise."""
        if not self._telemetry_resolved:
            self._telemetry_resolved = True
            meters, tracers, identities, acquire_spans, own_adapter = self._telemetry_settings
            if own_adapter is not None:
                from .observability.adapter import AdapterTelemetry

                self._telemetry = AdapterTelemetry(own_adapter, lambda: self._core.stats()["held"])
            elif meters is not None or tracers is not None or global_providers_set():
                from .telemetry import Telemetry

                self._telemetry = Telemetry(self._core, meters, tracers, identities, acquire_spans)
                # The metric counts threshold alerts, so hits and starts report them from now on.
                self._alerting = True
                self._core.alert_thresholds(self._alert_at)
            # The forms' hit is the core's own from now on when nothing listens to hits (a 0.6
            # adapter is told none): no Python call of the manager's per hit.
            hits_heard = self._telemetry is not None and self._telemetry.hears_hits
            if not hits_heard and not self._alerting:
                self._hit_now = self._core.hit_now
        return self._telemetry

    def _start_acquire(
        self,
        user_id: str | None,
        weight: int,
        max_per_user: int | None,
        wait_timeout: float | None,
        resources: Sequence[Resource],
        request: Request | WebSocket | None,
        rate_limits: Sequence[PolicyEntry],
        budgets: Sequence[PolicyEntry],
        reserve: Reserve,
        on_budget: OnBudget,
        priority: int,
        model: str | None,
        prices: Prices | None,
        prompt_tokens: int | None,
        max_tokens: int | None,
    ) -> Awaitable[_core.LeaseHandle]:
        """Starts an acquire in the core (arguments it refuses raise here); resolves to the
        granted handle."""
        pools = [(r.name, r.capacity, r.max_waiting) for r in resources] or None
        arguments = _core.AcquireArgs(
            user_id=user_id,
            weight=weight,
            max_per_user=max_per_user,
            wait_timeout=wait_timeout,
            resources=pools,
            rate_limits=rate_limits or None,
            budgets=budgets or None,
            reserve=reserve,
            on_budget=on_budget if budgets or reserve is not None or on_budget != "cut" else None,
            priority=priority or None,
            model=model,
            prices=prices,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
        )
        acquired = self._core.acquire(arguments)
        if request is None:
            return acquired
        return self._acquire_for(request, acquired)

    @staticmethod
    async def _acquire_for(
        request: Request | WebSocket, acquired: Awaitable[_core.LeaseHandle]
    ) -> _core.LeaseHandle:
        """An acquire for a request or a WebSocket: given up if the client goes away while it waits;
        its decisions kept for the ``RateLimit`` headers."""
        try:
            handle = await unless_disconnected(request, acquired)
        except RateLimited as refused:
            remember(request.scope, refused.decisions)
            raise
        remember(request.scope, handle.rate_decisions, handle.pool_usage)  # for the headers
        return handle

    @asynccontextmanager
    async def lease(
        self,
        user_id: str | None,
        *,
        weight: int = 1,
        max_per_user: int | None = None,
        wait_timeout: float | None = None,
        resources: Sequence[Resource] = (),
        request: Request | WebSocket | None = None,
        rate_limits: Sequence[PolicyEntry] = (),
        budgets: Sequence[PolicyEntry] = (),
        reserve: Reserve = None,
        on_budget: OnBudget = "cut",
        priority: int = 0,
        timeout: float | None = None,
        model: str | None = None,
        prices: Prices | None = None,
        prompt_tokens: int | None = None,
        max_tokens: int | None = None,
        renew_interval: float | None = None,
    ) -> AsyncIterator[Lease]:
        """``async with manager.lease(user_id) as lease:`` holds a lease for the block (the
        arguments are :meth:`acquire`'s) and releases it however the block ends. Under
        ``on_lost="cancel"`` a lost lease cancels the block with :class:`LeaseLost`.
        ``renew_interval`` is checked as :meth:`Lease.wrap` checks it."""
        lease = await self.acquire(
            user_id,
            weight=weight,
            max_per_user=max_per_user,
            wait_timeout=wait_timeout,
            resources=resources,
            request=request,
            rate_limits=rate_limits,
            budgets=budgets,
            reserve=reserve,
            on_budget=on_budget,
            priority=priority,
            timeout=timeout,
            model=model,
            prices=prices,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
        )
        async with lease._held():
            if renew_interval is not None:
                check_renew_interval(renew_interval, self._config.lease_seconds)
            yield lease

    def stream_lease(
        self,
        *,
        user: Callable[..., Any],
        weight: int = 1,
        max_per_user: int | None = None,
        wait_timeout: float | None = None,
        resources: Sequence[Resource] = (),
        rate_limits: Sequence[PolicyEntry] = (),
        budgets: Sequence[PolicyEntry] = (),
        reserve: Reserve = None,
        on_budget: OnBudget = "cut",
        priority: int = 0,
        model: str | None = None,
        prices: Prices | None = None,
        prompt_tokens: int | None = None,
        max_tokens: int | None = None,
    ) -> Callable[..., AsyncIterator[Lease]]:
        """A FastAPI dependency that holds a lease for the whole response:
        ``lease: Lease = Depends(manager.stream_lease(user=current_user))``. ``user`` is a
        dependency (FastAPI resolves it) that returns the user id; the other arguments are
        :meth:`acquire`'s. It acquires before the endpoint runs (a refusal answers 429 or 503
        through :func:`install_exception_handler`, which it needs), yields the :class:`Lease`,
        and releases it when the response ends (its last body message is sent) or the client
        leaves: the request's background tasks run after that without a slot, and no revoke,
        lost lease or drain cancels them. It serves a path operation that
        ``yield``s Server-Sent Events (``response_class=EventSourceResponse``, GET or POST) or
        JSON Lines, one that returns a ``StreamingResponse``, a WebSocket route. Count tokens
        with :meth:`Lease.consume` (or ``lease.wrap(source, tokens=...)``) in the endpoint.

        A lost lease (``on_lost="cancel"``), a revoke or a drain ends the response at once, even
        while the endpoint waits for its next item, and a budget cut ends it after the item
        that used the budget up: the client gets a final event (see
        :class:`~fastapi_stream_lease.stream_end.StreamEndMiddleware`).

        ``Depends(manager.stream_lease(...), scope="function")`` (FastAPI 0.121 and later)
        releases the lease when the endpoint function returns, before the response is sent: an
        admission check only (the caps and ``rate_limits`` are checked and counted, the stream
        holds no slot). Raises ``RuntimeError`` on a FastAPI older than 0.118, which ran a
        ``yield`` dependency's exit before the body streamed."""
        from .lease_dependency import lease_dependency

        options = {
            "weight": weight, "max_per_user": max_per_user, "wait_timeout": wait_timeout,
            "resources": resources, "rate_limits": rate_limits, "budgets": budgets,
            "reserve": reserve, "on_budget": on_budget, "priority": priority,
            "model": model, "prices": prices,
            "prompt_tokens": prompt_tokens, "max_tokens": max_tokens,
        }  # fmt: skip
        return lease_dependency(self.acquire, self._requests, user, options)

    async def stream(
        self,
        user_id: str | None,
        stream: AsyncIterable[Any] | Iterable[Any],
        media_type: str | None = "text/event-stream",
        status_code: int = 200,
        headers: Mapping[str, str] | None = None,
        auto_renew: bool = True,
        renew_interval: float | None = None,
        close_source: bool = True,
        acquire_timeout: float | None = None,
        include_lease_headers: bool | None = None,
        timeout: float | None = None,
        **response_options: Any,
    ) -> ProtectedStreamingResponse:
        """The 0.6 API's one line: ``return await manager.stream(user_id, events())``
        acquires a lease (waiting up to ``acquire_timeout`` seconds, or ``timeout``, its other
        0.6 name; default ``LeaseConfig.wait_timeout``) and returns
        :meth:`Lease.as_streaming_response` over ``stream`` (its arguments are that method's).
        A refusal raises as :meth:`acquire` does; a response that cannot be built releases the
        lease."""
        if timeout is not None and acquire_timeout is not None:
            raise TypeError("pass acquire_timeout or its other name timeout, not both")
        lease = await self.acquire(user_id, wait_timeout=acquire_timeout, timeout=timeout)
        try:
            return lease.as_streaming_response(
                stream,
                media_type=media_type,
                status_code=status_code,
                headers=headers,
                auto_renew=auto_renew,
                renew_interval=renew_interval,
                close_source=close_source,
                include_lease_headers=include_lease_headers,
                **response_options,
            )
        except BaseException:
            await lease._release_quietly("error")
            raise

    async def hit(self, identity: str, *policies: PolicyEntry, cost: int = 1) -> list[RateDecision]:
        """Counts one request of ``identity`` (a user id, an IP address) against every policy at
        once, all or nothing, across every worker: a hit refused by one policy consumes from
        none. A policy paired with an identity of its own counts that one instead, in the same
        step: ``hit(ip, per_ip, (per_user_and_ip, f"{username}|{ip}"))`` (on a Redis Cluster
        this needs ``global_pool=True``, the default). Returns each policy's decision, in the
        order given; raises :class:`RateLimited` (429, ``Retry-After``) when one refuses.
        ``cost`` is how many units the request takes (1 by default). A dry-run policy
        (``RateLimit(enforce=False)``) never refuses: its decision says ``would_refuse``."""
        # Resolved first: with telemetry on, the hit reports the thresholds it reached. What
        # nobody listens to costs a hit no call.
        telemetry = self._telemetry if self._telemetry_resolved else self._instruments()
        decisions: list[RateDecision] = await self._core.hit(identity, policies, cost, True)
        if telemetry is not None:
            telemetry.rated(decisions)
        if self._alerting:
            self._tell_thresholds(identity, policies, decisions)
        return decisions

    def _hit_told(
        self, identity: str, policies: Sequence[PolicyEntry], cost: int
    ) -> Awaitable[list[RateDecision]]:
        """The forms' hit (``_hit_now``) until telemetry is looked for, and for good when
        something listens (telemetry, ``on_threshold``): :meth:`hit`, which tells them. Once
        nothing listens, ``_hit_now`` is the core's: the decisions themselves when nothing
        waits for them (units leased to this worker, the embedded store), else an awaitable."""
        return self.hit(identity, *policies, cost=cost)

    # A class attribute, so a manager holds no bound method of its own (no cycle to collect).
    _hit_now: Callable[
        [str, Sequence[PolicyEntry], int], list[RateDecision] | Awaitable[list[RateDecision]]
    ] = _hit_told  # type: ignore[assignment]

    async def peek(self, identity: str, policy: RateLimit) -> RateDecision:
        """What ``policy`` has left for ``identity``, without consuming anything."""
        (decision,) = await self._core.hit(identity, (policy,), 0, False)
        return decision

    async def usage(self, user_id: str, *budgets: PolicyEntry) -> dict[str, RateDecision]:
        """Each budget's state for ``user_id`` (or, paired with one, ``(budget, team_id)``,
        for the identity of its own), keyed by the budget's name, for a dashboard or an account
        page: ``used`` tokens in its window (the reservations of streams running now included),
        ``remaining``, ``limit`` and ``reset``. Nothing is consumed."""
        decisions = await self._core.hit(user_id, budgets, 0, False)
        return {decision.policy.name: decision for decision in decisions}

    async def answer_estimate(self, model: str, user_id: str | None = None) -> int:
        """The answer tokens ``reserve="auto"`` reserves for ``model`` when a request of
        ``user_id`` gives no ``max_tokens``, before the cap of what its budgets hold: the bound
        of the size bucket that holds the 95th percentile of the user's own settled answers of
        the model once it has 20 of them; else the model's figure, the same percentile of the
        users' sizes (each user counted once, at the bucket of their own 95th percentile) once
        20 users have answered; else 1,024. Without ``user_id``, the model's figure. The figure
        streams use: on Redis this worker's, read again at most every 10 s. Without a global
        pool (``global_pool=False``) ``user_id`` is needed."""
        return await self._core.answer_estimate(model, user_id)

    async def reset(self, identity: str, *policies: PolicyEntry) -> None:
        """Forgets ``identity``'s counts of ``policies`` (or, paired with one, the identity's
        own): a fresh allowance (for support staff)."""
        await self._core.forget_rates(identity, policies)

    async def revoke(self, user_id: str, ban_seconds: float = 0) -> int:
        """Ends every live stream and WebSocket of ``user_id`` on every worker: this one at
        once, the others within one renewal period (``renew_every``). Each ends the way a lost
        lease ends, with :class:`LeaseRevoked` at the stream's edge, and its slots are freed.
        For ``ban_seconds`` (up to 30 days) the user's new streams are refused with
        :class:`UserBanned` (403, ``Retry-After``). Nothing else of the user's (rate and budget
        counters) or of anyone else's is touched. Returns how many leases the user had.
        A stream that holds no user pool (``resources`` only) is not the user's, and streams
        that other workers admitted from their local floor during a Redis outage
        (``failure_mode="open"``) are not in Redis: only this worker's end."""
        revoked = await self._core.revoke(user_id, ban_seconds)
        digest = self._core.identity_digest(user_id)
        log.info(
            "revoked %d stream lease(s) of identity %s; new ones refused for %g s",
            revoked,
            digest,
            ban_seconds,
            extra={"identity_hash": digest, "revoked": revoked, "ban_seconds": ban_seconds},
        )
        return revoked

    def rate_limit(
        self, *policies: RateLimit, key: KeyFunction | None = None, cost: int = 1
    ) -> Callable[[Request], Awaitable[list[RateDecision]]]:
        """A FastAPI dependency: ``Depends(manager.rate_limit(per_minute, per_day))`` counts
        each request against the policies (all or nothing) and answers 429 when one refuses
        (through :func:`install_exception_handler`). ``key`` maps the request (sync or async)
        to the identity to count, e.g. the authenticated user; left out, the client's IP
        address (:meth:`client_ip`). The headers reach the response, a ``StreamingResponse``
        included, through the middleware :func:`install_exception_handler` adds (or
        :class:`RateLimitHeaders`)."""
        return rate_limit_dependency(self, policies, key, cost)

    def rate_limited(
        self, *policies: RateLimit, key: KeyFunction | None = None, cost: int = 1
    ) -> Callable[[Callable[..., Any]], Callable[..., Awaitable[Any]]]:
        """The route decorator form of :meth:`rate_limit` (put it below ``@app.get``); the
        endpoint needs no ``Request`` parameter, FastAPI still sees its signature."""
        return rate_limit_decorator(self, policies, key, cost)

    async def guard_websocket(
        self,
        websocket: WebSocket,
        *,
        connects: Sequence[RateLimit] = (),
        messages: Sequence[RateLimit] = (),
        key: KeyFunction | None = None,
    ) -> WebSocket:
        """Call before ``accept()``: counts the connect against ``connects``, then each message
        the client sends against ``messages``, however the endpoint reads it
        (``receive_text()``, ``iter_json()``, ``receive()``, ...); returns ``websocket``. A
        refused connect closes the socket with 1008 (before the handshake completes, clients see
        HTTP 403) and raises ``WebSocketDisconnect``; a refused message closes it with 1008 and
        reaches the reader as the client's disconnect (``WebSocketDisconnect``, or a
        ``websocket.disconnect`` message from ``receive()``), so the endpoint ends as when a
        client leaves."""
        return await guard_websocket(self, websocket, connects, messages, key)

    async def get_active_count(self, user_id: str | None = None) -> int:
        """Slots in use for ``user_id``, or across every process when ``user_id`` is None."""
        return await self._core.count(user_id)

    @property
    def active_leases(self) -> frozenset[Lease]:
        """The leases this process holds now (neither released nor lost), as 0.6 listed them."""
        return frozenset(
            lease for lease in list(self._leases) if not (lease.released or lease.lost)
        )

    @property
    def active_leases_count(self) -> int:
        """How many leases this process holds now (``stats()["held"]``)."""
        return self._core.stats()["held"]

    @property
    def circuit_state(self) -> CircuitState:
        """The circuit breaker in front of Redis: ``CircuitState.OPEN`` while it refuses calls
        at once (``stats()["breaker_open"]``), else ``CircuitState.CLOSED``. It is always on
        here (0.6 returned None without a ``failure_policy``)."""
        return CircuitState.OPEN if self._core.stats()["breaker_open"] else CircuitState.CLOSED

    @property
    def is_closing(self) -> bool:
        """True once :meth:`drain`, :meth:`close` or :meth:`aclose` began: new acquires are
        refused with :class:`ManagerClosed`."""
        return self._closing or bool(self._core.stats()["closed"])

    @property
    def metrics(self) -> Any:
        """The ``telemetry`` adapter given (0.6's alias of it), or None."""
        return self._adapter

    async def verify_cluster_config(
        self, strict: bool = False, retry_attempts: int = 3, retry_delay: float = 0.1
    ) -> bool:
        """The 0.6 API's startup check, kept for a lifespan's fail-fast: one call to the store
        (a count), tried ``retry_attempts`` times ``retry_delay`` seconds apart. True when it
        answered; else :class:`BackendUnavailable` under ``strict=True``, or a logged warning
        and False. There is no registered configuration to compare here: every call carries
        its caps and timings to Redis, so workers with other caps each apply their own, and
        :class:`ConfigurationMismatchError` is never raised."""
        if retry_attempts < 1:
            raise ValueError(f"retry_attempts must be at least 1, got {retry_attempts!r}")
        if retry_delay < 0:
            raise ValueError(f"retry_delay must be 0 or more seconds, got {retry_delay!r}")
        for attempt in range(retry_attempts):
            try:
                await self._probe_store()
                return True
            except BackendError as error:
                if attempt + 1 < retry_attempts:
                    await asyncio.sleep(retry_delay)
                    continue
                if self._lifecycle is not None:
                    self._lifecycle.refused(None, error)
                if strict:
                    raise
                log.warning("the store did not answer the startup check: %s", error)
        return False

    async def _probe_store(self) -> None:
        """The startup check's one read: the global pool's count or, without a global pool, the
        count of one user's pool under a name of the check's own."""
        await self._core.count(None if self.config.global_pool else STARTUP_CHECK_IDENTITY)

    def stats(self) -> ManagerStats:
        """This process's counters, for monitoring:

        * ``held``: leases it holds now;
        * ``lost``: leases lost so far: found gone from Redis with their slot taken meanwhile,
          or past their deadline without a successful renewal;
        * ``reclaimed``: leases a renewal found gone from Redis and took back (there was room);
        * ``revoked``: leases this process ended because of a drain or an operator's
          :meth:`revoke`;
        * ``renew_failures``: renewal script calls that failed (their leases are renewed by a
          later round, or lost at their deadline);
        * ``unremoved``: leases released or lost here whose removal from Redis failed, waiting
          for another try (at most 10,000);
        * ``unreleasable``: leases given up on release because Redis answered that removing
          them met an error a retry would meet again (a key of another type where one of their
          pools should be: another program writes under this ``key_prefix``); they were removed
          from their other pools, and their release raised :class:`BackendError`;
        * ``tags``: the Redis hash tags this process's holder is registered in: those where it
          holds leases (one tag per user with ``global_pool=False``, else one in all), and those
          where it held some lately; a tag where two renewal rounds in a row find it holds
          nothing, with no grant between them, is left (in Redis too), so this counts the users
          served lately, not every user ever served;
        * ``pruned``: members found in Redis under this process's name that belong to none of
          its leases (a release lost in a failover, say), and removed;
        * ``closed``: whether :meth:`aclose` has been called;
        * ``breaker_open``: whether the circuit breaker refuses calls instead of sending them;
        * ``redis_calls``, ``redis_call_failures``, ``redis_call_micros``: the script calls
          this manager made to Redis, those that failed (an error, a timeout, no connection)
          and the time they took in all, in microseconds (0 on the embedded store);
        * ``waiting``: its acquires waiting in line now;
        * ``budget_streams``: its streams with token budgets open now;
        * ``unsettled``: settlements of ended streams' budgets not applied yet: calls under way
          (top-ups in flight included: a stream that ends during one is settled when it
          returns), or whose call failed, waiting for another try (at most 10,000 of those); 0
          once every ended stream is settled;
        * ``settlements_dropped``: settlements given up: the queue was full (those that only give
          tokens back go first), or they still failed when the manager closed (their charges,
          the tokens streamed past a reservation, are lost: an under-count).
        """
        # The core builds exactly these keys (tests/test_leases.py checks them).
        return cast(ManagerStats, self._core.stats())

    async def aclose(self) -> None:
        """Stops renewal and releases every lease this process holds. On Redis that takes one
        release script call per 1,000 leases (of weight 1), a few calls in flight at once."""
        self._closing = True
        await self._core.aclose()

    async def drain(self, timeout: float = 5.0) -> None:
        """Drains this worker for a rolling deploy: stops admitting at once (new acquires get
        :class:`ManagerClosed`, 503 with ``Retry-After``, so a load balancer retries elsewhere;
        acquires waiting in line end with it at once, giving up their places), waits up to
        ``timeout`` seconds for the streams it holds to end (and for the requests of
        :meth:`stream_lease` to finish their background tasks), ends the rest as revoked
        (:class:`LeaseRevoked` at each stream's edge, whatever ``on_lost`` says), and closes the
        manager, releasing everything. Call it when the server is told to stop (SIGTERM), as
        :meth:`lifespan` does: by the lifespan's shutdown, uvicorn and gunicorn have already
        waited for (or cut off) every stream."""
        self._closing = True
        self._core.refuse_new()
        held = self._core.stats()["held"]
        log.info(
            "draining: refusing new streams, waiting up to %g s for %d", timeout, held,
            extra={"held": held, "timeout": timeout},
        )  # fmt: skip
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout, 0.0)
        # The count lives in the core, which has no event to await; the requests of
        # stream_lease() still running their background tasks are waited for too.
        while self._core.stats()["held"] or self._requests:
            if loop.time() >= deadline:
                break
            await asyncio.sleep(DRAIN_CHECK_SECONDS)
        revoked = self._core.revoke_held()
        if revoked:
            await asyncio.sleep(0)  # the streams' tasks see their revocation before the close
        await self.aclose()
        log.info(
            "drained: %d stream(s) ended on their own, %d revoked", held - revoked, revoked,
            extra={"held": held, "revoked": revoked},
        )  # fmt: skip
        if self._lifecycle is not None:  # the hooks of the streams that ended
            await self._lifecycle.flush(max(deadline - loop.time(), 0.0) + DRAIN_CHECK_SECONDS)

    @asynccontextmanager
    async def lifespan(
        self, app: object = None, *, drain_timeout: float = 5.0, check_backend: bool = False
    ) -> AsyncIterator[None]:
        """Ties the manager to the app's lifespan: ``FastAPI(lifespan=manager.lifespan)``, or,
        within the app's own lifespan, ``async with manager.lifespan(app, drain_timeout=20):``
        around its ``yield`` (``app`` is not used; Starlette passes it).

        At startup, ``check_backend=True`` reads one pool from the store, so an unreachable or
        misconfigured Redis fails the startup (:class:`BackendUnavailable`,
        :class:`BackendError`) instead of the first request. Then, where the server handles
        SIGTERM or SIGINT in Python (uvicorn and gunicorn's ASGI worker do), that signal also
        starts :meth:`drain` with ``drain_timeout`` at once: they run the lifespan's shutdown
        only after every connection has closed, too late to let streams finish or to end the
        rest. At shutdown, the drain started by the signal is awaited, or one is run (nothing to
        wait for by then), and the manager is closed (docs/recipes/deployment.md has the whole
        sequence)."""
        if check_backend:
            await self._probe_store()
        loop = asyncio.get_running_loop()
        drains: list[asyncio.Task[None]] = []

        def start_drain() -> None:
            if not drains:
                drains.append(loop.create_task(self.drain(drain_timeout)))

        try:
            with calling_on_stop_signals(loop, start_drain):
                yield
        finally:
            start_drain()
            await drains[0]

    async def close(self, drain: bool = True, timeout: float = 5.0) -> None:
        """The 0.6 API's shutdown: :meth:`drain` (``drain=True``, up to ``timeout`` seconds),
        else :meth:`aclose` at once."""
        if drain:
            await self.drain(timeout)
        else:
            await self.aclose()

    def register_exception_handlers(self, app: Any) -> None:
        """The 0.6 API's name for :func:`install_exception_handler`."""
        install_exception_handler(app)

    async def release(self, lease: Lease) -> None:
        """The 0.6 API's release: the same as ``await lease.release()``."""
        await lease.release()

    async def renew(self, lease: Lease) -> bool:
        """The 0.6 API's renewal: the same as ``await lease.renew()``."""
        return await lease.renew()

    async def __aenter__(self) -> StreamLeaseManager:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"StreamLeaseManager(backend={self.backend!r}, config={self.config!r})"
