//! This process's side of the waiting line. Waiters line up here by the ticket the shared line
//! gave them; only the earliest one talks to Redis (when woken by a release, at a periodic check,
//! and to keep all of this process's waiters alive in the shared line with one write). The others
//! sleep until their turn, so the Redis work of waiting grows with releases and processes, not
//! with the number of waiters.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// How often the earliest waiter checks again without a wake-up (a lost one costs at most this).
pub const RECHECK_WAITING: Duration = Duration::from_secs(1);
/// Waiters of a process that has not refreshed them for this long (it died) leave the shared line.
pub const WAITER_TTL: Duration = Duration::from_secs(3);

#[derive(Default)]
pub struct LocalLine {
    /// ticket -> fired when its waiter becomes the earliest
    waiters: Mutex<BTreeMap<u64, Arc<Notify>>>,
    /// Every waiter of this process, from its first call until it stops waiting (including one
    /// whose first call is still in flight, so the heartbeat never takes it out of line).
    present: Mutex<HashSet<String>>,
    last_heartbeat: Mutex<Option<Instant>>,
}

/// A waiter of this process, until dropped.
pub struct Present<'a> {
    line: &'a LocalLine,
    id: String,
}

impl Drop for Present<'_> {
    fn drop(&mut self) {
        self.line.present().remove(&self.id);
    }
}

impl LocalLine {
    fn waiters(&self) -> MutexGuard<'_, BTreeMap<u64, Arc<Notify>>> {
        self.waiters.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn present(&self) -> MutexGuard<'_, HashSet<String>> {
        self.present.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts a waiter as this process's until the returned guard is dropped.
    pub fn arrive(&self, id: &str) -> Present<'_> {
        self.present().insert(id.to_owned());
        Present {
            line: self,
            id: id.to_owned(),
        }
    }

    /// Lines up a waiter by its ticket; the returned `Notify` fires when it becomes the earliest.
    pub fn join(&self, ticket: u64) -> Arc<Notify> {
        let turn = Arc::new(Notify::new());
        self.waiters().insert(ticket, Arc::clone(&turn));
        turn
    }

    pub fn is_first(&self, ticket: u64) -> bool {
        self.waiters().keys().next() == Some(&ticket)
    }

    pub fn len(&self) -> usize {
        self.waiters().len()
    }

    /// Every waiter of this process.
    pub fn ids(&self) -> Vec<String> {
        self.present().iter().cloned().collect()
    }

    /// Removes a waiter; if it was the earliest, the next one's turn comes.
    pub fn leave(&self, ticket: u64) {
        let mut waiters = self.waiters();
        let was_first = waiters.keys().next() == Some(&ticket);
        waiters.remove(&ticket);
        if was_first {
            if let Some(next) = waiters.values().next() {
                next.notify_one();
            }
        }
    }

    /// True at most once per `RECHECK_WAITING`: time to refresh every local waiter's liveness.
    pub fn heartbeat_due(&self) -> bool {
        let mut last = self.last_heartbeat.lock().unwrap_or_else(PoisonError::into_inner);
        let due = last.is_none_or(|at| at.elapsed() >= RECHECK_WAITING);
        if due {
            *last = Some(Instant::now());
        }
        due
    }
}

/// Leaves the local line however the waiter's acquire ends.
pub struct LocalTurn<'a> {
    pub line: &'a LocalLine,
    pub ticket: u64,
    pub turn: Arc<Notify>,
}

impl Drop for LocalTurn<'_> {
    fn drop(&mut self) {
        self.line.leave(self.ticket);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lowest_ticket_has_the_turn_and_passes_it_on() {
        let line = LocalLine::default();
        let arrivals: Vec<_> = ["a", "b", "c"].iter().map(|id| line.arrive(id)).collect();
        line.join(7);
        line.join(3); // an earlier ticket that answered later
        line.join(9);
        assert!(line.is_first(3) && !line.is_first(7));
        line.leave(7); // a later waiter leaving changes nobody's turn
        assert!(line.is_first(3));
        line.leave(3);
        assert!(line.is_first(9));
        assert_eq!(
            line.ids().len(),
            3,
            "waiters stay present until they stop waiting"
        );
        drop(arrivals);
        assert!(line.ids().is_empty());
        assert!(line.heartbeat_due() && !line.heartbeat_due());
    }
}
