//! What the caller holds for a granted lease: its record, kept alive by the renewal loop until
//! released. Dropped without a release (never released, garbage collected), it frees its slot.

use std::future::Future;
use std::sync::Arc;

use super::Leases;
use crate::errors::CoreResult;
use crate::lease::LeaseRecord;

pub struct LeaseHandle {
    record: Arc<LeaseRecord>,
    leases: Arc<Leases>,
}

impl LeaseHandle {
    pub(super) fn new(record: Arc<LeaseRecord>, leases: Arc<Leases>) -> Self {
        LeaseHandle { record, leases }
    }

    pub fn record(&self) -> &LeaseRecord {
        &self.record
    }

    /// Releases now; the future resolves to whether the store still had the lease (false if it
    /// was released before). Dropping the future does not stop the release.
    pub fn release(&self) -> impl Future<Output = CoreResult<bool>> + Send + 'static {
        let release = self.leases.release(&self.record);
        async move {
            match release {
                Some(release) => release.await,
                None => Ok(false),
            }
        }
    }

    /// Starts the release without waiting for it; true if this call released the lease.
    pub fn release_nowait(&self) -> bool {
        self.leases.release_in_background(&self.record)
    }

    /// Resolves once the lease is lost; never if it is released first.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let record = Arc::clone(&self.record);
        async move { record.lost().await }
    }
}

impl Drop for LeaseHandle {
    fn drop(&mut self) {
        self.leases.release_in_background(&self.record);
    }
}
