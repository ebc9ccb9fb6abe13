//! What the caller holds for a granted lease: its record, kept alive by the renewal loop until
//! released. Dropped without a release (never released, garbage collected), it frees its slot.

use std::future::Future;
use std::sync::Arc;

use futures_util::future::Either;

use super::{Leases, Releasing};
use crate::errors::CoreResult;
use crate::lease::{LeaseRecord, LostWatcher};

pub struct HeldLease {
    record: Arc<LeaseRecord>,
    leases: Arc<Leases>,
}

impl HeldLease {
    pub(super) fn new(record: Arc<LeaseRecord>, leases: Arc<Leases>) -> Self {
        HeldLease { record, leases }
    }

    pub fn record(&self) -> &LeaseRecord {
        &self.record
    }

    /// Releases now: whether the store still had the lease, or the call to Redis that will
    /// tell, to be run to its end; false if it was released before, once that release's call
    /// ended.
    pub fn release(&self) -> Releasing<impl Future<Output = CoreResult<bool>> + Send + 'static> {
        match self.leases.release(&self.record) {
            Some(Releasing::Done(released)) => Releasing::Done(released),
            Some(Releasing::Call(call)) => Releasing::Call(Either::Left(call)),
            // Released by whoever came first (a revoke, a stream's end): its call may be under way.
            None => Releasing::Call(Either::Right(self.leases.release_under_way(&self.record))),
        }
    }

    /// Starts the release without waiting for it; true if this call released the lease.
    pub fn release_nowait(&self) -> bool {
        self.leases.release_in_background(&self.record)
    }

    /// When the store drops the lease unless renewed, in `monotonic_ms`: its group's deadline,
    /// `NEVER` where the store never drops leases (the embedded stores); None once released or
    /// lost.
    pub fn deadline_ms(&self) -> Option<u64> {
        self.leases.deadline_of(&self.record)
    }

    /// Calls `watcher` once the lease is lost; never if it is released first.
    pub fn when_lost(&self, watcher: LostWatcher) {
        self.record.when_lost(watcher);
    }
}

impl Drop for HeldLease {
    fn drop(&mut self) {
        self.leases.release_in_background(&self.record);
    }
}
