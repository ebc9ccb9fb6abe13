//! Token budgets of LLM streams (docs/design.md, "Token budgets"): rate policies counted in
//! tokens. A stream reserves an estimate at admission (in the acquire's atomic step), counts
//! what it streams here (`Meter::consume`, no I/O), has its reservation topped up ahead of need
//! and its streamed tokens moved into the bucket of the time they streamed by one loop per
//! manager that sends the top-ups of every stream of the process together (`round.rs`), and is
//! settled when its lease is released: what it holds and did not stream is given back to the
//! buckets it was taken from, and what it streamed since the last round is charged then.

mod account;
mod ledger;
mod meter;
mod round;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use self::account::{Account, Charge};
pub use self::meter::Meter;
use crate::backend::Stores;
use crate::config::FailureMode;
use crate::lease::{LeaseId, LeaseRecord, Store};
use crate::rate::{answer_sizes, Adjustment, AnswerKeys, AnswerSample, RatePolicy, Settlement};
pub use crate::rate::{Price, Usage};
use crate::runtime;
use crate::sync::lock;

/// Tokens a top-up reserves ahead of what a stream has streamed; a stream asks for one when
/// less than half of this is left, and may run this far past its reservation while the top-up
/// is on its way (see `ledger.rs`).
pub const TOP_UP: u64 = 256;

/// Top-up rounds at most this often: a few Redis calls per second per process, whatever the
/// number of streams, tokens or chunks.
pub const TOP_UP_EVERY: Duration = Duration::from_millis(250);

/// Failed calls (settlements and give-backs) kept for another try at most. Beyond it, one that
/// only gives back is dropped first (the tokens stay charged, which never admits too much); one
/// that charges is dropped only when nothing else can go, and counted
/// (`Stats::settlements_dropped`).
const MAX_RETRIES: usize = 10_000;

/// Answer tokens `reserve="auto"` reserves when the request gives no `max_tokens` and its model
/// has no learned size yet (`rate::answer_sizes`): LiteLLM's estimate for the same case, so a
/// stream moved behind this library reserves what it did.
pub const AUTO_ANSWER: u64 = 1_024;

/// What a stream that runs out of budget mid-stream does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnBudget {
    /// Ends with `BudgetExhausted` at its next item (the default: a budget is a limit).
    #[default]
    Cut,
    /// Finishes; its tokens are charged even above the limit, so the next request waits.
    Finish,
}

impl OnBudget {
    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "cut" => Ok(OnBudget::Cut),
            "finish" => Ok(OnBudget::Finish),
            other => Err(format!(
                "unknown on_budget {other:?}: use \"cut\" (the default: end the stream with BudgetExhausted) or \"finish\" (let it finish and charge the overage)"
            )),
        }
    }
}

/// What an acquire asks of its budgets (the policies are checked with its rate limits).
#[derive(Debug, Clone, Default)]
pub struct BudgetRequest {
    pub policies: Vec<RatePolicy>,
    /// The estimate reserved at admission: the prompt's tokens, the answer's.
    pub input: u64,
    pub output: u64,
    pub on_budget: OnBudget,
    /// The model's price, for the cost budgets (`unit="cost"`).
    pub price: Option<Price>,
    /// The model the request names (`model=`): its settlement counts the answer's size there.
    pub model: Option<String>,
    /// `reserve="auto"` without `max_tokens`: the most answer tokens the budgets hold after the
    /// prompt. The manager sizes the answer from the model's learned size, at most this
    /// (`output` holds `AUTO_ANSWER` within it until then).
    pub learned_within: Option<u64>,
    /// Where the stream's answer sizes are learned, in the tag of the first budget's counter
    /// (set by the manager from `model` and the identity).
    pub answers: Option<AnswerKeys>,
}

/// The streams with budgets this process holds, and the loop that tops them up.
pub struct Budgets {
    stores: Arc<Stores>,
    failure_mode: FailureMode,
    /// Open meters by lease id (settled ones leave).
    meters: Mutex<HashMap<LeaseId, Arc<Meter>>>,
    /// Wakes the top-up loop: a meter that needs a top-up, the first meter to open, a failed
    /// settlement.
    due: Arc<Notify>,
    /// Adjustments whose call failed (settlements and give-backs), tried again every round.
    retries: Mutex<Vec<Retry>>,
    dropped: AtomicU64,
    /// Budget calls under way that an ended stream's accounts wait for: settlements and
    /// give-backs (first tries and a round's retries), and top-ups (a stream may end while one
    /// is in flight; its answer is then given back).
    calls: TaskTracker,
    stop: CancellationToken,
    round_loop: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Budgets {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Budgets {
    pub fn new(stores: Arc<Stores>, failure_mode: FailureMode) -> Self {
        Budgets {
            stores,
            failure_mode,
            meters: Mutex::new(HashMap::new()),
            due: Arc::new(Notify::new()),
            retries: Mutex::new(Vec::new()),
            dropped: AtomicU64::new(0),
            calls: TaskTracker::new(),
            stop: CancellationToken::new(),
            round_loop: Mutex::new(None),
        }
    }

    /// A meter for a granted stream: `accounts` hold what the acquire reserved (the request's
    /// estimate), `room` what the budgets have left after it (the least of them).
    pub fn open(
        self: &Arc<Self>,
        record: &LeaseRecord,
        accounts: Vec<Account>,
        request: &BudgetRequest,
        room: u64,
    ) -> Arc<Meter> {
        let due = Arc::clone(&self.due);
        let meter = Arc::new(Meter::new(record.store, accounts, request, room, due));
        let first = {
            let mut meters = lock(&self.meters);
            meters.insert(record.id, Arc::clone(&meter));
            meters.len() == 1
        };
        if first {
            self.due.notify_one(); // the loop sleeps while no stream is open: its rounds resume
        }
        let mut round_loop = lock(&self.round_loop);
        if round_loop.is_none() && !self.stop.is_cancelled() {
            *round_loop = Some(round::start(self));
        }
        meter
    }

    /// Units of the budget counted at `key` that this process's streams hold and have not
    /// streamed: what their settlements give back if they end now.
    pub fn unstreamed(&self, key: &str) -> u64 {
        let meters: Vec<Arc<Meter>> = lock(&self.meters).values().cloned().collect();
        meters.iter().map(|meter| meter.unstreamed(key)).sum()
    }

    /// Settles the meter of a released lease: charges what it used beyond its reservation and
    /// gives back the rest: the embedded store on the spot, Redis by the returned call, which
    /// the release runs beside its own, or which is spawned; a failed call is retried later.
    pub fn settle(self: &Arc<Self>, record: &LeaseRecord) -> Option<SettlementCall> {
        let meter = lock(&self.meters).remove(&record.id)?;
        let (adjustments, answer) = meter.end()?;
        // A lost lease's stream (expired, revoked, drained) was cut short: its size is no
        // answer's.
        let answer = answer
            .filter(|_| !record.is_lost())
            .zip(meter.answers.clone())
            .map(|(tokens, keys)| AnswerSample {
                keys,
                bucket: answer_sizes::bucket_of(tokens),
            });
        if adjustments.is_empty() && answer.is_none() {
            return None;
        }
        let settlement = Settlement {
            id: record.id.to_string(),
            adjustments,
            answer,
        };
        self.apply(meter.store, settlement)
    }

    /// Gives back what a grant nobody took charged its request-rate policies (`refunds`; its
    /// budgets' reservation comes back with its release's settlement), applied at most once
    /// like a settlement.
    pub fn give_back(self: &Arc<Self>, record: &LeaseRecord, refunds: Vec<Adjustment>) {
        if !refunds.is_empty() {
            if let Some(call) = self.apply(record.store, Settlement::untaken(record.id.as_str(), refunds)) {
                runtime::handle().spawn(call);
            }
        }
    }

    /// Applies adjustments (a settlement or a give-back): on the embedded store at once, on
    /// Redis by the returned call, which the caller must run (a failed call is tried again
    /// later); `close` waits for it.
    fn apply(self: &Arc<Self>, store: Store, settlement: Settlement) -> Option<SettlementCall> {
        if self.stores.get(store).is_embedded() {
            let settled = futures_util::FutureExt::now_or_never(self.stores.get(store).settle(&settlement));
            debug_assert!(settled.is_some(), "the memory backend never waits");
            return None;
        }
        let budgets = Arc::clone(self);
        Some(Box::pin(self.calls.track_future(async move {
            budgets.send_adjustments(store, settlement).await;
        })))
    }

    async fn send_adjustments(&self, store: Store, settlement: Settlement) {
        let sent = self
            .stores
            .call(store, |backend| backend.settle(&settlement))
            .await;
        if sent.is_err() {
            let dropped = queue_retry(&mut lock(&self.retries), (store, settlement), MAX_RETRIES);
            if dropped.is_some_and(|(_, dropped)| !gives_back_only(&dropped)) {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
            self.due.notify_one(); // the next round tries it again
        }
    }

    /// Stops the loop and waits (up to `wait`) for the budget calls under way.
    pub async fn close(&self, wait: Duration) {
        self.stop.cancel();
        let round_loop = lock(&self.round_loop).take();
        if let Some(round_loop) = round_loop {
            let _ = round_loop.await;
        }
        self.calls.close();
        let _ = tokio::time::timeout(wait, self.calls.wait()).await;
        // The last try: what still fails is lost with this process, and counted.
        let retries = std::mem::take(&mut *lock(&self.retries));
        for (store, settlement) in retries {
            let _ = tokio::time::timeout(wait, self.send_adjustments(store, settlement)).await;
        }
        let lost = std::mem::take(&mut *lock(&self.retries));
        self.dropped.fetch_add(lost.len() as u64, Ordering::Relaxed);
    }

    /// Streams with budgets open now, settlements not applied yet (calls under way, top-ups
    /// included, and settlements waiting for another try: 0 means every ended stream is
    /// settled), and settlements dropped (the queue full, or still failing when the manager
    /// closed).
    pub fn counts(&self) -> (usize, usize, u64) {
        (
            lock(&self.meters).len(),
            lock(&self.retries).len() + self.calls.len(),
            self.dropped.load(Ordering::Relaxed),
        )
    }
}

/// A settlement's call to Redis, to be run to its end.
pub type SettlementCall = futures_util::future::BoxFuture<'static, ()>;

/// Adjustments whose call failed, and the store they are for.
type Retry = (Store, Settlement);

/// Whether the adjustments only give back (none charges).
fn gives_back_only(settlement: &Settlement) -> bool {
    settlement.adjustments.iter().all(|a| a.refund_from.is_some())
}

/// Queues `retry` for another try, keeping at most `max`: beyond, one that only gives back is
/// dropped first (`retry` itself if nothing queued only gives back), one that charges only when
/// nothing else can go. Returns the one dropped.
fn queue_retry(retries: &mut Vec<Retry>, retry: Retry, max: usize) -> Option<Retry> {
    if retries.len() < max {
        retries.push(retry);
        return None;
    }
    let dropped = match retries.iter().position(|(_, queued)| gives_back_only(queued)) {
        Some(at) => retries.swap_remove(at),
        None if gives_back_only(&retry.1) => return Some(retry),
        None => retries.swap_remove(0),
    };
    retries.push(retry);
    Some(dropped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rate::{Algorithm, Bucket, Unit};

    /// Adjustments named `id` that give back, or charge.
    fn retry(id: &str, gives_back: bool) -> Retry {
        let policy =
            RatePolicy::new("budget", 1_000, 60_000, Algorithm::SlidingWindow, Unit::Tokens).unwrap();
        let adjustment = Adjustment {
            key: "key".into(),
            policy,
            tokens: 5,
            refund_from: gives_back.then_some(Bucket { slot: 1, epoch: 1 }),
        };
        let settlement = Settlement {
            id: id.into(),
            adjustments: vec![adjustment],
            answer: None,
        };
        (Store::Main, settlement)
    }

    fn ids(retries: &[Retry]) -> Vec<&str> {
        let mut ids: Vec<&str> = retries.iter().map(|(_, s)| s.id.as_str()).collect();
        ids.sort_unstable();
        ids
    }

    #[test]
    fn failed_calls_are_kept_for_another_try_up_to_the_bound() {
        let mut retries = Vec::new();
        assert!(queue_retry(&mut retries, retry("a", false), 2).is_none());
        assert!(queue_retry(&mut retries, retry("b", true), 2).is_none());
        assert_eq!(ids(&retries), ["a", "b"]);
    }

    #[test]
    fn a_full_queue_drops_a_give_back_before_a_charge() {
        let mut retries = vec![retry("charge", false), retry("give back", true)];
        let dropped = queue_retry(&mut retries, retry("new charge", false), 2).unwrap();
        assert_eq!(dropped.1.id, "give back");
        assert_eq!(ids(&retries), ["charge", "new charge"]);
        let dropped = queue_retry(&mut retries, retry("new give back", true), 2).unwrap();
        assert_eq!(dropped.1.id, "new give back", "nothing queued only gives back");
        assert_eq!(ids(&retries), ["charge", "new charge"]);
    }

    #[test]
    fn a_full_queue_of_charges_drops_a_charge_only_for_another() {
        let mut retries = vec![retry("a", false), retry("b", false)];
        let dropped = queue_retry(&mut retries, retry("c", false), 2).unwrap();
        assert!(!gives_back_only(&dropped.1), "counted as a settlement dropped");
        assert_eq!(retries.len(), 2);
        assert!(ids(&retries).contains(&"c"));
    }
}
