//! The leases this process holds, grouped the way they are kept alive: per store and holders
//! key (one hash tag). A group shares one deadline, since one keep-alive (or one acquire) extends
//! every lease in it at once; so the renewal loop's work per round grows with the number of
//! groups, not of leases.

use std::collections::HashMap;
use std::sync::Arc;

use super::tally::Tallies;
use crate::lease::{LeaseId, LeaseRecord, Store};

/// Leases kept alive together, and when the store drops them unless kept alive meanwhile.
#[derive(Default)]
struct HeldGroup {
    leases: HashMap<LeaseId, Arc<LeaseRecord>>,
    /// `monotonic_ms` of the last successful acquire or keep-alive send, plus the lease duration.
    deadline_ms: u64,
}

/// The deadline of leases their store never drops (the embedded stores).
pub const NEVER: u64 = u64::MAX;

/// Groups by holders key, per store.
#[derive(Default)]
pub struct Held {
    main: HashMap<Arc<str>, HeldGroup>,
    fallback: HashMap<Arc<str>, HeldGroup>,
    count: usize,
    /// Slots held in each pool (by key), both stores together: what a local floor counts.
    slots_by_pool: HashMap<Arc<str>, u64>,
    /// What the holder's counts in Redis should be (main store).
    pub tallies: Tallies,
}

impl Held {
    fn side(&self, store: Store) -> &HashMap<Arc<str>, HeldGroup> {
        match store {
            Store::Main => &self.main,
            Store::Fallback => &self.fallback,
        }
    }

    fn side_mut(&mut self, store: Store) -> &mut HashMap<Arc<str>, HeldGroup> {
        match store {
            Store::Main => &mut self.main,
            Store::Fallback => &mut self.fallback,
        }
    }

    /// Holds `record`, which its store keeps at least until `deadline_ms`. A grant that found the
    /// holder's entry live (`holder_was_alive`) kept the whole group alive, so it extends the
    /// group's deadline. One that found it expired does not revive the group: if the group's own
    /// deadline passed before `now_ms`, its leases are taken out and returned (the caller marks
    /// them lost, as the sweep would) and the newcomer starts a group of its own. A grant that
    /// arrives after its own deadline is returned too, not held: the holder's entry may have
    /// expired since its script ran, and its members been reaped (the protocol model checks it).
    pub fn insert(
        &mut self,
        record: Arc<LeaseRecord>,
        deadline_ms: u64,
        holder_was_alive: bool,
        now_ms: u64,
    ) -> Vec<Arc<LeaseRecord>> {
        let side = self.side_mut(record.store);
        let overdue = match side.get(&*record.holders) {
            Some(group) if !holder_was_alive && group.deadline_ms <= now_ms => side
                .remove(&*record.holders)
                .map(|group| group.leases.into_values().collect())
                .unwrap_or_default(),
            _ => Vec::new(),
        };
        self.count -= overdue.len();
        for lease in &overdue {
            self.count_slots(lease, false);
        }
        if deadline_ms <= now_ms {
            let mut overdue = overdue;
            overdue.push(record);
            return overdue;
        }
        let group = self
            .side_mut(record.store)
            .entry(Arc::clone(&record.holders))
            .or_default();
        group.deadline_ms = group.deadline_ms.max(deadline_ms);
        let added = group.leases.insert(record.id, Arc::clone(&record)).is_none();
        if added {
            self.count += 1;
            self.count_slots(&record, true);
        }
        overdue
    }

    /// Counts a lease's slots per pool, and its members in its tag's tally.
    fn count_slots(&mut self, record: &LeaseRecord, held: bool) {
        if record.store == Store::Main {
            self.tallies.hold(record, held);
        }
        let weight = u64::from(record.weight);
        for pool in &record.pools {
            match self.slots_by_pool.get_mut(&*pool.key) {
                Some(slots) if held => *slots += weight,
                Some(slots) => {
                    *slots = slots.saturating_sub(weight);
                    if *slots == 0 {
                        self.slots_by_pool.remove(&*pool.key);
                    }
                }
                None if held => {
                    self.slots_by_pool.insert(Arc::clone(&pool.key), weight);
                }
                None => {}
            }
        }
    }

    /// Slots this process holds in a pool, in either store.
    pub fn slots_in(&self, pool_key: &str) -> u64 {
        self.slots_by_pool.get(pool_key).copied().unwrap_or(0)
    }

    /// True if the lease was held.
    pub fn remove(&mut self, record: &LeaseRecord) -> bool {
        let side = self.side_mut(record.store);
        let Some(group) = side.get_mut(&*record.holders) else {
            return false;
        };
        let removed = group.leases.remove(&*record.id).is_some();
        if group.leases.is_empty() {
            side.remove(&*record.holders);
        }
        if removed {
            self.count -= 1;
            self.count_slots(record, false);
        }
        removed
    }

    pub fn len(&self) -> usize {
        self.count
    }

    /// The deadline (`monotonic_ms`) until which the store keeps `record`, if held: its group's
    /// ([`NEVER`] for the embedded stores).
    pub fn deadline_of(&self, record: &LeaseRecord) -> Option<u64> {
        let group = self.side(record.store).get(&*record.holders)?;
        group
            .leases
            .contains_key(&*record.id)
            .then_some(group.deadline_ms)
    }

    /// Whether nothing is held nor in flight (acquires sent, releases not confirmed, the retry
    /// list) in a tag (`holders`) of `store`.
    pub fn is_idle(&self, store: Store, holders: &str) -> bool {
        !self.side(store).contains_key(holders) && (store == Store::Fallback || !self.tallies.tracks(holders))
    }

    /// The holders keys of one store's groups.
    pub fn groups(&self, store: Store) -> Vec<String> {
        self.side(store)
            .keys()
            .map(|holders| holders.to_string())
            .collect()
    }

    pub fn leases_of(&self, store: Store, holders: &str) -> Vec<Arc<LeaseRecord>> {
        self.side(store)
            .get(holders)
            .map_or_else(Vec::new, |group| group.leases.values().cloned().collect())
    }

    /// Of the leases a prune listed in a tag (id, weight), those neither held nor in flight now:
    /// their ids are never used again, so their members can be removed whenever the call runs.
    /// A lease granted after the list was asked for is held or in flight, so it stays.
    pub fn strays(&self, store: Store, holders: &str, listed: Vec<(String, u32)>) -> Vec<(String, u32)> {
        let group = self.side(store).get(holders);
        listed
            .into_iter()
            .filter(|(id, _)| {
                !group.is_some_and(|group| group.leases.contains_key(id.as_str()))
                    && !self.tallies.is_in_flight(holders, id)
            })
            .collect()
    }

    /// Records that the store keeps a whole group at least until `deadline_ms`.
    pub fn extend(&mut self, store: Store, holders: &str, deadline_ms: u64) {
        if let Some(group) = self.side_mut(store).get_mut(holders) {
            group.deadline_ms = group.deadline_ms.max(deadline_ms);
        }
    }

    /// The leases of groups whose deadline passed (the caller marks them lost), and the next
    /// deadline of the others.
    pub fn overdue(&self, now_ms: u64) -> (Vec<Arc<LeaseRecord>>, Option<u64>) {
        let mut overdue = Vec::new();
        let mut next: Option<u64> = None;
        for group in self.main.values().chain(self.fallback.values()) {
            if group.deadline_ms == NEVER {
                continue;
            }
            if group.deadline_ms <= now_ms {
                overdue.extend(group.leases.values().cloned());
            } else {
                next = Some(next.map_or(group.deadline_ms, |n| n.min(group.deadline_ms)));
            }
        }
        (overdue, next)
    }

    /// Slots held per pool name (`per_user`, `global`, a resource's), both stores together.
    pub fn slots_by_name(&self) -> Vec<(String, u64)> {
        let mut slots: std::collections::BTreeMap<&str, u64> = std::collections::BTreeMap::new();
        for group in self.main.values().chain(self.fallback.values()) {
            for lease in group.leases.values() {
                for pool in &lease.pools {
                    *slots.entry(&pool.name).or_default() += u64::from(lease.weight);
                }
            }
        }
        slots.into_iter().map(|(name, n)| (name.to_owned(), n)).collect()
    }

    /// Every lease held, in both stores.
    pub fn all(&self) -> Vec<Arc<LeaseRecord>> {
        self.main
            .values()
            .chain(self.fallback.values())
            .flat_map(|group| group.leases.values().cloned())
            .collect()
    }

    pub fn drain(&mut self) -> Vec<Arc<LeaseRecord>> {
        self.count = 0;
        self.slots_by_pool.clear();
        self.tallies = Tallies::default();
        self.main
            .drain()
            .chain(self.fallback.drain())
            .flat_map(|(_, group)| group.leases.into_values())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Counted;
    use crate::keys::{Pool, PoolRole};

    fn lease(tag: &str, store: Store) -> Arc<LeaseRecord> {
        let pools = vec![Pool::new(
            "global",
            format!("{{{tag}}}:global"),
            0,
            PoolRole::Shared,
        )];
        Arc::new(LeaseRecord::new(pools, 1, store))
    }

    #[test]
    fn a_group_shares_one_deadline_and_vanishes_when_empty() {
        let mut held = Held::default();
        let (a, b, c) = (
            lease("t", Store::Main),
            lease("t", Store::Main),
            lease("t", Store::Fallback),
        );
        held.insert(Arc::clone(&a), 100, true, 0);
        held.insert(Arc::clone(&b), 150, true, 0);
        held.insert(Arc::clone(&c), 500, true, 0);
        assert_eq!(held.len(), 3);
        assert_eq!(held.slots_in("{t}:global"), 3, "both stores count");
        assert_eq!(held.groups(Store::Main), vec!["{t}:holders".to_owned()]);
        held.tallies.open_windows();
        assert!(
            !held.tallies.close_window("{t}:holders", Counted::of(&[&a, &b])),
            "the main store's members"
        );
        assert!(held.tallies.take_excess().is_empty());
        let (overdue, next) = held.overdue(120);
        assert!(
            overdue.is_empty() && next == Some(150),
            "the later acquire extends the group"
        );
        held.extend(Store::Main, "{t}:holders", 1000);
        assert_eq!(held.overdue(600).0.len(), 1, "only the fallback group is overdue");
        assert!(held.remove(&a) && held.remove(&b) && !held.remove(&b));
        assert_eq!(held.groups(Store::Main), Vec::<String>::new());
        assert_eq!(held.slots_in("{t}:global"), 1);
        assert_eq!(held.drain().len(), 1);
        assert_eq!(held.len(), 0);
    }

    #[test]
    fn a_new_grant_does_not_revive_an_overdue_group() {
        let mut held = Held::default();
        let (old, new) = (lease("t", Store::Main), lease("t", Store::Main));
        assert!(held.insert(Arc::clone(&old), 100, true, 0).is_empty());
        let late = lease("t", Store::Main);
        assert!(
            held.insert(Arc::clone(&late), 300, true, 200).is_empty(),
            "a grant that found the holder live kept the group alive, however late it lands"
        );
        held.remove(&late);
        // The group's deadline passed and the grant found the holder's entry expired: the store
        // may have reaped `old` and given its slot away.
        let overdue = held.insert(Arc::clone(&new), 500, false, 400);
        assert_eq!(overdue.len(), 1);
        assert!(Arc::ptr_eq(&overdue[0], &old));
        assert_eq!((held.len(), held.slots_in("{t}:global")), (1, 1));
        assert_eq!(held.leases_of(Store::Main, "{t}:holders").len(), 1);
        held.tallies.open_windows();
        assert!(
            !held.tallies.close_window("{t}:holders", Counted::of(&[&new])),
            "the lost one does not count"
        );
        assert!(held.tallies.take_excess().is_empty());
    }

    /// A grant delivered after its own deadline (an event loop blocked longer than a lease)
    /// must not join a group a later grant revived, since the
    /// holder's entry may have expired, and its members been reaped, since its script ran.
    #[test]
    fn a_grant_arriving_after_its_deadline_is_not_held() {
        let mut held = Held::default();
        let (alive, late) = (lease("t", Store::Main), lease("t", Store::Main));
        assert!(held.insert(Arc::clone(&alive), 900, false, 500).is_empty());
        let overdue = held.insert(Arc::clone(&late), 400, true, 500);
        assert_eq!(overdue.len(), 1);
        assert!(Arc::ptr_eq(&overdue[0], &late));
        assert_eq!((held.len(), held.slots_in("{t}:global")), (1, 1));
    }

    /// A prune's list of leases to keep is taken before its call, so an acquire sent
    /// meanwhile, and run by Redis first, would lose its member were the list trusted: the
    /// strays are filtered when the list comes back, since a grant made meanwhile is held or in
    /// flight.
    #[test]
    fn a_prune_removes_only_leases_neither_held_nor_in_flight() {
        let mut held = Held::default();
        let (kept, granted, sent, released) = (
            lease("t", Store::Main),
            lease("t", Store::Main),
            lease("t", Store::Main),
            lease("t", Store::Main),
        );
        held.insert(Arc::clone(&kept), 100, true, 0);
        let listed = |leases: &[&Arc<LeaseRecord>]| -> Vec<(String, u32)> {
            leases
                .iter()
                .map(|lease| (lease.id.to_string(), lease.weight))
                .collect()
        };
        // What a list may name: any lease granted after the ids to keep were taken.
        let all = listed(&[&kept, &granted, &sent, &released]);
        // Since then: `granted` was acquired and held, `sent` is being acquired, `released`
        // was held, then released, and its release is still under way.
        held.tallies.flight_start(&granted, false);
        held.insert(Arc::clone(&granted), 100, true, 0);
        held.tallies.flight_end(&granted, true);
        held.tallies.flight_start(&sent, false);
        held.insert(Arc::clone(&released), 100, true, 0);
        held.remove(&released);
        held.tallies.flight_start(&released, true);
        assert!(held.strays(Store::Main, "{t}:holders", all.clone()).is_empty());
        // Once the release is confirmed, the released lease's id is never used again.
        held.tallies.flight_end(&released, true);
        assert_eq!(held.strays(Store::Main, "{t}:holders", all), listed(&[&released]));
    }
}
