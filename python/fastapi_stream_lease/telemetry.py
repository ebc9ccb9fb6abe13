"""OpenTelemetry metrics and traces, shaped after ASP.NET Core's rate-limiting instruments, in
this library's namespace. Nothing here is imported unless a manager is given a provider or the
OpenTelemetry API is installed (FastAPI brings it); without an SDK the API's no-op providers
make every call nearly free.

Privacy: attributes and span events carry pool and policy names, results and durations, never a
user id, a header or a body. With ``trace_identities=True`` a span carries the identity's keyed
hash (the one in the Redis keys), never the identity.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import time
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .errors import (
    BackendError,
    ClientDisconnected,
    LineFull,
    ManagerClosed,
    PoolFull,
    RateLimited,
    StreamLeaseError,
    UserBanned,
)
from .rates import policy_of

if TYPE_CHECKING:
    from ._core import Manager
    from .alerts import ThresholdCrossed
    from .lease import Lease
    from .rates import PolicyEntry, RateDecision
    from .resources import Resource

NAME = "fastapi_stream_lease"

log = logging.getLogger(NAME)

#: Every value the ``result`` attribute of ``fastapi_stream_lease.requests`` takes.
RESULTS = (
    "acquired",
    "per_user",
    "global",
    "resource",
    "rate",
    "budget",
    "banned",
    "line_full",
    "backend_unavailable",
    "closed",
    "canceled",
    "invalid",
)


def global_providers_set() -> bool:
    """Whether the app has set OpenTelemetry's global meter or tracer provider (without it,
    the API's proxies record nothing, and a manager skips its instruments altogether)."""
    try:
        from opentelemetry import metrics, trace
    except ImportError:
        return False
    meters = type(metrics.get_meter_provider()).__name__
    return meters not in ("_ProxyMeterProvider", "NoOpMeterProvider") or not isinstance(
        trace.get_tracer_provider(), (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
    )


def result_of(error: BaseException | None) -> str:
    """The ``result`` of an acquire that ended with ``error`` (None: granted)."""
    if error is None:
        return "acquired"
    if isinstance(error, LineFull):
        return "line_full"
    if isinstance(error, PoolFull):
        return error.limit if error.limit in ("per_user", "global") else "resource"
    if isinstance(error, RateLimited):
        units = {d.policy.name: d.policy.unit for d in error.decisions}
        return "rate" if units.get(error.policy, "requests") == "requests" else "budget"
    if isinstance(error, ManagerClosed):
        return "closed"
    if isinstance(error, UserBanned):
        return "banned"
    if isinstance(error, BackendError):
        return "backend_unavailable"
    if isinstance(error, ClientDisconnected) or not isinstance(error, Exception):
        return "canceled"  # the client left, or asyncio.CancelledError
    return "invalid"


#: Seconds between two reads of the shared pools' use from Redis (one call each), at least.
SAMPLE_EVERY = 1.0


class PoolSampler:
    """The use of one manager's shared pools across every worker (``pool.used`` and
    ``pool.capacity``), read from Redis by one call when a reader collects, at most once a
    second: never per request. A reader in another thread (a periodic exporter, Prometheus'
    HTTP server) waits for the read, up to ``redis_timeout``; one collecting on the manager's own
    event loop is never blocked: it starts the read and gets the previous figures."""

    def __init__(self, core: Manager) -> None:
        self.core = core
        self.loop: asyncio.AbstractEventLoop | None = None
        self.figures: list[tuple[str, int, int]] = []
        self.read_at = -SAMPLE_EVERY
        self.timeout = core.config.redis_timeout + 0.5
        self.reading: asyncio.Future[None] | None = None

    def sample(self) -> list[tuple[str, int, int]]:
        loop, now = self.loop, time.monotonic()
        if loop is None or loop.is_closed() or now - self.read_at < SAMPLE_EVERY:
            return self.figures
        self.read_at = now
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self.reading = asyncio.ensure_future(self.read())
            return self.figures
        try:
            asyncio.run_coroutine_threadsafe(self.read(), loop).result(self.timeout)
        except (concurrent.futures.TimeoutError, RuntimeError):
            pass  # the loop is busy or stopping: the figures stay as they were
        return self.figures

    async def read(self) -> None:
        try:
            self.figures = await self.core.shared_usage()
        except StreamLeaseError:
            self.figures = []  # no figure rather than a stale one while Redis is away


class Observed:
    """What the observable instruments of one meter provider read, for every manager that
    records there (an instrument is made once per provider: a second one of the same name
    would be ignored): results counted per acquire, and the managers' cores."""

    def __init__(self, meter: Any) -> None:
        from opentelemetry.metrics import Observation

        self.results: dict[str, int] = {}
        self.members: weakref.WeakSet[Telemetry] = weakref.WeakSet()

        def summed(key: str, scale: float = 1) -> Any:
            def observe(_options: Any) -> list[Any]:
                total = sum(m.core.stats()[key] for m in list(self.members))
                return [Observation(total * scale)]

            return observe

        def redis_calls(_options: Any) -> list[Any]:
            stats = [m.core.stats() for m in list(self.members)]
            failed = sum(s["redis_call_failures"] for s in stats)
            ok = sum(s["redis_calls"] for s in stats) - failed
            return [Observation(ok, {"outcome": "ok"}), Observation(failed, {"outcome": "error"})]

        def shared(figure: Callable[[tuple[str, int, int]], int]) -> Any:
            def observe(_options: Any) -> list[Any]:
                # The same pool seen by two managers of one process is one pool.
                figures = {f[0]: figure(f) for m in list(self.members) for f in m.sampler.sample()}
                return [Observation(n, {"pool": pool}) for pool, n in figures.items()]

            return observe

        def results(_options: Any) -> list[Any]:
            # The first callback of every collection, before the histograms are read.
            for member in list(self.members):
                taken = member.collect_lease_times()
                self.results["acquired"] = self.results.get("acquired", 0) + taken
                member.time_in_queue.flush()
            counts = dict(self.results)
            return [Observation(n, {"result": result}) for result, n in counts.items()]

        meter.create_observable_counter(
            f"{NAME}.requests",
            [results],
            unit="{request}",
            description="Acquires, by result (acquired, per_user, global, resource, rate, "
            "budget, banned, line_full, backend_unavailable, closed, canceled, invalid).",
        )
        pools_seen: set[str] = set()

        def active(_options: Any) -> list[Any]:
            held = {pool: 0 for pool in pools_seen}  # a pool no longer held reads 0, not nothing
            for member in list(self.members):
                for pool, n in member.core.slots_by_pool():
                    held[pool] = held.get(pool, 0) + n
            pools_seen.update(held)
            return [Observation(n, {"pool": pool}) for pool, n in held.items()]

        meter.create_observable_up_down_counter(
            f"{NAME}.leases.active",
            [active],
            unit="{lease}",
            description="Slots held by this process, per pool.",
        )
        meter.create_observable_up_down_counter(
            f"{NAME}.requests.queued",
            [summed("waiting")],
            unit="{request}",
            description="Acquires waiting in line for shared capacity.",
        )
        meter.create_observable_counter(
            f"{NAME}.redis.calls",
            [redis_calls],
            unit="{call}",
            description="Script calls to Redis, by outcome (ok, error: an error, a timeout, "
            "no connection).",
        )
        meter.create_observable_counter(
            f"{NAME}.redis.call.time",
            [summed("redis_call_micros", scale=1e-6)],
            unit="s",
            description="Time spent in script calls to Redis, in all (its rate over the calls' "
            "rate is the mean latency).",
        )
        meter.create_observable_gauge(
            f"{NAME}.pool.used",
            [shared(lambda figures: figures[1])],
            unit="{slot}",
            description="Slots in use in each shared pool across every worker (from Redis, "
            "one call per collection).",
        )
        meter.create_observable_gauge(
            f"{NAME}.pool.capacity",
            [shared(lambda figures: figures[2])],
            unit="{slot}",
            description="Capacity of each shared pool (0: unlimited).",
        )
        for create, name, key, description in (
            (meter.create_observable_counter, "leases.lost", "lost",
             "Leases found lost (gone from Redis, slot taken)."),
            (meter.create_observable_counter, "leases.reclaimed", "reclaimed",
             "Leases found gone from Redis and taken back."),
            (meter.create_observable_counter, "leases.revoked", "revoked",
             "Leases ended by a drain or an operator's revoke."),
            (meter.create_observable_up_down_counter, "breaker.open", "breaker_open",
             "Managers whose circuit breaker refuses calls."),
        ):  # fmt: skip
            create(
                f"{NAME}.{name}",
                [summed(key)],
                description=description,
            )


#: Durations kept for the next collection, at most; beyond, each is recorded at once.
MAX_BUFFERED = 100_000


class BufferedHistogram:
    """A histogram whose values are recorded when a reader collects: one SDK record costs tens
    of microseconds on a request's path (its exemplar filter, attributes, locks, and cold
    caches between the other work), a third of that in one loop at collection. A deque, so the
    event loop appends while a reader's thread takes."""

    def __init__(self, histogram: Any) -> None:
        self.histogram = histogram
        self.values: collections.deque[float] = collections.deque()

    def record(self, value: float) -> None:
        if len(self.values) < MAX_BUFFERED:
            self.values.append(value)
        else:
            self.histogram.record(value)

    def flush(self) -> None:
        record, values = self.histogram.record, self.values
        while values:
            try:
                record(values.popleft())
            except IndexError:  # another reader's thread took the last one
                return


#: Per meter provider, what its observable instruments read.
_OBSERVED: weakref.WeakKeyDictionary[Any, Observed] = weakref.WeakKeyDictionary()


class Traced:
    """The facts of one sampled acquire, and the span that gets them: the library's own (``own``:
    the facts become its attributes and it ends with the acquire) or the request's (the facts
    become an event on it, and the result one of its attributes)."""

    __slots__ = ("facts", "own", "span")

    def __init__(self, span: Any, facts: dict[str, Any], own: bool) -> None:
        self.span, self.facts, self.own = span, facts, own


class Telemetry:
    """The instruments and tracer of one manager. The SDK costs microseconds per record
    (a histogram's 6.5 on a 2 GHz Xeon), so what can be is counted and kept until a
    reader collects, and an acquire granted outside a sampled trace runs no Python of this
    class but the trace check: the core counts the grants its callers take and keeps how long
    each lease was held; refusals are counted here (a dict increment); the leases held per
    pool (from the core), the shared pools' use (from Redis) and the waiters in line (from the
    core) are read at collection; the held times, and the time in queue of acquires that could
    wait, are recorded into the histograms then. Per acquire, in a sampled trace only: an event
    on the request's span (a span of the library's own is dearer: the SDK's span costs about
    three times the event), and one at its release; per release, with budgets, the tokens."""

    #: Every hit is told (:meth:`rated`: the dry runs that would have refused).
    hears_hits = True

    def __init__(
        self,
        core: Manager,
        meter_provider: Any = None,
        tracer_provider: Any = None,
        trace_identities: bool = False,
        acquire_spans: bool = False,
    ) -> None:
        from opentelemetry import metrics, trace

        from . import __version__

        provider = meter_provider or metrics.get_meter_provider()
        meter = provider.get_meter(NAME, __version__)
        self.tracer = (tracer_provider or trace.get_tracer_provider()).get_tracer(NAME, __version__)
        self._trace = trace
        self.core = core
        self.sampler = PoolSampler(core)
        self._own_pools = ("per_user", "global") if core.config.global_pool else ("per_user",)
        self._trace_identities = trace_identities
        self._acquire_spans = acquire_spans
        observed = _OBSERVED.get(provider)
        if observed is None:
            observed = _OBSERVED[provider] = Observed(meter)
        observed.members.add(self)
        self._results = observed.results
        self.lease_duration = meter.create_histogram(
            f"{NAME}.lease.duration", unit="s", description="How long leases were held."
        )
        self._taken_seen = self._dropped_seen = 0
        core.time_leases()
        self.time_in_queue = BufferedHistogram(
            meter.create_histogram(
                f"{NAME}.request.time_in_queue",
                unit="s",
                description="How long acquires that could wait took, whatever their result.",
            )
        )
        self.tokens = meter.create_counter(
            f"{NAME}.tokens", unit="{token}", description="Tokens charged to budgets, by direction."
        )
        self.thresholds_crossed = meter.create_counter(
            f"{NAME}.rate.threshold_crossed",
            unit="{alert}",
            description="Identities whose use of a rate policy or budget reached one of the "
            "alert_at fractions of its limit (the policy's own, else the manager's), once per "
            "window, by policy and threshold.",
        )
        self.dry_run_refusals = meter.create_counter(
            f"{NAME}.rate.would_refuse",
            unit="{request}",
            description="Hits and stream starts that a dry-run rate policy (enforce=False) let "
            "through without room for them, by policy.",
        )

    def collect_lease_times(self) -> int:
        """Records the held times the core kept since the last collection into the
        ``lease.duration`` histogram; returns how many leases were taken since then."""
        taken, held, dropped = self.core.collect_lease_times()
        record = self.lease_duration.record
        for seconds in held:
            record(seconds)
        if dropped > self._dropped_seen:
            log.warning(
                "%d lease durations were not recorded: more leases ended between two collections "
                "of the metrics reader than the core keeps (2,000,000); collect more often",
                dropped - self._dropped_seen,
            )
            self._dropped_seen = dropped
        new, self._taken_seen = taken - self._taken_seen, taken
        return new

    def threshold_crossed(self, alert: ThresholdCrossed) -> None:
        """Counts one alert, by policy and threshold (never the identity)."""
        self.thresholds_crossed.add(1, {"policy": alert.policy, "threshold": alert.threshold})

    def rated(self, decisions: Sequence[RateDecision]) -> list[str]:
        """Counts the dry-run policies among ``decisions`` that would have refused (nothing
        to do for the others: a refusal is an acquire's or a hit's result); returns their
        names."""
        names = [d.policy.name for d in decisions if d.would_refuse and not d.policy.enforce]
        for name in names:
            self.dry_run_refusals.add(1, {"policy": name})
        return names

    def trace_acquire(
        self, user_id: str | None, resources: Sequence[Resource], policies: Sequence[PolicyEntry]
    ) -> Traced | None:
        """Where the facts of an acquire about to start go, when its trace is sampled: an event
        on the request's span (a span of the acquire's own, its child, with
        ``acquire_spans=True``), or a span of its own when there is no request span and the
        tracer's sampler keeps it. None otherwise, and then nothing is built: most traces are
        not sampled."""
        if self.sampler.loop is None:
            self.sampler.loop = asyncio.get_running_loop()
        current = self._trace.get_current_span()
        context = current.get_span_context()
        if context.is_valid and not context.trace_flags.sampled:
            return None
        own = self._acquire_spans or not context.is_valid
        span = self.tracer.start_span(f"{NAME}.acquire") if own else current
        if not span.is_recording():
            return None
        pools = [*(self._own_pools if user_id is not None else ()), *(r.name for r in resources)]
        facts: dict[str, Any] = {f"{NAME}.pools": pools}
        if policies:
            facts[f"{NAME}.policies"] = [policy_of(entry).name for entry in policies]
        if self._trace_identities and user_id is not None:
            facts[f"{NAME}.identity_hash"] = self.core.identity_digest(user_id)
        return Traced(span, facts, own)

    def granted(
        self,
        started: float,
        waits: bool,
        traced: Traced | None,
        decisions: Sequence[RateDecision],
        budgets: bool,
    ) -> Callable[[Lease], None] | None:
        """An acquire granted and taken (the core counts it, and times the lease): what
        :meth:`admitted` records of it, only when there is any; returns what its release must
        tell (:meth:`ended`), if anything: an event in a sampled trace, the tokens of a
        lease with budgets."""
        if waits or traced is not None or decisions:
            self.admitted(started, waits, traced, None, decisions)
        return self.ended if traced is not None or budgets else None

    def admitted(
        self,
        started: float,
        waits: bool,
        traced: Traced | None,
        error: BaseException | None,
        decisions: Sequence[RateDecision] = (),
    ) -> None:
        """An acquire started at ``started`` (``time.monotonic()``) ended, granted (``error``
        None; ``decisions``: what its rate policies said) or not: a refusal's ``requests``
        result (a grant's is the core's), its time in queue if it could wait (``waits``), and
        its facts on the span ``traced`` names."""
        waited = time.monotonic() - started
        if waits:
            self.time_in_queue.record(waited)
        result = result_of(error)
        if error is not None:
            self._results[result] = self._results.get(result, 0) + 1
        would_refuse = self.rated(decisions) if decisions else ()
        if traced is not None:
            facts, span = traced.facts, traced.span
            if would_refuse:
                facts[f"{NAME}.would_refuse"] = would_refuse
            facts[f"{NAME}.result"] = result
            facts[f"{NAME}.wait_seconds"] = waited
            if traced.own:
                span.set_attributes(facts)
                span.end()
            else:
                span.add_event(f"{NAME}.acquire", facts)
                span.set_attribute(f"{NAME}.result", result)

    def ended(self, lease: Lease) -> None:
        """A lease granted in a sampled trace or with budgets released (told once, by
        :class:`Lease`): its tokens, and an event on the current span (``...lease.released``,
        ``.lost``, ``.revoked``, ``.budget_exhausted``)."""
        used = lease.tokens_used
        if used is not None:
            self.tokens.add(used[0], {"direction": "input"})
            self.tokens.add(used[1], {"direction": "output"})
        span = self._trace.get_current_span()
        if span.is_recording():
            how = (
                "revoked"
                if lease.revoked
                else "lost"
                if lease.lost
                else "budget_exhausted"
                if lease.budget_exhausted
                else "released"
            )
            span.add_event(f"{NAME}.lease.{how}")
