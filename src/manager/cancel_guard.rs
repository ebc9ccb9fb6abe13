//! The guard of an acquire in progress: however the acquire ends without an outcome (an error,
//! the wait running out, cancellation), it leaves the line and gives back what its calls may
//! have taken. Nothing is given back for calls that never left this process: there is nothing
//! to undo, and a dead server is not called.

use std::sync::Arc;

use super::Manager;
use crate::backend::Waiter;
use crate::lease::{LeaseRecord, Store};

pub struct CancelGuard<'a> {
    manager: &'a Arc<Manager>,
    record: &'a Arc<LeaseRecord>,
    waiter: Option<&'a Waiter>,
    /// A call was sent that may have run (its script may have granted or queued).
    sent: bool,
    /// The acquire has its outcome: nothing to undo.
    disarmed: bool,
}

impl<'a> CancelGuard<'a> {
    pub fn new(manager: &'a Arc<Manager>, record: &'a Arc<LeaseRecord>, waiter: Option<&'a Waiter>) -> Self {
        CancelGuard {
            manager,
            record,
            waiter,
            sent: false,
            disarmed: false,
        }
    }

    /// A call left this process: its script may have run.
    pub fn sent(&mut self) {
        self.sent = true;
    }

    /// The acquire has its outcome, which undoes whatever it must itself.
    pub fn disarm(&mut self) {
        self.disarmed = true;
    }
}

impl Drop for CancelGuard<'_> {
    fn drop(&mut self) {
        if self.disarmed {
            return;
        }
        if !self.sent {
            self.manager.leases.flight_end(self.record, false);
            return;
        }
        // Release is idempotent, so giving back a grant that did not happen costs nothing; the
        // acquire's flight becomes the release's.
        self.manager.leases.release_in_background(self.record);
        if let (Some(waiter), Some(line)) = (self.waiter, &self.manager.line) {
            let (stores, line, id) = (Arc::clone(&self.manager.stores), line.clone(), waiter.id.clone());
            crate::runtime::handle()
                .spawn(async move { stores.call(Store::Main, |main| main.leave(&line, &id)).await });
        }
    }
}
