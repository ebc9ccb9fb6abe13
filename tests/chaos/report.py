"""What a chaos run prints at its end: the seed, the schedule, the counts, the invariants and
every violation."""

from __future__ import annotations

from collections import Counter, defaultdict

from chaos.auditor import Audit
from chaos.faults import KINDS

INVARIANTS = ["caps", "counted", "slabs", "redis caps", "rates", "hits", "budgets", "leftovers",
              "drain", "ttl", "errors", "memory"]
# Violations listed per invariant (the count is always complete).
LISTED = 12


def summary(audit: Audit, seed: int, target: str, seconds: float, workers: int) -> list[str]:
    b = audit.bounds
    lines = [
        f"chaos run: seed {seed}, {target}, {workers} workers, {seconds:.0f} s of faults and "
        f"streams",
        f"settings: lease_seconds {b.lease}, renew_every {b.renew:.3f}, redis_timeout "
        f"{b.timeout}, max_per_user {audit.settings.max_per_user}, max_global "
        f"{audit.settings.max_global}, resources {audit.settings.resources}",
        f"bounds: notice {b.notice} s; settle after Redis lost writes = 3 x renew_every + 4 x "
        f"redis_timeout = {b.settle:.2f} s; "
        f"leftover = 5 s + renew_every + 3 x redis_timeout = "
        f"{b.leftover:.2f} s; after a kill lease_seconds = {b.lease} s",
        "schedule (seconds after the start; actual duration):",
    ]
    for fault in audit.faults:
        actual = fault.t1 - fault.t0
        lines.append(f"  {fault.describe()}  [{actual:.2f}s]")
    kinds = Counter(f.kind for f in audit.faults)
    lines.append("faults by kind: " + ", ".join(f"{k} {kinds[k]}" for k in KINDS if kinds[k]))
    lines.append("outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(audit.outcomes.items())))
    stats: Counter[str] = Counter()
    for life in audit.workers.values():
        for key, value in (life.bye or {}).items():
            if isinstance(value, int) and not isinstance(value, bool):
                stats[key] += value
    lines.append("workers' stats at exit (those not killed): "
                 + ", ".join(f"{k} {v}" for k, v in sorted(stats.items())))
    lines.append("checked: " + ", ".join(f"{k} {v}" for k, v in audit.checked.items()))
    worst: dict[str, float] = defaultdict(float)
    after: dict[str, float] = defaultdict(lambda: float("-inf"))
    excess: dict[str, int] = defaultdict(int)
    for episode in audit.episodes:
        kind = episode.fault.split(" at ")[0]
        worst[kind] = max(worst[kind], episode.end - episode.start)
        after[kind] = max(after[kind], episode.after_fault)
        excess[kind] += 1
    lines.append(
        f"over a cap before the windows: {len(audit.episodes)} episodes"
        + ("; by the fault before: " + ", ".join(
            f"{k} {excess[k]} (longest {worst[k]:.2f}s, over until {after[k]:+.2f}s after "
            f"it ended)" for k in sorted(worst)) if worst else ""))
    longest = {}
    for episode in audit.episodes:
        kind = episode.fault.split(" at ")[0]
        if kind not in longest or episode.after_fault > longest[kind].after_fault:
            longest[kind] = episode
    for kind in sorted(longest):
        episode = longest[kind]
        lines.append(
            f"  the latest after {episode.fault}: {audit.settings.pool_name(episode.pool)} over "
            f"by {episode.excess} from {audit.rel(episode.start):.2f}s to "
            f"{audit.rel(episode.end):.2f}s; open: {episode.streams}")
    for key, value in audit.figures.items():
        lines.append(f"{key}: {value}")
    lines.append("drain: " + ", ".join(f"{k} {v}" for k, v in audit.drain.items()))
    by_invariant = defaultdict(list)
    for violation in audit.violations:
        by_invariant[violation.invariant].append(violation)
    lines.append("invariants:")
    for name in INVARIANTS:
        if name == "slabs" and not audit.settings.lease_global_slots:
            continue  # judged only where the workers lease the global pool's slots
        found = by_invariant.get(name, [])
        lines.append(f"  {name:11s} {'ok' if not found else f'{len(found)} VIOLATIONS'}")
        for violation in sorted(found, key=lambda v: v.at)[:LISTED]:
            lines.append(f"    at {audit.rel(violation.at):7.2f}s: {violation.detail}")
    lines.append(f"result: {'PASS' if not audit.violations else 'FAIL'} "
                 f"({len(audit.violations)} violations), seed {seed}, {target}")
    return lines


def overall(results: list[tuple[int, str, float, Audit]]) -> list[str]:
    """The figures of every run together (what the README quotes)."""
    kinds: Counter[str] = Counter()
    episodes: Counter[str] = Counter()
    after: dict[str, float] = {}
    outcomes: Counter[str] = Counter()
    figures: dict[str, float] = {}
    violations = 0
    for *_, audit in results:
        kinds.update(f.kind for f in audit.faults)
        outcomes.update(audit.outcomes)
        violations += len(audit.violations)
        for episode in audit.episodes:
            kind = episode.fault.split(" at ")[0]
            episodes[kind] += 1
            after[kind] = max(after.get(kind, float("-inf")), episode.after_fault)
        for key, value in audit.figures.items():
            if key == "lost with no fault that can lose a lease":
                figures[key] = figures.get(key, 0) + value  # type: ignore[operator]
            elif isinstance(value, (int, float)):
                figures[key] = max(figures.get(key, float("-inf")), value)
    seconds = sum(seconds for _, _, seconds, _ in results)
    lines = [
        f"all runs: {len(results)} runs, {seconds / 60:.1f} minutes of streams and faults, "
        f"seeds {sorted({seed for seed, *_ in results})}",
        f"faults: {sum(kinds.values())}: " + ", ".join(
            f"{k} {kinds[k]}" for k in KINDS if kinds[k]),
        f"streams: {outcomes['started']} started; " + ", ".join(
            f"{k} {v}" for k, v in sorted(outcomes.items()) if k.startswith("ended")),
        "acquires without a stream: " + ", ".join(
            f"{k} {v}" for k, v in sorted(outcomes.items())
            if not k.startswith(("ended", "started", "logged"))),
        "over a cap before the windows, by the fault before: " + (", ".join(
            f"{k} {episodes[k]} (over until {after[k]:+.2f}s after it ended)"
            for k in sorted(episodes)) or "never"),
    ]
    lines += [f"{key}: {value}" for key, value in figures.items()]
    lines.append(f"violations: {violations}")
    return lines
