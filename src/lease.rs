//! A lease as the core sees it: its id, the pools it takes a slot in, and its state, shared by
//! the caller's handle, the renewal loop and releases in flight.

use std::borrow::Borrow;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use crate::keys::{self, Pool, PoolRole};
use crate::sync::lock;

/// State bits: a lease can be lost (or revoked, which is lost by an operator's decision) and
/// later released; all stay visible.
const LOST: u8 = 1;
const RELEASED: u8 = 2;
const REVOKED: u8 = 4;

/// Told once a lease is lost (from whichever thread found it); dropped untold if the lease is
/// released first.
pub type LostWatcher = Box<dyn FnOnce() + Send>;

/// Milliseconds on this process's monotonic clock (deadlines never follow wall-clock jumps).
pub fn monotonic_ms() -> u64 {
    origin().elapsed().as_millis() as u64
}

/// Nanoseconds on the clock of [`monotonic_ms`], at least 1.
pub fn monotonic_nanos() -> u64 {
    (origin().elapsed().as_nanos() as u64).max(1)
}

/// Seconds on the clock of [`monotonic_ms`], to the nanosecond (to place its deadlines on
/// another clock).
pub fn monotonic_seconds() -> f64 {
    origin().elapsed().as_secs_f64()
}

fn origin() -> &'static Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    ORIGIN.get_or_init(Instant::now)
}

/// Where a lease lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Store {
    /// The manager's backend: Redis, or the embedded store.
    Main,
    /// This process's local floor, admitting while Redis is down (`failure_mode="open"`).
    Fallback,
}

/// A lease's id: a random UUID as 32 lowercase hex digits, kept inline (a `String` would be one
/// more allocation per held lease, and one more per map that holds it by id).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct LeaseId([u8; 32]);

impl LeaseId {
    pub fn random() -> Self {
        let mut hex = [0u8; 32];
        uuid::Uuid::new_v4().simple().encode_lower(&mut hex);
        LeaseId(hex)
    }

    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).expect("a lease id is ASCII hex")
    }

    /// The id `text` is, if it is one as `random` makes them (32 lowercase hex digits).
    pub fn parse(text: &str) -> Option<Self> {
        let hex: [u8; 32] = text.as_bytes().try_into().ok()?;
        hex.iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
            .then_some(LeaseId(hex))
    }
}

impl Deref for LeaseId {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

/// Hashed as its text, so maps keyed by `LeaseId` can be searched with a `&str`.
impl Hash for LeaseId {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl Borrow<str> for LeaseId {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl fmt::Debug for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

pub struct LeaseRecord {
    pub id: LeaseId,
    /// The pools this lease takes a slot in, the caller's own quota first (keys and capacities,
    /// to take it back if lost).
    pub pools: Vec<Pool>,
    /// The holders key of the pools' hash tag (they all share one); shared by the leases of a
    /// tag when the pools come from the manager's `KeySpace`.
    pub holders: Arc<str>,
    /// How many of the first pools are the caller's own quota (refuse at once, never wait).
    pub own_pools: usize,
    pub weight: u32,
    pub store: Store,
    state: AtomicU8,
    /// When revoked: the ms its user's new streams were banned for then (0: no ban), so the
    /// stream's end tells the same wait as the ban's refusals.
    revoked_ban_ms: AtomicU64,
    /// When its caller took it, in ns on the clock of `monotonic_nanos` (0: not timed, as
    /// without a metrics reader).
    taken_at_ns: AtomicU64,
    /// Waiting for the lease to be lost; emptied when it is lost or released.
    lost_watchers: Mutex<Vec<LostWatcher>>,
}

impl LeaseRecord {
    pub fn new(pools: Vec<Pool>, weight: u32, store: Store) -> Self {
        LeaseRecord {
            id: LeaseId::random(),
            holders: pools
                .first()
                .map_or_else(|| keys::holders_key("").into(), |pool| Arc::clone(&pool.holders)),
            own_pools: pools.iter().take_while(|p| p.role == PoolRole::Own).count(),
            pools,
            weight,
            store,
            state: AtomicU8::new(0),
            revoked_ban_ms: AtomicU64::new(0),
            taken_at_ns: AtomicU64::new(0),
            lost_watchers: Mutex::new(Vec::new()),
        }
    }

    /// The members this lease has in the store: `weight` in each of its pools.
    pub fn units(&self) -> u64 {
        u64::from(self.weight) * self.pools.len() as u64
    }

    /// What each of its members adds to its holder's sum of ids in Redis: the first 24 bits of
    /// the id (the scripts' prelude, `id_value`, computes the same).
    pub fn id_value(&self) -> u64 {
        u64::from_str_radix(&self.id[..6], 16).expect("a lease id is hex")
    }

    /// The `{hash tag}` all this lease's keys share (its Redis Cluster slot).
    pub fn hash_tag(&self) -> &str {
        keys::hash_tag(&self.holders)
    }

    /// Held -> lost; false if it was released (or already lost) meanwhile. `counted` runs once
    /// it is lost and before anyone waiting for that hears it, so a stream that ends by its loss
    /// finds it in the manager's counts.
    pub fn mark_lost(&self, counted: impl FnOnce()) -> bool {
        let lost = self
            .state
            .compare_exchange(0, LOST, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if lost {
            counted();
            self.tell_lost();
        }
        lost
    }

    /// Held -> revoked (and lost, so its stream ends the way a lost lease's does: a drain or an
    /// operator ended it, its user's new streams banned for `ban_ms`); false if it was
    /// released or lost meanwhile.
    pub fn mark_revoked(&self, ban_ms: u64) -> bool {
        self.revoked_ban_ms.fetch_max(ban_ms, Ordering::AcqRel);
        let revoked = self
            .state
            .compare_exchange(0, LOST | REVOKED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if revoked {
            self.tell_lost();
        }
        revoked
    }

    pub fn is_revoked(&self) -> bool {
        self.state.load(Ordering::Acquire) & REVOKED != 0
    }

    /// The ms its user's new streams were banned for when it was revoked (0: no ban).
    pub fn revoked_ban_ms(&self) -> u64 {
        self.revoked_ban_ms.load(Ordering::Acquire)
    }

    /// Held or lost -> released; true only for the one call that made the change.
    pub fn mark_released(&self) -> bool {
        let released = self.state.fetch_or(RELEASED, Ordering::AcqRel) & RELEASED == 0;
        if released {
            let never_told = std::mem::take(&mut *lock(&self.lost_watchers));
            drop(never_told); // outside the lock: a watcher dropped untold tells its loop
        }
        released
    }

    /// Its caller took it at `nanos` ([`monotonic_nanos`]).
    pub fn stamp_taken(&self, nanos: u64) {
        self.taken_at_ns.store(nanos, Ordering::Relaxed);
    }

    /// When its caller took it, if it was stamped.
    pub fn taken_at(&self) -> Option<u64> {
        match self.taken_at_ns.load(Ordering::Relaxed) {
            0 => None,
            nanos => Some(nanos),
        }
    }

    pub fn is_lost(&self) -> bool {
        self.state.load(Ordering::Acquire) & LOST != 0
    }

    pub fn is_released(&self) -> bool {
        self.state.load(Ordering::Acquire) & RELEASED != 0
    }

    /// Calls `watcher` once the lease is lost (now, if it is); never if it is released first.
    pub fn when_lost(&self, watcher: LostWatcher) {
        let mut watchers = lock(&self.lost_watchers);
        // Read under the lock that `tell_lost` takes after the state changed: either this sees
        // the change, or `tell_lost` sees the watcher.
        let state = self.state.load(Ordering::Acquire);
        if state & RELEASED != 0 {
            return;
        }
        if state & LOST == 0 {
            watchers.push(watcher);
            return;
        }
        drop(watchers);
        watcher();
    }

    /// Keeps `held` until the lease is lost or released, or its record dropped, whichever
    /// comes first: dropping `held` gives back what it holds for the lease (a slot of its
    /// process's slab). Kept with the lost watchers, which every end empties: no field of its
    /// own on every lease.
    pub fn keep_until_ended(&self, held: impl Send + 'static) {
        self.when_lost(Box::new(move || drop(held)));
    }

    fn tell_lost(&self) {
        let watchers = std::mem::take(&mut *lock(&self.lost_watchers));
        watchers.into_iter().for_each(|watcher| watcher());
    }
}
