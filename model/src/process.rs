//! The process side: per lease its `LeaseRecord` state and calls, per holder its held group,
//! its tally (`renewal/tally.rs`, mirrored line by line) and its renewal round.

use crate::config::{bits, ModelConfig};
use crate::redis::{ids_of, AcquireReply, KeepaliveReply};

/// A call the process awaits: sent (the script has not run), or the script ran and its reply is
/// on the way.
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub enum Call<T> {
    #[default]
    None,
    Sent,
    Ran(T),
}

impl<T> Call<T> {
    pub fn is_none(&self) -> bool {
        matches!(self, Call::None)
    }

    pub fn is_sent(&self) -> bool {
        matches!(self, Call::Sent)
    }
}

/// A lease in this process (`LeaseRecord`'s state bits, and where its acquire stands). A lease
/// found lost is released at once (`OnLost::Cancel`: its stream is cancelled, and the stream's
/// `finally` releases it), so LOST is not a phase of its own.
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    /// Not acquired yet (its id unused).
    #[default]
    Idle,
    /// The acquire call is out (state bits 0, not held).
    Acquiring,
    /// In the held set: its stream is live.
    Held,
    /// Marked released (first caller of `mark_released`).
    Released,
}

/// One lease's process-side state.
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub struct Lease {
    /// Leases of one class (same holder, weight and pools) are interchangeable (symmetry).
    pub class: u8,
    pub phase: Phase,
    /// The acquire call, while `Acquiring`.
    pub acquire: Call<AcquireReply>,
    /// The grant's deadline (`sent_at + lease duration`) as ticks left, while `Acquiring`.
    pub sent: u8,
    /// The life the process knew its holder's entry had when it sent the acquire, which then
    /// trusts it (`EntryCheck`); 0: the acquire reads the entry.
    pub trusted: u8,
    /// The release call of `Leases::release` is out (a stream that ended, a grant given back).
    pub release: bool,
    /// On the retry list (`unremoved`).
    pub unremoved: bool,
}

/// `Tally` of `renewal/tally.rs`, with lease sets as masks. A lease's `Share` is its units,
/// its ids (`ids_of`) and whether it is held now (its bit in `held_ids`).
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq)]
pub struct Tally {
    pub held: u8,
    /// The leases held: their sum of ids.
    pub held_ids: u8,
    pub in_flight: u8,
    pub lo: u8,
    pub held_hi: u8,
    pub seen_in_flight: u8,
    /// The leases in flight when the window opened or changed since: Redis may or may not count
    /// them. Every other lease held now was held all along.
    pub changed: u8,
    pub window_open: bool,
    pub reported: Option<u8>,
    /// `prune_unexplained`: the last answer's sum of ids was not explained (its members not
    /// held nor in flight are pruned at the next round).
    pub unexplained: bool,
}

impl Tally {
    fn seen(&mut self) {
        if self.window_open {
            self.lo = self.lo.min(self.held);
            self.held_hi = self.held_hi.max(self.held);
        }
    }

    /// `Tally::changed` (`sum_of_ids`: the count-only judgement keeps no such list).
    fn changed(&mut self, cfg: &ModelConfig, lease: usize) {
        if self.window_open && cfg.sum_of_ids {
            self.changed |= 1 << lease;
        }
    }

    /// Empty: dropped (`windows_survive`: not while its window is open).
    fn is_empty(&self, cfg: &ModelConfig) -> bool {
        self.held == 0
            && self.in_flight == 0
            && self.reported.is_none()
            && !self.unexplained
            && !(cfg.windows_survive && self.window_open)
    }

    /// The most Redis may have counted while the window was open.
    pub fn hi(&self, cfg: &ModelConfig) -> u8 {
        self.held_hi + bits(self.seen_in_flight).map(|l| cfg.units(l)).sum::<u8>()
    }

    /// Whether Redis's sum of ids is what the leases held all along add, plus those of some of
    /// the leases that changed, with as many members as it counted (the model's leases are
    /// fewer than `MOST_CHANGES_JUDGED`: every choice is tried).
    fn ids_explained(&self, cfg: &ModelConfig, counted: KeepaliveReply) -> bool {
        let changed = self.changed;
        let (mut members, mut ids) = (self.held, self.held_ids);
        for lease in bits(changed & self.held_ids) {
            members = members.saturating_sub(cfg.units(lease));
            ids &= !(1 << lease);
        }
        let Some(members) = counted.members.checked_sub(members) else {
            return false;
        };
        (0..=changed)
            .filter(|choice| choice & !changed == 0)
            .any(|chosen| {
                let units: u8 = bits(chosen).map(|l| cfg.units(l)).sum();
                units == members && ids_of(cfg, ids | chosen) == counted.ids
            })
    }
}

/// `Tallies` for one tag: a tally exists while it is not empty.
pub fn change(cfg: &ModelConfig, tally: &mut Option<Tally>, change: impl FnOnce(&mut Tally)) {
    let mut t = tally.take().unwrap_or_default();
    change(&mut t);
    t.seen();
    if !t.is_empty(cfg) {
        *tally = Some(t);
    }
}

/// `Tallies::hold`.
pub fn tally_hold(cfg: &ModelConfig, tally: &mut Option<Tally>, lease: usize, held: bool) {
    let units = cfg.units(lease);
    change(cfg, tally, |t| {
        if held {
            t.held += units;
            t.held_ids |= 1 << lease;
        } else {
            t.held = t.held.saturating_sub(units);
            t.held_ids &= !(1 << lease);
        }
        t.changed(cfg, lease);
    });
}

/// `Tallies::flight_start`.
pub fn flight_start(cfg: &ModelConfig, tally: &mut Option<Tally>, lease: usize, held: bool) {
    change(cfg, tally, |t| {
        t.in_flight |= 1 << lease;
        if !held && t.window_open {
            t.seen_in_flight |= 1 << lease;
        }
        t.changed(cfg, lease);
    });
}

/// `Tallies::flight_end`.
pub fn flight_end(cfg: &ModelConfig, tally: &mut Option<Tally>, lease: usize, counted: bool) {
    change(cfg, tally, |t| {
        if t.in_flight & (1 << lease) != 0 {
            t.changed(cfg, lease);
        }
        t.in_flight &= !(1 << lease);
        if !counted {
            t.seen_in_flight &= !(1 << lease);
        }
    });
}

/// `Tallies::open_windows`.
pub fn open_windows(cfg: &ModelConfig, tally: &mut Option<Tally>) {
    if let Some(t) = tally {
        t.lo = t.held;
        t.held_hi = t.held;
        t.seen_in_flight = t.in_flight;
        if cfg.sum_of_ids {
            t.changed = t.in_flight;
        }
        t.window_open = true;
        t.reported = None;
        // `retain`: an empty tally goes, open window or not (so does one kept by
        // `windows_survive`: a new keep-alive is on its way only for a tag held or in flight).
        if t.held == 0 && t.in_flight == 0 {
            *tally = None;
        }
    }
}

/// `Tallies::close_window`: true if the tag's leases must be checked one by one: the count is
/// short (`check_on_excess`: or above the window's highest figure; `sum_of_ids`: or its sum
/// of ids is not explained).
pub fn close_window(cfg: &ModelConfig, tally: &mut Option<Tally>, counted: KeepaliveReply) -> bool {
    let Some(t) = tally else {
        return false;
    };
    t.window_open = false;
    t.reported = Some(counted.members);
    let unexplained = cfg.sum_of_ids && !t.ids_explained(cfg, counted);
    t.unexplained = cfg.prune_unexplained && unexplained;
    let judged =
        counted.members < t.lo || (cfg.check_on_excess && counted.members > t.hi(cfg)) || unexplained;
    t.changed = 0;
    if t.is_empty(cfg) {
        *tally = None;
    }
    judged
}

/// `Tallies::take_excess`: whether the tag's last count exceeded the most it could have had
/// (`prune_unexplained`: or its sum of ids was not explained).
pub fn take_excess(cfg: &ModelConfig, tally: &mut Option<Tally>) -> bool {
    let Some(t) = tally else {
        return false;
    };
    let excess = t.reported.is_some_and(|members| members > t.hi(cfg)) || t.unexplained;
    t.reported = None;
    t.unexplained = false;
    excess
}

/// Where a renewal round stands (`renewal/round.rs`: `renew_held` and `renew_store`). The
/// keep-alive's script and its reply are two steps (what happens in between is what the window
/// is for); the other calls' scripts run and answer in one step.
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq)]
pub enum Round {
    #[default]
    Idle,
    /// The keep-alive of the tag (step 2); `known`: under `Count::GrantedOnlyGrows`, the
    /// group's granted members.
    Keepalive {
        excess: bool,
        known: u8,
        call: Call<KeepaliveReply>,
    },
    /// The prune of members in excess (step 1's verdict, sent after the keep-alive).
    Prune {
        renewed: bool,
        short: bool,
        keep: u8,
        known: u8,
    },
    /// `Prune::TwoStep`'s second call: the members to remove by lease id.
    PruneStrays {
        renewed: bool,
        short: bool,
        strays: u8,
        known: u8,
    },
    /// The check of the leases one by one (step 3).
    Reclaim { renewed: bool, check: u8, known: u8 },
    /// The recount (step 4): a second keep-alive; `lost`, `reclaimed` from the check.
    Recount {
        renewed: bool,
        lost: u8,
        reclaimed: u8,
        known: u8,
    },
    /// The releases of step 7 (one call for the tag: at most 1,000 members).
    Releasing { leases: u8 },
}

/// Property bookkeeping about the round under way (not the protocol's).
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq)]
pub enum RoundGhost {
    /// No round, or one that sent no keep-alive (the holder held nothing).
    #[default]
    Unkept,
    /// So far calm: nothing of the holder was in flight when its window opened, none of its
    /// leases changed until the keep-alive's answer, every call was answered, no fault.
    Calm,
    /// Not calm.
    Spoiled,
}

/// One holder: one process's manager, with its renewal loop.
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq)]
pub struct Holder {
    /// The process is frozen.
    pub stalled: bool,
    /// Its group's deadline as ticks left (0 while it holds nothing).
    pub deadline: u8,
    /// Ticks its entry has left, as far as the process knows (a lower bound while Redis keeps
    /// what it answered; kept while it holds nothing: the entry stays in the tag).
    pub entry_known: u8,
    /// `Count::Exact`: what Redis should count.
    pub tally: Option<Tally>,
    /// `Count::GrantedOnlyGrows`: the group's `granted_units` (0 while it holds nothing).
    pub granted: u8,
    pub round: Round,
    /// The round's `sent_at + lease duration` as ticks left (0 while no round runs).
    pub round_sent: u8,
    pub ghost: RoundGhost,
    /// Property bookkeeping: a fault happened and no calm round of this holder followed yet.
    pub exposed: bool,
    /// Property bookkeeping: calm rounds in a row (at most 2).
    pub calm: u8,
}
