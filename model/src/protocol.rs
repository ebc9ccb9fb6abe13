//! The model: its state, its actions (each one atomic step of a process, of Redis, of time or
//! of a fault) and how each changes the state.

use crate::config::{bits, Count, ModelConfig, Prune, MAX_HOLDERS, MAX_LEASES};
use crate::process::{self, Call, Holder, Lease, Phase, Round, RoundGhost, Tally};
use crate::redis::{AcquireReply, Ids, Redis};

/// A request the process gave up on (its call timed out) that Redis may still run.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Late {
    Acquire(usize),
    Release { holder: usize, leases: u8 },
    Keepalive { holder: usize, resync: bool, known: u8 },
    Prune { holder: usize, keep: u8 },
    PruneIds { holder: usize, strays: u8 },
    Reclaim { holder: usize, check: u8 },
}

impl Late {
    fn holder(self, cfg: &ModelConfig) -> usize {
        match self {
            Late::Acquire(lease) => cfg.leases[lease].holder,
            Late::Release { holder, .. }
            | Late::Keepalive { holder, .. }
            | Late::Prune { holder, .. }
            | Late::PruneIds { holder, .. }
            | Late::Reclaim { holder, .. } => holder,
        }
    }
}

/// The whole system: Redis, its snapshot, the processes, and what is left of the budgets.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct State {
    pub redis: Redis,
    /// An earlier state of Redis that a failover may restore.
    pub snapshot: Option<Redis>,
    pub leases: [Lease; MAX_LEASES],
    pub holders: [Holder; MAX_HOLDERS],
    pub late: Option<Late>,
    pub restores: u8,
    pub restarts: u8,
    pub stalls: u8,
    pub failures: u8,
}

/// The call a timeout hits.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Target {
    Acquire(usize),
    Release(usize),
    Round(usize),
}

/// How a call fails (the process sees a timeout in every case).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Failure {
    /// Its script never runs.
    Unrun,
    /// Its script ran (now, or before) and the reply is lost.
    Ran,
    /// Its script runs later (`RunLate`).
    Late,
}

/// One step.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Action {
    /// A process sends the acquire of a lease (`admission/acquire.rs`).
    Acquire(usize),
    /// Redis runs it.
    RunAcquire(usize),
    /// GRANTED arrives and the binding holds it (`Granted::hold`).
    Hold(usize),
    /// GRANTED arrives for a caller that is gone: the `Granted` is dropped and releases itself.
    DropGrant(usize),
    /// REFUSED arrives.
    Refused(usize),
    /// The stream ends: `Leases::release`.
    End(usize),
    /// Redis runs that release, and its reply arrives.
    Release(usize),
    /// The holder's renewal loop starts a round.
    StartRound(usize),
    /// Redis runs the round's keep-alive.
    RunKeepalive(usize),
    /// The keep-alive's reply arrives, or Redis runs another call of the round and it answers;
    /// the round goes on.
    Answer(usize),
    /// A call times out.
    Fail { call: Target, how: Failure },
    /// Redis runs the request given up on.
    RunLate,
    /// Time passes: one tick on the server's clock and every process's.
    Tick,
    /// A replica's copy of Redis as it is now (what a failover may come back to).
    Snapshot,
    /// A failover: Redis is the snapshot again.
    Restore,
    /// Redis restarts empty.
    Restart,
    /// A process freezes ...
    Stall(usize),
    /// ... and wakes (its keeper sweeps the overdue groups first).
    Resume(usize),
    /// Another client counts the pools (`count.lua`).
    Observe,
}

/// The model of the protocol under a configuration.
pub struct ProtocolModel {
    pub cfg: ModelConfig,
}

impl ProtocolModel {
    pub fn new(cfg: ModelConfig) -> Self {
        cfg.validate().expect("a valid configuration");
        ProtocolModel { cfg }
    }
}

impl State {
    /// The state after `action` (the same state when it changes nothing).
    pub fn after(&self, cfg: &ModelConfig, action: Action) -> State {
        let mut s = self.clone();
        Step { cfg, s: &mut s }.apply(action);
        s
    }

    pub fn new(cfg: &ModelConfig) -> Self {
        let mut leases: [Lease; MAX_LEASES] = std::array::from_fn(|_| Lease {
            class: NO_CLASS,
            ..Lease::default()
        });
        for (lease, spec) in cfg.leases.iter().enumerate() {
            leases[lease].class = cfg.leases.iter().position(|other| other == spec).unwrap_or(lease) as u8;
        }
        let mut s = State {
            redis: Redis::default(),
            snapshot: None,
            leases,
            holders: Default::default(),
            late: None,
            restores: cfg.restores,
            restarts: cfg.restarts,
            stalls: cfg.stalls,
            failures: cfg.failures,
        };
        // Kept leases: granted and held before the run, their holder's entry fresh.
        for (lease, spec) in cfg.leases.iter().enumerate().filter(|(_, spec)| spec.kept) {
            let holder = spec.holder;
            let units = cfg.units(lease);
            s.leases[lease].phase = Phase::Held;
            s.redis.members[lease] = cfg.pool_mask(lease);
            s.redis.index[holder] |= cfg.pool_mask(lease);
            s.redis.entry[holder] = Some(cfg.ttl);
            s.redis.count[holder] = Some(s.redis.count[holder].unwrap_or(0) + units as i8);
            if cfg.sum_of_ids {
                s.redis.summed[lease] = units as i8;
            }
            let h = &mut s.holders[holder];
            h.deadline = cfg.ttl;
            if cfg.count == Count::GrantedOnlyGrows {
                h.granted += units;
            }
            if cfg.count == Count::Exact {
                let tally = h.tally.get_or_insert_with(Tally::default);
                tally.held += units;
                tally.held_ids |= 1 << lease;
            }
        }
        s
    }

    /// The leases of a holder in its held set.
    pub fn held(&self, cfg: &ModelConfig, holder: usize) -> u8 {
        bits(cfg.leases_of(holder))
            .filter(|&l| self.leases[l].phase == Phase::Held)
            .fold(0, |mask, l| mask | 1 << l)
    }

    /// Whether the process has a call under way for a lease, or keeps it to release again (as
    /// a lease its round took back after its release).
    pub fn in_flight(&self, cfg: &ModelConfig, lease: usize) -> bool {
        let l = &self.leases[lease];
        let bit = 1 << lease;
        let round = &self.holders[cfg.leases[lease].holder].round;
        l.phase == Phase::Acquiring
            || l.release
            || l.unremoved
            || matches!(*round, Round::Releasing { leases } if leases & bit != 0)
            || matches!(*round, Round::Recount { reclaimed, .. } if reclaimed & bit != 0)
    }
}

/// One step being applied.
struct Step<'a> {
    cfg: &'a ModelConfig,
    s: &'a mut State,
}

impl Step<'_> {
    fn exact(&self) -> bool {
        self.cfg.count == Count::Exact
    }

    fn holder_of(&self, lease: usize) -> usize {
        self.cfg.leases[lease].holder
    }

    fn tally(&mut self, lease: usize) -> &mut Option<Tally> {
        let holder = self.holder_of(lease);
        &mut self.s.holders[holder].tally
    }

    fn has_group(&self, holder: usize) -> bool {
        self.s.held(self.cfg, holder) != 0
    }

    /// Property bookkeeping: the round is not calm.
    fn spoil(&mut self, holder: usize) {
        let ghost = &mut self.s.holders[holder].ghost;
        if *ghost == RoundGhost::Calm {
            *ghost = RoundGhost::Spoiled;
        }
    }

    /// Property bookkeeping: one of the holder's leases changed; it matters while its keep-alive
    /// window is open.
    fn activity(&mut self, holder: usize) {
        if matches!(self.s.holders[holder].round, Round::Keepalive { .. }) {
            self.spoil(holder);
        }
    }

    /// Nothing of the holder in flight (its window would see only what it holds).
    fn nothing_in_flight(&self, holder: usize) -> bool {
        bits(self.cfg.leases_of(holder)).all(|l| !self.s.in_flight(self.cfg, l))
            && self.s.holders[holder].tally.is_none_or(|t| t.in_flight == 0)
    }

    fn flight_start(&mut self, lease: usize, held: bool) {
        if self.exact() {
            let cfg = self.cfg;
            process::flight_start(cfg, self.tally(lease), lease, held);
        }
    }

    fn flight_end(&mut self, lease: usize, counted: bool) {
        if self.exact() {
            let cfg = self.cfg;
            process::flight_end(cfg, self.tally(lease), lease, counted);
        }
    }

    fn tally_hold(&mut self, lease: usize, held: bool) {
        if self.exact() {
            let cfg = self.cfg;
            process::tally_hold(cfg, self.tally(lease), lease, held);
        }
    }

    /// Out of the held set (`Held::remove` of a held lease), into `phase`.
    fn leave_held(&mut self, lease: usize, phase: Phase) {
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
    fn retry_later(&mut self, lease: usize) {
        self.s.leases[lease].unremoved = true;
        self.flight_start(lease, false);
    }

    /// `Leases::release`: false if it was released already.
    fn release(&mut self, lease: usize) -> bool {
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
    fn lose(&mut self, lease: usize, still_stored: bool) {
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
    fn sweep(&mut self, holder: usize) {
        if self.s.holders[holder].stalled || self.s.holders[holder].deadline > 0 {
            return;
        }
        for lease in bits(self.s.held(self.cfg, holder)) {
            self.lose(lease, true);
        }
    }

    /// `Granted::hold` -> `Leases::hold` -> `Held::insert`.
    fn hold(&mut self, lease: usize, alive: bool) {
        let holder = self.holder_of(lease);
        let deadline = self.s.leases[lease].sent;
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

    /// Round step 1 and 2: the excess judged, windows opened, the keep-alive sent.
    fn start_round(&mut self, holder: usize) {
        let cfg = self.cfg;
        let exact = self.exact();
        let quiet = self.nothing_in_flight(holder);
        let kept = self.has_group(holder);
        let h = &mut self.s.holders[holder];
        let excess = exact && process::take_excess(cfg, &mut h.tally);
        if exact {
            process::open_windows(cfg, &mut h.tally);
        }
        h.round_sent = cfg.ttl;
        h.ghost = match (kept, quiet) {
            (false, _) => RoundGhost::Unkept,
            (true, true) => RoundGhost::Calm,
            (true, false) => RoundGhost::Spoiled,
        };
        let known = h.granted;
        if kept {
            h.round = Round::Keepalive {
                excess,
                known,
                call: Call::Sent,
            };
        } else {
            self.after_keepalive(holder, false, false, excess, known);
        }
    }

    /// After the keep-alive: the prune of members in excess, sent with what is held or in
    /// flight now.
    fn after_keepalive(&mut self, holder: usize, renewed: bool, short: bool, excess: bool, known: u8) {
        if excess && self.cfg.prune != Prune::Never {
            let in_flight = self.s.holders[holder].tally.map_or(0, |t| t.in_flight);
            let keep = self.s.held(self.cfg, holder) | in_flight;
            self.s.holders[holder].round = Round::Prune {
                renewed,
                short,
                keep,
                known,
            };
        } else {
            self.after_prune(holder, renewed, short, known);
        }
    }

    /// Step 3: a short tag's held leases checked one by one (no call for none: straight to the
    /// recount).
    fn after_prune(&mut self, holder: usize, renewed: bool, short: bool, known: u8) {
        if !short {
            return self.finish(holder, renewed, 0, 0);
        }
        let check = self.s.held(self.cfg, holder);
        self.s.holders[holder].round = if check != 0 {
            Round::Reclaim {
                renewed,
                check,
                known,
            }
        } else {
            Round::Recount {
                renewed,
                lost: 0,
                reclaimed: 0,
                known,
            }
        };
    }

    /// Steps 6 and 7: deadlines extended, results applied, releases sent again.
    fn finish(&mut self, holder: usize, renewed: bool, lost: u8, reclaimed: u8) {
        if renewed && self.has_group(holder) {
            let h = &mut self.s.holders[holder];
            h.deadline = h.deadline.max(h.round_sent);
        }
        let mut again = 0;
        for lease in bits(reclaimed) {
            match self.s.leases[lease].phase {
                Phase::Released => again |= 1 << lease,
                // Before: `Held::taken_back`, for a lease still in the group.
                Phase::Held if !self.exact() => self.s.holders[holder].granted += self.cfg.units(lease),
                _ => {}
            }
        }
        for lease in bits(lost) {
            self.lose(lease, false);
        }
        for lease in bits(self.cfg.leases_of(holder)) {
            if std::mem::take(&mut self.s.leases[lease].unremoved) {
                again |= 1 << lease;
            }
        }
        if again != 0 {
            self.s.holders[holder].round = Round::Releasing { leases: again };
        } else {
            self.end_round(holder);
        }
    }

    fn end_round(&mut self, holder: usize) {
        let h = &mut self.s.holders[holder];
        match h.ghost {
            RoundGhost::Unkept => {}
            RoundGhost::Calm => {
                h.calm = (h.calm + 1).min(2);
                h.exposed = false;
            }
            RoundGhost::Spoiled => h.calm = 0,
        }
        h.round = Round::Idle;
        h.round_sent = 0;
        h.ghost = RoundGhost::Unkept;
    }

    /// The keep-alive's reply, or another call of the round run by Redis and answered.
    fn answer(&mut self, holder: usize) {
        let cfg = self.cfg;
        match self.s.holders[holder].round {
            Round::Keepalive {
                excess,
                known,
                call: Call::Ran(reply),
            } => {
                let short = match cfg.count {
                    Count::Exact => process::close_window(cfg, &mut self.s.holders[holder].tally, reply),
                    Count::GrantedOnlyGrows => false,
                };
                self.after_keepalive(holder, reply.alive, !reply.alive || short, excess, known);
            }
            Round::Prune {
                renewed,
                short,
                keep,
                known,
            } => {
                if cfg.prune == Prune::TwoStep {
                    let listed = self.s.redis.list_strays(cfg, holder, keep);
                    let in_flight = self.s.holders[holder].tally.map_or(0, |t| t.in_flight);
                    let strays = listed & !(self.s.held(cfg, holder) | in_flight);
                    if strays != 0 {
                        self.s.holders[holder].round = Round::PruneStrays {
                            renewed,
                            short,
                            strays,
                            known,
                        };
                        return;
                    }
                } else {
                    self.s.redis.prune(cfg, holder, keep);
                }
                self.after_prune(holder, renewed, short, known);
            }
            Round::PruneStrays {
                renewed,
                short,
                strays,
                known,
            } => {
                self.s.redis.prune_ids(cfg, holder, strays);
                self.after_prune(holder, renewed, short, known);
            }
            Round::Reclaim {
                renewed,
                check,
                known,
            } => {
                let (lost, reclaimed) = self.s.redis.reclaim(cfg, holder, check);
                // Before: the recount raised the granted count to the group's, taken back included.
                let taken_back: u8 = match cfg.count {
                    Count::Exact => 0,
                    Count::GrantedOnlyGrows => bits(reclaimed).map(|l| cfg.units(l)).sum(),
                };
                self.s.holders[holder].round = Round::Recount {
                    renewed,
                    lost,
                    reclaimed,
                    known: known + taken_back,
                };
            }
            Round::Recount {
                renewed,
                lost,
                reclaimed,
                known,
            } => {
                let reply = self.s.redis.keepalive(cfg, holder, true, known);
                self.finish(holder, renewed || reply.alive, lost, reclaimed);
            }
            Round::Releasing { leases } => {
                self.s.redis.release(cfg, holder, leases);
                for lease in bits(leases) {
                    self.flight_end(lease, true);
                }
                self.end_round(holder);
            }
            _ => unreachable!("no call to answer"),
        }
    }

    /// Runs the round's call in Redis, without its answer (a reply lost, or a request that runs
    /// late).
    fn run_round_call(&mut self, holder: usize) {
        let cfg = self.cfg;
        let redis = &mut self.s.redis;
        match self.s.holders[holder].round {
            Round::Keepalive { known, call, .. } => {
                if call == Call::Sent {
                    redis.keepalive(cfg, holder, false, known);
                }
            }
            Round::Prune { keep, .. } => {
                if cfg.prune == Prune::KeepList {
                    redis.prune(cfg, holder, keep);
                }
            }
            Round::PruneStrays { strays, .. } => {
                redis.prune_ids(cfg, holder, strays);
            }
            Round::Reclaim { check, .. } => {
                redis.reclaim(cfg, holder, check);
            }
            Round::Recount { known, .. } => {
                redis.keepalive(cfg, holder, true, known);
            }
            Round::Releasing { leases } => {
                redis.release(cfg, holder, leases);
            }
            Round::Idle => unreachable!("no call under way"),
        }
    }

    /// The round's call as a request that may run late (None: one that changes nothing).
    fn late_round_call(&self, holder: usize) -> Option<Late> {
        Some(match self.s.holders[holder].round {
            Round::Keepalive { known, .. } => Late::Keepalive {
                holder,
                resync: false,
                known,
            },
            Round::Prune { .. } if self.cfg.prune == Prune::TwoStep => return None,
            Round::Prune { keep, .. } => Late::Prune { holder, keep },
            Round::PruneStrays { strays, .. } => Late::PruneIds { holder, strays },
            Round::Reclaim { check, .. } => Late::Reclaim { holder, check },
            Round::Recount { known, .. } => Late::Keepalive {
                holder,
                resync: true,
                known,
            },
            Round::Releasing { leases } => Late::Release { holder, leases },
            Round::Idle => unreachable!("no call under way"),
        })
    }

    /// The round's call times out: the round goes on as the code does on an error.
    fn fail_round(&mut self, holder: usize, how: Failure) {
        match how {
            Failure::Unrun => {}
            Failure::Ran => self.run_round_call(holder),
            Failure::Late => self.s.late = self.late_round_call(holder),
        }
        self.spoil(holder);
        match self.s.holders[holder].round {
            Round::Keepalive { excess, known, .. } => {
                self.after_keepalive(holder, false, false, excess, known)
            }
            Round::Prune {
                renewed,
                short,
                known,
                ..
            }
            | Round::PruneStrays {
                renewed,
                short,
                known,
                ..
            } => self.after_prune(holder, renewed, short, known),
            Round::Reclaim { renewed, .. } => self.finish(holder, renewed, 0, 0),
            Round::Recount {
                renewed,
                lost,
                reclaimed,
                ..
            } => self.finish(holder, renewed, lost, reclaimed),
            Round::Releasing { leases } => {
                for lease in bits(leases) {
                    self.retry_later(lease);
                }
                self.end_round(holder);
            }
            Round::Idle => unreachable!("no call under way"),
        }
    }

    /// A fault of Redis: every holder's counts may be off until its next calm round.
    fn fault(&mut self) {
        for holder in 0..self.cfg.holders {
            self.spoil(holder);
            let h = &mut self.s.holders[holder];
            h.exposed = true;
            h.calm = 0;
        }
    }

    fn tick(&mut self) {
        for holder in 0..self.cfg.holders {
            if self.has_group(holder) {
                let h = &mut self.s.holders[holder];
                h.deadline = h.deadline.saturating_sub(1);
            }
            let h = &mut self.s.holders[holder];
            h.round_sent = h.round_sent.saturating_sub(1);
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

    fn apply(&mut self, action: Action) {
        let cfg = self.cfg;
        match action {
            Action::Acquire(lease) => {
                let l = &mut self.s.leases[lease];
                l.phase = Phase::Acquiring;
                l.acquire = Call::Sent;
                l.sent = cfg.ttl;
                self.flight_start(lease, false);
                self.activity(self.holder_of(lease));
            }
            Action::RunAcquire(lease) => {
                self.s.leases[lease].acquire = Call::Ran(self.s.redis.acquire(cfg, lease));
            }
            Action::Hold(lease) => {
                let Call::Ran(AcquireReply::Granted { alive }) = self.s.leases[lease].acquire else {
                    unreachable!("a grant to hold")
                };
                self.hold(lease, alive);
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
                                self.s.redis.acquire(cfg, lease);
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
                        redis.acquire(cfg, lease);
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

/// Leases of one class are interchangeable: a state's representative sorts them by how they look
/// everywhere in the state (their process side, their members, every mask they are in).
impl stateright::Representative for State {
    fn representative(&self) -> Self {
        let key = |l: usize| {
            let bit = 1u8 << l;
            let mut masks = Vec::with_capacity(6 * MAX_HOLDERS + 1);
            let mut replied = 0;
            for h in &self.holders {
                let (a, b) = match h.round {
                    Round::Prune { keep, .. } => (keep, 0),
                    Round::PruneStrays { strays, .. } => (strays, 0),
                    Round::Reclaim { check, .. } => (check, 0),
                    Round::Recount { lost, reclaimed, .. } => (lost, reclaimed),
                    Round::Releasing { leases } => (leases, 0),
                    Round::Keepalive {
                        call: Call::Ran(reply),
                        ..
                    } => {
                        replied += reply.ids[l]; // 0 in other holders' replies
                        (0, 0)
                    }
                    _ => (0, 0),
                };
                let [c, d, e, f] = h
                    .tally
                    .map_or([0; 4], |t| [t.in_flight, t.seen_in_flight, t.held_ids, t.changed]);
                masks.extend([a, b, c, d, e, f].map(|m| m & bit != 0));
            }
            masks.push(self.late.is_some_and(|late| late.leases() & bit != 0));
            (
                self.leases[l],
                (self.redis.members[l], self.redis.summed[l], replied),
                self.snapshot.as_ref().map(|s| (s.members[l], s.summed[l])),
                masks,
            )
        };
        // perm[new] = old: leases move only among the positions of their class.
        let mut perm: [usize; MAX_LEASES] = std::array::from_fn(|i| i);
        let mut placed = [false; MAX_LEASES];
        for first in 0..MAX_LEASES {
            let class = self.leases[first].class;
            if placed[first] || class == NO_CLASS {
                continue;
            }
            let positions: Vec<usize> = (first..MAX_LEASES)
                .filter(|&l| self.leases[l].class == class)
                .collect();
            let mut sorted = positions.clone();
            sorted.sort_by_key(|&l| key(l));
            for (&position, &old) in positions.iter().zip(&sorted) {
                perm[position] = old;
                placed[position] = true;
            }
        }
        if perm.iter().enumerate().all(|(i, &old)| i == old) {
            return self.clone();
        }
        self.permuted(&perm)
    }
}

/// The class of a lease slot the configuration does not use.
pub const NO_CLASS: u8 = u8::MAX;

impl Late {
    /// The leases a late request names.
    fn leases(self) -> u8 {
        match self {
            Late::Acquire(lease) => 1 << lease,
            Late::Release { leases, .. } => leases,
            Late::Prune { keep, .. } => keep,
            Late::PruneIds { strays, .. } => strays,
            Late::Reclaim { check, .. } => check,
            Late::Keepalive { .. } => 0,
        }
    }
}

impl State {
    /// The same state with its leases renumbered: `perm[new] = old`.
    fn permuted(&self, perm: &[usize; MAX_LEASES]) -> Self {
        let remap = |mask: u8| -> u8 {
            (0..MAX_LEASES)
                .filter(|&new| mask & (1 << perm[new]) != 0)
                .fold(0, |m, new| m | 1 << new)
        };
        let renumber = |old: usize| perm.iter().position(|&o| o == old).expect("a permutation");
        let renumber_ids = |ids: Ids| -> Ids { std::array::from_fn(|new| ids[perm[new]]) };
        let mut s = self.clone();
        for (new, &old) in perm.iter().enumerate() {
            s.leases[new] = self.leases[old];
            s.redis.members[new] = self.redis.members[old];
            if let (Some(to), Some(from)) = (&mut s.snapshot, &self.snapshot) {
                to.members[new] = from.members[old];
            }
        }
        s.redis.summed = renumber_ids(self.redis.summed);
        if let (Some(to), Some(from)) = (&mut s.snapshot, &self.snapshot) {
            to.summed = renumber_ids(from.summed);
        }
        for h in s.holders.iter_mut() {
            match &mut h.round {
                Round::Prune { keep, .. } => *keep = remap(*keep),
                Round::PruneStrays { strays, .. } => *strays = remap(*strays),
                Round::Reclaim { check, .. } => *check = remap(*check),
                Round::Recount { lost, reclaimed, .. } => {
                    *lost = remap(*lost);
                    *reclaimed = remap(*reclaimed);
                }
                Round::Releasing { leases } => *leases = remap(*leases),
                Round::Keepalive {
                    call: Call::Ran(reply),
                    ..
                } => reply.ids = renumber_ids(reply.ids),
                Round::Idle | Round::Keepalive { .. } => {}
            }
            if let Some(t) = &mut h.tally {
                t.in_flight = remap(t.in_flight);
                t.seen_in_flight = remap(t.seen_in_flight);
                t.held_ids = remap(t.held_ids);
                t.changed = remap(t.changed);
            }
        }
        s.late = self.late.map(|late| match late {
            Late::Acquire(lease) => Late::Acquire(renumber(lease)),
            Late::Release { holder, leases } => Late::Release {
                holder,
                leases: remap(leases),
            },
            Late::Prune { holder, keep } => Late::Prune {
                holder,
                keep: remap(keep),
            },
            Late::PruneIds { holder, strays } => Late::PruneIds {
                holder,
                strays: remap(strays),
            },
            Late::Reclaim { holder, check } => Late::Reclaim {
                holder,
                check: remap(check),
            },
            late @ Late::Keepalive { .. } => late,
        });
        s
    }
}
