//! One budget of one stream: the tokens the stream holds in it, bucket by bucket, oldest first,
//! and the arithmetic on them (what a round moves, what a roll takes, what the settlement gives
//! back and charges). Pure: no I/O, no locks; time is passed in, in `monotonic_ms`.

use crate::rate::price::{self, Price, Usage};
use crate::rate::{Adjustment, Algorithm, Bucket, RatePolicy, Unit};

/// A roll goes out this long before the bucket of a stream's unused reservation may leave its
/// window (rounds come every `TOP_UP_EVERY`; the margin covers a slow call or two), or half a
/// window before for windows shorter than twice that.
pub const ROLL_AHEAD_MS: u64 = 2_000;

/// Tokens taken from one budget by one call, and when their bucket leaves the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
            Algorithm::FixedWindow | Algorithm::Calendar(_) => answered_at + counts_ms,
        };
        Charge {
            bucket,
            tokens,
            leaves_ms,
        }
    }
}

/// One budget of a stream: its counter, and the units (tokens, or money for a cost budget) the
/// stream holds in it.
#[derive(Debug, Clone)]
pub struct Account {
    pub key: String,
    pub policy: RatePolicy,
    /// The model's price, for a cost budget.
    price: Option<Price>,
    /// The prompt's tokens as estimated at admission: a cost budget prices the answer's tokens
    /// after them (`Price::answer_units`).
    input: u64,
    /// Units of the answer's tokens counted in rounds after they streamed (see
    /// `Ledger::take_due`).
    pub(super) moved: u64,
    /// Tokens held for the stream and not streamed yet, oldest first, bucket by bucket: what it
    /// reserved and was topped up with (for a budget that counts the prompt too, the prompt's
    /// tokens first: see `pinned`).
    pub(super) reserved: Vec<Charge>,
    /// The oldest tokens of `reserved` that the prompt used: they count where they were
    /// reserved, at admission.
    pinned: u64,
}

impl Account {
    pub fn new(key: String, policy: RatePolicy, reserved: Vec<Charge>) -> Self {
        Account {
            key,
            policy,
            price: None,
            input: 0,
            moved: 0,
            reserved,
            pinned: 0,
        }
    }

    /// Pins the prompt's `input` tokens (as this budget counts them, priced at `price` for a
    /// cost budget) among those it holds.
    pub(super) fn pin_prompt(&mut self, input: u64, price: Option<Price>) {
        self.price = price.filter(|_| self.policy.unit == Unit::Cost);
        self.input = input;
        self.pinned = self
            .units_of(Usage {
                input,
                ..Usage::default()
            })
            .min(self.held());
    }

    /// What this budget counts of `usage`, in its unit.
    fn units_of(&self, usage: Usage) -> u64 {
        price::units_of(self.policy.unit, self.price.as_ref(), usage)
    }

    /// Units of the answer's tokens from `from` to `to` (counted from its start).
    pub(super) fn answer_units(&self, from: u64, to: u64) -> u64 {
        match self.price {
            Some(price) => price.answer_units(self.input, from, to),
            None => to.saturating_sub(from),
        }
    }

    /// Units per million answer tokens (a million for a token budget).
    pub(super) fn answer_price(&self) -> u64 {
        price::answer_price(self.policy.unit, self.price.as_ref())
    }

    fn held(&self) -> u64 {
        self.reserved.iter().map(|charge| charge.tokens).sum()
    }

    /// Whether top-ups take from it: it counts the answer's tokens.
    pub(super) fn counts_output(&self) -> bool {
        matches!(self.policy.unit, Unit::Tokens | Unit::OutputTokens | Unit::Cost)
    }

    /// The charges of `reserved` past the prompt's tokens and `skip` more, oldest first, each
    /// with the tokens of it that lie there.
    pub(super) fn unstreamed(&self, skip: u64) -> impl Iterator<Item = (usize, u64)> + '_ {
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
    pub(super) fn must_roll(&self, skip: u64, now_ms: u64) -> bool {
        let Some((at, _)) = self.unstreamed(skip).next() else {
            return false;
        };
        let leaves_ms = self.reserved[at].leaves_ms;
        match self.policy.algorithm {
            Algorithm::SlidingWindow => leaves_ms <= now_ms + ROLL_AHEAD_MS.min(self.policy.window_ms / 2),
            Algorithm::FixedWindow | Algorithm::Calendar(_) => leaves_ms <= now_ms,
        }
    }

    /// Takes up to `tokens` units held past the prompt's out of `reserved`, oldest first;
    /// returns them.
    pub(super) fn take_unstreamed(&mut self, tokens: u64) -> Vec<Charge> {
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

    /// Puts back the charges a roll took (its call failed): a roll takes all that was held past
    /// the prompt, oldest first, so they go back behind the prompt's tokens, in order.
    pub(super) fn restore(&mut self, mut charges: Vec<Charge>) {
        self.reserved.append(&mut charges);
    }

    /// Holds `charge`, the tokens a top-up took.
    pub(super) fn take(&mut self, charge: Charge) {
        self.reserved.push(charge);
    }

    /// The refund of `tokens` from `bucket`, or (None) their charge now.
    pub(super) fn adjustment(&self, tokens: u64, refund_from: Option<Bucket>) -> Adjustment {
        Adjustment {
            key: self.key.clone(),
            policy: self.policy.clone(),
            tokens,
            refund_from,
        }
    }

    /// The adjustments that settle the account to a stream's final figures, `self.moved` of
    /// whose answer units were counted in the rounds after they streamed: the prompt's units
    /// stay where they were reserved (as many as it used), every other unit held is given back
    /// to its bucket, and what the stream used beyond those is charged now, the time it ended.
    pub(super) fn settle_to(&self, usage: Usage, adjustments: &mut Vec<Adjustment>) {
        let moved = if self.counts_output() { self.moved } else { 0 };
        let prompt = Usage { output: 0, ..usage };
        let keep = self.units_of(prompt).min(self.pinned);
        let mut kept = 0;
        for charge in &self.reserved {
            let stays = (keep - kept).min(charge.tokens);
            kept += stays;
            if charge.tokens > stays {
                adjustments.push(self.adjustment(charge.tokens - stays, Some(charge.bucket)));
            }
        }
        let now = self.units_of(usage).saturating_sub(moved + kept);
        if now > 0 {
            adjustments.push(self.adjustment(now, None));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Bucket = Bucket { slot: 1, epoch: 7 };
    const B: Bucket = Bucket { slot: 2, epoch: 7 };

    fn policy(algorithm: Algorithm, unit: Unit, window_ms: u64) -> RatePolicy {
        RatePolicy::new("budget", 10_000, window_ms, algorithm, unit).unwrap()
    }

    fn charge(bucket: Bucket, tokens: u64, leaves_ms: u64) -> Charge {
        Charge {
            bucket,
            tokens,
            leaves_ms,
        }
    }

    /// An account of `unit` holding `charges`, `input` of whose tokens the prompt pinned.
    fn account(unit: Unit, input: u64, charges: Vec<Charge>) -> Account {
        let mut account = Account::new(
            "key".into(),
            policy(Algorithm::SlidingWindow, unit, 60_000),
            charges,
        );
        account.pin_prompt(input, None);
        account
    }

    /// (refunded per bucket in order, charged now) of a settlement.
    fn settled(account: &Account, input: u64, output: u64, moved: u64) -> (Vec<(Bucket, u64)>, u64) {
        let mut adjustments = Vec::new();
        let account = Account {
            moved,
            ..account.clone()
        };
        let usage = Usage {
            input,
            cached_input: 0,
            output,
        };
        account.settle_to(usage, &mut adjustments);
        let refunds = adjustments
            .iter()
            .filter_map(|a| Some((a.refund_from?, a.tokens)))
            .collect();
        let now = adjustments
            .iter()
            .filter(|a| a.refund_from.is_none())
            .map(|a| a.tokens)
            .sum();
        (refunds, now)
    }

    #[test]
    fn a_sliding_charge_leaves_counted_from_its_send_and_a_fixed_one_from_its_answer() {
        let sliding = policy(Algorithm::SlidingWindow, Unit::Tokens, 60_000);
        let fixed = policy(Algorithm::FixedWindow, Unit::Tokens, 60_000);
        assert_eq!(Charge::new(A, 5, &sliding, 1_000, (100, 130)).leaves_ms, 1_100);
        assert_eq!(Charge::new(A, 5, &fixed, 1_000, (100, 130)).leaves_ms, 1_130);
    }

    #[test]
    fn the_prompt_is_pinned_at_most_to_what_the_account_holds() {
        assert_eq!(account(Unit::Tokens, 100, vec![charge(A, 400, 0)]).pinned, 100);
        assert_eq!(account(Unit::Tokens, 900, vec![charge(A, 400, 0)]).pinned, 400);
        assert_eq!(
            account(Unit::OutputTokens, 100, vec![charge(A, 400, 0)]).pinned,
            0
        );
        assert!(!account(Unit::InputTokens, 100, vec![]).counts_output());
        assert!(account(Unit::Tokens, 100, vec![]).counts_output());
    }

    #[test]
    fn streamed_tokens_are_taken_oldest_first_past_the_prompt_across_buckets() {
        let mut account = account(Unit::Tokens, 100, vec![charge(A, 300, 0), charge(B, 300, 0)]);
        assert_eq!(account.take_unstreamed(150), vec![charge(A, 150, 0)]);
        assert_eq!(
            account.take_unstreamed(200),
            vec![charge(A, 50, 0), charge(B, 150, 0)]
        );
        // The prompt's 100 stay; only 150 are left to take, from B.
        assert_eq!(account.take_unstreamed(1_000), vec![charge(B, 150, 0)]);
        assert_eq!(account.reserved, vec![charge(A, 100, 0)]);
    }

    #[test]
    fn a_sliding_reservation_rolls_ahead_of_its_bucket_leaving_and_a_fixed_one_once_it_ended() {
        let sliding = account(Unit::OutputTokens, 0, vec![charge(A, 300, 60_000)]);
        assert!(!sliding.must_roll(0, 60_000 - ROLL_AHEAD_MS - 1));
        assert!(sliding.must_roll(0, 60_000 - ROLL_AHEAD_MS));
        // Past its first 300 tokens, nothing is held: nothing to roll.
        assert!(!sliding.must_roll(300, 60_000));
        let mut short = Account::new(
            "key".into(),
            policy(Algorithm::SlidingWindow, Unit::OutputTokens, 1_000),
            vec![charge(A, 300, 10_000)],
        );
        short.pin_prompt(0, None);
        assert!(
            !short.must_roll(0, 10_000 - 501),
            "half a window ahead for short windows"
        );
        assert!(short.must_roll(0, 10_000 - 500));
        let mut fixed = Account::new(
            "key".into(),
            policy(Algorithm::FixedWindow, Unit::OutputTokens, 60_000),
            vec![charge(A, 300, 60_000)],
        );
        fixed.pin_prompt(0, None);
        assert!(!fixed.must_roll(0, 59_999));
        assert!(fixed.must_roll(0, 60_000));
    }

    #[test]
    fn a_roll_skips_the_pinned_prompt_which_never_rolls() {
        let account = account(
            Unit::Tokens,
            100,
            vec![charge(A, 100, 1_000), charge(B, 200, 60_000)],
        );
        assert!(
            !account.must_roll(0, 1_000),
            "the prompt's tokens count where they were reserved"
        );
    }

    #[test]
    fn a_settlement_keeps_the_prompt_gives_back_the_rest_and_charges_what_streamed_now() {
        let account = account(Unit::Tokens, 100, vec![charge(A, 1_100, 0), charge(B, 256, 0)]);
        // 300 streamed, 200 of them moved in rounds: 100 charged now.
        let (refunds, now) = settled(&account, 100, 300, 200);
        assert_eq!((refunds, now), (vec![(A, 1_000), (B, 256)], 100));
    }

    #[test]
    fn a_prompt_reported_smaller_than_reserved_gives_back_the_difference() {
        let account = account(Unit::Tokens, 100, vec![charge(A, 600, 0)]);
        let (refunds, now) = settled(&account, 40, 0, 0);
        assert_eq!((refunds, now), (vec![(A, 560)], 0));
    }

    #[test]
    fn a_prompt_reported_larger_than_reserved_is_charged_the_rest_now() {
        let account = account(Unit::InputTokens, 100, vec![charge(A, 100, 0)]);
        let (refunds, now) = settled(&account, 150, 999, 999);
        assert_eq!((refunds, now), (vec![], 50), "an input budget counts no answer");
    }

    #[test]
    fn restored_charges_go_back_behind_the_prompt_in_order() {
        let mut account = account(Unit::Tokens, 100, vec![charge(A, 400, 0)]);
        let rolled = account.take_unstreamed(300);
        account.restore(rolled);
        assert_eq!(account.take_unstreamed(300), vec![charge(A, 300, 0)]);
    }
}
