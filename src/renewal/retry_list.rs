//! The release retry list: leases to take out of the store again, by id. Their release failed,
//! or they were lost (a holder that comes back would otherwise keep their members alive).
//! Retried every round, after the keep-alive; until removed, they are in flight (Redis may still
//! count them).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::Leases;
use crate::lease::{LeaseId, LeaseRecord};
use crate::sync::lock;

/// Leases kept for another release try at most; beyond, a lease is left to its holder's expiry
/// (or, while this process lives, to the reconciliation of its granted count).
const MAX_UNREMOVED: usize = 10_000;

#[derive(Default)]
pub(super) struct RetryList(Mutex<HashMap<LeaseId, Arc<LeaseRecord>>>);

impl RetryList {
    pub fn len(&self) -> usize {
        lock(&self.0).len()
    }

    /// Every lease on the list, which is left empty (those that fail again come back).
    pub fn take_all(&self) -> Vec<Arc<LeaseRecord>> {
        std::mem::take(&mut *lock(&self.0)).into_values().collect()
    }
}

impl Leases {
    /// Keeps leases for another release try (each once, up to `MAX_UNREMOVED`; those beyond are
    /// left to the prune of extra members, or to their holder's expiry).
    pub(super) fn retry_later(&self, records: impl IntoIterator<Item = Arc<LeaseRecord>>) {
        let mut unremoved = lock(&self.retries.0);
        for record in records {
            if unremoved.len() >= MAX_UNREMOVED {
                self.flight_end(&record, true);
                continue;
            }
            self.flight_start(&record);
            unremoved.insert(record.id, record);
        }
    }
}
