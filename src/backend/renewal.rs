//! What a renewal round asks a store, and what the store answers: keep-alives by holders key
//! (one hash tag each), checks of leases one by one, in batches of bounded size.

use std::sync::Arc;

use crate::errors::CoreError;
use crate::lease::LeaseRecord;

/// Members (a lease of weight w is w members per pool) per reclaim or release script call:
/// bounds how long one script blocks Redis.
const BATCH_UNITS: u64 = 1000;

/// Splits leases into script-call batches of at most `BATCH_UNITS` members (at least one lease).
/// With `one_slot`, a batch also never mixes hash tags (Redis Cluster runs a script on one slot
/// only); the caller sorts the leases by tag first.
pub fn batches(leases: &[Arc<LeaseRecord>], one_slot: bool) -> Vec<&[Arc<LeaseRecord>]> {
    let mut batches = Vec::new();
    let (mut start, mut units) = (0, 0);
    for (i, lease) in leases.iter().enumerate() {
        let weight = u64::from(lease.weight);
        let new_slot = one_slot && lease.hash_tag() != leases[start].hash_tag();
        if i > start && (units + weight > BATCH_UNITS || new_slot) {
            batches.push(&leases[start..i]);
            (start, units) = (i, 0);
        }
        units += weight;
    }
    if start < leases.len() {
        batches.push(&leases[start..]);
    }
    batches
}

/// What Redis counts for a holder in a tag (`<tag>:holders:<id>:members`): its members, and the
/// sum of their ids (`LeaseRecord::id_value` per member).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counted {
    pub members: u64,
    pub ids: u64,
}

/// What one keep-alive found for one group (the leases of one holders key, one hash tag).
#[derive(Debug, Clone, PartialEq)]
pub struct Kept {
    pub holders: String,
    /// The holder's entry was live, and is extended; else its leases must be checked one by one.
    pub alive: bool,
    /// What Redis counts for the holder in the tag (None for the embedded stores, which never
    /// lose a member).
    pub counted: Option<Counted>,
    /// The tag's revocation stamp (`revoke`, which never repeats a value; always 0 in the
    /// embedded stores, whose revocations end this process's leases at once).
    pub revocations: u64,
}

/// What the calls of one renewal round found. Groups whose calls failed are not renewed: their
/// deadlines decide.
#[derive(Default)]
pub struct RoundReport {
    /// Holders keys of the groups kept alive (their remaining leases all extended).
    pub renewed: Vec<String>,
    /// Members removed because their holder held no lease of theirs.
    pub pruned: u64,
    /// Found gone and taken back.
    pub reclaimed: Vec<Arc<LeaseRecord>>,
    /// Found gone with no room to take them back (and removed everywhere).
    pub lost: Vec<Arc<LeaseRecord>>,
    /// Found gone and revoked by an operator, so never taken back (and removed everywhere).
    pub revoked: Vec<Arc<LeaseRecord>>,
    pub failures: Vec<CoreError>,
    /// Whether any call got an answer (for the circuit breaker).
    pub answered: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{Pool, PoolRole};
    use crate::lease::Store;

    fn lease_in(key: String, weight: u32) -> Arc<LeaseRecord> {
        let pool = Pool::new("global", key, 0, PoolRole::Shared);
        Arc::new(LeaseRecord::new(vec![pool], weight, Store::Main))
    }

    #[test]
    fn batches_bound_the_members_per_call() {
        let leases: Vec<_> = (0..2500).map(|_| lease_in("k".into(), 1)).collect();
        let sizes: Vec<usize> = batches(&leases, false).iter().map(|b| b.len()).collect();
        assert_eq!(sizes, vec![1000, 1000, 500]);
        let heavy: Vec<_> = (0..25).map(|_| lease_in("k".into(), 100)).collect();
        let heavy_sizes: Vec<usize> = batches(&heavy, false).iter().map(|b| b.len()).collect();
        assert_eq!(heavy_sizes, vec![10, 10, 5]);
        assert!(batches(&[], true).is_empty());
        let tagged = |tag: &str| lease_in(format!("{{{tag}}}:user"), 1);
        let spread = vec![tagged("a"), tagged("a"), tagged("b")];
        let sizes: Vec<usize> = batches(&spread, true).iter().map(|b| b.len()).collect();
        assert_eq!(sizes, vec![2, 1]);
    }
}
