//! What the leases report for monitoring: the events counted so far, and a snapshot of them with
//! the figures of the moment (`Leases::counters`).

use std::sync::atomic::{AtomicU64, Ordering};

/// Events counted since the manager started.
#[derive(Default)]
pub(super) struct EventCounts {
    /// Leases found lost, and taken back.
    pub lost: AtomicU64,
    pub reclaimed: AtomicU64,
    /// Leases revoked by an operator or a drain.
    pub revoked: AtomicU64,
    /// Members removed from Redis because this holder held no lease of theirs.
    pub pruned: AtomicU64,
    /// Renewal calls that failed.
    pub renew_failures: AtomicU64,
    /// Leases given up on release (see `Counters::unreleasable`).
    pub unreleasable: AtomicU64,
}

/// Adds `n` to an event's count.
pub(super) fn add(count: &AtomicU64, n: u64) {
    count.fetch_add(n, Ordering::Relaxed);
}

/// Reads an event's count.
pub(super) fn read(count: &AtomicU64) -> u64 {
    count.load(Ordering::Relaxed)
}

/// Counters for monitoring.
#[derive(Debug, Clone, Copy)]
pub struct Counters {
    /// Leases waiting for another release try.
    pub unremoved: usize,
    /// Members removed from Redis because this holder held no lease of theirs.
    pub pruned: u64,
    /// Leases this process holds.
    pub held: usize,
    /// Leases found lost, and taken back, so far.
    pub lost: u64,
    pub reclaimed: u64,
    /// Leases revoked by an operator (`revoke`) so far.
    pub revoked: u64,
    /// Renewal calls that failed.
    pub renew_failures: u64,
    /// Leases given up on release: Redis answered that removing them met an error (a key of
    /// another type among their pools), which a retry would meet again.
    pub unreleasable: u64,
    /// Hash tags the holder is in (`joined`).
    pub tags: usize,
    pub closed: bool,
}
