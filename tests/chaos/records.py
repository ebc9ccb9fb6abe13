"""What the auditor judges a chaos run by: the bounds the README states, and the records of
the run (its streams, its workers' lives, its samples of Redis), with the violations and the
episodes over a cap it finds (the judgement is in ``auditor``)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from chaos.settings import Settings

STATE_LOSS = ("redis_restart", "redis_restore")
REDIS_WIDE = ("redis_pause", "redis_restart", "redis_restore")
# Clock slack between this machine's monotonic clock and Redis' TIME (the same clock, read
# by two processes), for the bounds measured from a kill.
CLOCK_SLACK = 0.05
# The circuit breaker's longest cool-down (src/breaker.rs).
BREAKER_MAX = 5.0


@dataclass(frozen=True)
class Bounds:
    lease: float
    renew: float
    timeout: float
    # From the core reporting a lease lost to its stream ending (the event loop's latency).
    notice: float = 0.5

    @property
    def settle(self) -> float:
        """From Redis answering again after it lost writes (restarted empty, restored from a
        snapshot) to every worker's leases checked (taken back or reported lost). The round
        running then ends within two calls; rounds tick every ``renew``. The first keep-alive on
        the connection Redis dropped may fail (it reconnects): a round. The next finds the
        holder gone, or its count short, or above what it holds (a snapshot that brought back
        more released members than it lost), and the reclaim checks its leases in the same
        round. A grant still in flight during a keep-alive can hide a missing one until the
        next: a round. Each call takes at most ``timeout``: ``3 x renew + 4 x timeout``, for
        either kind. (A snapshot that brings back exactly as many members as it lost is found
        by the sum of ids kept beside the count: docs/design.md, section 9.2.)"""
        return 3 * self.renew + 4 * self.timeout

    @property
    def leftover(self) -> float:
        """From a stream's end, or Redis (the link, the worker) answering again, to its slot no
        longer counted: a release that failed is retried at every round once the circuit
        breaker lets calls through. A process that holds leases has its keep-alive (which does
        not wait for the breaker) close it; one that holds none waits for the breaker's next
        probe, at most ``BREAKER_MAX`` after the last failure (a call may still fail within
        ``timeout`` of Redis answering again); then the next round (``renew``) releases
        (``timeout``)."""
        return BREAKER_MAX + self.renew + 3 * self.timeout

    @classmethod
    def of(cls, settings: Settings) -> Bounds:
        return cls(settings.lease_seconds, settings.renew_every, settings.redis_timeout)


@dataclass
class Stream:
    id: str
    worker: str
    user: str | None
    weight: int
    resources: list[str]
    lease: str
    t_req: float
    t_start: float
    pools: list[str]
    t_end: float | None = None
    how: str = "open"
    lost: bool = False  # its lease was lost by the time it ended (by LeaseLost or not)
    exempt: list[tuple[float, float, str]] = field(default_factory=list)
    rate: bool = False  # its acquire counted the user's start rate
    budget: bool = False  # it spent the user's token budget
    reserve: int = 0  # tokens it reserved at admission
    tokens: list[tuple[float, int]] = field(default_factory=list)  # (sent at, tokens)


@dataclass
class WorkerLife:
    name: str
    slot: int
    pid: int
    t_spawn: float
    t_dead: float | None = None  # killed by the schedule
    bye: dict[str, object] | None = None
    exit_code: int | None = None
    rss: list[tuple[float, int]] = field(default_factory=list)
    # When its manager's lost, reclaimed and pruned counters changed (polled every 0.1 s).
    stats: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    # The last lines it wrote on stderr (shown when it failed).
    stderr: deque[str] = field(default_factory=lambda: deque(maxlen=20))


@dataclass
class Sample:
    r0: float  # monotonic, just before the call
    r1: float  # just after the reply
    now_ms: int  # Redis' TIME
    holders: dict[int, int]  # holder id -> expiry (ms, Redis' clock), in the shared tag
    pools: dict[str, list[tuple[str, int]]]  # pool -> (member, holder id)
    # A pool in a tag of its own (a user's, under lease_global_slots) -> that tag's holders.
    own_holders: dict[str, dict[int, int]] = field(default_factory=dict)
    # The pools this read took in: one tag's, where each tag is read on its own (the cluster,
    # under lease_global_slots; its times and clock are that tag's); None: every pool at once.
    reads: frozenset[str] | None = None

    def counted(self, holder: int, pool: str = "") -> bool:
        """Whether ``holder``'s members in ``pool`` count: its entry in the pool's tag is live."""
        return self.own_holders.get(pool, self.holders).get(holder, 0) > self.now_ms

    def covers(self, pool: str) -> bool:
        return self.reads is None or pool in self.reads


@dataclass
class Violation:
    invariant: str
    at: float
    detail: str


@dataclass
class Overdue:
    """A slot counted past its bound: first and last seen so, since when it may be counted."""

    first: float
    last: float
    since: float
    worker: str | None
    what: str


@dataclass
class Episode:
    """A stretch of time one pool was over its cap (before any window is applied)."""

    pool: str
    start: float
    end: float
    excess: int
    fault: str  # the last fault that began before it
    after_fault: float  # from that fault's end (Redis, the worker, the link back) to its end
    streams: str = ""  # those open at its start
