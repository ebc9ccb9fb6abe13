//! The steps of a lease (acquire, hold, release, loss, the lost sweep), of time and of faults,
//! and the dispatch of every action.

use super::{Action, Failure, Late, State, Target};
use crate::config::{bits, Count, EntryCheck, ModelConfig};
use crate::process::{self, Call, Phase, Round, RoundGhost, Tally};
use crate::redis::{AcquireReply, Redis};

/// One step being applied.
pub(super) struct Step<'a> {
    pub(super) cfg: &'a ModelConfig,
    pub(super) s: &'a mut State,
}

impl Step<'_> {
    pub(super) fn exact(&self) -> bool {
        self.cfg.count == Count::Exact
    }

    pub(super) fn holder_of(&self, lease: usize) -> usize {
        self.cfg.leases[lease].holder
    }

    pub(super) fn tally(&mut self, lease: usize) -> &mut Option<Tally> {
        let holder = self.holder_of(lease);
        &mut self.s.holders[holder].tally
    }

    pub(super) fn has_group(&self, holder: usize) -> bool {
        self.s.held(self.cfg, holder) != 0
    }

    /// Property bookkeeping: the round is not calm.
    pub(super) fn spoil(&mut self, holder: usize) {
        let ghost = &mut self.s.holders[holder].ghost;
        if *ghost == RoundGhost::Calm {
            *ghost = RoundGhost::Spoiled;
        }
    }

    /// Property bookkeeping: one of the holder's leases changed; it matters while its keep-alive
    /// window is open.
    pub(super) fn activity(&mut self, holder: usize) {
        if matches!(self.s.holders[holder].round, Round::Keepalive { .. }) {
            self.spoil(holder);
        }
    }

    /// Nothing of the holder in flight (its window would see only what it holds).
    pub(super) fn nothing_in_flight(&self, holder: usize) -> bool {
        bits(self.cfg.leases_of(holder)).all(|l| !self.s.in_flight(self.cfg, l))
            && self.s.holders[holder].tally.is_none_or(|t| t.in_flight == 0)
    }

    pub(super) fn flight_start(&mut self, lease: usize, held: bool) {
        if self.exact() {
            let cfg = self.cfg;
            process::flight_start(cfg, self.tally(lease), lease, held);
        }
    }

    pub(super) fn flight_end(&mut self, lease: usize, counted: bool) {
        if self.exact() {
            let cfg = self.cfg;
            process::flight_end(cfg, self.tally(lease), lease, counted);
        }
    }

    pub(super) fn tally_hold(&mut self, lease: usize, held: bool) {
        if self.exact() {
            let cfg = self.cfg;
            process::tally_hold(cfg, self.tally(lease), lease, held);
        }
    }

    /// Out of the held set (`Held::remove` of a held lease), into `phase`.
    pub(super) fn leave_held(&mut self, lease: usize, phase: Phase) {
        debug_assert_eq!(self.s.leases[lease].phase, Phase::Held);
        self.s.leases[lease].phase = phase;
        self.tally_hold(lease, false);
        let holder = self.holder_of(lease);
        if !self.has_group(holder) {
            let h = &mut self.s.holders[holder];
            h.deadline = 0;
            h.granted = 0;
        }
    }

    /// `Leases::retry_later`.
    pub(super) fn retry_later(&mut self, lease: usize) {
        self.s.leases[lease].unremoved = true;
        self.flight_start(lease, false);
    }

    /// `Leases::release`: false if it was released already.
    pub(super) fn release(&mut self, lease: usize) -> bool {
        let phase = self.s.leases[lease].phase;
        if phase == Phase::Released {
            return false;
        }
        let was_held = phase == Phase::Held;
        if was_held {
            self.leave_held(lease, Phase::Released);
        } else {
            self.s.leases[lease].phase = Phase::Released;
        }
        self.flight_start(lease, was_held);
        self.s.leases[lease].release = true;
        self.activity(self.holder_of(lease));
        true
    }

    /// `Leases::lose` of a held lease (`still_stored`: put on the retry list); its stream is
    /// cancelled and releases it (`OnLost::Cancel`).
    pub(super) fn lose(&mut self, lease: usize, still_stored: bool) {
        if self.s.leases[lease].phase != Phase::Held {
            return; // mark_lost succeeds only from 0
        }
        self.leave_held(lease, Phase::Idle);
        if still_stored {
            self.retry_later(lease);
        }
        self.release(lease);
    }

    /// The lost sweep (`renewal/sweep.rs`): the keeper wakes at the group's deadline.
    pub(super) fn sweep(&mut self, holder: usize) {
        if self.s.holders[holder].stalled || self.s.holders[holder].deadline > 0 {
            return;
        }
        for lease in bits(self.s.held(self.cfg, holder)) {
            self.lose(lease, true);
        }
    }

    /// `Granted::hold` -> `Leases::hold` -> `Held::insert`; `life`: the ticks the reply says the
    /// holder's entry had left.
    pub(super) fn hold(&mut self, lease: usize, alive: bool, life: u8) {
        let holder = self.holder_of(lease);
        // `sent` counts down a lease duration from the sending: the grant's deadline, or the
        // entry's life from the sending (the script ran later, so it lives at least that long).
        let sent = self.s.leases[lease].sent;
        let deadline = match self.cfg.grant_dated_by_entry {
            true => sent.saturating_sub(self.cfg.ttl.saturating_sub(life)),
            false => sent,
        };
        let had_group = self.has_group(holder);
        let overdue = if had_group && !alive && self.s.holders[holder].deadline == 0 {
            self.s.held(self.cfg, holder)
        } else {
            0
        };
        for old in bits(overdue) {
            self.leave_held(old, Phase::Idle);
        }
        let h = &mut self.s.holders[holder];
        h.entry_known = h.entry_known.max(deadline);
        if had_group && overdue == 0 {
            h.deadline = h.deadline.max(deadline);
        } else {
            h.deadline = deadline;
            h.granted = 0;
        }
        if self.cfg.count == Count::GrantedOnlyGrows {
            h.granted += self.cfg.units(lease);
        }
        let l = &mut self.s.leases[lease];
        l.phase = Phase::Held;
        l.acquire = Call::None;
        l.sent = 0;
        self.tally_hold(lease, true);
        self.flight_end(lease, true);
        for old in bits(overdue) {
            self.retry_later(old);
            self.release(old);
        }
        self.activity(holder);
        if self.cfg.late_grants_lost && deadline == 0 {
            self.lose(lease, true);
        }
        self.sweep(holder);
    }

    /// A fault of Redis: every holder's counts may be off until its next calm round.
    pub(super) fn fault(&mut self) {
        for holder in 0..self.cfg.holders {
            self.spoil(holder);
            let h = &mut self.s.holders[holder];
            h.exposed = true;
            h.calm = 0;
        }
    }

    pub(super) fn tick(&mut self) {
        for holder in 0..self.cfg.holders {
            if self.has_group(holder) {
                let h = &mut self.s.holders[holder];
                h.deadline = h.deadline.saturating_sub(1);
            }
            let h = &mut self.s.holders[holder];
            h.round_sent = h.round_sent.saturating_sub(1);
            h.entry_known = h.entry_known.saturating_sub(1);
        }
        for lease in self.s.leases.iter_mut() {
            if lease.phase == Phase::Acquiring {
                lease.sent = lease.sent.saturating_sub(1);
            }
        }
        self.s.redis.tick();
        if let Some(snapshot) = &mut self.s.snapshot {
            snapshot.tick();
        }
        for holder in 0..self.cfg.holders {
            self.sweep(holder);
        }
    }

    pub(super) fn apply(&mut self, action: Action) {
        let cfg = self.cfg;
        match action {
            Action::Acquire(lease) => {
                let trusted = match cfg.entry_check {
                    EntryCheck::Read => 0,
                    EntryCheck::TrustKnown => self.s.holders[self.holder_of(lease)].entry_known,
                    EntryCheck::TrustAlways => cfg.ttl,
                };
                let l = &mut self.s.leases[lease];
                l.trusted = trusted;
                l.phase = Phase::Acquiring;
                l.acquire = Call::Sent;
                l.sent = cfg.ttl;
                self.flight_start(lease, false);
                self.activity(self.holder_of(lease));
            }
            Action::RunAcquire(lease) => {
                let trusted = self.s.leases[lease].trusted;
                self.s.leases[lease].acquire = Call::Ran(self.s.redis.acquire(cfg, lease, trusted));
            }
            Action::Hold(lease) => {
                let Call::Ran(AcquireReply::Granted { alive, life }) = self.s.leases[lease].acquire else {
                    unreachable!("a grant to hold")
                };
                self.hold(lease, alive, life);
            }
            Action::DropGrant(lease) => {
                let l = &mut self.s.leases[lease];
                l.acquire = Call::None;
                l.sent = 0;
                self.release(lease);
            }
            Action::Refused(lease) => {
                let l = &mut self.s.leases[lease];
                l.acquire = Call::None;
                l.sent = 0;
                l.phase = Phase::Released;
                self.flight_end(lease, false);
                self.activity(self.holder_of(lease));
            }
            Action::End(lease) => {
                self.release(lease);
            }
            Action::Release(lease) => {
                self.s.redis.release(cfg, self.holder_of(lease), 1 << lease);
                self.s.leases[lease].release = false;
                self.flight_end(lease, true);
                self.activity(self.holder_of(lease));
            }
            Action::StartRound(holder) => self.start_round(holder),
            Action::RunKeepalive(holder) => {
                let Round::Keepalive { known, call, .. } = &mut self.s.holders[holder].round else {
                    unreachable!("a keep-alive under way")
                };
                *call = Call::Ran(self.s.redis.keepalive(cfg, holder, false, *known));
            }
            Action::Answer(holder) => self.answer(holder),
            Action::Fail { call, how } => {
                self.s.failures -= 1;
                // Property bookkeeping: a failed call may leave Redis off until calm rounds follow.
                let holder = match call {
                    Target::Acquire(lease) | Target::Release(lease) => self.holder_of(lease),
                    Target::Round(holder) => holder,
                };
                self.s.holders[holder].calm = 0;
                match call {
                    Target::Acquire(lease) => {
                        match (how, self.s.leases[lease].acquire) {
                            (Failure::Late, _) => self.s.late = Some(Late::Acquire(lease)),
                            (Failure::Ran, Call::Sent) => {
                                let trusted = self.s.leases[lease].trusted;
                                self.s.redis.acquire(cfg, lease, trusted);
                            }
                            _ => {}
                        }
                        let l = &mut self.s.leases[lease];
                        l.acquire = Call::None;
                        l.sent = 0;
                        // The admission guard: a call that may have run is given back.
                        self.release(lease);
                    }
                    Target::Release(lease) => {
                        let holder = self.holder_of(lease);
                        match how {
                            Failure::Unrun => {}
                            Failure::Ran => {
                                self.s.redis.release(cfg, holder, 1 << lease);
                            }
                            Failure::Late => {
                                self.s.late = Some(Late::Release {
                                    holder,
                                    leases: 1 << lease,
                                })
                            }
                        }
                        self.s.leases[lease].release = false;
                        self.retry_later(lease);
                        self.activity(holder);
                    }
                    Target::Round(holder) => self.fail_round(holder, how),
                }
            }
            Action::RunLate => {
                let late = self.s.late.take().expect("a late request");
                let redis = &mut self.s.redis;
                match late {
                    Late::Acquire(lease) => {
                        redis.acquire(cfg, lease, self.s.leases[lease].trusted);
                    }
                    Late::Release { holder, leases } => {
                        redis.release(cfg, holder, leases);
                    }
                    Late::Keepalive {
                        holder,
                        resync,
                        known,
                    } => {
                        redis.keepalive(cfg, holder, resync, known);
                    }
                    Late::Prune { holder, keep } => {
                        redis.prune(cfg, holder, keep);
                    }
                    Late::PruneIds { holder, strays } => {
                        redis.prune_ids(cfg, holder, strays);
                    }
                    Late::Reclaim { holder, check } => {
                        redis.reclaim(cfg, holder, check);
                    }
                }
                let holder = late.holder(cfg);
                self.spoil(holder);
                self.s.holders[holder].calm = 0;
            }
            Action::Tick => self.tick(),
            Action::Snapshot => self.s.snapshot = Some(self.s.redis.clone()),
            Action::Restore => {
                self.s.redis = self.s.snapshot.take().expect("a snapshot");
                self.s.restores -= 1;
                self.fault();
            }
            Action::Restart => {
                self.s.redis = Redis::default();
                self.s.restarts -= 1;
                self.fault();
            }
            Action::Stall(holder) => {
                self.s.stalls -= 1;
                self.spoil(holder);
                let h = &mut self.s.holders[holder];
                h.stalled = true;
                h.calm = 0;
            }
            Action::Resume(holder) => {
                self.s.holders[holder].stalled = false;
                self.sweep(holder);
            }
            Action::Observe => self.s.redis.count(cfg),
        }
    }
}
