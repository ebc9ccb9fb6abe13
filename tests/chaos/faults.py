"""The fault schedule of a chaos run, drawn from its seed, and the faults themselves.

One fault at a time, each followed by a quiet gap, so every window the auditor allows belongs
to one fault. The kinds come round in shuffled cycles, so every kind is drawn early in a run.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

# What each kind does (the auditor's windows are in auditor.py).
KINDS = {
    "redis_pause": "Redis stopped with SIGSTOP, then SIGCONT (its clock runs on)",
    "redis_restart": "Redis killed with SIGKILL and started again empty",
    "redis_restore": "Redis killed and started from a snapshot SAVEd seconds earlier "
                     "(a failover to a lagging replica)",
    "script_flush": "SCRIPT FLUSH (every node of a cluster)",
    "worker_kill": "a worker SIGKILLed; a new one takes its place",
    "worker_stop": "a worker SIGSTOPped, then SIGCONT",
    "net_cut": "one worker's connections to Redis stalled (a black hole) or reset",
}

# The cluster run's kinds: no proxy sits between the workers and a cluster (the nodes announce
# their own addresses), so no network cut; the Redis faults hit the master that holds the tag.
CLUSTER_KINDS = [kind for kind in KINDS if kind != "net_cut"]


@dataclass
class Fault:
    kind: str
    at: float  # seconds after the run began
    duration: float = 0.0  # how long it lasts (0: instant)
    slot: int | None = None  # the worker slot it hits
    mode: str = ""  # net_cut: stall or reset
    snapshot_age: float = 0.0  # redis_restore: the snapshot is SAVEd this long before the kill
    # Filled in as it runs, in time.monotonic(): it began, it ended (Redis answers again, the
    # worker runs again, the network flows again).
    t0: float = 0.0
    t1: float = 0.0
    notes: dict[str, object] = field(default_factory=dict)

    def describe(self) -> str:
        parts = [f"{self.at:7.1f}s {self.kind}"]
        if self.slot is not None:
            parts.append(f"worker {self.slot}")
        if self.mode:
            parts.append(self.mode)
        if self.duration:
            parts.append(f"{self.duration:.2f}s")
        if self.snapshot_age:
            parts.append(f"snapshot {self.snapshot_age:.2f}s old")
        return " ".join(parts)


def draw_schedule(
    seed: int, seconds: float, kinds: list[str], workers: int, lease_seconds: float,
    warm_up: float = 3.0, cool_down: float = 6.0,
) -> list[Fault]:
    """Faults from ``warm_up`` until ``cool_down`` before the end. Stalls come short (well
    within ``lease_seconds``: nothing may be lost) or long (past it: leases expire)."""
    rng = random.Random(f"faults-{seed}")
    schedule: list[Fault] = []
    at = warm_up
    cycle: list[str] = []
    while True:
        if not cycle:
            cycle = list(kinds)
            rng.shuffle(cycle)
        kind = cycle.pop()
        short = rng.random() < 0.5
        stall = rng.uniform(0.2, lease_seconds * 0.4) if short else rng.uniform(
            lease_seconds * 1.25, lease_seconds * 2.5)
        gap = rng.uniform(2.5, 6.0)
        fault = Fault(kind, at)
        if kind in ("redis_pause", "worker_stop"):
            fault.duration = stall
        elif kind == "redis_restart":
            fault.duration = rng.uniform(0.05, 1.5)
        elif kind == "redis_restore":
            fault.duration = rng.uniform(0.05, 1.0)
            fault.snapshot_age = rng.uniform(0.3, 2.2)
        elif kind == "worker_kill":
            fault.duration = rng.uniform(0.2, 2.0)  # until a new worker takes its place
        elif kind == "net_cut":
            fault.duration = stall
            fault.mode = rng.choice(["stall", "reset"])
        if kind.startswith("worker") or kind == "net_cut":
            fault.slot = rng.randrange(workers)
        fault.at += fault.snapshot_age  # the snapshot is SAVEd first
        if fault.at + fault.duration > seconds - cool_down:
            return schedule
        schedule.append(fault)
        at = fault.at + fault.duration + gap
