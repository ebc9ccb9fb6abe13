//! One stream's meter: its ledger (`ledger.rs`, the arithmetic) under a lock, and the wake-ups
//! around it: the top-up loop's when the stream becomes due, the stream's own when a top-up
//! answers or the lease ends (`ready`).

use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use super::ledger::Ledger;
use super::{Account, BudgetRequest, Usage};
use crate::errors::CoreError;
use crate::lease::Store;
use crate::rate::{Adjustment, AnswerKeys, TopUp, ToppedUp};
use crate::sync::lock;

#[derive(Debug)]
pub struct Meter {
    pub store: Store,
    /// Where the stream's answer sizes are learned, if it names a model.
    pub answers: Option<AnswerKeys>,
    ledger: Mutex<Ledger>,
    /// Woken when a top-up answers or the meter ends.
    changed: Notify,
    /// The top-up loop's wake-up.
    due: Arc<Notify>,
}

impl Meter {
    /// `room`: what the stream's budgets have left after its reservation (the least of them).
    pub(super) fn new(
        store: Store,
        accounts: Vec<Account>,
        request: &BudgetRequest,
        room: u64,
        due: Arc<Notify>,
    ) -> Self {
        Meter {
            store,
            answers: request.answers.clone(),
            ledger: Mutex::new(Ledger::new(accounts, request, room)),
            changed: Notify::new(),
            due,
        }
    }

    /// The stream started: from now on its tokens count (a grant dropped before it is held
    /// gives its whole reservation back).
    pub fn hold(&self) {
        lock(&self.ledger).hold();
    }

    /// Counts `tokens` of the answer streamed (no I/O: a top-up it makes due goes out with the
    /// next round). See `Ledger::consume`.
    pub fn consume(&self, tokens: u64) -> Result<(), CoreError> {
        if lock(&self.ledger).consume(tokens)? {
            self.due.notify_one();
        }
        Ok(())
    }

    /// See `Ledger::report`.
    pub fn report(&self, usage: Usage) -> Result<(), CoreError> {
        lock(&self.ledger).report(usage)
    }

    /// See `Ledger::used`.
    pub fn used(&self) -> (u64, u64) {
        lock(&self.ledger).used()
    }

    /// See `Ledger::references`.
    pub fn references(&self) -> ((u64, u64), u64) {
        lock(&self.ledger).references()
    }

    /// Under `on_budget="cut"`: the stream streamed past its reservation and no top-up is left.
    /// Units of the budget counted at `key` the stream holds and has not streamed.
    pub fn unstreamed(&self, key: &str) -> u64 {
        lock(&self.ledger).unstreamed(key)
    }

    pub fn is_exhausted(&self) -> bool {
        lock(&self.ledger).is_exhausted()
    }

    /// See `Ledger::exhausted_error`.
    pub fn exhausted_error(&self) -> CoreError {
        lock(&self.ledger).exhausted_error()
    }

    /// See `Ledger::is_waiting`.
    pub fn is_waiting(&self) -> bool {
        lock(&self.ledger).is_waiting()
    }

    /// Resolves once the stream need not wait for a top-up (see `is_waiting`).
    pub async fn ready(&self) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if !self.is_waiting() {
                return;
            }
            changed.await;
        }
    }

    /// The stream's top-up for a round at `now_ms`, if it needs one (`Ledger::take_due`).
    pub(super) fn take_due(&self, now_ms: u64) -> Option<TopUp> {
        lock(&self.ledger).take_due(now_ms)
    }

    /// A top-up's answer (`Ledger::topped_up`): the refunds that give it back if the stream
    /// was settled meanwhile.
    pub(super) fn topped_up(&self, want: u64, answer: &ToppedUp, call: (u64, u64)) -> Vec<Adjustment> {
        let (refunds, due_again) = {
            let mut ledger = lock(&self.ledger);
            let refunds = ledger.topped_up(want, answer, call);
            (refunds, ledger.is_due())
        };
        if due_again {
            self.due.notify_one(); // flagged again while this one was under way
        }
        self.changed.notify_waiters();
        refunds
    }

    /// A top-up whose call failed (`Ledger::top_up_failed`).
    pub(super) fn top_up_failed(&self, want: u64, fail_open: bool) {
        if lock(&self.ledger).top_up_failed(want, fail_open) {
            self.due.notify_one();
        }
        self.changed.notify_waiters();
    }

    /// Ends the meter (once): the adjustments that settle each budget to what the stream used
    /// (`Ledger::end`) and the size of its answer (`Ledger::answer`), or None if it had ended
    /// already.
    pub(super) fn end(&self) -> Option<(Vec<Adjustment>, Option<u64>)> {
        let ended = {
            let mut ledger = lock(&self.ledger);
            let answer = ledger.answer();
            ledger.end().map(|adjustments| (adjustments, answer))
        };
        self.changed.notify_waiters();
        ended
    }
}
