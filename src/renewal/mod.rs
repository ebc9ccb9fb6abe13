//! The leases this process holds: holding them (`held.rs`), keeping them alive (one loop per
//! manager, `keeper.rs`, running rounds, `round.rs`), finding those lost (`sweep.rs`) or revoked
//! (`revoke.rs`), and releasing them (`release.rs`, failures kept on `retry_list.rs`). `Leases`
//! is made of those parts; nothing here calls back into the manager: it learns of slots that
//! free through `subscribe()` (`gate.rs`).

mod counters;
mod gate;
mod held;
mod held_lease;
mod held_times;
mod joined_tags;
mod keeper;
mod release;
mod release_calls;
mod retry_list;
mod revoke;
mod round;
mod sweep;
mod tally;

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use self::counters::Counters;
use self::counters::EventCounts;
use self::gate::Gate;
use self::held::Held;
pub use self::held::NEVER;
pub use self::held_lease::HeldLease;
pub use self::held_times::Collected;
use self::held_times::HeldTimes;
use self::joined_tags::JoinedTags;
use self::keeper::Keeper;
use self::release::Releases;
pub use self::release::Releasing;
use self::retry_list::RetryList;
use crate::backend::Stores;
use crate::budget::Budgets;
use crate::errors::{CoreError, CoreResult};
use crate::keys::LineKeys;
use crate::lease::{monotonic_ms, LeaseRecord, Store};
use crate::runtime;
use crate::sync::lock;

pub struct Leases {
    stores: Arc<Stores>,
    /// Settles the token budgets of the leases released here.
    budgets: Arc<Budgets>,
    /// Waiters to wake in every process when a release frees a slot (None: nobody waits).
    line: Option<LineKeys>,
    ttl_ms: u64,
    period: Duration,
    redis_timeout: Duration,
    /// The leases held, by group kept alive together.
    held: Mutex<Held>,
    /// Leases to take out of the store again.
    retries: RetryList,
    /// Releases through Redis under way.
    releases: Releases,
    /// The tags where the holder was granted leases.
    joined: JoinedTags,
    /// The renewal loop.
    keeper: Keeper,
    /// Whether the manager admits, and the wake-ups of its waiters.
    gate: Gate,
    /// Where revokes are heard, and the revocation stamp each group's keep-alive found last.
    revocations: revoke::RevocationWatch,
    counts: EventCounts,
    /// How long leases were held, once a metrics reader asks.
    held_times: HeldTimes,
}

impl Drop for Leases {
    fn drop(&mut self) {
        self.keeper.stop.cancel();
    }
}

impl Leases {
    pub fn new(
        stores: Arc<Stores>,
        budgets: Arc<Budgets>,
        line: Option<LineKeys>,
        ttl_ms: u64,
        period: Duration,
        redis_timeout: Duration,
        revocations_channel: String,
    ) -> Self {
        Leases {
            releases: Releases::new(&stores, line.clone()),
            stores,
            budgets,
            line,
            ttl_ms,
            period,
            redis_timeout,
            held: Mutex::new(Held::default()),
            retries: RetryList::default(),
            joined: JoinedTags::default(),
            keeper: Keeper::default(),
            gate: Gate::default(),
            revocations: revoke::RevocationWatch::new(revocations_channel),
            counts: EventCounts::default(),
            held_times: HeldTimes::default(),
        }
    }

    /// An acquire of `record` is about to be sent: until `flight_end`, Redis may or may not
    /// count it (only the main store keeps counts).
    pub fn flight_start(&self, record: &LeaseRecord) {
        if record.store == Store::Main {
            lock(&self.held).tallies.flight_start(record, false);
        }
    }

    /// Until when the holder's entry in the tag of `record` lives as far as this process knows,
    /// if that is `at_least_ms` from now or later: what an acquire of `record` may trust
    /// (`GrantTerms::entry_known_until_ms`). Asked once its flight began: a tag is left only
    /// while nothing is in flight there, and then forgotten here first.
    pub fn entry_known_until(&self, record: &LeaseRecord, at_least_ms: u64) -> Option<u64> {
        if record.store != Store::Main {
            return None;
        }
        self.joined.entry_known_until(&record.holders, at_least_ms)
    }

    /// The calls of `record` are over: its outcome is known or given up; `counted` unless Redis
    /// certainly never had it (refused, never sent).
    pub fn flight_end(&self, record: &LeaseRecord, counted: bool) {
        if record.store == Store::Main {
            lock(&self.held).tallies.flight_end(record, counted);
        }
    }

    /// Holds a granted lease, which its store keeps at least until `deadline_ms` (the embedded
    /// stores never drop one); `holder_was_alive` says whether the grant found the holder's entry
    /// live (see `Held::insert`). Refused once the manager is closed.
    pub fn hold(
        self: &Arc<Self>,
        record: Arc<LeaseRecord>,
        deadline_ms: u64,
        holder_was_alive: bool,
    ) -> CoreResult<HeldLease> {
        let mut held = lock(&self.held);
        // Checked under the lock that close() drains, so no lease slips past a close.
        if self.is_closed() {
            return Err(CoreError::Closed);
        }
        let embedded = self.stores.get(record.store).is_embedded();
        let deadline_ms = if embedded { NEVER } else { deadline_ms };
        let overdue = held.insert(Arc::clone(&record), deadline_ms, holder_was_alive, monotonic_ms());
        if record.store == Store::Main {
            self.joined
                .join(&record.holders, if embedded { 0 } else { deadline_ms });
            if !embedded {
                self.hear_revocations();
            }
        }
        // Counted as held before it stops being in flight, so no figure in between misses it.
        if record.store == Store::Main {
            held.tallies.flight_end(&record, true);
        }
        drop(held);
        for lost in &overdue {
            self.lose(lost, true);
        }
        Ok(HeldLease::new(record, Arc::clone(self)))
    }

    /// Stops renewal and releases every lease held; the returned future finishes the work
    /// (waiting for the loop, the releases and those already in flight).
    pub fn close(self: &Arc<Self>) -> impl Future<Output = CoreResult<()>> + Send + 'static {
        self.refuse_new();
        self.keeper.stop.cancel();
        let keeper = lock(&self.keeper.task).take();
        let held: Vec<Arc<LeaseRecord>> = lock(&self.held)
            .drain()
            .into_iter()
            .filter(|record| record.mark_released())
            .collect();
        for record in &held {
            // `Budgets::close` waits for these.
            if let Some(settlement) = self.budgets.settle(record) {
                runtime::handle().spawn(settlement);
            }
        }
        let leases = Arc::clone(self);
        async move {
            if let Some(keeper) = keeper {
                let _ = keeper.await;
            }
            let released = leases.release_all(&held).await;
            leases.releases.tracker.close();
            let _ = tokio::time::timeout(leases.redis_timeout, leases.releases.tracker.wait()).await;
            leases.depart().await;
            released.map(drop)
        }
    }

    /// Ends every lease held the way a lost one ends (its stream gets `LeaseRevoked`); their
    /// releases, by their streams or by `close()`, free their slots. Returns how many.
    pub fn revoke_held(&self) -> usize {
        let held = lock(&self.held).all();
        let revoked = held.iter().filter(|record| record.mark_revoked(0)).count();
        counters::add(&self.counts.revoked, revoked as u64);
        revoked
    }

    /// Slots this process holds per pool name (for metrics; walks every lease held).
    pub fn slots_by_name(&self) -> Vec<(String, u64)> {
        lock(&self.held).slots_by_name()
    }

    /// The deadline (`monotonic_ms`) until which the store keeps `record`, if still held.
    pub fn deadline_of(&self, record: &LeaseRecord) -> Option<u64> {
        lock(&self.held).deadline_of(record)
    }

    /// Slots this process holds in a pool (both stores).
    pub fn slots_in(&self, pool_key: &str) -> u64 {
        lock(&self.held).slots_in(pool_key)
    }

    /// From now on, each lease its caller takes is counted, and its held time kept for
    /// `collect_held_times`.
    pub fn time_held(&self) {
        self.held_times.start();
    }

    /// Its caller took `record` (counted and stamped once `time_held` was asked).
    pub fn taken(&self, record: &LeaseRecord) {
        self.held_times.taken(record);
    }

    /// Leases taken so far, and how long each lease released since the last call was held.
    pub fn collect_held_times(&self) -> Collected {
        self.held_times.take()
    }

    pub fn counters(&self) -> Counters {
        Counters {
            unremoved: self.retries.len(),
            pruned: counters::read(&self.counts.pruned),
            held: lock(&self.held).len(),
            lost: counters::read(&self.counts.lost),
            reclaimed: counters::read(&self.counts.reclaimed),
            revoked: counters::read(&self.counts.revoked),
            renew_failures: counters::read(&self.counts.renew_failures),
            unreleasable: counters::read(&self.counts.unreleasable),
            tags: self.joined.len(),
            closed: self.is_closed(),
        }
    }
}
