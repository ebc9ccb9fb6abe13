//! One stream's budgets: what it reserved from each (and in which buckets), what it streamed,
//! and what it needs next. `consume()` only counts and, when less than half an increment of
//! the reservation is left, flags the meter for the next top-up round, which brings it one
//! increment ahead again. While its budgets have room to spare (`SLACK_ROOM`), a stream may run
//! up to one increment past its reservation while its top-up is on its way (the slack that lets
//! a fast stream go on without pausing); beyond that, or with little room left, it waits for
//! the answer (`ready`). So a top-up is needed every half increment at most, and a stream
//! overshoots by at most one increment and the chunk it is on (in practice, only a stream whose
//! top-up was on its way when the room ran out).

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use super::{BudgetRequest, OnBudget, TOP_UP};
use crate::errors::CoreError;
use crate::lease::Store;
use crate::rate::{Adjustment, Algorithm, Bucket, RatePolicy, TopUp, ToppedUp, Unit};
use crate::sync::lock;

/// Room its budgets must have left after a top-up for a stream to keep its slack.
const SLACK_ROOM: u64 = 4 * TOP_UP;

/// A roll goes out this long before the bucket of a stream's unused reservation may leave its
/// window (rounds come every `TOP_UP_EVERY`; the margin covers a slow call or two), or half a
/// window before for windows shorter than twice that.
const ROLL_AHEAD_MS: u64 = 2_000;

/// State bits.
const DUE: u8 = 1;
const IN_FLIGHT: u8 = 2;
const EXHAUSTED: u8 = 4;
const ENDED: u8 = 8;
const HELD: u8 = 16;

/// Tokens taken from one budget by one call, and when their bucket may leave the window.
#[derive(Debug, Clone, Copy)]
pub struct Charge {
    pub bucket: Bucket,
    pub tokens: u64,
    /// `monotonic_ms` from which the bucket may stop counting: the call's send plus the window
    /// for a sliding window (a slice counts for at least a window after it was written to);
    /// never for a fixed window, whose tokens go when it ends, all at once.
    pub leaves_ms: u64,
}

impl Charge {
    pub fn new(bucket: Bucket, tokens: u64, policy: &RatePolicy, sent_at: u64) -> Self {
        let leaves_ms = match policy.algorithm {
            Algorithm::SlidingWindow => sent_at + policy.window_ms,
            Algorithm::FixedWindow => u64::MAX,
        };
        Charge {
            bucket,
            tokens,
            leaves_ms,
        }
    }
}

/// One budget of a stream: its counter, and what was taken from it, bucket by bucket.
#[derive(Debug, Clone)]
pub struct Account {
    pub key: String,
    pub policy: RatePolicy,
    /// Oldest first.
    pub charges: Vec<Charge>,
}

impl Account {
    fn charged(&self) -> u64 {
        self.charges.iter().map(|charge| charge.tokens).sum()
    }

    /// When the first of the tokens not used yet (the account's first `used` count as used,
    /// oldest first) may stop counting; None if all are used.
    fn unused_leave_at(&self, used: u64) -> Option<u64> {
        let mut through = 0;
        for charge in &self.charges {
            through += charge.tokens;
            if through > used {
                return Some(charge.leaves_ms);
            }
        }
        None
    }

    /// Takes the newest `tokens` out of the charges; returns them, newest first.
    fn take_newest(&mut self, mut tokens: u64) -> Vec<Charge> {
        let mut taken = Vec::new();
        while tokens > 0 {
            let Some(last) = self.charges.last_mut() else {
                break;
            };
            let part = tokens.min(last.tokens);
            taken.push(Charge {
                tokens: part,
                ..*last
            });
            last.tokens -= part;
            tokens -= part;
            if last.tokens == 0 {
                self.charges.pop();
            }
        }
        taken
    }

    /// Whether top-ups take from it: it counts the answer's tokens.
    fn counts_output(&self) -> bool {
        matches!(self.policy.unit, Unit::Tokens | Unit::OutputTokens)
    }

    /// The adjustments that bring what was taken to `tokens`: a charge of the difference, or
    /// refunds from the newest buckets back.
    fn settle_to(&self, tokens: u64, adjustments: &mut Vec<Adjustment>) {
        let charged = self.charged();
        let adjustment = |tokens, refund_from| Adjustment {
            key: self.key.clone(),
            policy: self.policy.clone(),
            tokens,
            refund_from,
        };
        if tokens > charged {
            adjustments.push(adjustment(tokens - charged, None));
            return;
        }
        let mut excess = charged - tokens;
        for charge in self.charges.iter().rev() {
            if excess == 0 {
                break;
            }
            let back = excess.min(charge.tokens);
            adjustments.push(adjustment(back, Some(charge.bucket)));
            excess -= back;
        }
    }
}

/// The slack a stream gets while its budgets have `room` left.
fn slack_for(room: u64) -> u64 {
    if room >= SLACK_ROOM {
        TOP_UP
    } else {
        0
    }
}

#[derive(Debug)]
struct Ledger {
    accounts: Vec<Account>,
    /// Per output account, the charges a top-up under way gives back (a roll): out of
    /// `accounts` meanwhile, so a settlement never gives them back twice.
    rolling: Vec<Vec<Charge>>,
    /// The prompt's tokens as estimated at admission.
    input: u64,
    /// The answer's tokens as estimated at admission.
    output_estimate: u64,
    /// The figures the model reported at the end, replacing the estimate and the count.
    reported: Option<(u64, u64)>,
}

#[derive(Debug)]
pub struct Meter {
    pub store: Store,
    on_budget: OnBudget,
    /// Answer tokens streamed so far.
    output: AtomicU64,
    /// Answer tokens the reservation covers (`u64::MAX` when no budget counts them).
    covered: AtomicU64,
    /// How far past `covered` the stream may run while a top-up is on its way: `TOP_UP` while
    /// its budgets have `SLACK_ROOM` left, else 0.
    slack: AtomicU64,
    flags: AtomicU8,
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
        let covered = if accounts.iter().any(Account::counts_output) {
            request.output
        } else {
            u64::MAX
        };
        Meter {
            store,
            on_budget: request.on_budget,
            output: AtomicU64::new(0),
            covered: AtomicU64::new(covered),
            slack: AtomicU64::new(slack_for(room)),
            flags: AtomicU8::new(0),
            ledger: Mutex::new(Ledger {
                accounts,
                rolling: Vec::new(),
                input: request.input,
                output_estimate: request.output,
                reported: None,
            }),
            changed: Notify::new(),
            due,
        }
    }

    fn has(&self, flag: u8) -> bool {
        self.flags.load(Ordering::Acquire) & flag != 0
    }

    /// The stream started: from now on its tokens count (a grant dropped before it is held
    /// gives its whole reservation back).
    pub fn hold(&self) {
        self.flags.fetch_or(HELD, Ordering::AcqRel);
    }

    /// Counts `tokens` of the answer streamed. Refused after the lease's release, and, under
    /// `on_budget="cut"`, once the budget ran out (the stream ends before its next item).
    pub fn consume(&self, tokens: u64) -> Result<(), CoreError> {
        if self.has(ENDED) {
            return Err(CoreError::Misuse(
                "consume() after the lease was released: count a stream's tokens while it holds its lease (inside wrap() or the async with block)".into(),
            ));
        }
        if self.is_exhausted() {
            return Err(self.exhausted_error());
        }
        let output = self.output.fetch_add(tokens, Ordering::AcqRel) + tokens;
        if output.saturating_add(TOP_UP / 2) > self.covered.load(Ordering::Acquire)
            && self.flags.fetch_or(DUE, Ordering::AcqRel) & DUE == 0
        {
            self.due.notify_one();
        }
        Ok(())
    }

    /// The model's own figures for the whole stream (an OpenAI-style final `usage` chunk):
    /// they replace the estimate and the count at settlement.
    pub fn report(&self, input: u64, output: u64) -> Result<(), CoreError> {
        if self.has(ENDED) {
            return Err(CoreError::Misuse(
                "report_usage() after the lease was released: report the model's usage before the stream ends".into(),
            ));
        }
        lock(&self.ledger).reported = Some((input, output));
        Ok(())
    }

    /// Tokens used so far, as the settlement charges them: (prompt, answer), the prompt's as
    /// estimated and the answer's as counted, or the model's figures once reported, except that
    /// the answer is never charged less than was counted as streamed (those tokens went out;
    /// `Lease.report_usage` logs a report below the count).
    pub fn used(&self) -> (u64, u64) {
        let ledger = lock(&self.ledger);
        let counted = self.output.load(Ordering::Acquire);
        match ledger.reported {
            Some((input, output)) => (input, output.max(counted)),
            None => (ledger.input, counted),
        }
    }

    /// What a model's report is checked against: the estimates made at admission (prompt,
    /// answer) and the answer's tokens counted here, whatever was reported.
    pub fn references(&self) -> ((u64, u64), u64) {
        let ledger = lock(&self.ledger);
        (
            (ledger.input, ledger.output_estimate),
            self.output.load(Ordering::Acquire),
        )
    }

    /// Under `on_budget="cut"`: the stream streamed past its reservation and no top-up is left.
    pub fn is_exhausted(&self) -> bool {
        self.has(EXHAUSTED)
    }

    pub fn exhausted_error(&self) -> CoreError {
        let ledger = lock(&self.ledger);
        let policy = ledger
            .accounts
            .iter()
            .find(|account| account.counts_output())
            .map(|account| account.policy.clone());
        CoreError::BudgetExhausted(policy.map_or_else(String::new, |p| p.name.to_string()))
    }

    /// Streamed more than one increment past its reservation with a top-up due or under way:
    /// the stream should wait for its answer before its next item (that is what bounds the
    /// overshoot).
    pub fn is_waiting(&self) -> bool {
        let flags = self.flags.load(Ordering::Acquire);
        flags & ENDED == 0
            && flags & (DUE | IN_FLIGHT) != 0
            && self.output.load(Ordering::Acquire)
                > self
                    .covered
                    .load(Ordering::Acquire)
                    .saturating_add(self.slack.load(Ordering::Acquire))
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

    /// Takes the meter's due top-up for a round, if any: the tokens that restore one increment
    /// ahead (when flagged due), and a roll of the reservation not used yet when its bucket is
    /// about to leave the window (`now_ms + ROLL_AHEAD_MS`): given back there, wanted again now,
    /// so a stream that outlives the window stays counted in it.
    pub(super) fn take_due(&self, now_ms: u64) -> Option<TopUp> {
        let flags = self.flags.load(Ordering::Acquire);
        if flags & (IN_FLIGHT | ENDED) != 0 {
            return None;
        }
        let mut ledger = lock(&self.ledger);
        let (input, output) = (ledger.input, self.output.load(Ordering::Acquire));
        let rolls = ledger.accounts.iter().any(|account| {
            account.counts_output()
                && account
                    .unused_leave_at(account.policy.unit.of(input, output))
                    .is_some_and(|at| at <= now_ms + ROLL_AHEAD_MS.min(account.policy.window_ms / 2))
        });
        if flags & DUE == 0 && !rolls {
            return None;
        }
        // In one step, so `is_waiting` never sees neither flag in between.
        let _ = self.flags.fetch_update(Ordering::AcqRel, Ordering::Acquire, |f| {
            Some((f & !DUE) | IN_FLIGHT)
        });
        let covered = self.covered.load(Ordering::Acquire);
        let rolled = if rolls { covered.saturating_sub(output) } else { 0 };
        let need = (output + TOP_UP).saturating_sub(covered);
        let want = (rolled + if flags & DUE != 0 { need } else { 0 }).max(1);
        let (mut keys, mut policies, mut give_back, mut rolling) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for account in ledger.accounts.iter_mut().filter(|a| a.counts_output()) {
            let taken = account.take_newest(rolled);
            keys.push(account.key.clone());
            policies.push(account.policy.clone());
            give_back.push(taken.iter().map(|c| (c.bucket, c.tokens)).collect());
            rolling.push(taken);
        }
        ledger.rolling = rolling;
        drop(ledger);
        self.covered.fetch_sub(rolled, Ordering::AcqRel);
        Some(TopUp {
            keys,
            policies,
            give_back,
            want,
            forced: self.on_budget == OnBudget::Finish,
        })
    }

    /// A top-up's answer: `granted` of `want` tokens, taken from each budget that counts the
    /// answer in `buckets` (in account order), `room` left after it. Less than wanted means no
    /// budget is left. A meter settled meanwhile returns the refunds that give the top-up back.
    pub(super) fn topped_up(&self, want: u64, answer: &ToppedUp, sent_at: u64) -> Vec<Adjustment> {
        let (granted, buckets) = (answer.granted, &answer.buckets);
        self.slack.store(slack_for(answer.room), Ordering::Release);
        {
            let mut ledger = lock(&self.ledger);
            ledger.rolling.clear(); // given back
                                    // Checked under the ledger's lock, which `end()` takes after setting ENDED: a
                                    // top-up is either in the settlement or given back here.
            let ended = self.has(ENDED);
            let output_accounts = ledger.accounts.iter_mut().filter(|a| a.counts_output());
            let mut refunds = Vec::new();
            for (account, bucket) in output_accounts.zip(buckets) {
                let Some(bucket) = *bucket else { continue };
                if ended {
                    refunds.push(Adjustment {
                        key: account.key.clone(),
                        policy: account.policy.clone(),
                        tokens: granted,
                        refund_from: Some(bucket),
                    });
                } else {
                    let charge = Charge::new(bucket, granted, &account.policy, sent_at);
                    account.charges.push(charge);
                }
            }
            if ended {
                self.flags.fetch_and(!IN_FLIGHT, Ordering::AcqRel);
                return refunds;
            }
        }
        let covered = self.covered.fetch_add(granted, Ordering::AcqRel) + granted;
        if granted < want && self.on_budget == OnBudget::Cut && self.output.load(Ordering::Acquire) > covered
        {
            self.flags.fetch_or(EXHAUSTED, Ordering::AcqRel);
        }
        let flags = self.flags.fetch_and(!IN_FLIGHT, Ordering::AcqRel);
        if flags & DUE != 0 {
            self.due.notify_one(); // flagged again while this one was under way
        }
        self.changed.notify_waiters();
        Vec::new()
    }

    /// A top-up whose call failed: granted here without a charge (`fail_open`: the settlement
    /// charges it), or tried again next round (the stream waits only if it ran past its
    /// reservation).
    pub(super) fn top_up_failed(&self, want: u64, fail_open: bool) {
        // A roll that may not have run: its charges stay ours (if it ran, they were given back
        // and the settlement gives nothing there: an over-count at most).
        let restored: u64 = {
            let mut ledger = lock(&self.ledger);
            let rolling = std::mem::take(&mut ledger.rolling);
            let mut restored = 0;
            for (account, mut charges) in ledger
                .accounts
                .iter_mut()
                .filter(|a| a.counts_output())
                .zip(rolling)
            {
                restored = charges.iter().map(|c| c.tokens).sum();
                charges.reverse();
                account.charges.extend(charges);
            }
            restored
        };
        self.covered.fetch_add(restored, Ordering::AcqRel);
        let want = want.saturating_sub(restored);
        if fail_open {
            self.covered.fetch_add(want, Ordering::AcqRel);
        } else {
            self.flags.fetch_or(DUE, Ordering::AcqRel);
            self.due.notify_one();
        }
        self.flags.fetch_and(!IN_FLIGHT, Ordering::AcqRel);
        self.changed.notify_waiters();
    }

    /// Ends the meter (once): the adjustments that settle each budget to what the stream used
    /// (nothing, if it was never held), or None if it had ended already.
    pub(super) fn end(&self) -> Option<Vec<Adjustment>> {
        if self.flags.fetch_or(ENDED, Ordering::AcqRel) & ENDED != 0 {
            return None;
        }
        self.changed.notify_waiters();
        let (input, output) = if self.has(HELD) { self.used() } else { (0, 0) };
        let ledger = lock(&self.ledger);
        let mut adjustments = Vec::new();
        for account in &ledger.accounts {
            account.settle_to(account.policy.unit.of(input, output), &mut adjustments);
        }
        Some(adjustments)
    }
}
