//! The leases this process holds: holding them, keeping them alive (one loop per manager,
//! `keeper.rs`, running rounds, `round.rs`), finding those lost (`sweep.rs`) and releasing them.
//! Nothing here calls back into admission: it learns of slots that free through `subscribe()`.

mod held;
mod held_lease;
mod keeper;
mod release_calls;
mod revoke;
mod round;
mod sweep;
mod tally;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};
use tokio_util::task::TaskTracker;

use self::held::{Held, NEVER};
pub use self::held_lease::HeldLease;
use self::release_calls::ReleaseCalls;
use crate::backend::{batches, Stores};
use crate::budget::Budgets;
use crate::errors::{CoreError, CoreResult};
use crate::group_commit::GroupCommit;
use crate::keys::{self, LineKeys};
use crate::lease::{monotonic_ms, LeaseId, LeaseRecord, Store};
use crate::runtime;
use crate::sync::lock;

/// Release script calls in flight at once when releasing many leases (each up to 1,000).
const RELEASE_CALLS_IN_FLIGHT: usize = 4;

/// Leases kept for another release try at most; beyond, a lease is left to its holder's expiry
/// (or, while this process lives, to the reconciliation of its granted count).
const MAX_UNREMOVED: usize = 10_000;

/// What a release leaves to do once the lease is marked released.
pub enum Releasing<F> {
    /// Nothing: the store answered at once (the embedded store); whether it still had the lease.
    Done(CoreResult<bool>),
    /// The call to Redis, to run to its end whoever waits for it; resolves like `Done`.
    Call(F),
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

pub struct Leases {
    stores: Arc<Stores>,
    /// Settles the token budgets of the leases released here.
    budgets: Arc<Budgets>,
    /// Waiters to wake in every process when a release frees a slot (None: nobody waits).
    line: Option<LineKeys>,
    ttl_ms: u64,
    period: Duration,
    redis_timeout: Duration,
    held: Mutex<Held>,
    /// Leases to take out of the store again, by id: their release failed, or they were lost (a
    /// holder that comes back would otherwise keep their members alive). Retried every round,
    /// after the keep-alive; at most `MAX_UNREMOVED`.
    unremoved: Mutex<HashMap<LeaseId, Arc<LeaseRecord>>>,
    /// The process that runs the renewal loop (0: not started). A forked child's copies of the
    /// leases belong to it: the child never releases them.
    owner_pid: AtomicU32,
    /// Releases in flight, so `close()` can wait for them.
    releases: TaskTracker,
    /// Releases from Redis, those that come while one is in flight sent together.
    release_calls: Arc<GroupCommit<ReleaseCalls>>,
    /// The holders keys of the tags where this manager's holder was granted a lease in Redis,
    /// each with whether a renewal round found it idle (nothing held nor in flight there) with
    /// no grant there since: the holder stays in a tag between leases, leaves it at the next
    /// round that finds it idle again (`leave_idle_tags`), so this process keeps state for the
    /// tags it uses, not for every user it ever served, and leaves the rest on close (`depart`).
    joined: Mutex<HashMap<Arc<str>, bool>>,
    stop: CancellationToken,
    keeper: Mutex<Option<JoinHandle<()>>>,
    /// Cancelled when the manager stops admitting (a drain, a close): waiting acquires end on it.
    closed: CancellationToken,
    /// Bumped whenever a slot may have freed (a release here, or one published anywhere).
    freed: watch::Sender<u64>,
    lost: AtomicU64,
    reclaimed: AtomicU64,
    revoked: AtomicU64,
    /// The revocation stamp each group's keep-alive found last.
    seen_revocations: Mutex<revoke::Seen>,
    pruned: AtomicU64,
    renew_failures: AtomicU64,
    unreleasable: AtomicU64,
}

impl Drop for Leases {
    fn drop(&mut self) {
        self.stop.cancel();
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
    ) -> Self {
        let release_calls = Arc::new(GroupCommit::new(ReleaseCalls {
            stores: Arc::clone(&stores),
            line: line.clone(),
        }));
        Leases {
            stores,
            budgets,
            line,
            ttl_ms,
            period,
            redis_timeout,
            held: Mutex::new(Held::default()),
            unremoved: Mutex::new(HashMap::new()),
            owner_pid: AtomicU32::new(0),
            releases: TaskTracker::new(),
            release_calls,
            joined: Mutex::new(HashMap::new()),
            stop: CancellationToken::new(),
            keeper: Mutex::new(None),
            closed: CancellationToken::new(),
            freed: watch::Sender::new(0),
            lost: AtomicU64::new(0),
            reclaimed: AtomicU64::new(0),
            revoked: AtomicU64::new(0),
            seen_revocations: Mutex::default(),
            pruned: AtomicU64::new(0),
            renew_failures: AtomicU64::new(0),
            unreleasable: AtomicU64::new(0),
        }
    }

    /// Starts the renewal loop (once, by the process that uses the manager).
    pub fn start_keeper(self: &Arc<Self>) {
        self.owner_pid.store(runtime::process_id(), Ordering::Release);
        *lock(&self.keeper) = Some(keeper::start(self));
    }

    /// True in a process forked from the one that holds these leases.
    fn in_forked_child(&self) -> bool {
        let owner = self.owner_pid.load(Ordering::Acquire);
        owner != 0 && owner != runtime::process_id()
    }

    /// Keeps leases for another release try (each once, up to `MAX_UNREMOVED`; those beyond are
    /// left to the prune of extra members, or to their holder's expiry).
    /// Until removed, they are in flight: Redis may still count them.
    fn retry_later(&self, records: impl IntoIterator<Item = Arc<LeaseRecord>>) {
        let mut unremoved = lock(&self.unremoved);
        for record in records {
            if unremoved.len() >= MAX_UNREMOVED {
                self.flight_end(&record, true);
                continue;
            }
            self.flight_start(&record);
            unremoved.insert(record.id, record);
        }
    }

    /// An acquire of `record` is about to be sent: until `flight_end`, Redis may or may not
    /// count it (only the main store keeps counts).
    pub fn flight_start(&self, record: &LeaseRecord) {
        if record.store == Store::Main {
            lock(&self.held).tallies.flight_start(record, false);
        }
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
        let deadline_ms = if self.stores.get(record.store).is_embedded() {
            NEVER
        } else {
            deadline_ms
        };
        let overdue = held.insert(Arc::clone(&record), deadline_ms, holder_was_alive, monotonic_ms());
        if record.store == Store::Main {
            let mut joined = lock(&self.joined);
            match joined.get_mut(&*record.holders) {
                Some(idle) => *idle = false,
                None => drop(joined.insert(Arc::clone(&record.holders), false)),
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

    pub fn is_closed(&self) -> bool {
        self.closed.is_cancelled()
    }

    /// Resolves once the manager stops admitting.
    pub fn closing(&self) -> WaitForCancellationFuture<'_> {
        self.closed.cancelled()
    }

    /// Marks the lease released and stops renewing it, before returning, so no cancellation
    /// can undo it; then removes it from its store: at once on the embedded store, or by the
    /// returned call to Redis, which the caller must run to its end (`release_in_background`,
    /// or as the task of whoever awaits it: one task, not one that waits for another). None if
    /// it was already released.
    pub fn release(
        self: &Arc<Self>,
        record: &Arc<LeaseRecord>,
    ) -> Option<Releasing<impl Future<Output = CoreResult<bool>> + Send + 'static>> {
        if self.in_forked_child() || !record.mark_released() {
            return None;
        }
        let settled = self.budgets.settle(record);
        {
            let mut held = lock(&self.held);
            let was_held = held.remove(record);
            if record.store == Store::Main {
                held.tallies.flight_start(record, was_held);
            }
        }
        if self.stores.get(record.store).is_embedded() {
            // The embedded store never waits: done now.
            let line = match record.store {
                Store::Main => self.line.as_ref(),
                Store::Fallback => None,
            };
            let released = self
                .stores
                .call(record.store, |store| {
                    store.release(std::slice::from_ref(record), line)
                })
                .now_or_never()
                .expect("the memory backend never waits")
                .map(|answers| answers.into_iter().next().unwrap_or(Ok(false)));
            let done = self.after_release(record, released, settled).now_or_never();
            return Some(Releasing::Done(done.expect("the memory backend never waits")));
        }
        // Tracked, so that closing the manager waits for it.
        let release = Arc::clone(self).release_task(Arc::clone(record), settled);
        Some(Releasing::Call(self.releases.track_future(release)))
    }

    /// A release through Redis, as its task runs it: the call (batched), then `after_release`.
    /// Only what this path awaits is in it (the embedded store's call in the same block made
    /// every release's task 4 KB).
    pub(crate) async fn release_task(
        self: Arc<Self>,
        record: Arc<LeaseRecord>,
        settled: Option<JoinHandle<()>>,
    ) -> CoreResult<bool> {
        let released = self.release_calls.submit(Arc::clone(&record)).await;
        self.after_release(&record, released, settled).await
    }

    /// What follows a release's call (`released`: the call's answer for this lease, see
    /// `answered`): waiters woken, and its budgets settled too when the release resolves
    /// (usage() then tells it).
    async fn after_release(
        &self,
        record: &Arc<LeaseRecord>,
        released: CoreResult<CoreResult<bool>>,
        settled: Option<JoinHandle<()>>,
    ) -> CoreResult<bool> {
        self.answered(record, released.as_ref().ok());
        self.wake();
        if let Some(settled) = settled {
            let _ = settled.await;
        }
        released.and_then(|answer| answer)
    }

    /// Takes in what a release call said of one lease (None: the call failed): done, whether
    /// Redis still had it or not; kept for another try when the call failed; given up, and
    /// counted, when the call answered that removing this lease met an error (a key of another
    /// type among its pools): the script removed it from its other pools, and a retry would
    /// meet the same error every round.
    fn answered(&self, record: &Arc<LeaseRecord>, answer: Option<&CoreResult<bool>>) {
        match answer {
            Some(Ok(_)) => self.flight_end(record, true),
            Some(Err(_)) => {
                self.unreleasable.fetch_add(1, Ordering::Relaxed);
                self.flight_end(record, true);
            }
            None => self.retry_later([Arc::clone(record)]),
        }
    }

    /// Starts the release without waiting for it; true if this call released the lease.
    pub fn release_in_background(self: &Arc<Self>, record: &Arc<LeaseRecord>) -> bool {
        match self.release(record) {
            None => false,
            Some(Releasing::Done(_)) => true,
            Some(Releasing::Call(call)) => {
                runtime::handle().spawn(call);
                true
            }
        }
    }

    /// Releases many leases, in batched script calls, a few in flight; the leases of a call that
    /// fails are kept for another try (see `answered`).
    async fn release_all(&self, leases: &[Arc<LeaseRecord>]) -> CoreResult<u64> {
        let mut releases = Vec::new();
        for store in [Store::Fallback, Store::Main] {
            let one_slot = self.stores.get(store).is_cluster();
            let mut of_store: Vec<_> = leases.iter().filter(|l| l.store == store).cloned().collect();
            if one_slot {
                // Each batch stays within one slot.
                of_store.sort_unstable_by(|a, b| a.hash_tag().cmp(b.hash_tag()));
            }
            let line = if store == Store::Main {
                self.line.as_ref()
            } else {
                None
            };
            let batches: Vec<Vec<_>> = batches(&of_store, one_slot)
                .into_iter()
                .map(<[_]>::to_vec)
                .collect();
            releases.extend(batches.into_iter().map(move |batch| async move {
                let released = self
                    .stores
                    .call(store, |backend| backend.release(&batch, line))
                    .await;
                match &released {
                    Ok(answers) => {
                        for (record, answer) in batch.iter().zip(answers) {
                            self.answered(record, Some(answer));
                        }
                    }
                    Err(_) => self.retry_later(batch),
                }
                released
                    .map(|answers| answers.iter().filter(|answer| matches!(answer, Ok(true))).count() as u64)
            }));
        }
        // Closing a manager that holds 100,000 leases makes a hundred calls.
        let released = runtime::a_few_at_a_time(releases, RELEASE_CALLS_IN_FLIGHT).await;
        released.into_iter().sum()
    }

    /// Stops renewal and releases every lease held; the returned future finishes the work
    /// (waiting for the loop, the releases and those already in flight).
    pub fn close(self: &Arc<Self>) -> impl Future<Output = CoreResult<()>> + Send + 'static {
        self.refuse_new();
        self.stop.cancel();
        let keeper = lock(&self.keeper).take();
        let held: Vec<Arc<LeaseRecord>> = lock(&self.held)
            .drain()
            .into_iter()
            .filter(|record| record.mark_released())
            .collect();
        for record in &held {
            // `Budgets::close` waits for these.
            drop(self.budgets.settle(record));
        }
        let leases = Arc::clone(self);
        async move {
            if let Some(keeper) = keeper {
                let _ = keeper.await;
            }
            let released = leases.release_all(&held).await;
            leases.releases.close();
            let _ = tokio::time::timeout(leases.redis_timeout, leases.releases.wait()).await;
            leases.depart().await;
            released.map(drop)
        }
    }

    /// Leaves every tag this manager joined where it holds nothing now.
    async fn depart(&self) {
        let joined = lock(&self.joined).drain().map(|(holders, _)| holders).collect();
        self.depart_from(joined).await;
    }

    /// At a renewal round: leaves the tags found idle (nothing held nor in flight there) at the
    /// last round too, with no grant there since, and marks those idle now. A lease that comes
    /// meanwhile is safe: `depart.lua` leaves no tag where the holder has members, and an
    /// acquire after it registers the holder again (and joins the tag again here).
    pub(super) async fn leave_idle_tags(&self) {
        let idle = {
            let held = lock(&self.held);
            let mut joined = lock(&self.joined);
            let mut idle = Vec::new();
            joined.retain(|holders, was_idle| {
                if !held.is_idle(Store::Main, holders) {
                    *was_idle = false;
                    return true;
                }
                if *was_idle {
                    idle.push(Arc::clone(holders));
                    return false;
                }
                *was_idle = true;
                true
            });
            idle
        };
        if !idle.is_empty() {
            self.depart_from(idle).await;
        }
    }

    /// Leaves the tags of `holders_keys` where the holder holds nothing now (a failure leaves
    /// its entry to expire and the reaper). Not from a forked child: the tags are its parent's.
    async fn depart_from(&self, holders_keys: Vec<Arc<str>>) {
        if self.in_forked_child() {
            return;
        }
        let mut joined: Vec<String> = holders_keys.iter().map(|holders| holders.to_string()).collect();
        let one_slot = self.stores.get(Store::Main).is_cluster();
        joined.sort_unstable_by(|a, b| keys::hash_tag(a).cmp(keys::hash_tag(b)));
        let groups: Vec<&[String]> = if one_slot {
            joined
                .chunk_by(|a, b| keys::hash_tag(a) == keys::hash_tag(b))
                .collect()
        } else {
            joined.chunks(1000).collect()
        };
        for group in groups {
            let _ = self.stores.call(Store::Main, |main| main.depart(group)).await;
        }
    }

    /// Ends every lease held the way a lost one ends (its stream gets `LeaseRevoked`); their
    /// releases, by their streams or by `close()`, free their slots. Returns how many.
    pub fn revoke_held(&self) -> usize {
        let held = lock(&self.held).all();
        let revoked = held.iter().filter(|record| record.mark_revoked()).count();
        self.revoked.fetch_add(revoked as u64, Ordering::Relaxed);
        revoked
    }

    /// Slots this process holds per pool name (for metrics; walks every lease held).
    pub fn slots_by_name(&self) -> Vec<(String, u64)> {
        lock(&self.held).slots_by_name()
    }

    /// Slots this process holds in a pool (both stores).
    pub fn slots_in(&self, pool_key: &str) -> u64 {
        lock(&self.held).slots_in(pool_key)
    }

    /// Refuses to hold any new lease (the manager is closed).
    pub fn refuse_new(&self) {
        self.closed.cancel();
    }

    /// Wakes this process's waiters: a slot may have freed.
    pub fn wake(&self) {
        self.freed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Changes whenever a slot may have freed.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.freed.subscribe()
    }

    pub fn counters(&self) -> Counters {
        Counters {
            unremoved: lock(&self.unremoved).len(),
            pruned: self.pruned.load(Ordering::Relaxed),
            held: lock(&self.held).len(),
            lost: self.lost.load(Ordering::Relaxed),
            reclaimed: self.reclaimed.load(Ordering::Relaxed),
            revoked: self.revoked.load(Ordering::Relaxed),
            renew_failures: self.renew_failures.load(Ordering::Relaxed),
            unreleasable: self.unreleasable.load(Ordering::Relaxed),
            tags: lock(&self.joined).len(),
            closed: self.is_closed(),
        }
    }
}
