//! Releasing leases: marked released at once (no cancellation can undo it), then removed from
//! their store, at once on the embedded store, or by a call to Redis that runs to its end
//! (batched with those in flight, `release_calls.rs`). Their budgets are settled with them; a
//! failed call leaves them to the retry list.

use std::future::Future;
use std::sync::Arc;

use futures_util::{future, FutureExt};
use tokio_util::task::TaskTracker;

use super::release_calls::ReleaseCalls;
use super::{counters, Leases};
use crate::backend::{batches, Stores};
use crate::budget::SettlementCall;
use crate::errors::CoreResult;
use crate::group_commit::GroupCommit;
use crate::keys::LineKeys;
use crate::lease::{LeaseRecord, Store};
use crate::runtime;
use crate::sync::lock;

/// Release script calls in flight at once when releasing many leases (each up to 1,000).
const RELEASE_CALLS_IN_FLIGHT: usize = 4;

/// What a release leaves to do once the lease is marked released.
pub enum Releasing<F> {
    /// Nothing: the store answered at once (the embedded store); whether it still had the lease.
    Done(CoreResult<bool>),
    /// The call to Redis, to run to its end whoever waits for it; resolves like `Done`.
    Call(F),
}

/// The releases through Redis under way.
pub(super) struct Releases {
    /// Releases in flight, so `close()` can wait for them.
    pub tracker: TaskTracker,
    /// Releases from Redis, those that come while one is in flight sent together.
    calls: Arc<GroupCommit<ReleaseCalls>>,
}

impl Releases {
    pub fn new(stores: &Arc<Stores>, line: Option<LineKeys>) -> Self {
        Releases {
            tracker: TaskTracker::new(),
            calls: Arc::new(GroupCommit::new(ReleaseCalls {
                stores: Arc::clone(stores),
                line,
            })),
        }
    }
}

impl Leases {
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
        self.held_times.released(record);
        let settlement = self.budgets.settle(record);
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
            debug_assert!(settlement.is_none(), "the embedded store settles at once");
            return Some(Releasing::Done(self.after_release(record, released)));
        }
        // Tracked, so that closing the manager waits for it.
        let release = Arc::clone(self).release_task(Arc::clone(record), settlement);
        Some(Releasing::Call(self.releases.tracker.track_future(release)))
    }

    /// A release through Redis, as its task runs it: the call (batched), then `after_release`,
    /// and beside it the budgets' settlement; it resolves once both are done (`usage()` then
    /// tells the settlement). Only what this path awaits is in it (the embedded store's call in the same
    /// block made every release's task 4 KB).
    pub(crate) async fn release_task(
        self: Arc<Self>,
        record: Arc<LeaseRecord>,
        settlement: Option<SettlementCall>,
    ) -> CoreResult<bool> {
        let release = self
            .releases
            .calls
            .submit(Arc::clone(&record))
            .map(|released| self.after_release(&record, released));
        match settlement {
            Some(settlement) => future::join(release, settlement).await.0,
            None => release.await,
        }
    }

    /// What follows a release's call (`released`: the call's answer for this lease, see
    /// `answered`): waiters woken.
    fn after_release(
        &self,
        record: &Arc<LeaseRecord>,
        released: CoreResult<CoreResult<bool>>,
    ) -> CoreResult<bool> {
        self.answered(record, released.as_ref().ok());
        self.wake();
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
                counters::add(&self.counts.unreleasable, 1);
                self.flight_end(record, true);
            }
            None => self.retry_later([Arc::clone(record)]),
        }
    }

    /// A lease released already, by whoever came first (a revoke, a stream's end), whose call
    /// to Redis may still be under way: resolves to false (this call released nothing) once
    /// that call ended, or after `redis_timeout` at most, so that whoever awaits a release
    /// finds the store as the release left it.
    pub fn release_under_way(
        self: &Arc<Self>,
        record: &Arc<LeaseRecord>,
    ) -> impl Future<Output = CoreResult<bool>> + Send + 'static {
        let leases = Arc::clone(self);
        let record = Arc::clone(record);
        // Subscribed before the first look, so no release's end slips between the two.
        let mut freed = self.subscribe();
        async move {
            let ended = async {
                while record.store == Store::Main
                    && lock(&leases.held)
                        .tallies
                        .is_in_flight(&record.holders, &record.id)
                {
                    if freed.changed().await.is_err() {
                        return;
                    }
                }
            };
            let _ = tokio::time::timeout(leases.redis_timeout, ended).await;
            Ok(false)
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
    pub(super) async fn release_all(&self, leases: &[Arc<LeaseRecord>]) -> CoreResult<u64> {
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
}
