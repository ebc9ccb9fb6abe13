//! The Redis side: the keys of one hash tag and the scripts of `src/lua/`, each one atomic step.
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
    /// Per holder: `T:holders:<id>:members` (today: its field 'n') or `:granted` (before); None:
    /// no key.
    pub count: [Option<i8>; MAX_HOLDERS],
    /// Per lease: the members of it that its holder's sum of ids (field 's') adds up
    /// (`sum_of_ids`; all 0 without the key).
    pub summed: Ids,
}

/// A sum of member ids, as the members of each lease that it adds up.
pub type Ids = [i8; MAX_LEASES];

/// What the acquire script answers (no waiting line: a caller that does not wait).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub enum AcquireReply {
    /// GRANTED, and whether the holder's entry was live.
    Granted {
        alive: bool,
    },
    Refused,
}

/// What the keep-alive script answers for the tag, as the process reads it
/// (`backend/redis/keepalive.rs`: a figure below 0 reads as 0).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct KeepaliveReply {
    pub alive: bool,
    /// The holder's count of members (today's protocol; 0 before, which returned none).
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
        if capacity > 0 && used + weight > capacity {
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

    /// prelude `add_members` (and, before, its `INCRBY` of the granted count).
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

    /// prelude `count_members`: the count moves by `change`, the sum of ids by `ids` (today's
    /// exact count only; the old count moved in `add_members`).
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

    /// `acquire.lua` for a caller that does not wait (no line).
    pub fn acquire(&mut self, cfg: &ModelConfig, lease: usize) -> AcquireReply {
        self.reap(cfg);
        let spec = &cfg.leases[lease];
        let holder = spec.holder;
        for &pool in &spec.pools {
            let capacity = cfg.capacities[pool];
            let used = self.used_slots(cfg, pool, spec.weight, capacity);
            if capacity > 0 && used + spec.weight > capacity {
                // `refusal`: a resent call of a lease already granted is granted again.
                if self.members[lease] & (1 << spec.pools[0]) != 0 {
                    return AcquireReply::Granted {
                        alive: self.is_alive(holder),
                    };
                }
                return AcquireReply::Refused;
            }
        }
        let alive = self.hold(cfg, holder);
        for &pool in &spec.pools {
            self.add_members(cfg, pool, lease);
        }
        let units = cfg.units(lease) as i8;
        self.count_members(cfg, holder, units, Self::ids_of_lease(lease, units));
        AcquireReply::Granted { alive }
    }

    /// `keepalive.lua` for one tag. `resync`: the recount after a check (today: count again
    /// from the pools; before: raise the granted count to `known`). `known`: before, the members
    /// the process knew were granted to the group (unused today).
    pub fn keepalive(&mut self, cfg: &ModelConfig, holder: usize, resync: bool, known: u8) -> KeepaliveReply {
        self.reap(cfg);
        let (alive, members, ids) = match cfg.count {
            Count::Exact => {
                if resync {
                    self.recount(cfg, holder);
                }
                let count = self.count[holder].unwrap_or(0);
                (
                    self.is_alive(holder),
                    count.max(0) as u8,
                    self.read_ids(cfg, holder),
                )
            }
            Count::GrantedOnlyGrows => {
                let known = known as i8;
                if resync && self.count[holder].unwrap_or(0) < known {
                    self.count[holder] = Some(known);
                }
                let alive = self.is_alive(holder) && self.count[holder].unwrap_or(0) >= known;
                (alive, 0, Ids::default())
            }
        };
        if alive {
            self.entry[holder] = Some(cfg.ttl);
            if cfg.lazy_index {
                self.sweep_index(cfg, holder);
            }
        }
        KeepaliveReply { alive, members, ids }
    }

    /// The holder's sum of ids as the process reads it: one below 0 reads as 0. (A sum with
    /// leases both above and below 0, which only a check without its recount leaves, has the
    /// sign its ids give it; the model reads it as above 0, and reading it as 0 finds the same
    /// in `model/tests/protocol.rs`.)
    fn read_ids(&self, cfg: &ModelConfig, holder: usize) -> Ids {
        let mut ids = Ids::default();
        for l in bits(cfg.leases_of(holder)) {
            ids[l] = self.summed[l];
        }
        if ids.iter().all(|&id| id <= 0) {
            return Ids::default();
        }
        ids
    }

    /// `keepalive.lua`'s sweep of the index (the whole index at these sizes): a pool where the
    /// holder has no member leaves it (release.lua leaves it listed).
    fn sweep_index(&mut self, cfg: &ModelConfig, holder: usize) {
        for pool in bits(self.index[holder]) {
            if self.zcount(cfg, pool, holder) == 0 {
                self.index[holder] &= !(1 << pool);
            }
        }
    }

    /// The index lists every pool where the holder has members (what the reaper, the recount
    /// and the prune rely on to find them).
    pub fn index_covers_members(&self, cfg: &ModelConfig) -> bool {
        (0..cfg.leases.len()).all(|l| {
            let holder = cfg.leases[l].holder;
            self.members[l] & !self.index[holder] == 0
        })
    }

    /// `reclaim.lua`: the holder's leases in `check` (a mask), one by one; returns the masks
    /// (lost, reclaimed).
    pub fn reclaim(&mut self, cfg: &ModelConfig, holder: usize, check: u8) -> (u8, u8) {
        self.hold(cfg, holder);
        let (mut lost, mut reclaimed) = (0, 0);
        for lease in bits(check) {
            let spec = &cfg.leases[lease];
            let mask = cfg.pool_mask(lease);
            if self.members[lease] & mask == mask {
                continue;
            }
            let mut room = true;
            let mut removed = 0;
            for &pool in &spec.pools {
                removed += self.remove_members(cfg, pool, lease);
                let capacity = cfg.capacities[pool];
                if capacity > 0 && self.used_slots(cfg, pool, spec.weight, capacity) + spec.weight > capacity
                {
                    room = false;
                }
            }
            if room {
                for &pool in &spec.pools {
                    self.add_members(cfg, pool, lease);
                }
                let change = cfg.units(lease) as i8 - removed as i8;
                self.count_members(cfg, holder, change, Self::ids_of_lease(lease, change));
                reclaimed |= 1 << lease;
            } else {
                let change = -(removed as i8);
                self.count_members(cfg, holder, change, Self::ids_of_lease(lease, change));
                lost |= 1 << lease;
            }
        }
        if self.index[holder] == 0 {
            self.leave_tag(cfg, holder);
        } else if cfg.reclaim_recounts {
            self.recount(cfg, holder);
        }
        (lost, reclaimed)
    }

    /// `release.lua` for the holder's leases in `leases` (a mask); returns how many were still
    /// present somewhere. Today the index and the holder's entry stay (the keep-alive's sweep
    /// and the reaper see to them); before `lazy_index`, pools the holder left went from its
    /// index, and a holder whose index emptied left the tag.
    pub fn release(&mut self, cfg: &ModelConfig, holder: usize, leases: u8) -> u8 {
        let mut touched = 0u8;
        let mut removed = 0u8;
        let mut removed_ids = Ids::default();
        let mut released = 0;
        for lease in bits(leases) {
            let mut present = false;
            for &pool in &cfg.leases[lease].pools {
                touched |= 1 << pool;
                let gone = self.remove_members(cfg, pool, lease);
                present |= gone > 0;
                removed += gone;
                removed_ids[lease] -= gone as i8;
            }
            released += u8::from(present);
        }
        self.count_members(cfg, holder, -(removed as i8), removed_ids);
        if !cfg.lazy_index {
            let mut left_a_pool = false;
            for pool in bits(touched) {
                if self.zcount(cfg, pool, holder) == 0 {
                    self.index[holder] &= !(1 << pool);
                    left_a_pool = true;
                }
            }
            if left_a_pool && self.index[holder] == 0 {
                self.leave_tag(cfg, holder);
            }
        }
        released
    }

    /// `prune.lua` at 0826417, in one step: removes the holder's members whose lease is not in
    /// `keep` (a mask), then recounts; returns the members removed.
    pub fn prune(&mut self, cfg: &ModelConfig, holder: usize, keep: u8) -> u8 {
        let mut removed = 0;
        for pool in bits(self.index[holder]) {
            for lease in bits(cfg.leases_of(holder) & !keep) {
                removed += self.remove_members(cfg, pool, lease);
            }
            if self.zcount(cfg, pool, holder) == 0 {
                self.index[holder] &= !(1 << pool);
            }
        }
        self.recount(cfg, holder);
        removed
    }

    /// `strays.lua`, the first step of today's prune: the holder's leases with members in its
    /// pools that are not in `keep` (a mask); changes nothing.
    pub fn list_strays(&self, cfg: &ModelConfig, holder: usize, keep: u8) -> u8 {
        bits(self.index[holder])
            .flat_map(|pool| {
                bits(cfg.leases_of(holder) & !keep).filter(move |&l| self.members[l] & (1 << pool) != 0)
            })
            .fold(0, |mask, l| mask | 1 << l)
    }

    /// `prune.lua`, the second step: removes the members of the holder's leases in `strays` (a
    /// mask), then recounts; returns the members removed.
    pub fn prune_ids(&mut self, cfg: &ModelConfig, holder: usize, strays: u8) -> u8 {
        let mut removed = 0;
        for pool in bits(self.index[holder]) {
            for lease in bits(strays) {
                removed += self.remove_members(cfg, pool, lease);
            }
            if self.zcount(cfg, pool, holder) == 0 {
                self.index[holder] &= !(1 << pool);
            }
        }
        self.recount(cfg, holder);
        removed
    }

    /// `count.lua` on every pool: reap, then walk.
    pub fn count(&mut self, cfg: &ModelConfig) {
        self.reap(cfg);
        for pool in 0..cfg.capacities.len() {
            self.live_count(cfg, pool);
        }
    }

    /// One tick of the server's clock.
    pub fn tick(&mut self) {
        for left in self.entry.iter_mut().flatten() {
            *left = left.saturating_sub(1);
        }
    }
}
