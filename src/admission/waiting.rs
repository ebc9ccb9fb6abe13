//! This process's side of the waiting line. Waiters line up here by the ticket the shared line
//! gave them; only the earliest one talks to Redis (when woken by a release, at a periodic check,
//! and to keep all of this process's waiters alive in the shared line with one write). The others
//! sleep until their turn, so the Redis work of waiting grows with releases and processes, not
//! with the number of waiters.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::backend::Stores;
use crate::fifo::Fifo;
use crate::keys::LineKeys;
use crate::renewal::Leases;
use crate::runtime;
use crate::sync::lock;

/// How often the earliest waiter checks again without a wake-up (a lost one costs at most this).
pub const RECHECK_WAITING: Duration = Duration::from_secs(1);
/// Waiters of a process that has not refreshed them for this long (it died) leave the shared line.
pub const WAITER_TTL: Duration = Duration::from_secs(3);

/// A waiter's place here: its ticket in the shared line, then its arrival here (tickets can
/// repeat: the shared counter starts again when its key is lost).
type Place = (u64, u64);

#[derive(Default)]
pub struct LocalLine {
    /// Fired when its waiter becomes the earliest.
    turns: Mutex<Fifo<Place, Arc<Notify>>>,
    arrivals: AtomicU64,
    /// Every waiter of this process, from its first call until it stops waiting (including one
    /// whose first call is still in flight, so the heartbeat never takes it out of line).
    present: Mutex<HashSet<String>>,
    last_heartbeat: Mutex<Option<Instant>>,
    /// The task that turns wake-ups published by any process into local ones (started once).
    listener: Mutex<Option<JoinHandle<()>>>,
}

/// A waiter of this process, until dropped.
pub struct Present<'a> {
    line: &'a LocalLine,
    id: String,
}

impl Drop for Present<'_> {
    fn drop(&mut self) {
        lock(&self.line.present).remove(&self.id);
    }
}

/// A waiter's place in this process's line; it leaves however the waiter's acquire ends.
pub struct LocalTurn<'a> {
    line: &'a LocalLine,
    place: Place,
    pub turn: Arc<Notify>,
}

impl LocalTurn<'_> {
    /// Its ticket in the shared line.
    pub fn ticket(&self) -> u64 {
        self.place.0
    }

    pub fn is_first(&self) -> bool {
        lock(&self.line.turns).first().map(|(first, _)| first) == Some(self.place)
    }
}

impl Drop for LocalTurn<'_> {
    fn drop(&mut self) {
        self.line.leave(self.place);
    }
}

impl LocalLine {
    /// Counts a waiter as this process's until the returned guard is dropped.
    pub fn arrive(&self, id: &str) -> Present<'_> {
        lock(&self.present).insert(id.to_owned());
        Present {
            line: self,
            id: id.to_owned(),
        }
    }

    /// Lines up a waiter by its ticket in the shared line; its turn comes when it is the earliest.
    pub fn join(&self, ticket: u64) -> LocalTurn<'_> {
        let turn = Arc::new(Notify::new());
        let place = (ticket, self.arrivals.fetch_add(1, Ordering::Relaxed));
        lock(&self.turns).insert(place, Arc::clone(&turn));
        LocalTurn {
            line: self,
            place,
            turn,
        }
    }

    pub fn len(&self) -> usize {
        lock(&self.turns).len()
    }

    /// Every waiter of this process.
    pub fn ids(&self) -> Vec<String> {
        lock(&self.present).iter().cloned().collect()
    }

    /// Removes a waiter; if it was the earliest, the next one's turn comes.
    fn leave(&self, place: Place) {
        let mut turns = lock(&self.turns);
        let was_first = turns.first().map(|(first, _)| first) == Some(place);
        turns.remove(place);
        if was_first {
            if let Some((_, next)) = turns.first() {
                next.notify_one();
            }
        }
    }

    /// True at most once per `RECHECK_WAITING`: time to refresh every local waiter's liveness.
    pub fn heartbeat_due(&self) -> bool {
        let mut last = lock(&self.last_heartbeat);
        let due = last.is_none_or(|at| at.elapsed() >= RECHECK_WAITING);
        if due {
            *last = Some(Instant::now());
        }
        due
    }

    /// Starts (once) the task that wakes this process's waiters for every release published by
    /// any process, until `stop`.
    pub fn listen(
        &self,
        stores: &Arc<Stores>,
        leases: &Arc<Leases>,
        line: &LineKeys,
        stop: &CancellationToken,
    ) {
        let mut listener = lock(&self.listener);
        if listener.is_some() {
            return;
        }
        let (stores, leases, line, stop) =
            (Arc::clone(stores), Arc::clone(leases), line.clone(), stop.clone());
        *listener = Some(runtime::handle().spawn(async move {
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = stores.main().listen(&line, || leases.wake()) => {}
                }
                // The subscription broke (Redis restarted, a failover): subscribe again soon.
                tokio::time::sleep(RECHECK_WAITING).await;
            }
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lowest_ticket_has_the_turn_and_passes_it_on() {
        let line = LocalLine::default();
        let arrivals: Vec<_> = ["a", "b", "c"].iter().map(|id| line.arrive(id)).collect();
        let seven = line.join(7);
        let three = line.join(3); // an earlier ticket that answered later
        let nine = line.join(9);
        assert!(three.is_first() && !seven.is_first());
        drop(seven); // a later waiter leaving changes nobody's turn
        assert!(three.is_first());
        drop(three);
        assert!(nine.is_first());
        assert_eq!(
            line.ids().len(),
            3,
            "waiters stay present until they stop waiting"
        );
        drop(arrivals);
        assert!(line.ids().is_empty());
        assert!(line.heartbeat_due() && !line.heartbeat_due());
    }

    #[test]
    fn a_repeated_ticket_strands_nobody() {
        // The shared ticket counter started again (its key expired or was lost in a failover).
        let line = LocalLine::default();
        let first = line.join(4);
        let again = line.join(4);
        assert_eq!(line.len(), 2, "both waiters keep their place");
        drop(first);
        assert!(again.is_first(), "the second one's turn comes");
    }
}
