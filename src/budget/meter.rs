//! One stream's budgets: what it holds in each (and in which buckets), what it streamed, and
//! what it needs next. `consume()` only counts and, when less than half an increment of the
//! reservation is left, flags the meter for the next top-up round, which brings it one
//! increment ahead again. Every round also moves the tokens streamed since the last one out of
//! their reservation's bucket into the current one, so each token counts in the window of the
//! time it streamed (to within one round), and the settlement does the same for the rest. While its budgets have room to spare (`SLACK_ROOM`), a stream may run
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

/// Tokens taken from one budget by one call, and when their bucket leaves the window.
#[derive(Debug, Clone, Copy)]
pub struct Charge {
    pub bucket: Bucket,
    pub tokens: u64,
    /// When, in `monotonic_ms`, the bucket leaves the window, from the time the server said it
    /// counts on its own clock: a sliding window's slice from the call's send (never later
    /// than it really leaves: a roll goes out before), a fixed window from its answer (never
    /// earlier than it really ends: a roll goes out after, into the next window).
    pub leaves_ms: u64,
}

impl Charge {
    /// `counts_ms`: how long the server said the bucket counts; `call`: when the call that
    /// took the tokens was sent and answered.
    pub fn new(bucket: Bucket, tokens: u64, policy: &RatePolicy, counts_ms: u64, call: (u64, u64)) -> Self {
        let (sent_at, answered_at) = call;
        let leaves_ms = match policy.algorithm {
            Algorithm::SlidingWindow => sent_at + counts_ms,
            Algorithm::FixedWindow => answered_at + counts_ms,
        };
        Charge {
            bucket,
            tokens,
            leaves_ms,
        }
    }
}

/// One budget of a stream: its counter, and the tokens the stream holds in it.
#[derive(Debug, Clone)]
pub struct Account {
    pub key: String,
    pub policy: RatePolicy,
    /// Tokens held for the stream and not streamed yet, oldest first, bucket by bucket: what it
    /// reserved and was topped up with (for a budget that counts the prompt too, the prompt's
    /// tokens first: see `pinned`).
    reserved: Vec<Charge>,
    /// The oldest tokens of `reserved` that the prompt used: they count where they were
    /// reserved, at admission.
    pinned: u64,
}

impl Account {
    pub fn new(key: String, policy: RatePolicy, reserved: Vec<Charge>) -> Self {
        Account {
            key,
            policy,
            reserved,
            pinned: 0,
        }
    }

    fn held(&self) -> u64 {
        self.reserved.iter().map(|charge| charge.tokens).sum()
    }

    /// The charges of `reserved` past the prompt's tokens and `skip` more, oldest first, each
    /// with the tokens of it that lie there.
    fn unstreamed(&self, skip: u64) -> impl Iterator<Item = (usize, u64)> + '_ {
        let mut skip = self.pinned + skip;
        self.reserved.iter().enumerate().filter_map(move |(at, charge)| {
            let skipped = skip.min(charge.tokens);
            skip -= skipped;
            (charge.tokens > skipped).then_some((at, charge.tokens - skipped))
        })
    }

    /// Whether the first token held past the prompt's and `skip` more sits in a bucket about
    /// to leave its window: a sliding window's within `ROLL_AHEAD_MS` (or half the window), so
    /// that it is taken again in a later bucket before; a fixed window's once it ended (a fixed
    /// window's tokens can only be taken again in the next one).
    fn must_roll(&self, skip: u64, now_ms: u64) -> bool {
        let Some((at, _)) = self.unstreamed(skip).next() else {
            return false;
        };
        let leaves_ms = self.reserved[at].leaves_ms;
        match self.policy.algorithm {
            Algorithm::SlidingWindow => leaves_ms <= now_ms + ROLL_AHEAD_MS.min(self.policy.window_ms / 2),
            Algorithm::FixedWindow => leaves_ms <= now_ms,
        }
    }

    /// Takes up to `tokens` held past the prompt's out of `reserved`, oldest first; returns them.
    fn take_unstreamed(&mut self, tokens: u64) -> Vec<Charge> {
        let mut left = tokens;
        let mut taken = Vec::new();
        let parts: Vec<(usize, u64)> = self.unstreamed(0).collect();
        for (at, available) in parts {
            if left == 0 {
                break;
            }
            let part = left.min(available);
            let charge = &mut self.reserved[at];
            charge.tokens -= part;
            left -= part;
            taken.push(Charge {
                tokens: part,
                ..*charge
            });
        }
        self.reserved.retain(|charge| charge.tokens > 0);
        taken
    }

    /// Whether top-ups take from it: it counts the answer's tokens.
    fn counts_output(&self) -> bool {
        matches!(self.policy.unit, Unit::Tokens | Unit::OutputTokens)
    }

    /// The adjustments that settle the account to a stream's final figures, `moved` of whose
    /// answer tokens were counted in the rounds after they streamed: the prompt's tokens stay
    /// where they were reserved (as many as it used), every other token held is given back to
    /// its bucket, and what the stream used beyond those is charged now, the time it ended.
    fn settle_to(&self, input: u64, output: u64, moved: u64, adjustments: &mut Vec<Adjustment>) {
        let moved = if self.counts_output() { moved } else { 0 };
        let keep = self.policy.unit.of(input, 0).min(self.pinned);
        let adjustment = |tokens, refund_from| Adjustment {
            key: self.key.clone(),
            policy: self.policy.clone(),
            tokens,
            refund_from,
        };
        let mut kept = 0;
        for charge in &self.reserved {
            let stays = (keep - kept).min(charge.tokens);
            kept += stays;
            if charge.tokens > stays {
                adjustments.push(adjustment(charge.tokens - stays, Some(charge.bucket)));
            }
        }
        let now = self.policy.unit.of(input, output).saturating_sub(moved + kept);
        if now > 0 {
            adjustments.push(adjustment(now, None));
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
    /// Answer tokens counted in the bucket of a round after they streamed (their reservation
    /// given back in the same step): sent in a top-up, or, if its call failed, left counted
    /// where they were reserved. Never given back.
    moved: u64,
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
        let mut accounts = accounts;
        for account in &mut accounts {
            account.pinned = account.policy.unit.of(request.input, 0).min(account.held());
        }
        Meter {
            store,
            on_budget: request.on_budget,
            output: AtomicU64::new(0),
            covered: AtomicU64::new(covered),
            slack: AtomicU64::new(slack_for(room)),
            flags: AtomicU8::new(0),
            ledger: Mutex::new(Ledger {
                accounts,
                moved: 0,
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

    /// Takes the meter's top-up for a round, if it needs one: the answer tokens streamed since
    /// the last round within its reservation (given back where they were reserved and taken in
    /// the current bucket, so each token counts in the window of the time it streamed), the
    /// tokens that restore one increment ahead (when flagged due), and a roll of the
    /// reservation not used yet when its bucket is about to leave the window (see
    /// `Account::must_roll`): given back there, wanted again now, so a stream that outlives the
    /// window stays counted in it.
    pub(super) fn take_due(&self, now_ms: u64) -> Option<TopUp> {
        let flags = self.flags.load(Ordering::Acquire);
        if flags & (IN_FLIGHT | ENDED) != 0 {
            return None;
        }
        let mut ledger = lock(&self.ledger);
        let output = self.output.load(Ordering::Acquire);
        let covered = self.covered.load(Ordering::Acquire);
        // Tokens past `covered` (the slack) have no reservation to move: the top-up takes them.
        // Without a budget that counts the answer, nothing moves.
        let counts_output = ledger.accounts.iter().any(Account::counts_output);
        let moved = match counts_output {
            true => output.min(covered).saturating_sub(ledger.moved),
            false => 0,
        };
        let rolls = ledger
            .accounts
            .iter()
            .any(|account| account.counts_output() && account.must_roll(moved, now_ms));
        if moved == 0 && flags & DUE == 0 && !rolls {
            return None;
        }
        // In one step, so `is_waiting` never sees neither flag in between.
        let _ = self.flags.fetch_update(Ordering::AcqRel, Ordering::Acquire, |f| {
            Some((f & !DUE) | IN_FLIGHT)
        });
        ledger.moved += moved;
        let rolled = if rolls {
            covered.saturating_sub(ledger.moved)
        } else {
            0
        };
        let need = (output + TOP_UP).saturating_sub(covered);
        let want = rolled + if flags & DUE != 0 { need } else { 0 };
        let (mut keys, mut policies, mut give_back, mut rolling) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for account in ledger.accounts.iter_mut().filter(|a| a.counts_output()) {
            let streamed = account.take_unstreamed(moved);
            let taken = account.take_unstreamed(rolled);
            keys.push(account.key.clone());
            policies.push(account.policy.clone());
            give_back.push(
                streamed
                    .iter()
                    .chain(&taken)
                    .map(|c| (c.bucket, c.tokens))
                    .collect(),
            );
            rolling.push(taken);
        }
        ledger.rolling = rolling;
        drop(ledger);
        self.covered.fetch_sub(rolled, Ordering::AcqRel);
        Some(TopUp {
            keys,
            policies,
            give_back,
            moved,
            want,
            forced: self.on_budget == OnBudget::Finish,
        })
    }

    /// A top-up's answer: `granted` of `want` tokens, taken from each budget that counts the
    /// answer in `buckets` (in account order), `room` left after it. Less than wanted means no
    /// budget is left. A meter settled meanwhile returns the refunds that give the top-up back.
    pub(super) fn topped_up(&self, want: u64, answer: &ToppedUp, call: (u64, u64)) -> Vec<Adjustment> {
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
            for (account, taken) in output_accounts.zip(buckets) {
                let Some((bucket, counts_ms)) = *taken else {
                    continue;
                };
                if granted == 0 {
                    continue; // only moved tokens went there: streamed, never given back
                }
                if ended {
                    refunds.push(Adjustment {
                        key: account.key.clone(),
                        policy: account.policy.clone(),
                        tokens: granted,
                        refund_from: Some(bucket),
                    });
                } else {
                    let charge = Charge::new(bucket, granted, &account.policy, counts_ms, call);
                    account.reserved.push(charge);
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
                // A roll takes all that was held past the prompt, oldest first: it goes back
                // behind the prompt's tokens, in order.
                account.reserved.append(&mut charges);
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
            account.settle_to(input, output, ledger.moved, &mut adjustments);
        }
        Some(adjustments)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Bucket = Bucket { slot: 1, epoch: 7 };
    const B: Bucket = Bucket { slot: 2, epoch: 7 };

    fn policy(algorithm: Algorithm, unit: Unit) -> RatePolicy {
        RatePolicy::new("budget", 10_000, 60_000, algorithm, unit).unwrap()
    }

    /// A stream of `unit` that reserved `(input, output)` into bucket A, which leaves at 60 s.
    fn meter(algorithm: Algorithm, unit: Unit, input: u64, output: u64) -> Meter {
        let policy = policy(algorithm, unit);
        let reserved = vec![Charge {
            bucket: A,
            tokens: unit.of(input, output),
            leaves_ms: 60_000,
        }];
        let request = BudgetRequest {
            policies: vec![policy.clone()],
            input,
            output,
            on_budget: OnBudget::Cut,
        };
        let account = Account::new("key".into(), policy, reserved);
        let meter = Meter::new(
            Store::Main,
            vec![account],
            &request,
            5_000,
            Arc::new(Notify::new()),
        );
        meter.hold();
        meter
    }

    fn answer(granted: u64, bucket: Bucket) -> ToppedUp {
        ToppedUp {
            granted,
            room: 5_000,
            buckets: vec![Some((bucket, 60_000))],
        }
    }

    /// (refunded from A, refunded from B, charged now) in a settlement.
    fn totals(adjustments: &[Adjustment]) -> (u64, u64, u64) {
        let from = |bucket| {
            adjustments
                .iter()
                .filter(|a| a.refund_from == Some(bucket))
                .map(|a| a.tokens)
                .sum()
        };
        let now = adjustments
            .iter()
            .filter(|a| a.refund_from.is_none())
            .map(|a| a.tokens)
            .sum();
        (from(A), from(B), now)
    }

    #[test]
    fn each_round_moves_the_tokens_streamed_since_the_last_out_of_their_reservation() {
        let meter = meter(Algorithm::SlidingWindow, Unit::Tokens, 100, 1_000);
        assert!(meter.take_due(0).is_none(), "nothing streamed, nothing due");
        meter.consume(300).unwrap();
        let top_up = meter.take_due(0).unwrap();
        // The prompt's 100 stay where they were reserved; the 300 streamed leave bucket A.
        assert_eq!((top_up.moved, top_up.want), (300, 0));
        assert_eq!(top_up.give_back, vec![vec![(A, 300)]]);
        assert!(meter.topped_up(top_up.want, &answer(0, B), (0, 0)).is_empty());
        meter.consume(200).unwrap();
        let top_up = meter.take_due(0).unwrap();
        assert_eq!(
            (top_up.moved, top_up.give_back.clone()),
            (200, vec![vec![(A, 200)]])
        );
        meter.topped_up(top_up.want, &answer(0, B), (0, 0));
        // Settled: the prompt stays, the 500 not streamed come back, nothing more is charged.
        assert_eq!(totals(&meter.end().unwrap()), (500, 0, 0));
    }

    #[test]
    fn a_stream_whose_budgets_count_only_the_prompt_has_nothing_to_move() {
        let meter = meter(Algorithm::SlidingWindow, Unit::InputTokens, 100, 1_000);
        meter.consume(300).unwrap();
        assert!(
            meter.take_due(0).is_none(),
            "an entry with no budget to take from"
        );
        assert_eq!(totals(&meter.end().unwrap()), (0, 0, 0));
    }

    #[test]
    fn a_stream_shorter_than_a_round_is_charged_its_tokens_where_it_ended() {
        let meter = meter(Algorithm::SlidingWindow, Unit::OutputTokens, 0, 1_000);
        meter.consume(300).unwrap();
        // No round ran: the whole reservation goes back to A, the 300 are charged now.
        assert_eq!(totals(&meter.end().unwrap()), (1_000, 0, 300));
    }

    #[test]
    fn a_report_below_the_count_is_charged_the_count() {
        let meter = meter(Algorithm::SlidingWindow, Unit::OutputTokens, 0, 1_000);
        meter.consume(400).unwrap();
        meter.report(0, 100).unwrap();
        assert_eq!(meter.used(), (0, 400));
        assert_eq!(totals(&meter.end().unwrap()), (1_000, 0, 400));
    }

    #[test]
    fn a_failed_move_leaves_its_tokens_counted_where_they_were_reserved() {
        let meter = meter(Algorithm::SlidingWindow, Unit::OutputTokens, 0, 1_000);
        meter.consume(300).unwrap();
        let top_up = meter.take_due(0).unwrap();
        meter.top_up_failed(top_up.want, false);
        // Never given back, never charged again: the 300 stay counted in A.
        assert_eq!(totals(&meter.end().unwrap()), (700, 0, 0));
    }

    #[test]
    fn a_sliding_reservation_rolls_before_its_bucket_leaves_and_a_fixed_one_after() {
        let sliding = meter(Algorithm::SlidingWindow, Unit::OutputTokens, 0, 1_000);
        assert!(sliding.take_due(60_000 - ROLL_AHEAD_MS - 1).is_none());
        let roll = sliding.take_due(60_000 - ROLL_AHEAD_MS).unwrap();
        assert_eq!(
            (roll.want, roll.give_back.clone()),
            (1_000, vec![vec![(A, 1_000)]])
        );
        let fixed = meter(Algorithm::FixedWindow, Unit::OutputTokens, 0, 1_000);
        assert!(
            fixed.take_due(59_999).is_none(),
            "taken again in the same window is no use"
        );
        assert_eq!(fixed.take_due(60_000).unwrap().want, 1_000);
    }

    #[test]
    fn a_top_up_short_of_what_the_stream_streamed_past_its_reservation_cuts_it() {
        let meter = meter(Algorithm::SlidingWindow, Unit::OutputTokens, 0, 100);
        meter.consume(300).unwrap(); // 200 past the reservation, within the slack
        assert!(!meter.is_waiting());
        meter.consume(100).unwrap();
        assert!(
            meter.is_waiting(),
            "more than the slack past: it waits for its top-up"
        );
        let top_up = meter.take_due(0).unwrap();
        assert_eq!((top_up.moved, top_up.want), (100, 400 + TOP_UP - 100));
        meter.topped_up(top_up.want, &answer(50, B), (0, 0));
        assert!(meter.is_exhausted());
        // Settled to what it streamed: the reservation left A with the move, the 50 granted
        // come back from B, the other 300 streamed are charged now.
        let (a, b, now) = totals(&meter.end().unwrap());
        assert_eq!((a, b, now), (0, 50, 400 - 100));
    }
}
