//! The lost sweep: a lease whose group's deadline passed without a successful keep-alive is lost
//! at that moment (its store has expired it), whatever sockets and retries are still doing.

use std::sync::Arc;

use super::{counters, Leases};
use crate::lease::{monotonic_ms, LeaseRecord};
use crate::sync::lock;

impl Leases {
    /// Marks the leases of overdue groups lost; returns the next deadline.
    pub(super) fn expire_overdue(&self) -> Option<u64> {
        let (overdue, next) = lock(&self.held).overdue(monotonic_ms());
        for record in &overdue {
            self.lose(record, true);
        }
        next
    }

    /// Marks a lease lost; `still_stored` when Redis may still have its members (a holder that
    /// comes back would keep them alive), so they are removed again.
    pub fn lose(&self, record: &Arc<LeaseRecord>, still_stored: bool) {
        if record.mark_lost(|| counters::add(&self.counts.lost, 1)) {
            lock(&self.held).remove(record);
            if still_stored {
                self.retry_later([Arc::clone(record)]);
            }
        }
    }
}
