//! The scripts of `src/lua/`, one function each, run as one atomic step.

use super::{AcquireReply, Ids, KeepaliveReply, Redis};
use crate::config::{bits, Count, ModelConfig};

impl Redis {
    /// `acquire.lua` for a caller that does not wait (no line). `trusted`: the life the process
    /// knew its holder's entry had (0: none, the entry is read). An acquire that trusts it and
    /// finds room by the pools' plain counts adds the members without a look at the entry; one
    /// that finds a pool full goes the way of any other (the walk, the refusal).
    pub fn acquire(&mut self, cfg: &ModelConfig, lease: usize, trusted: u8) -> AcquireReply {
        let spec = &cfg.leases[lease];
        let holder = spec.holder;
        let room = |pool: &usize| {
            let capacity = cfg.capacities[*pool];
            capacity == 0 || self.zcard(cfg, *pool) + spec.weight <= capacity
        };
        if trusted > 0 && spec.pools.iter().all(room) {
            for &pool in &spec.pools {
                self.add_members(cfg, pool, lease);
            }
            let units = cfg.units(lease) as i8;
            self.count_members(cfg, holder, units, Self::ids_of_lease(lease, units));
            return AcquireReply::Granted {
                alive: true,
                life: trusted,
            };
        }
        let was_alive = self.is_alive(holder);
        if cfg.acquire_reaps || (!was_alive && cfg.reap_before_rejoining) {
            self.reap(cfg);
        }
        for &pool in &spec.pools {
            let capacity = cfg.capacities[pool];
            let used = self.used_slots(cfg, pool, spec.weight, capacity);
            if capacity > 0 && used + spec.weight > capacity {
                // `refusal`: a resent call of a lease already granted is granted again.
                if self.members[lease] & (1 << spec.pools[0]) != 0 {
                    return AcquireReply::Granted {
                        alive: self.is_alive(holder),
                        life: self.life(cfg, holder),
                    };
                }
                self.refused_by_the_dead |= self.holds_the_dead(cfg, pool);
                return AcquireReply::Refused;
            }
        }
        let alive = self.join(cfg, holder, was_alive);
        for &pool in &spec.pools {
            self.add_members(cfg, pool, lease);
        }
        let units = cfg.units(lease) as i8;
        self.count_members(cfg, holder, units, Self::ids_of_lease(lease, units));
        AcquireReply::Granted {
            alive,
            life: self.life(cfg, holder),
        }
    }

    /// `keepalive.lua` for one tag. `resync`: the recount after a check (the exact count: count
    /// again from the pools; a count that only grows: raise it to `known`). `known`: under
    /// `Count::GrantedOnlyGrows`, the members the process knows were granted to the group
    /// (unused by the exact count).
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
    /// present somewhere. With `lazy_index` the index and the holder's entry stay (the
    /// keep-alive's sweep and the reaper see to them); without, pools the holder left go from
    /// its index, and a holder whose index empties leaves the tag.
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

    /// `Prune::KeepList`, in one step: removes the holder's members whose lease is not in
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

    /// `strays.lua`, the first step of `Prune::TwoStep`: the holder's leases with members in its
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
}
