"""The auditor: outside the library, it judges a chaos run from what the streams themselves told
(start and end, stamped in their own process) and from samples of Redis read with a script of
its own, against the bounds the README states.

Invariants checked (each violation is listed with its time and the streams it involves):

* ``caps``: at every moment, the weight of the streams that are open, per user, per resource
  and in all, is at most the cap, except inside the windows below.
* ``counted``: every open stream is counted in Redis in every pool it took (its members are
  there, under a live holder) at every sample, except inside the same windows. A sample of one
  tag (each tag read on its own: the cluster, under ``lease_global_slots``) judges its tag's
  pools against the streams open at its own time.
* ``slabs``: under ``lease_global_slots``, the slabs the global pool counts hold at least the
  open streams' global slots at every sample of it, except inside the same windows.
* ``redis caps``: no pool in Redis holds more live holders' members than its capacity.
* ``rates``: no window of the start rate's ``per`` seconds holds more of one user's starts
  that counted the rate than its limit (a start counts it between its ``t_req`` and
  ``t_start``: only starts known to fall inside a window are counted in it).
* ``hits``: no window of the leased hit rate's ``per`` seconds holds more of one hot user's
  allowed hits than its limit (a hit is served between its ``t_req`` and ``t_done``, from units
  its worker took ahead or by Redis: only hits known to fall inside a window are counted in it).
* ``budgets``: at each budget level (a user's tokens, a team's money shared by its users), no
  window of ``budget_per`` seconds holds more of one identity's units, by the time the streams
  sent them, than the level's limit plus one top-up increment and one chunk per concurrent
  stream, priced in the level's unit (the most of the identity's budgeted streams open at once
  in that window: the token budgets guide's bound).
* ``leftovers``: a slot is counted in Redis at most ``leftover`` after its stream ended, or after
  Redis (or the worker's network, or the worker) came back from a fault that overlapped, and at
  most ``lease_seconds`` after its worker was killed.
* ``drain``: once the workers are gone, every pool counts 0 and every key is gone (but the
  tag's clock, which any call writes, with a 1 h TTL); every key has a TTL.
* ``errors``: no worker raised anything unexpected, and each exited as told.
* ``memory``: no worker's RSS grew past the limit.

Windows (``notice``, ``settle`` and ``leftover`` are :class:`Bounds`):

* a stream whose lease was lost may overlap others for its last ``notice`` seconds: the core
  reports a loss no later than Redis can drop the lease, and the stream's task then has to run
  to end with ``LeaseLost``;
* the streams of a worker stopped with SIGSTOP, from the stop until ``notice`` after it runs
  again: frozen, they are still open, while their leases may expire and their slots go to
  others;
* after Redis lost writes (restarted empty, restored from an earlier snapshot), the streams
  whose acquire began before it came back, from the fault until ``settle + notice``
  after Redis answers again: each worker's next keep-alive finds its grants missing and takes them
  back where there is room, else reports them lost.
* the same loss forgets rate and budget counts: a rate or budget window that overlaps the
  loss (from the snapshot, or the kill, until ``settle`` after Redis answers) is not judged,
  and a later budget window also allows the reservations that streams open at the loss still
  held (they stream on from reservations Redis no longer counts).
"""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from collections.abc import Callable

from fastapi_stream_lease import TOP_UP_INCREMENT

from chaos.faults import Fault
from chaos.records import (
    CLOCK_SLACK,
    REDIS_WIDE,
    STATE_LOSS,
    Bounds,
    Episode,
    Overdue,
    Sample,
    Stream,
    Violation,
    WorkerLife,
)
from chaos.settings import BudgetLevel, Settings


class Audit:
    def __init__(self, settings: Settings, bounds: Bounds, t_origin: float) -> None:
        self.settings = settings
        self.bounds = bounds
        self.t_origin = t_origin
        self.caps = settings.pools()
        self.streams: dict[str, Stream] = {}
        self.by_lease: dict[str, Stream] = {}
        self.workers: dict[str, WorkerLife] = {}
        self.samples: list[Sample] = []
        self.faults: list[Fault] = []
        self.outcomes: Counter[str] = Counter()
        self.violations: list[Violation] = []
        self.episodes: list[Episode] = []
        self.figures: dict[str, object] = {}
        self.checked: dict[str, int] = Counter()
        self.drain: dict[str, object] = {}
        # The allowed hits of each hot user: (t_req, t_done).
        self.hits: dict[str, list[tuple[float, float]]] = defaultdict(list)

    # -- what the run feeds in --

    def event(self, worker: str, event: dict[str, object]) -> None:
        kind = str(event["e"])
        if kind == "start":
            user = event["user"]
            resources = list(event["res"])  # type: ignore[call-overload]
            stream = Stream(
                id=str(event["id"]), worker=worker, user=user,  # type: ignore[arg-type]
                weight=int(event["weight"]), resources=resources,  # type: ignore[call-overload]
                lease=str(event["lease"]), t_req=float(event["t_req"]),  # type: ignore[arg-type]
                t_start=float(event["t_start"]),  # type: ignore[arg-type]
                pools=self.settings.pools_of(user, resources),  # type: ignore[arg-type]
                rate=bool(event.get("rate")), budget=bool(event.get("budget")),
                reserve=int(event.get("reserve", 0)),  # type: ignore[call-overload]
            )
            self.streams[stream.id] = stream
            self.by_lease[stream.lease] = stream
            self.outcomes["started"] += 1
        elif kind == "end":
            stream = self.streams[str(event["id"])]
            stream.t_end = float(event["t_end"])  # type: ignore[arg-type]
            # "lost": ended by LeaseLost. A stream can also end by itself just as its lease is
            # lost, before the cancellation reaches it: ``lost`` is set then too.
            stream.how = str(event["how"])
            stream.lost = bool(event["lost"]) or stream.how == "lost"
            self.outcomes[f"ended {stream.how}"] += 1
            if stream.lost and stream.how != "lost":
                self.outcomes["ended by itself as its lease was lost"] += 1
        elif kind == "tok":
            self.streams[str(event["id"])].tokens.append(
                (float(event["t"]), int(event["n"])))  # type: ignore[arg-type, call-overload]
        elif kind == "hit":
            self.hits[str(event["user"])].append(
                (float(event["t_req"]), float(event["t_done"])))  # type: ignore[arg-type]
            self.outcomes["hits allowed"] += 1
        elif kind == "limited":
            self.outcomes[f"limited ({event['policy']})"] += 1
        elif kind == "refused":
            waited = " after waiting" if event.get("waited") else ""
            self.outcomes[f"refused ({event['limit']}){waited}"] += 1
        elif kind == "error":
            self.outcomes["errors"] += 1
            self.violations.append(Violation(
                "errors", float(event["t"]), f"worker {worker}: {event['error']}"))  # type: ignore[arg-type]
        elif kind == "log":
            self.outcomes[f"logged: {event['kind']}"] += 1
        elif kind in ("unavailable", "cancelled_acquire", "lost_at_once"):
            self.outcomes[kind.replace("_", " ")] += 1
        elif kind == "stats":
            self.workers[worker].stats.append((float(event["t"]), {  # type: ignore[arg-type]
                k: int(event[k]) for k in ("lost", "reclaimed", "pruned")}))  # type: ignore[call-overload]
        elif kind == "bye":
            self.workers[worker].bye = event["stats"]  # type: ignore[assignment]

    def killed(self, worker: str, t_dead: float) -> None:
        """The worker was SIGKILLed: its open streams ended when it died."""
        self.workers[worker].t_dead = t_dead
        for stream in self.streams.values():
            if stream.worker == worker and stream.t_end is None:
                stream.t_end = t_dead
                stream.how = "killed"
                self.outcomes["ended killed"] += 1

    # -- the judgement --

    def rel(self, t: float) -> float:
        return t - self.t_origin

    def judge(self, t_finish: float) -> None:
        for stream in self.streams.values():
            if stream.t_end is None:
                self.violations.append(Violation(
                    "errors", t_finish, f"stream {stream.id} never ended (worker {stream.worker})"))
                stream.t_end = t_finish
        self.faults.sort(key=lambda f: f.t0)
        for stream in self.streams.values():
            stream.exempt = self.windows_of(stream)
        self.check_caps()
        self.check_rates()
        self.check_hits()
        self.check_budgets()
        self.check_samples()
        self.check_workers()
        self.measure_losses()

    def measure_losses(self) -> None:
        """How long after the fault ended its lost streams ended: a stopped worker's after it
        ran again, those open when Redis lost writes after Redis answered again."""
        b = self.bounds
        for kind, label in (("worker_stop", "a stopped worker's lost streams ended after "
                                             "SIGCONT"),
                            ("redis_restart", "streams lost to a restart ended after Redis "
                                              "answered"),
                            ("redis_restore", "streams lost to a restore ended after Redis "
                                              "answered")):
            worst = None
            for i, fault in enumerate(self.faults):
                if fault.kind != kind:
                    continue
                # Until the next fault begins (the gaps are longer than every window).
                until = self.faults[i + 1].t0 if i + 1 < len(self.faults) else float("inf")
                for stream in self.streams.values():
                    assert stream.t_end is not None
                    if stream.how != "lost" or stream.t_req >= fault.t1 or not (
                            fault.t0 <= stream.t_end < min(until, fault.t1 + b.settle
                                                           + b.notice + b.lease)):
                        continue
                    if kind == "worker_stop" and stream.worker != fault.notes.get("worker"):
                        continue
                    late = stream.t_end - fault.t1
                    worst = late if worst is None else max(worst, late)
            if worst is not None:
                self.figures[f"{label}, at most (s)"] = round(worst, 2)
        # When each worker's counters last moved after Redis lost writes (its leases checked).
        worst_check = None
        for i, fault in enumerate(self.faults):
            if fault.kind not in STATE_LOSS:
                continue
            until = self.faults[i + 1].t0 if i + 1 < len(self.faults) else float("inf")
            for life in self.workers.values():
                moved = [t for t, _ in life.stats if fault.t0 <= t < until]
                if moved:
                    late = max(moved) - fault.t1
                    worst_check = late if worst_check is None else max(worst_check, late)
        if worst_check is not None:
            self.figures["after Redis lost writes, a worker's lost or reclaimed count last moved "
                         "after Redis answered, at most (s)"] = round(worst_check, 2)
        # From the core counting a lease lost to its stream's end (the counter is polled every
        # 0.1 s: the last move at or before the end).
        notice = None
        for stream in self.streams.values():
            if stream.how != "lost":
                continue
            life = self.workers[stream.worker]
            assert stream.t_end is not None
            moves = [t for (t, now_), (_, before) in zip(life.stats[1:], life.stats, strict=False)
                     if now_["lost"] > before["lost"] and t <= stream.t_end + 0.1]
            if moves:
                late = stream.t_end - max(moves)
                notice = late if notice is None else max(notice, late)
        if notice is not None:
            self.figures["a lost stream ended after its worker counted it lost, at most (s; "
                         "polled every 0.1 s)"] = round(notice, 2)
        unexplained = [s for s in self.streams.values() if s.lost and not self.may_lose(s)]
        self.figures["lost with no fault that can lose a lease"] = len(unexplained)
        if unexplained:
            self.figures["lost with no fault that can lose a lease: the first"] = ", ".join(
                self.describe(s) for s in unexplained[:5])

    def may_lose(self, stream: Stream) -> bool:
        """Whether a fault could have cost this stream its lease: Redis losing writes, or Redis,
        its worker or its worker's link stalled for longer than a renewal can make up for
        (``lease_seconds - renew_every - redis_timeout``), shortly before it ended."""
        b = self.bounds
        assert stream.t_end is not None
        for fault in self.faults:
            if not fault.t0 <= stream.t_end <= fault.t1 + b.settle + b.notice + b.lease:
                continue
            if fault.kind in STATE_LOSS:
                return True
            long = fault.t1 - fault.t0 >= b.lease - b.renew - b.timeout
            mine = fault.notes.get("worker") == stream.worker
            if long and (fault.kind == "redis_pause" or (
                    fault.kind in ("net_cut", "worker_stop") and mine)):
                return True
        return False

    def windows_of(self, stream: Stream) -> list[tuple[float, float, str]]:
        b = self.bounds
        assert stream.t_end is not None
        windows = []
        if stream.lost:
            windows.append((stream.t_end - b.notice, stream.t_end, "lost"))
        for fault in self.faults:
            if fault.kind == "worker_stop" and fault.notes.get("worker") == stream.worker:
                if stream.t_req < fault.t1:
                    windows.append((fault.t0, fault.t1 + b.notice, "worker_stop"))
            elif fault.kind in STATE_LOSS and stream.t_req < fault.t1:
                windows.append((fault.t0, fault.t1 + b.settle + b.notice, fault.kind))
        return [(lo, hi, why) for lo, hi, why in windows
                if lo < stream.t_end and hi > stream.t_start]

    def fault_before(self, t: float) -> str:
        last = self.last_fault(t)
        return "none" if last is None else f"{last.kind} at {self.rel(last.t0):.1f}s"

    def last_fault(self, t: float) -> Fault | None:
        last = None
        for fault in self.faults:
            if fault.t0 <= t:
                last = fault
        return last

    def check_caps(self) -> None:
        """Sweeps the streams' starts and ends, once as they were (the episodes over a cap, for
        the figures) and once without the windows (any excess left is a violation)."""
        raw: list[tuple[float, int, Stream]] = []
        judged: list[tuple[float, int, Stream]] = []
        for stream in self.streams.values():
            assert stream.t_end is not None
            raw += [(stream.t_start, 1, stream), (stream.t_end, -1, stream)]
            for lo, hi in _minus(stream.t_start, stream.t_end,
                                 [(lo, hi) for lo, hi, _ in stream.exempt]):
                judged += [(lo, 1, stream), (hi, -1, stream)]
        # Ends before starts at the same instant: touching streams do not overlap.
        raw.sort(key=lambda e: (e[0], e[1]))
        judged.sort(key=lambda e: (e[0], e[1]))
        self.checked["cap checks"] = len(judged) // 2

        live: dict[str, int] = defaultdict(int)
        opened: dict[str, set[str]] = defaultdict(set)
        over: dict[str, Episode] = {}
        for t, sign, stream in raw:
            for pool in stream.pools:
                live[pool] += sign * stream.weight
                (opened[pool].add if sign > 0 else opened[pool].discard)(stream.id)
                cap = self.caps[pool]
                if live[pool] > cap:
                    episode = over.get(pool)
                    if episode is None:
                        over[pool] = Episode(pool, t, t, live[pool] - cap, self.fault_before(t),
                                             0.0, ", ".join(self.describe(self.streams[i])
                                                            for i in sorted(opened[pool])))
                    else:
                        episode.excess = max(episode.excess, live[pool] - cap)
                elif pool in over:
                    episode = over.pop(pool)
                    episode.end = t
                    fault = self.last_fault(episode.start)
                    if fault is not None:
                        episode.after_fault = t - fault.t1
                    self.episodes.append(episode)

        live = defaultdict(int)
        members: dict[str, set[str]] = defaultdict(set)
        reported: dict[str, float] = {}
        for t, sign, stream in judged:
            for pool in stream.pools:
                live[pool] += sign * stream.weight
                if sign > 0:
                    members[pool].add(stream.id)
                else:
                    members[pool].discard(stream.id)
                cap = self.caps[pool]
                if sign > 0 and live[pool] > cap and reported.get(pool, -1.0) < t - 1.0:
                    reported[pool] = t
                    involved = sorted(members[pool], key=lambda i: self.streams[i].t_start)
                    self.violations.append(Violation(
                        "caps", t,
                        f"{self.settings.pool_name(pool)}: weight {live[pool]} > cap {cap}; "
                        f"last fault {self.fault_before(t)}; open: "
                        + ", ".join(self.describe(self.streams[i]) for i in involved)))

    def counts_lost(self) -> list[tuple[float, float, Fault]]:
        """When Redis forgot counts: from the snapshot (a restore) or the kill (a restart)
        until ``settle`` after it answered again."""
        return [(float(f.notes.get("t_snapshot", f.t0)), f.t1 + self.bounds.settle, f)  # type: ignore[arg-type]
                for f in self.faults if f.kind in STATE_LOSS]

    def judged(self, lo: float, hi: float) -> bool:
        """Whether a rate or budget window [lo, hi] is judged: it overlaps no loss of counts."""
        return not any(f_lo < hi and f_hi > lo for f_lo, f_hi, _ in self.counts_lost())

    def by_user(self, kind: Callable[[Stream], bool]) -> dict[str, list[Stream]]:
        """The streams of ``kind`` (those that counted the rate, those with a budget), per user."""
        streams: dict[str, list[Stream]] = defaultdict(list)
        for stream in self.streams.values():
            if kind(stream) and stream.user is not None:
                streams[stream.user].append(stream)
        return streams

    def check_rates(self) -> None:
        """Every window of ``rate_per`` seconds, anchored at each start's ``t_req``: the starts
        wholly inside it (``t_req`` and ``t_start`` both) number at most ``rate_limit``."""
        settings = self.settings
        most = 0
        for user, starts in self.by_user(lambda s: s.rate).items():
            starts.sort(key=lambda s: s.t_req)
            reported = float("-inf")
            for k, first in enumerate(starts):
                lo, hi = first.t_req, first.t_req + settings.rate_per - CLOCK_SLACK
                inside = []
                for stream in starts[k:]:
                    if stream.t_req > hi:
                        break
                    if stream.t_start <= hi:
                        inside.append(stream)
                if not self.judged(lo, hi):
                    continue
                self.checked["rate windows"] += 1
                most = max(most, len(inside))
                if len(inside) > settings.rate_limit and lo > reported + settings.rate_per:
                    reported = lo
                    self.violations.append(Violation(
                        "rates", lo,
                        f"{user}: {len(inside)} starts > limit {settings.rate_limit} within "
                        f"{settings.rate_per} s; last fault {self.fault_before(lo)}: "
                        + ", ".join(self.describe(s) for s in inside)))
        self.figures[f"most starts of one user counted by the start rate in one window (limit "
                     f"{settings.rate_limit})"] = most

    def check_hits(self) -> None:
        """Every window of ``hit_per`` seconds, anchored at each allowed hit's ``t_req``: the
        hits wholly inside it (asked and answered) number at most ``hit_limit``, though the
        workers served most of them from units they had taken ahead."""
        settings = self.settings
        most = 0
        for user, hits in self.hits.items():
            hits.sort()
            reported = float("-inf")
            for k, (lo, _) in enumerate(hits):
                hi = lo + settings.hit_per - CLOCK_SLACK
                inside = 0
                for t_req, t_done in hits[k:]:
                    if t_req > hi:
                        break
                    inside += t_done <= hi
                if not self.judged(lo, hi):
                    continue
                self.checked["hit windows"] += 1
                most = max(most, inside)
                if inside > settings.hit_limit and lo > reported + settings.hit_per:
                    reported = lo
                    self.violations.append(Violation(
                        "hits", lo, f"{user}: {inside} hits > limit {settings.hit_limit} within "
                        f"{settings.hit_per} s; last fault {self.fault_before(lo)}"))
        self.figures[f"most allowed hits of one user in one window of the leased rate (limit "
                     f"{settings.hit_limit})"] = most

    def check_budgets(self) -> None:
        """Each budget level (its user's tokens, its team's money), in its unit: every window
        of ``budget_per`` seconds, anchored at each chunk an identity's streams sent, holds at
        most the level's limit, one increment and one chunk per concurrent stream, and the
        reservations orphaned by a loss of counts."""
        for level in self.settings.budget_levels():
            streams_of: dict[str, list[Stream]] = defaultdict(list)
            for user, streams in self.by_user(lambda s: s.budget).items():
                streams_of[level.identity_of(user)] += streams
            self.check_budget_level(level, streams_of)

    def check_budget_level(self, level: BudgetLevel, streams_of: dict[str, list[Stream]]) -> None:
        settings = self.settings
        per = settings.budget_per - CLOCK_SLACK
        slack = (TOP_UP_INCREMENT + settings.max_chunk) * level.per_token
        most = 0
        for identity, streams in streams_of.items():
            sent = sorted((t, n * level.per_token) for s in streams for t, n in s.tokens)
            total = 0
            j = 0
            reported = float("-inf")
            for i, (lo, _) in enumerate(sent):
                hi = lo + per
                while j < len(sent) and sent[j][0] <= hi:
                    total += sent[j][1]
                    j += 1
                window = total
                total -= sent[i][1]
                if not self.judged(lo, hi):
                    continue
                self.checked[f"budget windows ({level.name})"] += 1
                most = max(most, window)
                if window <= level.limit:
                    continue
                open_ = [s for s in streams if s.t_start < hi and (s.t_end or hi) > lo]
                concurrent = _most_at_once(open_, lo, hi)
                bound = (level.limit + slack * concurrent
                         + self.orphaned(open_, lo) * level.per_token)
                if window > bound and lo > reported + settings.budget_per:
                    reported = lo
                    self.violations.append(Violation(
                        "budgets", lo,
                        f"{level.name} of {identity}: {window} {level.unit} sent within "
                        f"{settings.budget_per} s > {bound} (limit {level.limit} + {slack} x "
                        f"{concurrent} streams at once); last fault {self.fault_before(lo)}: "
                        + ", ".join(self.describe(s) for s in open_)))
        self.figures[f"most {level.name} one identity sent in one budget window, in "
                     f"{level.unit} (limit {level.limit})"] = most

    def orphaned(self, streams: list[Stream], lo: float) -> int:
        """The reservations of ``streams`` that Redis forgot before ``lo`` while they were
        open: they stream on from tokens no window counts."""
        return sum(stream.reserve for stream in streams if any(
            f_lo < (stream.t_end or lo) and stream.t_req < f.t1 and f_hi <= lo
            for f_lo, f_hi, f in self.counts_lost()))

    def describe(self, stream: Stream) -> str:
        assert stream.t_end is not None
        return (f"{stream.id}(w{stream.weight} {self.rel(stream.t_req):.3f}/"
                f"{self.rel(stream.t_start):.3f}-{self.rel(stream.t_end):.3f} {stream.how})")

    def counters_near(self, worker: str, t: float) -> str:
        """The worker's lost, reclaimed and pruned counters as they moved around ``t``."""
        life = self.workers[worker]
        return "; ".join(
            f"{self.rel(at):.2f}s {counts}" for at, counts in life.stats
            if t - 5 <= at <= t + 2) or "no change"

    def holder_workers(self) -> dict[int, str]:
        """Holder ids to the workers they belong to, from the leases seen under them."""
        owners: dict[int, str] = {}
        for sample in self.samples:
            for entries in sample.pools.values():
                for member, holder in entries:
                    stream = self.by_lease.get(member.split("#")[0])
                    if stream is not None:
                        owners.setdefault(holder, stream.worker)
        return owners

    def recovered(self, worker: str | None, since: float) -> float:
        """When a slot of ``worker`` whose stream ended (or that was first seen) at ``since``
        could start to be removed: then, or when the last fault that overlapped its removal
        ended (Redis, the worker's link or the worker back)."""
        b = self.bounds
        start = since
        for fault in self.faults:
            # A restore brings back what its snapshot held: from the SAVE on, it may matter.
            began = float(fault.notes.get("t_snapshot", fault.t0))  # type: ignore[arg-type]
            if began > start + b.leftover:
                continue
            touches = fault.kind in REDIS_WIDE or (
                fault.kind in ("net_cut", "worker_stop") and fault.notes.get("worker") == worker)
            if touches and fault.t1 >= since - b.leftover:
                start = max(start, fault.t1)
        return start

    def died(self, worker: str | None) -> float | None:
        life = self.workers.get(worker) if worker is not None else None
        return life.t_dead if life is not None else None

    def allowed_until(self, worker: str | None, since: float) -> float:
        """The latest moment such a slot may still be counted: ``leftover`` after it could
        start to be removed, or ``lease_seconds`` after its worker died, if it died first."""
        b = self.bounds
        allowed = self.recovered(worker, since) + b.leftover
        died = self.died(worker)
        if died is not None and died <= allowed:
            allowed = max(allowed, died + b.lease + CLOCK_SLACK)
        return allowed

    def check_samples(self) -> None:
        slabs = self.settings.lease_global_slots
        owners = self.holder_workers()
        streams = sorted(self.streams.values(), key=lambda s: s.t_start)
        samples = sorted(self.samples, key=lambda s: s.r0)
        first_seen: dict[str, float] = {}
        ends: list[tuple[float, str]] = []  # heap of (t_end, id) of the streams begun
        open_ids: set[str] = set()
        next_stream = 0
        leftover_worst: dict[str, float] = defaultdict(float)
        overdue: dict[tuple[str, str], Overdue] = {}
        for sample in samples:
            while next_stream < len(streams) and streams[next_stream].t_start < sample.r0:
                stream = streams[next_stream]
                assert stream.t_end is not None
                heapq.heappush(ends, (stream.t_end, stream.id))
                open_ids.add(stream.id)
                next_stream += 1
            while ends and ends[0][0] <= sample.r1:
                open_ids.discard(heapq.heappop(ends)[1])
            index = {pool: dict(entries) for pool, entries in sample.pools.items()}

            # Every open stream is counted in every pool it took (of those the sample read);
            # under lease_global_slots its global slot is a slab's, so the global pool counts at
            # least the open streams.
            global_read = sample.covers(self.settings.global_key)
            on_slabs = 0
            for sid in open_ids:
                stream = self.streams[sid]
                if any(lo <= sample.r1 and hi >= sample.r0 for lo, hi, _ in stream.exempt):
                    continue
                pools_read = [pool for pool in stream.pools if sample.covers(pool)]
                if not pools_read:
                    continue
                self.checked["open streams checked in samples"] += 1
                if slabs and stream.user is not None and not stream.lost and global_read:
                    on_slabs += stream.weight
                for pool in pools_read:
                    if slabs and pool == self.settings.global_key:
                        continue
                    there = index.get(pool, {})
                    for member in _members(stream.lease, stream.weight):
                        holder = there.get(member)
                        if holder is None or not sample.counted(holder, pool):
                            self.violations.append(Violation(
                                "counted", sample.r0,
                                f"open stream {self.describe(stream)} of worker {stream.worker}"
                                f" not counted in {self.settings.pool_name(pool)} "
                                f"({'absent' if holder is None else 'holder expired'}); "
                                f"last fault {self.fault_before(sample.r0)}; its worker's "
                                f"counters: {self.counters_near(stream.worker, sample.r0)}"))
                            break
                    else:
                        continue
                    break

            global_pool = sample.pools.get(self.settings.global_key, [])
            held = sum(sample.counted(h) for _, h in global_pool)
            if slabs and global_read and on_slabs > held:
                self.violations.append(Violation(
                    "slabs", sample.r0,
                    f"open streams take {on_slabs} global slots, the slabs counted hold {held}; "
                    f"last fault {self.fault_before(sample.r0)}"))

            # No pool holds more live members than its capacity; no slot outlives its bound
            # (a slab's, under lease_global_slots, lives as long as its worker keeps it).
            for pool, entries in sample.pools.items():
                counted = [(m, h) for m, h in entries if sample.counted(h, pool)]
                self.checked["pool samples"] += 1
                if len(counted) > self.caps.get(pool, 1 << 60):
                    self.violations.append(Violation(
                        "redis caps", sample.r0,
                        f"{self.settings.pool_name(pool)} counts {len(counted)} live members "
                        f"> {self.caps[pool]}"))
                judged = not (slabs and pool == self.settings.global_key)
                for member, holder in counted if judged else []:
                    lease = member.split("#")[0]
                    known = self.by_lease.get(lease)
                    if known is not None and (known.t_end is None or known.t_end > sample.r0):
                        continue  # open (or not yet ended when the sample was read)
                    # The state a sample read is of some moment in [r0, r1]: seen first at r1
                    # at the latest, still there at r0 at the earliest.
                    first_seen.setdefault(lease, sample.r1)
                    worker: str | None
                    if known is not None:
                        assert known.t_end is not None
                        worker, since = known.worker, known.t_end
                    else:
                        worker, since = owners.get(holder), first_seen[lease]
                    died = self.died(worker)
                    if died is not None and died <= sample.r0:
                        leftover_worst["killed"] = max(leftover_worst["killed"],
                                                       sample.r0 - died)
                    else:
                        leftover_worst["alive"] = max(
                            leftover_worst["alive"], sample.r0 - self.recovered(worker, since))
                    if sample.r0 > self.allowed_until(worker, since):
                        late = overdue.setdefault((lease, pool), Overdue(
                            sample.r0, sample.r0, since, worker,
                            self.describe(known) if known else f"unknown lease {lease}"))
                        late.last = sample.r0
        for (_, pool), late in overdue.items():
            self.violations.append(Violation(
                "leftovers", late.first,
                f"{late.what} of worker {late.worker} still counted in "
                f"{self.settings.pool_name(pool)} {late.first - late.since:.2f}s to "
                f"{late.last - late.since:.2f}s after "
                f"{'first seen' if late.what.startswith('unknown') else 'its end'} (bound from "
                f"{self.rel(late.since):.2f}s: "
                f"{self.allowed_until(late.worker, late.since) - late.since:.2f}s); "
                f"last fault {self.fault_before(late.first)}"))
        self.checked["samples"] = len(samples)
        self.figures["leftover: longest a slot was counted after its stream ended, or Redis "
                     "(the link, the worker) came back (s)"] = round(leftover_worst["alive"], 2)
        self.figures["leftover: longest a killed worker's slot was counted after it died (s)"] = (
            round(leftover_worst["killed"], 2))

    def check_workers(self) -> None:
        for life in self.workers.values():
            if life.t_dead is None and (life.bye is None or life.exit_code != 0):
                said = "" if life.bye else " without saying bye"
                self.violations.append(Violation(
                    "errors", life.t_spawn,
                    f"worker {life.name} (pid {life.pid}) exited with {life.exit_code}{said}; "
                    f"its stderr ended: {' | '.join(life.stderr)}"))
            elif life.stderr and life.t_dead is None:
                self.violations.append(Violation(
                    "errors", life.t_spawn,
                    f"worker {life.name} wrote on stderr: {' | '.join(life.stderr)}"))


def _most_at_once(streams: list[Stream], lo: float, hi: float) -> int:
    """The most of ``streams`` open at one moment of [lo, hi] (touching ones do not overlap)."""
    edges = sorted([(max(s.t_start, lo), 1) for s in streams]
                   + [(min(s.t_end or hi, hi), -1) for s in streams])
    most = running = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


def _members(lease: str, weight: int) -> list[str]:
    return [lease] + [f"{lease}#{unit}" for unit in range(2, weight + 1)]


def _minus(lo: float, hi: float, holes: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """[lo, hi] without the holes."""
    pieces = [(lo, hi)]
    for h_lo, h_hi in holes:
        cut = []
        for p_lo, p_hi in pieces:
            if h_hi <= p_lo or h_lo >= p_hi:
                cut.append((p_lo, p_hi))
                continue
            if p_lo < h_lo:
                cut.append((p_lo, h_lo))
            if h_hi < p_hi:
                cut.append((h_hi, p_hi))
        pieces = cut
    return pieces
