//! The Redis side: the keys of one hash tag, and the scripts of `src/lua/` (in `scripts.rs`),
//! each one atomic step, built of the steps of `src/lua/prelude/` (here).
//!
//! A lease's members are all scored by its holder (the process that acquired it); with a
//! weight w a lease has w members per pool, added and removed together by every script, so a
//! bit per pool says whether they are there. Holder entries keep their expiry as ticks left
//! (`Some(0)`: expired, not yet reaped). Key expiry (the 1 h idle TTLs), the reap budget and
//! the 1 s walk marker are left out: at these sizes the reap always finishes and a pool that
//! looks full is always walked.
//!
//! A holder's sum of member ids (`T:holders:<id>:members`, field 's') is kept as what each
//! lease adds to it: its members summed. The scripts' `id_value` is the first 32 bits of a
//! random id, so a sum tells sets of leases apart; the model's sum is exact (no two sets of
//! leases share one).

mod scripts;

use crate::config::{bits, Count, ModelConfig, MAX_HOLDERS, MAX_LEASES};

/// The keys of one tag.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub struct Redis {
    /// Per lease: the pools (bit mask) where its members are.
    pub members: [u8; MAX_LEASES],
    /// Per holder: its entry in `T:holders`, as ticks left before it expires; None: no entry.
    pub entry: [Option<u8>; MAX_HOLDERS],
    /// Per holder: the pools in its index `T:holders:<id>` (bit mask).
    pub index: [u8; MAX_HOLDERS],
    /// Per holder: `T:holders:<id>:members` (`Count::Exact`: its field 'n') or `:granted`
    /// (`Count::GrantedOnlyGrows`); None: no key.
    pub count: [Option<i8>; MAX_HOLDERS],
    /// Per lease: the members of it that its holder's sum of ids (field 's') adds up
    /// (`sum_of_ids`; all 0 without the key).
    pub summed: Ids,
    /// An acquire was refused for a pool that held members of a holder whose entry was not
    /// live: a slot of the dead counted against the living (sticky; what `walk_when_full`
    /// prevents).
    pub refused_by_the_dead: bool,
}

/// A sum of member ids, as the members of each lease that it adds up.
pub type Ids = [i8; MAX_LEASES];

/// What the acquire script answers (no waiting line: a caller that does not wait).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub enum AcquireReply {
    /// GRANTED, whether the holder's entry was live, and the ticks the entry has left after the
    /// call (the lease duration for an entry written anew or extended).
    Granted {
        alive: bool,
        life: u8,
    },
    Refused,
}

/// What the keep-alive script answers for the tag, as the process reads it
/// (`backend/redis/keepalive.rs`: a figure below 0 reads as 0).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct KeepaliveReply {
    pub alive: bool,
    /// The holder's count of members (`Count::Exact`; 0 under `Count::GrantedOnlyGrows`, which
    /// returns none).
    pub members: u8,
    /// The holder's sum of ids (`sum_of_ids`; all 0 otherwise).
    pub ids: Ids,
}

/// The sum of ids of the leases in `leases` (a mask), each with all its members.
pub fn ids_of(cfg: &ModelConfig, leases: u8) -> Ids {
    std::array::from_fn(|l| {
        if leases & (1 << l) != 0 {
            cfg.units(l) as i8
        } else {
            0
        }
    })
}

impl Redis {
    /// The entry is live: its expiry is after now.
    pub fn is_alive(&self, holder: usize) -> bool {
        matches!(self.entry[holder], Some(left) if left > 0)
    }

    /// `ZCARD` of a pool.
    pub fn zcard(&self, cfg: &ModelConfig, pool: usize) -> u8 {
        (0..cfg.leases.len())
            .filter(|&l| self.members[l] & (1 << pool) != 0)
            .map(|l| cfg.leases[l].weight)
            .sum()
    }

    /// `ZCOUNT pool holder holder`: the holder's members in a pool.
    pub fn zcount(&self, cfg: &ModelConfig, pool: usize, holder: usize) -> u8 {
        bits(cfg.leases_of(holder))
            .filter(|&l| self.members[l] & (1 << pool) != 0)
            .map(|l| cfg.leases[l].weight)
            .sum()
    }

    /// prelude `remove_held`: every member of a holder in a pool.
    fn remove_held(&mut self, cfg: &ModelConfig, pool: usize, holder: usize) {
        for l in bits(cfg.leases_of(holder)) {
            self.members[l] &= !(1 << pool);
        }
    }

    /// prelude `leave_tag`.
    fn leave_tag(&mut self, cfg: &ModelConfig, holder: usize) {
        self.entry[holder] = None;
        self.drop_count(cfg, holder);
    }

    /// `DEL T:holders:<id>:members`: the count and the sum of ids.
    fn drop_count(&mut self, cfg: &ModelConfig, holder: usize) {
        self.count[holder] = None;
        for l in bits(cfg.leases_of(holder)) {
            self.summed[l] = 0;
        }
    }

    /// prelude `reap`: expired holders lose their members pool by pool, then their entry and
    /// count once their index is empty.
    pub fn reap(&mut self, cfg: &ModelConfig) {
        for holder in 0..cfg.holders {
            if self.entry[holder] != Some(0) {
                continue;
            }
            for pool in bits(self.index[holder]) {
                self.remove_held(cfg, pool, holder);
                self.index[holder] &= !(1 << pool);
            }
            self.leave_tag(cfg, holder);
        }
    }

    /// prelude `live_count`: drops the members of holders not live (expired or gone), then
    /// `ZCARD` (the walk marker left out: the walk always runs).
    pub fn live_count(&mut self, cfg: &ModelConfig, pool: usize) -> u8 {
        for holder in 0..cfg.holders {
            if self.zcount(cfg, pool, holder) > 0 && !self.is_alive(holder) {
                self.remove_held(cfg, pool, holder);
            }
        }
        self.zcard(cfg, pool)
    }

    /// prelude `used_slots`.
    fn used_slots(&mut self, cfg: &ModelConfig, pool: usize, weight: u8, capacity: u8) -> u8 {
        let used = self.zcard(cfg, pool);
        if cfg.walk_when_full && capacity > 0 && used + weight > capacity {
            self.live_count(cfg, pool)
        } else {
            used
        }
    }

    /// prelude `hold`: registers or extends the holder; an entry found not live loses its count.
    fn hold(&mut self, cfg: &ModelConfig, holder: usize) -> bool {
        let alive = self.is_alive(holder);
        if !alive {
            self.drop_count(cfg, holder);
        }
        self.entry[holder] = Some(cfg.ttl);
        alive
    }

    /// `acquire.lua`'s `join`: `hold` for an acquire, which leaves an entry it found live
    /// (`was_alive`, read before it decided) to the keep-alive, unless
    /// `acquire_extends_live_entry`.
    fn join(&mut self, cfg: &ModelConfig, holder: usize, was_alive: bool) -> bool {
        if was_alive && !cfg.acquire_extends_live_entry {
            return true;
        }
        self.hold(cfg, holder)
    }

    /// The ticks a live holder's entry has left (the lease duration for one that is not: what
    /// the reply of a grant that found it gone says, the entry then written anew).
    pub fn life(&self, cfg: &ModelConfig, holder: usize) -> u8 {
        match self.entry[holder] {
            Some(left) if left > 0 => left,
            _ => cfg.ttl,
        }
    }

    /// Whether `pool` holds members of a holder whose entry is not live.
    fn holds_the_dead(&self, cfg: &ModelConfig, pool: usize) -> bool {
        (0..cfg.holders).any(|h| !self.is_alive(h) && self.zcount(cfg, pool, h) > 0)
    }

    /// prelude `add_members` (and, under `Count::GrantedOnlyGrows`, the `INCRBY` of the granted
    /// count).
    fn add_members(&mut self, cfg: &ModelConfig, pool: usize, lease: usize) {
        let holder = cfg.leases[lease].holder;
        self.members[lease] |= 1 << pool;
        self.index[holder] |= 1 << pool;
        if cfg.count == Count::GrantedOnlyGrows {
            self.incr(holder, cfg.leases[lease].weight as i8);
        }
    }

    /// prelude `remove_members`: the members removed.
    fn remove_members(&mut self, cfg: &ModelConfig, pool: usize, lease: usize) -> u8 {
        if self.members[lease] & (1 << pool) == 0 {
            return 0;
        }
        self.members[lease] &= !(1 << pool);
        cfg.leases[lease].weight
    }

    fn incr(&mut self, holder: usize, change: i8) {
        if change != 0 {
            self.count[holder] = Some(self.count[holder].unwrap_or(0) + change);
        }
    }

    /// prelude `count_members`: the count moves by `change`, the sum of ids by `ids` (the exact
    /// count only; a count that only grows moves in `add_members`).
    fn count_members(&mut self, cfg: &ModelConfig, holder: usize, change: i8, ids: Ids) {
        if cfg.count == Count::Exact {
            // A change of the count and one of the sum are both 0 or neither.
            self.incr(holder, change);
            if cfg.sum_of_ids {
                for (summed, id) in self.summed.iter_mut().zip(ids) {
                    *summed += id;
                }
            }
        }
    }

    /// `change` members of one lease: what they add to a sum of ids.
    fn ids_of_lease(lease: usize, change: i8) -> Ids {
        std::array::from_fn(|l| if l == lease { change } else { 0 })
    }

    /// prelude `recount`: the holder's members in the pools of its index, and their sum of ids.
    fn recount(&mut self, cfg: &ModelConfig, holder: usize) -> u8 {
        let mut count = 0;
        for l in bits(cfg.leases_of(holder)) {
            let found = bits(self.index[holder] & self.members[l]).count() as u8 * cfg.leases[l].weight;
            count += found;
            if cfg.sum_of_ids {
                self.summed[l] = found as i8;
            }
        }
        self.count[holder] = Some(count as i8);
        count
    }

    /// The index lists every pool where the holder has members (what the reaper, the recount
    /// and the prune rely on to find them).
    pub fn index_covers_members(&self, cfg: &ModelConfig) -> bool {
        (0..cfg.leases.len()).all(|l| {
            let holder = cfg.leases[l].holder;
            self.members[l] & !self.index[holder] == 0
        })
    }

    /// One tick of the server's clock.
    pub fn tick(&mut self) {
        for left in self.entry.iter_mut().flatten() {
            *left = left.saturating_sub(1);
        }
    }
}
