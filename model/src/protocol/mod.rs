//! The model: its state, its actions (each one atomic step of a process, of Redis, of time or
//! of a fault) and how each changes the state: the steps of a lease and of time and faults in
//! `step.rs`, those of a renewal round in `round.rs`, and the symmetry reduction (leases of one
//! class are interchangeable) in `symmetry.rs`.

mod round;
mod step;
mod symmetry;

use self::step::Step;
use crate::config::{bits, Count, ModelConfig, MAX_HOLDERS, MAX_LEASES};
use crate::process::{Holder, Lease, Phase, Round, Tally};
use crate::redis::Redis;

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
    /// The holder whose call it was.
    pub(super) fn holder(self, cfg: &ModelConfig) -> usize {
        match self {
            Late::Acquire(lease) => cfg.leases[lease].holder,
            Late::Release { holder, .. }
            | Late::Keepalive { holder, .. }
            | Late::Prune { holder, .. }
            | Late::PruneIds { holder, .. }
            | Late::Reclaim { holder, .. } => holder,
        }
    }

    /// The leases a late request names.
    pub(super) fn leases(self) -> u8 {
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
    /// A process sends the acquire of a lease (`manager/admit.rs`).
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

/// The class of a lease slot the configuration does not use.
pub const NO_CLASS: u8 = u8::MAX;
