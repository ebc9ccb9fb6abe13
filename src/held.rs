//! The leases this process holds, grouped the way they are kept alive: per holders key (one
//! hash tag), apart for leases of the local fallback. A group shares one deadline, since one
//! keep-alive (or one acquire) extends every lease in it at once; so the renewal loop's work per
//! round grows with the number of groups, not of leases.

use std::collections::HashMap;
use std::sync::Arc;

use crate::lease::LeaseRecord;

/// Leases kept alive together, and when the store drops them unless kept alive meanwhile.
#[derive(Default)]
struct Group {
    leases: HashMap<String, Arc<LeaseRecord>>,
    /// `monotonic_ms` of the last successful acquire or keep-alive send, plus the lease duration.
    deadline_ms: u64,
    /// Members granted to this group since it formed (weight x pools per lease, taken back ones
    /// included): Redis counts the same, so a shortfall there means grants went missing.
    granted_units: u64,
}

/// Indexed by `LeaseRecord::local`: the main backend's groups, then the local fallback's.
#[derive(Default)]
pub struct Held {
    sides: [HashMap<String, Group>; 2],
    count: usize,
}

impl Held {
    /// Holds `record`, which the store keeps at least until `deadline_ms`.
    pub fn insert(&mut self, record: Arc<LeaseRecord>, deadline_ms: u64) {
        let group = self.sides[usize::from(record.local)]
            .entry(record.holders.clone())
            .or_default();
        group.deadline_ms = group.deadline_ms.max(deadline_ms);
        group.granted_units += record.units();
        if group.leases.insert(record.id.clone(), record).is_none() {
            self.count += 1;
        }
    }

    /// Counts a lease found gone and taken back, if it is still held.
    pub fn taken_back(&mut self, record: &LeaseRecord) {
        if let Some(group) = self.sides[usize::from(record.local)].get_mut(&record.holders) {
            if group.leases.contains_key(&record.id) {
                group.granted_units += record.units();
            }
        }
    }

    /// True if the lease was held.
    pub fn remove(&mut self, record: &LeaseRecord) -> bool {
        let side = &mut self.sides[usize::from(record.local)];
        let Some(group) = side.get_mut(&record.holders) else {
            return false;
        };
        let removed = group.leases.remove(&record.id).is_some();
        if group.leases.is_empty() {
            side.remove(&record.holders);
        }
        self.count -= usize::from(removed);
        removed
    }

    pub fn len(&self) -> usize {
        self.count
    }

    /// One side's groups: holders key and members granted.
    pub fn groups(&self, local: bool) -> Vec<(String, u64)> {
        self.sides[usize::from(local)]
            .iter()
            .map(|(holders, group)| (holders.clone(), group.granted_units))
            .collect()
    }

    pub fn leases_of(&self, local: bool, holders: &str) -> Vec<Arc<LeaseRecord>> {
        self.sides[usize::from(local)]
            .get(holders)
            .map_or_else(Vec::new, |group| group.leases.values().cloned().collect())
    }

    /// Records that the store keeps a whole group at least until `deadline_ms`.
    pub fn extend(&mut self, local: bool, holders: &str, deadline_ms: u64) {
        if let Some(group) = self.sides[usize::from(local)].get_mut(holders) {
            group.deadline_ms = group.deadline_ms.max(deadline_ms);
        }
    }

    /// The leases of groups whose deadline passed (the caller marks them lost), and the next
    /// deadline of the others.
    pub fn overdue(&self, now_ms: u64) -> (Vec<Arc<LeaseRecord>>, Option<u64>) {
        let mut overdue = Vec::new();
        let mut next: Option<u64> = None;
        for group in self.sides.iter().flat_map(HashMap::values) {
            if group.deadline_ms <= now_ms {
                overdue.extend(group.leases.values().cloned());
            } else {
                next = Some(next.map_or(group.deadline_ms, |n| n.min(group.deadline_ms)));
            }
        }
        (overdue, next)
    }

    pub fn drain(&mut self) -> Vec<Arc<LeaseRecord>> {
        self.count = 0;
        self.sides
            .iter_mut()
            .flat_map(|side| side.drain())
            .flat_map(|(_, group)| group.leases.into_values())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::Pool;

    fn lease(tag: &str, local: bool) -> Arc<LeaseRecord> {
        let pools = vec![Pool {
            name: "global".into(),
            key: format!("{{{tag}}}:global"),
            capacity: 0,
        }];
        Arc::new(if local {
            LeaseRecord::local(pools, 1)
        } else {
            LeaseRecord::new(pools, 1)
        })
    }

    #[test]
    fn a_group_shares_one_deadline_and_vanishes_when_empty() {
        let mut held = Held::default();
        let (a, b, c) = (lease("t", false), lease("t", false), lease("t", true));
        held.insert(Arc::clone(&a), 100);
        held.insert(Arc::clone(&b), 150);
        held.insert(Arc::clone(&c), 500);
        assert_eq!(held.len(), 3);
        assert_eq!(held.groups(false), vec![("{t}:holders".to_owned(), 2)]);
        held.taken_back(&a);
        assert_eq!(held.groups(false)[0].1, 3, "a lease taken back was granted again");
        let (overdue, next) = held.overdue(120);
        assert!(
            overdue.is_empty() && next == Some(150),
            "the later acquire extends the group"
        );
        held.extend(false, "{t}:holders", 1000);
        assert_eq!(held.overdue(600).0.len(), 1, "only the local group is overdue");
        assert!(held.remove(&a) && held.remove(&b) && !held.remove(&b));
        assert_eq!(held.groups(false), vec![]);
        assert_eq!(held.drain().len(), 1);
        assert_eq!(held.len(), 0);
    }
}
