//! This process's side of the waiting lines. Each pool has its own line, and a waiter here
//! knows its place in the line of each of its pools (as Redis gave it); it talks to Redis (when
//! woken by a release, at a periodic check, and to keep all of this process's waiters alive in
//! the shared line with one write) only while no waiter here stands before it in one of those
//! lines, or once the heartbeat says its place went to another user's waiter. The others sleep
//! until their turn, so the Redis work of waiting grows with releases, processes and pools, not
//! with the number of waiters.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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

/// A new waiter's id: in the order waiters arrive (the wall clock's ms, then this process's
/// count), then random. Equal places in a line go by id, so they go by arrival, across
/// processes as far as their clocks agree.
pub fn waiter_id() -> String {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64);
    let count = COUNT.fetch_add(1, Ordering::Relaxed) & 0xff_ffff;
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!("{ms:012x}{count:06x}{}", &random[..14])
}

/// A waiter's place here: its ticket in the shared line, then its arrival here (tickets can
/// repeat: the shared counter starts again when its key is lost).
type Place = (u64, u64);

/// One waiter here: what wakes it, its id, its place in the line of each of its pools (pool
/// key, place), and whether its place went to another user's waiter (it calls to learn why).
struct Waiting {
    turn: Arc<Notify>,
    id: String,
    places: Vec<(String, u64)>,
    displaced: Arc<AtomicBool>,
}

impl Waiting {
    fn shares_a_pool_with(&self, other: &Waiting) -> bool {
        self.places.iter().any(|(pool, _)| other.place_in(pool).is_some())
    }

    fn place_in(&self, pool: &str) -> Option<u64> {
        self.places
            .iter()
            .find(|(key, _)| key == pool)
            .map(|(_, place)| *place)
    }

    /// Whether it stands before `other` in a line they share (as Redis orders them: by place,
    /// then by id).
    fn stands_before(&self, other: &Waiting) -> bool {
        other.places.iter().any(|(pool, place)| {
            self.place_in(pool)
                .is_some_and(|mine| (mine, &self.id) < (*place, &other.id))
        })
    }
}

#[derive(Default)]
pub struct LocalLine {
    /// Fired when no earlier waiter waits for one of its pools any more.
    turns: Mutex<Fifo<Place, Waiting>>,
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
    displaced: Arc<AtomicBool>,
}

impl LocalTurn<'_> {
    /// Its ticket in the shared line.
    pub fn ticket(&self) -> u64 {
        self.place.0
    }

    /// Whether it asks Redis now: no waiter here stands before it in one of its lines, or its
    /// place went to another user's waiter (the answer says so).
    pub fn has_turn(&self) -> bool {
        if self.displaced.load(Ordering::Relaxed) {
            return true;
        }
        let turns = lock(&self.line.turns);
        let Some(me) = turns.get(self.place) else {
            return true;
        };
        let first = !turns.before(None).any(|other| other.stands_before(me));
        first
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

    /// Lines up a waiter (`id`) with its place in the line of each of its pools; its turn comes
    /// when no waiter here stands before it in one of them.
    pub fn join(&self, ticket: u64, places: Vec<(String, u64)>, id: &str) -> LocalTurn<'_> {
        let turn = Arc::new(Notify::new());
        let displaced = Arc::new(AtomicBool::new(false));
        let place = (ticket, self.arrivals.fetch_add(1, Ordering::Relaxed));
        let waiting = Waiting {
            turn: Arc::clone(&turn),
            id: id.to_owned(),
            places,
            displaced: Arc::clone(&displaced),
        };
        lock(&self.turns).insert(place, waiting);
        LocalTurn {
            line: self,
            place,
            turn,
            displaced,
        }
    }

    /// Wakes the waiters among `ids` whose places went to other users' waiters (a heartbeat
    /// said so): each calls at once, and is told. Returns whether any of them waits here.
    pub fn displace(&self, ids: &[String]) -> bool {
        let turns = lock(&self.turns);
        let mut any = false;
        for waiting in turns.before(None).filter(|waiting| ids.contains(&waiting.id)) {
            waiting.displaced.store(true, Ordering::Relaxed);
            waiting.turn.notify_one();
            any = true;
        }
        any
    }

    pub fn len(&self) -> usize {
        lock(&self.turns).len()
    }

    /// Every waiter of this process.
    pub fn ids(&self) -> Vec<String> {
        lock(&self.present).iter().cloned().collect()
    }

    /// Removes a waiter; the later ones that wait for one of its pools look again whether
    /// their turn came.
    fn leave(&self, place: Place) {
        let mut turns = lock(&self.turns);
        let Some(left) = turns.remove(place) else {
            return;
        };
        for other in turns.before(None) {
            if other.shares_a_pool_with(&left) {
                other.turn.notify_one();
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
                    _ = stores.main().listen(&line, Box::new(|| leases.wake())) => {}
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
        let db = |place: u64| vec![("db".to_owned(), place)];
        let seven = line.join(7, db(7), "a");
        let three = line.join(3, db(3), "b"); // an earlier place that answered later
        let nine = line.join(9, db(9), "c");
        assert!(three.has_turn() && !seven.has_turn());
        drop(seven); // a later waiter leaving changes nobody's turn
        assert!(three.has_turn());
        drop(three);
        assert!(nine.has_turn());
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
    fn each_pool_has_its_own_turn() {
        let line = LocalLine::default();
        let places =
            |names: &[&str], place: u64| names.iter().map(|n| ((*n).to_owned(), place)).collect::<Vec<_>>();
        let db = line.join(1, places(&["db"], 1), "a");
        let fs = line.join(2, places(&["fs"], 2), "b");
        let both = line.join(3, places(&["db", "fs"], 3), "c");
        assert!(
            db.has_turn() && fs.has_turn(),
            "a waiter for fs never waits behind one for db"
        );
        assert!(!both.has_turn());
        drop(db);
        assert!(!both.has_turn(), "fs's earlier waiter is still there");
        drop(fs);
        assert!(both.has_turn());
    }

    #[test]
    fn places_differ_from_line_to_line() {
        // Fair order: bob's first waiter is before alice's second in db's line.
        let line = LocalLine::default();
        let alice_2 = line.join(2, vec![("db".to_owned(), 2)], "a2");
        let bob_1 = line.join(3, vec![("db".to_owned(), 1)], "b1");
        assert!(bob_1.has_turn() && !alice_2.has_turn());
        let same_place = line.join(4, vec![("db".to_owned(), 1)], "a0");
        assert!(same_place.has_turn(), "equal places go by id, as in Redis");
    }

    #[test]
    fn a_displaced_waiter_calls_at_once() {
        let line = LocalLine::default();
        let first = line.join(1, vec![("db".to_owned(), 1)], "a");
        let later = line.join(2, vec![("db".to_owned(), 2)], "b");
        assert!(!later.has_turn());
        assert!(
            !line.displace(&["gone".to_owned()]),
            "a waiter that ended is not here"
        );
        assert!(line.displace(&["b".to_owned()]));
        assert!(later.has_turn(), "its call learns why it lost its place");
        assert!(first.has_turn());
    }

    #[test]
    fn a_repeated_ticket_strands_nobody() {
        // The shared ticket counter started again (its key expired or was lost in a failover).
        let line = LocalLine::default();
        let first = line.join(4, vec![("db".to_owned(), 4)], "a");
        let again = line.join(4, vec![("db".to_owned(), 4)], "b");
        assert_eq!(line.len(), 2, "both waiters keep their place");
        drop(first);
        assert!(again.has_turn(), "the second one's turn comes");
    }
}
