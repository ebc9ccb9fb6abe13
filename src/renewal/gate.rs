//! Whether the manager admits, and the wake-ups of its waiters: a drain or a close shuts the
//! gate (waiting acquires end on it, no new lease is held), and every slot that may have freed
//! (a release here, or one published anywhere) wakes this process's waiters.

use tokio::sync::watch;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use super::Leases;

pub(super) struct Gate {
    /// Cancelled when the manager stops admitting.
    closed: CancellationToken,
    /// Bumped whenever a slot may have freed.
    freed: watch::Sender<u64>,
}

impl Default for Gate {
    fn default() -> Self {
        Gate {
            closed: CancellationToken::new(),
            freed: watch::Sender::new(0),
        }
    }
}

impl Leases {
    pub fn is_closed(&self) -> bool {
        self.gate.closed.is_cancelled()
    }

    /// Resolves once the manager stops admitting.
    pub fn closing(&self) -> WaitForCancellationFuture<'_> {
        self.gate.closed.cancelled()
    }

    /// Refuses to hold any new lease (the manager is closed).
    pub fn refuse_new(&self) {
        self.gate.closed.cancel();
    }

    /// Wakes this process's waiters: a slot may have freed.
    pub fn wake(&self) {
        self.gate.freed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Changes whenever a slot may have freed.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.gate.freed.subscribe()
    }
}
