//! How long leases were held, for a metrics reader: once a reader is attached (`start`), each
//! lease its caller takes is counted and stamped, and its held time is kept at its release
//! until the reader collects (`take`). Off, it costs a lease one relaxed load.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use crate::lease::{monotonic_nanos, LeaseRecord};
use crate::sync::lock;

/// Held times kept between two collections, at most (a reader that never collects costs at
/// most 4 bytes for each, 8 MB in all); beyond, they are counted in `HeldTimes::dropped`.
pub const MAX_KEPT: usize = 2_000_000;

#[derive(Default)]
pub struct HeldTimes {
    on: AtomicBool,
    /// Leases taken by their callers since `start`.
    taken: AtomicU64,
    /// Seconds each lease released since the last `take` was held (f32: a histogram's bucket
    /// needs far fewer than its 7 digits).
    kept: Mutex<Vec<f32>>,
    dropped: AtomicU64,
}

/// What a reader collects: leases taken so far, and the held times kept since its last
/// collection.
pub struct Collected {
    pub taken: u64,
    pub held_seconds: Vec<f32>,
    pub dropped: u64,
}

impl HeldTimes {
    /// From now on, leases are counted and timed.
    pub fn start(&self) {
        self.on.store(true, Ordering::Relaxed);
    }

    /// Its caller took `record`.
    pub fn taken(&self, record: &LeaseRecord) {
        if self.on.load(Ordering::Relaxed) {
            record.stamp_taken(monotonic_nanos());
            self.taken.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// `record` was released (once): its held time is kept if it was stamped when taken.
    pub fn released(&self, record: &LeaseRecord) {
        let Some(taken_at) = record.taken_at() else {
            return;
        };
        let seconds = monotonic_nanos().saturating_sub(taken_at) as f64 / 1e9;
        let mut kept = lock(&self.kept);
        if kept.len() < MAX_KEPT {
            kept.push(seconds as f32);
        } else {
            drop(kept);
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The count, and the held times kept since the last call (taken out).
    pub fn take(&self) -> Collected {
        let held_seconds = std::mem::take(&mut *lock(&self.kept));
        Collected {
            taken: self.taken.load(Ordering::Relaxed),
            held_seconds,
            dropped: self.dropped.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::Store;

    #[test]
    fn off_it_neither_counts_nor_keeps() {
        let times = HeldTimes::default();
        let record = LeaseRecord::new(Vec::new(), 1, Store::Main);
        times.taken(&record);
        times.released(&record);
        let collected = times.take();
        assert_eq!((collected.taken, collected.held_seconds.len()), (0, 0));
    }

    #[test]
    fn on_it_counts_each_lease_taken_and_keeps_each_held_time_until_taken_out() {
        let times = HeldTimes::default();
        times.start();
        let records: Vec<_> = (0..3)
            .map(|_| LeaseRecord::new(Vec::new(), 1, Store::Main))
            .collect();
        for record in &records {
            times.taken(record);
        }
        times.released(&records[0]);
        times.released(&records[1]);
        let first = times.take();
        assert_eq!((first.taken, first.held_seconds.len()), (3, 2));
        assert!(first.held_seconds.iter().all(|s| *s >= 0.0));
        times.released(&records[2]);
        let second = times.take();
        assert_eq!(
            (second.taken, second.held_seconds.len(), second.dropped),
            (3, 1, 0)
        );
    }

    #[test]
    fn past_its_bound_a_held_time_is_counted_as_dropped_not_kept() {
        let times = HeldTimes::default();
        times.start();
        let record = LeaseRecord::new(Vec::new(), 1, Store::Main);
        record.stamp_taken(monotonic_nanos());
        for _ in 0..MAX_KEPT + 2 {
            times.released(&record);
        }
        let collected = times.take();
        assert_eq!((collected.held_seconds.len(), collected.dropped), (MAX_KEPT, 2));
        times.released(&record);
        assert_eq!(times.take().held_seconds.len(), 1, "room again once collected");
    }
}
