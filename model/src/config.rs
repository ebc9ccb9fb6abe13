//! The sizes of a model run and the protocol variant it checks: which count of a holder's
//! members Redis keeps, how members in excess are pruned, and a switch for each safeguard.

/// Holders (processes) a configuration may have at most.
pub const MAX_HOLDERS: usize = 3;
/// Leases (acquires) a configuration may have at most.
pub const MAX_LEASES: usize = 4;
/// Pools a configuration may have at most.
pub const MAX_POOLS: usize = 3;

/// One acquire of the run: one lease id, tried once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseSpec {
    /// The holder (process) that acquires it.
    pub holder: usize,
    /// Members per pool (`id`, `id#2`, ...).
    pub weight: u8,
    /// The pools it takes, in the order of the acquire's KEYS (its own quota first).
    pub pools: Vec<usize>,
    /// Held from the start (granted before the run) and its stream never ends by itself (it
    /// may still be lost): its holder keeps renewing.
    pub kept: bool,
}

impl LeaseSpec {
    /// A lease of weight 1 in pool 0, acquired during the run.
    pub fn new(holder: usize) -> Self {
        LeaseSpec {
            holder,
            weight: 1,
            pools: vec![0],
            kept: false,
        }
    }

    /// The same, held from the start and never ended by its stream.
    pub fn kept(holder: usize) -> Self {
        LeaseSpec {
            kept: true,
            ..LeaseSpec::new(holder)
        }
    }
}

/// Which count of a holder's members Redis keeps and the process compares with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Count {
    /// The code's: `T:holders:<id>:members` is exact (scripts count up and down what they add
    /// and remove, a check or a prune recounts), the keep-alive returns it, the process compares
    /// it with its tallies both ways (`renewal/tally.rs`).
    Exact,
    /// `T:holders:<id>:granted` only grows (every member added counted, none removed); the
    /// keep-alive says "not alive" when it is below the members the process knows were granted
    /// to the group (`granted_units`, which also only grows while the group lives), and the
    /// resync after a check raises it to that figure. A grant lost in a failover stays
    /// uncounted for good, and a release lost in one stays counted.
    GrantedOnlyGrows,
}

/// How members in excess are pruned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Prune {
    /// Never: members in excess stay until their holder's entry expires and a script reaps them.
    Never,
    /// In one call: removes the holder's members whose lease is not in the list of leases held
    /// or in flight, taken when the call is sent (so a grant made while the call is under way
    /// can be removed).
    KeepList,
    /// The code's: `strays.lua` only lists the holder's leases with members not in that list;
    /// the process then removes (`prune.lua`), by id, those that are still neither held nor in
    /// flight (a lease id that is neither is never used again, so no grant made meanwhile can be
    /// among them).
    TwoStep,
}

/// How an acquire learns that its holder's entry is live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EntryCheck {
    /// Every acquire reads the entry (and writes it anew when it finds it expired or gone).
    Read,
    /// The code's: an acquire the process sends while it knows its holder's entry has life left
    /// (a grant's or a keep-alive's answer told it, counted down from that call's sending;
    /// forgotten when a keep-alive finds the entry not live) neither reads nor writes the
    /// entry, and the process dates the grant from what it knew. Any other acquire reads it.
    TrustKnown,
    /// Every acquire trusts the entry, known or not, and the process dates the grant a lease
    /// duration from the sending (what `TrustKnown` guards against).
    TrustAlways,
}

/// The sizes of a run, its fault budgets and the protocol variant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelConfig {
    /// Holders (processes), each with one renewal loop.
    pub holders: usize,
    /// Capacity of each pool (0 = unlimited); pools share one hash tag.
    pub capacities: Vec<u8>,
    /// The acquires of the run.
    pub leases: Vec<LeaseSpec>,
    /// Whether time passes (ticks): holder entries expire, deadlines pass.
    pub time: bool,
    /// `lease_seconds` in ticks: a holder entry lives `ttl` ticks after its last extension.
    pub ttl: u8,
    /// Failovers: restores of an earlier snapshot of the whole Redis state.
    pub restores: u8,
    /// Redis restarts that come back empty.
    pub restarts: u8,
    /// Holder stalls (the process frozen: no sweep at its deadlines, no calls, no replies).
    pub stalls: u8,
    /// Calls that time out (a script that ran with its reply lost, or a request that runs
    /// later or never).
    pub failures: u8,
    /// Another client's `get_active_count()` (count.lua: reap, then walk the pools).
    pub observer: bool,
    /// The count Redis keeps (exact, or one that only grows).
    pub count: Count,
    /// How members in excess are pruned (`prune.lua`).
    pub prune: Prune,
    /// A tally whose keep-alive window is open is kept even when it holds nothing (off: it is
    /// dropped as empty, and the keep-alive's answer meets a new tally with no window, so a
    /// count of members just released looks like an excess).
    pub windows_survive: bool,
    /// A grant held after its own deadline (`sent_at + lease duration`) is lost on arrival, as
    /// the sweep would have found it (off: it joins a live group, though its holder's entry may
    /// have expired, and its members been reaped, since its script ran).
    pub late_grants_lost: bool,
    /// A keep-alive count above the window's highest figure also has the tag's leases checked
    /// one by one in the same round (members in excess may hide missing ones: a restore that
    /// brings back a released lease and loses a held one).
    pub check_on_excess: bool,
    /// Redis also keeps each holder's sum of member ids in the tag, the keep-alive returns it,
    /// and a sum that no choice of the leases changed during the call explains has the tag's
    /// leases checked one by one (a restore that brings back a released lease and loses a held
    /// one of the same size leaves the count right; `renewal/tally.rs`, `ids_explained`). Off:
    /// the count alone is judged.
    pub sum_of_ids: bool,
    /// A count whose sum of ids was not explained is judged at the next round as one in excess
    /// is (its members neither held nor in flight pruned; `Tallies::take_excess`): the leases
    /// that came back in place of those missing are strays, and the count alone, right by
    /// number, shows them only after the check has taken the missing ones back, a round later.
    pub prune_unexplained: bool,
    /// `reclaim.lua` ends by counting the holder's members again (off: only the second
    /// keep-alive does; `hold` drops the count of a holder found expired but not yet reaped, so
    /// a check whose recount never comes, one answered late or lost, leaves the count below the
    /// members, and members in excess unseen).
    pub reclaim_recounts: bool,
    /// `release.lua` leaves the holder's index and entry as they are, and the keep-alive drops
    /// from the index the pools where the holder has no member left (off: the release drops
    /// such pools itself, and a holder whose index it empties leaves the tag).
    pub lazy_index: bool,
    /// `acquire.lua` reaps dead holders before it decides (off, the code's: reaping is left to
    /// the keep-alives, the count and a full pool's walk, so an acquire pays for none of it,
    /// but see `reap_before_rejoining`).
    pub acquire_reaps: bool,
    /// An acquire that finds its own holder's entry expired or gone reaps before it registers
    /// the holder again (off: the members of the holder's lost leases, still in the pools,
    /// come back to life under the new entry, outside its count).
    pub reap_before_rejoining: bool,
    /// `acquire.lua` extends its holder's entry even when it is live (off: only an entry found
    /// expired or gone is written, a live one is left to the keep-alive).
    pub acquire_extends_live_entry: bool,
    /// The acquire's reply says how long the holder's entry has left after it, and the process
    /// dates the grant's deadline from that (`sent + life`; off: a whole lease duration from the
    /// acquire's sending, which holds only if every grant extends the entry).
    pub grant_dated_by_entry: bool,
    /// A pool that looks full is counted again by live holders, its dead holders' members
    /// dropped (prelude `used_slots`), before an acquire is refused for it.
    pub walk_when_full: bool,
    /// Whether an acquire reads its holder's entry, or trusts what the process knows of it.
    pub entry_check: EntryCheck,
}

impl ModelConfig {
    /// Two holders, one global pool of capacity 2, three leases of weight 1 (two for the first
    /// holder, one for the second), one failover, one call that times out, and the protocol as
    /// the code runs it: the exact count, the two-step prune, and every safeguard on (tallies
    /// keep their open window, late grants are lost, the reclaim recounts, a count in excess is
    /// checked one by one, the sum of ids is judged beside the count, and a sum not explained
    /// is pruned at the next round).
    pub fn small() -> Self {
        let lease = |holder| LeaseSpec::new(holder);
        ModelConfig {
            holders: 2,
            capacities: vec![2],
            leases: vec![lease(0), lease(0), lease(1)],
            time: true,
            ttl: 2,
            restores: 1,
            restarts: 0,
            stalls: 0,
            failures: 1,
            observer: false,
            count: Count::Exact,
            prune: Prune::TwoStep,
            windows_survive: true,
            late_grants_lost: true,
            check_on_excess: true,
            sum_of_ids: true,
            prune_unexplained: true,
            reclaim_recounts: true,
            lazy_index: true,
            acquire_reaps: false,
            reap_before_rejoining: true,
            acquire_extends_live_entry: false,
            grant_dated_by_entry: true,
            walk_when_full: true,
            entry_check: EntryCheck::TrustKnown,
        }
    }

    /// The exact count and the one-step prune, with every safeguard off.
    pub fn without_safeguards(self) -> Self {
        ModelConfig {
            count: Count::Exact,
            prune: Prune::KeepList,
            windows_survive: false,
            late_grants_lost: false,
            check_on_excess: false,
            sum_of_ids: false,
            prune_unexplained: false,
            reclaim_recounts: false,
            lazy_index: false,
            ..self
        }
    }

    /// A count of granted members that only grows, no prune, every safeguard off.
    pub fn growing_count(self) -> Self {
        ModelConfig {
            count: Count::GrantedOnlyGrows,
            prune: Prune::Never,
            ..self.without_safeguards()
        }
    }

    /// Checks the sizes against the model's fixed arrays.
    pub fn validate(&self) -> Result<(), String> {
        if self.holders == 0 || self.holders > MAX_HOLDERS {
            return Err(format!("1 to {MAX_HOLDERS} holders"));
        }
        if self.capacities.is_empty() || self.capacities.len() > MAX_POOLS {
            return Err(format!("1 to {MAX_POOLS} pools"));
        }
        if self.leases.is_empty() || self.leases.len() > MAX_LEASES {
            return Err(format!("1 to {MAX_LEASES} leases"));
        }
        if self.ttl == 0 {
            return Err("ttl of at least one tick".into());
        }
        for lease in &self.leases {
            if lease.holder >= self.holders || lease.weight == 0 || lease.pools.is_empty() {
                return Err(format!("bad lease {lease:?}"));
            }
            if lease.pools.iter().any(|&p| p >= self.capacities.len()) {
                return Err(format!("lease {lease:?} names an unknown pool"));
            }
        }
        for (pool, &capacity) in self.capacities.iter().enumerate() {
            let kept: u8 = self
                .leases
                .iter()
                .filter(|l| l.kept && l.pools.contains(&pool))
                .map(|l| l.weight)
                .sum();
            if capacity > 0 && kept > capacity {
                return Err(format!("kept leases exceed pool {pool}'s capacity"));
            }
        }
        Ok(())
    }

    /// Members a lease has in all its pools (what the tallies count).
    pub fn units(&self, lease: usize) -> u8 {
        let spec = &self.leases[lease];
        spec.weight * spec.pools.len() as u8
    }

    /// The pools of a lease as a bit mask.
    pub fn pool_mask(&self, lease: usize) -> u8 {
        self.leases[lease].pools.iter().fold(0, |mask, p| mask | 1 << p)
    }

    /// The leases of a holder as a bit mask.
    pub fn leases_of(&self, holder: usize) -> u8 {
        (0..self.leases.len())
            .filter(|&l| self.leases[l].holder == holder)
            .fold(0, |mask, l| mask | 1 << l)
    }
}

/// The set bits of a mask, lowest first.
pub fn bits(mask: u8) -> impl Iterator<Item = usize> {
    (0..8).filter(move |i| mask & (1 << i) != 0)
}
