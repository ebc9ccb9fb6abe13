"""A short chaos run at a fixed seed: every kind of fault, on one Redis, and no invariant the
auditor checks broken. ``make chaos`` runs the long ones (tests/chaos/)."""

from __future__ import annotations

import asyncio
import io

from fastapi_stream_lease import TOP_UP_INCREMENT

from chaos.auditor import Audit, Bounds, Sample, WorkerLife
from chaos.faults import KINDS, Fault
from chaos.report import summary
from chaos.run import ChaosRun
from chaos.settings import Settings

# This seed's 40 s draw each of them, and stall Redis, a worker and a worker's network past
# lease_seconds (see chaos.faults.draw_schedule); no seed below 20,000 draws all that in less.
SEED = 14347
SECONDS = 40
WORKERS = 3


async def finished_within(run: ChaosRun, seconds: float) -> Audit:
    """The run's audit; a run still going after ``seconds`` fails with the stack of every task,
    which says what it waits for."""
    task = asyncio.ensure_future(run.run())
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if not done:
        stacks = io.StringIO()
        for waiting in asyncio.all_tasks():
            waiting.print_stack(file=stacks)
        task.cancel()
        raise AssertionError(
            f"the chaos run went on past {seconds} s, waiting:\n{stacks.getvalue()}")
    return task.result()


async def test_a_short_chaos_run_breaks_no_invariant():
    run = ChaosRun(SEED, SECONDS, workers=WORKERS, say=lambda _: None, kinds=KINDS)
    audit = await finished_within(run, 5 * SECONDS)
    report = "\n".join(summary(audit, SEED, "redis", SECONDS, WORKERS))
    assert {fault.kind for fault in audit.faults} == set(KINDS), report
    long_stalls = {f.kind for f in audit.faults if f.t1 - f.t0 > audit.bounds.lease}
    assert {"redis_pause", "worker_stop", "net_cut"} <= long_stalls, report
    assert audit.outcomes["started"] > 100 and audit.checked["samples"] > 50, report
    # The teams' money is judged, and tight enough to refuse starts its users' budgets admit.
    assert audit.checked["budget windows (team_spend)"] > 100, report
    # The hot users' hits are judged, and the leased rate refuses some of them.
    assert audit.checked["hit windows"] > 100, report
    assert audit.outcomes["limited (team_spend)"] > 0, report
    assert not audit.violations, report


# -- the auditor itself, on made-up events: it sees what it must see, and allows only its windows

def audit_of(streams, faults=(), samples=(), settings=None):
    """An audit of ``streams`` (user, start, end, how, worker), all of weight 1."""
    settings = settings or Settings()
    audit = Audit(settings, Bounds.of(settings), t_origin=0.0)
    for worker in ("0.1", "1.1"):
        audit.workers[worker] = WorkerLife(worker, 0, 0, 0.0, bye={}, exit_code=0)
    for i, (user, start, end, how, worker) in enumerate(streams):
        audit.event(worker, {"e": "start", "id": f"s{i}", "user": user, "weight": 1, "res": [],
                             "lease": f"lease{i}", "t_req": start - 0.01, "t_start": start})
        audit.event(worker, {"e": "end", "id": f"s{i}", "t_end": end, "how": how,
                             "lost": how == "lost"})
    audit.faults = list(faults)
    audit.samples = list(samples)
    audit.judge(100.0)
    return audit


def invariants(audit):
    return sorted({violation.invariant for violation in audit.violations})


def four_of_user0(fourth_end: float, worker: str = "1.1", how: str = "ok"):
    return [("user0", 1.0, 9.0, "ok", "0.1") for _ in range(3)] + [
        ("user0", 2.0, fourth_end, how, worker)]


def test_the_auditor_sees_a_cap_exceeded_and_allows_a_lost_stream_its_last_moment():
    assert invariants(audit_of(four_of_user0(3.0, worker="0.1"))) == ["caps"]
    # Lost: the stream ends once the core reports its lease lost (ended by LeaseLost).
    assert invariants(audit_of(four_of_user0(2.3, how="lost"))) == []
    assert invariants(audit_of(four_of_user0(3.0, how="lost"))) == ["caps"]


def test_the_auditor_allows_a_stopped_worker_its_window_and_no_more():
    stop = Fault("worker_stop", 1.5, 3.0, slot=1, t0=1.5, t1=4.5, notes={"worker": "1.1"})
    notice = Bounds.of(Settings()).notice
    assert invariants(audit_of(four_of_user0(4.5 + notice - 0.05), [stop])) == []
    assert invariants(audit_of(four_of_user0(4.5 + notice + 0.2), [stop])) == ["caps"]


def test_the_auditor_sees_a_slot_counted_too_long_and_a_stream_not_counted():
    settings = Settings()
    leftover = Bounds.of(settings).leftover
    key = settings.user_key("user0")

    def sample(at: float) -> Sample:
        return Sample(at, at + 0.001, 10_000, {7: 20_000}, {key: [("lease0", 7)]})

    ended = [("user0", 1.0, 2.0, "ok", "0.1")]
    assert invariants(audit_of(ended, samples=[sample(2.0 + leftover - 0.1)])) == []
    assert invariants(audit_of(ended, samples=[sample(2.0 + leftover + 0.1)])) == ["leftovers"]
    still_open = [("user0", 1.0, 9.0, "ok", "0.1"), ("user0", 1.0, 9.0, "ok", "0.1")]
    assert invariants(audit_of(still_open, samples=[sample(5.0)])) == ["counted"]


def test_under_leased_global_slots_the_auditor_wants_slabs_that_hold_the_open_streams():
    """A stream's global slot is a slab's member there, not its own: the slabs counted must
    hold the open streams' slots, and a slab is no leftover of an unknown lease."""
    settings = Settings(lease_global_slots=True)
    user_pool = settings.user_key("user0")
    assert settings.own_holders_keys()[user_pool] == user_pool.removesuffix(":user") + ":holders"

    def sample(at: float, slots: int) -> Sample:
        slab = [("slab" if i == 0 else f"slab#{i + 1}", 7) for i in range(slots)]
        pools = {settings.global_key: slab, user_pool: [("lease0", 7), ("lease1", 7)]}
        return Sample(at, at + 0.001, 10_000, {7: 20_000}, pools, {user_pool: {7: 20_000}})

    two_open = [("user0", 1.0, 9.0, "ok", "0.1")] * 2
    assert invariants(audit_of(two_open, samples=[sample(5.0, 2)], settings=settings)) == []
    assert invariants(audit_of(two_open, samples=[sample(5.0, 1)], settings=settings)) == ["slabs"]


def test_on_a_cluster_the_auditor_judges_each_tags_read_by_the_streams_open_at_its_time():
    """Under lease_global_slots on a cluster each tag is read on its own master, at its own
    time: a read judges the pools it took in, against the streams open when it was taken."""
    settings = Settings(lease_global_slots=True, cluster=True)
    user_pool = settings.user_key("user0")
    assert [pools for _, pools in settings.tag_reads()][:2] == [
        [settings.global_key, *(settings.resource_key(name) for name in settings.resources)],
        [user_pool]]
    assert [level.name for level in settings.budget_levels()] == ["tokens"]

    def global_read(at: float, slots: int) -> Sample:
        slab = [("slab" if i == 0 else f"slab#{i + 1}", 7) for i in range(slots)]
        return Sample(at, at + 0.001, 10_000, {7: 20_000}, {settings.global_key: slab},
                      reads=frozenset({settings.global_key}))

    def user_read(at: float, members: list[str]) -> Sample:
        return Sample(at, at + 0.001, 10_000, {}, {user_pool: [(m, 7) for m in members]},
                      {user_pool: {7: 20_000}}, reads=frozenset({user_pool}))

    two_open = [("user0", 1.0, 5.0, "ok", "0.1")] * 2
    counted = [global_read(4.0, 2), user_read(4.5, ["lease0", "lease1"])]
    assert invariants(audit_of(two_open, samples=counted, settings=settings)) == []
    # The user's tag read after the streams ended: nothing of them is wanted there.
    after = [global_read(4.0, 2), user_read(5.5, [])]
    assert invariants(audit_of(two_open, samples=after, settings=settings)) == []
    # The global tag read after they ended: no slab is wanted; while they are open, two.
    assert invariants(audit_of(two_open, samples=[global_read(5.5, 0)], settings=settings)) == []
    assert invariants(audit_of(two_open, samples=[global_read(4.0, 1)],
                               settings=settings)) == ["slabs"]
    assert invariants(audit_of(two_open, samples=[user_read(4.5, ["lease0"])],
                               settings=settings)) == ["counted"]


def audit_of_limited(streams, faults=()):
    """An audit of budgeted, rate-counted streams: (user, t_req, t_start, t_end, tokens sent as
    (time, n), reserve)."""
    settings = Settings()
    audit = Audit(settings, Bounds.of(settings), t_origin=0.0)
    audit.workers["0.1"] = WorkerLife("0.1", 0, 0, 0.0, bye={}, exit_code=0)
    for i, (user, t_req, t_start, t_end, sent, reserve) in enumerate(streams):
        audit.event("0.1", {"e": "start", "id": f"s{i}", "user": user, "weight": 1, "res": [],
                            "lease": f"lease{i}", "t_req": t_req, "t_start": t_start,
                            "rate": True, "budget": True, "reserve": reserve})
        for t, n in sent:
            audit.event("0.1", {"e": "tok", "id": f"s{i}", "t": t, "n": n})
        audit.event("0.1", {"e": "end", "id": f"s{i}", "t_end": t_end, "how": "ok",
                            "lost": False})
    audit.faults = list(faults)
    audit.judge(100.0)
    return audit


def test_the_auditor_counts_starts_known_to_fall_in_one_rate_window():
    limit, per = Settings().rate_limit, Settings().rate_per
    # Short streams, one after another (never over max_per_user).
    starts = [("user0", 1.0 + 0.1 * i, 1.05 + 0.1 * i, 1.09 + 0.1 * i, [], 0)
              for i in range(limit + 1)]
    assert invariants(audit_of_limited(starts)) == ["rates"]
    # One start whose grant may have come after the window: not known to be inside it.
    starts[-1] = ("user0", 1.0 + 0.1 * limit, 1.0 + per, 1.0 + per + 0.05, [], 0)
    assert invariants(audit_of_limited(starts)) == []
    spread = [("user0", 1.0 + per * i / limit, 1.01 + per * i / limit, 1.02 + per * i / limit,
               [], 0) for i in range(limit + 1)]
    assert invariants(audit_of_limited(spread)) == [], "limit starts per window, no more"


def audit_of_hits(hits, faults=()):
    """An audit of allowed hits of the leased rate: (user, t_req, t_done)."""
    settings = Settings()
    audit = Audit(settings, Bounds.of(settings), t_origin=0.0)
    for user, t_req, t_done in hits:
        audit.event("0.1", {"e": "hit", "user": user, "t_req": t_req, "t_done": t_done})
    audit.faults = list(faults)
    audit.judge(100.0)
    return audit


def test_the_auditor_counts_hits_known_to_fall_in_one_window_of_the_leased_rate():
    limit, per = Settings().hit_limit, Settings().hit_per
    packed = [("user0", 1.0 + 0.001 * i, 1.0005 + 0.001 * i) for i in range(limit + 1)]
    assert invariants(audit_of_hits(packed)) == ["hits"]
    assert invariants(audit_of_hits(packed[:limit])) == []
    # One hit answered after the window: not known to be inside it.
    late = [*packed[:limit], ("user0", 1.0 + 0.001 * limit, 1.0 + per)]
    assert invariants(audit_of_hits(late)) == []
    other_user = [*packed[:limit], ("user1", 1.0 + 0.001 * limit, 1.0005 + 0.001 * limit)]
    assert invariants(audit_of_hits(other_user)) == []
    # Redis lost its counts meanwhile: the window is not judged.
    restart = Fault("redis_restart", 0.9, 0.2, t0=0.9, t1=1.1)
    assert invariants(audit_of_hits(packed, [restart])) == []


def test_the_auditor_holds_a_budget_window_to_the_guides_bound():
    settings = Settings()
    slack = TOP_UP_INCREMENT + settings.max_chunk
    # Two streams in one window may send the budget and one slack each, and no more.
    per_stream = (settings.budget + 2 * slack) // 2
    sent = [[(1.0 + 0.1 * k, per_stream // 10) for k in range(10)] for _ in range(2)]
    streams = [("user0", 0.9, 0.95, 3.0, sent[i], 100) for i in range(2)]
    assert invariants(audit_of_limited(streams)) == []
    sent[0].append((2.5, 2 * slack))
    assert invariants(audit_of_limited(streams)) == ["budgets"]
    # A restart forgot the counts while both were open: not judged across it, and the
    # reservations they held are allowed in the windows after it.
    restart = Fault("redis_restart", 1.5, 0.2, t0=1.5, t1=1.7)
    assert invariants(audit_of_limited(streams, [restart])) == []


def test_the_auditor_holds_a_teams_money_to_its_bound_when_each_user_keeps_to_theirs():
    """A team's budget in money, shared by its users, overspent while each user kept within
    their own token budget went unjudged."""
    settings = Settings()
    team = [f"user{i}" for i in range(settings.users) if settings.team_of(f"user{i}") == "team0"]
    # Each user sends one stream of 1,000 tokens: within their own bound of 800 + 316.
    sent = [(1.0 + 0.1 * k, 100) for k in range(10)]

    def streams(users):
        return [(user, 0.9, 0.95, 3.0, sent, 100) for user in users]

    assert invariants(audit_of_limited(streams(team[:2]))) == []  # 4,000 units: the team's limit
    audit = audit_of_limited(streams(team[:3]))  # 6,000 units > 4,000 + 632 x 3
    assert invariants(audit) == ["budgets"]
    assert [v.detail.split(":")[0] for v in audit.violations] == ["team_spend of team0"]
