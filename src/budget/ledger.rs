//! One stream's budgets as a state machine: what it holds in each budget (and in which
//! buckets), what it streamed, and what it needs next. Pure: no I/O, no locks, no clock (the
//! meter, `meter.rs`, holds it under a lock, passes the time in and wakes whoever must hear).
//!
//! `consume` only counts and, when less than half an increment of the reservation is left,
//! flags the stream due for the next top-up round, which brings it one increment ahead again.
//! Every round also moves the tokens streamed since the last one out of their reservation's
//! bucket into the current one, so each token counts in the window of the time it streamed (to
//! within one round), and the settlement does the same for the rest. While its budgets have
//! room to spare (`SLACK_ROOM`), a stream may run up to one increment past its reservation
//! while its top-up is on its way (the slack that lets a fast stream go on without pausing);
//! beyond that, or with little room left, it waits for the answer (`is_waiting`). So a top-up
//! is needed every half increment at most, and a stream overshoots by at most one increment
//! and the chunk it is on (in practice, only a stream whose top-up was on its way when the room
//! ran out).

use super::account::{Account, Charge};
use super::{BudgetRequest, OnBudget, TOP_UP};
use crate::errors::CoreError;
use crate::rate::price::{self, Usage};
use crate::rate::{Adjustment, TopUp, ToppedUp};

/// Room its budgets must have left after a top-up for a stream to keep its slack.
pub const SLACK_ROOM: u64 = 4 * TOP_UP;

/// The slack a stream gets while its budgets have `room` left.
fn slack_for(room: u64) -> u64 {
    if room >= SLACK_ROOM {
        TOP_UP
    } else {
        0
    }
}

#[derive(Debug)]
pub struct Ledger {
    on_budget: OnBudget,
    accounts: Vec<Account>,
    /// Answer tokens streamed so far.
    output: u64,
    /// Answer tokens the reservation covers (`u64::MAX` when no budget counts them).
    covered: u64,
    /// How far past `covered` the stream may run while a top-up is on its way: `TOP_UP` while
    /// its budgets have `SLACK_ROOM` left, else 0.
    slack: u64,
    /// The stream is due a top-up at the next round.
    due: bool,
    /// A top-up of the stream is on its way.
    in_flight: bool,
    /// Under `on_budget="cut"`: the stream streamed past its reservation and no top-up is left.
    exhausted: bool,
    /// Settled: the lease was released.
    ended: bool,
    /// The stream started: its tokens count (a grant dropped before it is held gives its whole
    /// reservation back).
    held: bool,
    /// Answer tokens counted in the bucket of a round after they streamed (their reservation
    /// given back in the same step): sent in a top-up, or, if its call failed, left counted
    /// where they were reserved. Never given back.
    moved: u64,
    /// Per output account, the charges a top-up under way gives back (a roll): out of
    /// `accounts` meanwhile, so a settlement never gives them back twice.
    rolling: Vec<Vec<Charge>>,
    /// The answer tokens that roll covered (out of `covered` meanwhile).
    rolled: u64,
    /// The prompt's tokens as estimated at admission.
    input: u64,
    /// The answer's tokens as estimated at admission.
    output_estimate: u64,
    /// The figures the model reported at the end, replacing the estimate and the count.
    reported: Option<Usage>,
}

impl Ledger {
    /// `accounts` hold what the acquire reserved for `request`; `room`: what the stream's
    /// budgets have left after it (the least of them).
    pub fn new(mut accounts: Vec<Account>, request: &BudgetRequest, room: u64) -> Self {
        for account in &mut accounts {
            account.pin_prompt(request.input, request.price);
        }
        let covered = if accounts.iter().any(Account::counts_output) {
            request.output
        } else {
            u64::MAX
        };
        Ledger {
            on_budget: request.on_budget,
            accounts,
            output: 0,
            covered,
            slack: slack_for(room),
            due: false,
            in_flight: false,
            exhausted: false,
            ended: false,
            held: false,
            moved: 0,
            rolling: Vec::new(),
            rolled: 0,
            input: request.input,
            output_estimate: request.output,
            reported: None,
        }
    }

    pub fn hold(&mut self) {
        self.held = true;
    }

    /// Counts `tokens` of the answer streamed; true when that made the stream due a top-up
    /// (the top-up loop must hear it). Refused after the lease's release, and, under
    /// `on_budget="cut"`, once the budget ran out (the stream ends before its next item).
    pub fn consume(&mut self, tokens: u64) -> Result<bool, CoreError> {
        if self.ended {
            return Err(CoreError::Misuse(
                "consume() after the lease was released: count a stream's tokens while it holds its lease (inside wrap() or the async with block)".into(),
            ));
        }
        if self.exhausted {
            return Err(self.exhausted_error());
        }
        self.output = self.output.saturating_add(tokens);
        let becomes_due = !self.due && self.output.saturating_add(TOP_UP / 2) > self.covered;
        self.due |= becomes_due;
        Ok(becomes_due)
    }

    /// The model's own figures for the whole stream (an OpenAI-style final `usage` chunk):
    /// they replace the estimate and the count at settlement.
    pub fn report(&mut self, usage: Usage) -> Result<(), CoreError> {
        if self.ended {
            return Err(CoreError::Misuse(
                "report_usage() after the lease was released: report the model's usage before the stream ends".into(),
            ));
        }
        self.reported = Some(usage);
        Ok(())
    }

    /// Tokens used so far, as the settlement charges them: (prompt, answer), the prompt's as
    /// estimated and the answer's as counted, or the model's figures once reported, except that
    /// the answer is never charged less than was counted as streamed (those tokens went out;
    /// `Lease.report_usage` logs a report below the count).
    pub fn used(&self) -> (u64, u64) {
        let usage = self.usage();
        (usage.input, usage.output)
    }

    /// `used`, with the prompt's cached tokens the model reported.
    fn usage(&self) -> Usage {
        match self.reported {
            Some(usage) => Usage {
                output: usage.output.max(self.output),
                ..usage
            },
            None => Usage {
                input: self.input,
                cached_input: 0,
                output: self.output,
            },
        }
    }

    /// What a model's report is checked against: the estimates made at admission (prompt,
    /// answer) and the answer's tokens counted here, whatever was reported.
    pub fn references(&self) -> ((u64, u64), u64) {
        ((self.input, self.output_estimate), self.output)
    }

    pub fn is_exhausted(&self) -> bool {
        self.exhausted
    }

    /// The error that ends an exhausted stream, naming its first budget that counts the answer.
    pub fn exhausted_error(&self) -> CoreError {
        let policy = self.accounts.iter().find(|account| account.counts_output());
        CoreError::BudgetExhausted(policy.map_or_else(String::new, |a| a.policy.name.to_string()))
    }

    /// Streamed more than its slack past its reservation with a top-up due or under way: the
    /// stream should wait for its answer before its next item (that is what bounds the
    /// overshoot).
    pub fn is_waiting(&self) -> bool {
        !self.ended && (self.due || self.in_flight) && self.output > self.covered.saturating_add(self.slack)
    }

    /// Flagged due again (while a top-up was on its way) and not ended.
    pub fn is_due(&self) -> bool {
        self.due && !self.ended
    }

    /// Units of the budget counted at `key` that the stream holds and has not streamed: what
    /// its settlement gives back if it ends now (0 once it ended).
    pub fn unstreamed(&self, key: &str) -> u64 {
        if self.ended {
            return 0;
        }
        let moving = self.output.min(self.covered).saturating_sub(self.moved);
        self.accounts
            .iter()
            .filter(|account| account.key == key)
            .map(|account| {
                let streamed = account.answer_units(self.moved, self.moved + moving);
                account.unstreamed(streamed).map(|(_, units)| units).sum::<u64>()
            })
            .sum()
    }

    /// Takes the stream's top-up for a round at `now_ms`, if it needs one: the answer tokens
    /// streamed since the last round within its reservation (given back where they were
    /// reserved and taken in the current bucket, so each token counts in the window of the time
    /// it streamed), the tokens that restore one increment ahead (when flagged due), and a roll
    /// of the reservation not used yet when its bucket is about to leave the window (see
    /// `Account::must_roll`): given back there, wanted again now, so a stream that outlives the
    /// window stays counted in it.
    pub fn take_due(&mut self, now_ms: u64) -> Option<TopUp> {
        if self.in_flight || self.ended {
            return None;
        }
        // Tokens past `covered` (the slack) have no reservation to move: the top-up takes them.
        // Without a budget that counts the answer, nothing moves.
        let moved = match self.accounts.iter().any(Account::counts_output) {
            true => self.output.min(self.covered).saturating_sub(self.moved),
            false => 0,
        };
        let rolls = self.accounts.iter().any(|account| {
            let streamed = account.answer_units(self.moved, self.moved + moved);
            account.counts_output() && account.must_roll(streamed, now_ms)
        });
        if moved == 0 && !self.due && !rolls {
            return None;
        }
        let was_due = std::mem::replace(&mut self.due, false);
        self.in_flight = true;
        let moved_from = self.moved;
        self.moved += moved;
        let rolled = if rolls {
            self.covered.saturating_sub(self.moved)
        } else {
            0
        };
        let need = (self.output + TOP_UP).saturating_sub(self.covered);
        let want = rolled + if was_due { need } else { 0 };
        let (mut keys, mut policies, mut give_back, mut rolling) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut moved_units, mut prices) = (Vec::new(), Vec::new());
        for account in self.accounts.iter_mut().filter(|a| a.counts_output()) {
            // In the budget's unit: the answer's tokens from where the last round left off.
            let units = account.answer_units(moved_from, self.moved);
            let streamed = account.take_unstreamed(units);
            // A roll takes all the rest, for a cost budget with the units its top-ups' rounding
            // held beyond the cost (else they would sit in the old bucket and roll again).
            let taken = match rolled {
                0 => Vec::new(),
                _ => account.take_unstreamed(u64::MAX),
            };
            account.moved += units;
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
            moved_units.push(units);
            prices.push(account.answer_price());
        }
        self.rolling = rolling;
        self.rolled = rolled;
        self.covered -= rolled;
        Some(TopUp {
            keys,
            policies,
            give_back,
            moved: moved_units,
            prices,
            want,
            forced: self.on_budget == OnBudget::Finish,
        })
    }

    /// A top-up's answer: `granted` of `want` tokens, taken from each budget that counts the
    /// answer in `buckets` (in account order), `room` left after it; `call`: when its call was
    /// sent and answered. Less than wanted means no budget is left. A stream settled meanwhile
    /// returns the refunds that give the top-up back.
    pub fn topped_up(&mut self, want: u64, answer: &ToppedUp, call: (u64, u64)) -> Vec<Adjustment> {
        let granted = answer.granted;
        self.slack = slack_for(answer.room);
        self.rolling.clear(); // given back
        self.rolled = 0;
        self.in_flight = false;
        let ended = self.ended;
        let mut refunds = Vec::new();
        let output_accounts = self.accounts.iter_mut().filter(|a| a.counts_output());
        for (account, taken) in output_accounts.zip(&answer.buckets) {
            let Some((bucket, counts_ms)) = *taken else {
                continue;
            };
            // What the store took for the tokens granted, in the budget's unit.
            let units = price::units_for(granted, account.answer_price());
            if units == 0 {
                continue; // only moved tokens went there: streamed, never given back
            }
            if ended {
                refunds.push(account.adjustment(units, Some(bucket)));
            } else {
                let charge = Charge::new(bucket, units, &account.policy, counts_ms, call);
                account.take(charge);
            }
        }
        if ended {
            return refunds;
        }
        self.covered = self.covered.saturating_add(granted);
        if granted < want && self.on_budget == OnBudget::Cut && self.output > self.covered {
            self.exhausted = true;
        }
        refunds
    }

    /// A top-up whose call failed: granted here without a charge (`fail_open`: the settlement
    /// charges it), or flagged due again for the next round (true: the top-up loop must hear
    /// it; the stream waits only if it ran past its reservation).
    pub fn top_up_failed(&mut self, want: u64, fail_open: bool) -> bool {
        // A roll that may not have run: its charges stay ours (if it ran, they were given back
        // and the settlement gives nothing there: an over-count at most).
        let rolling = std::mem::take(&mut self.rolling);
        let restored = std::mem::take(&mut self.rolled);
        let output_accounts = self.accounts.iter_mut().filter(|a| a.counts_output());
        for (account, charges) in output_accounts.zip(rolling) {
            account.restore(charges);
        }
        self.covered = self.covered.saturating_add(restored);
        let want = want.saturating_sub(restored);
        if fail_open {
            self.covered = self.covered.saturating_add(want);
        } else {
            self.due = true;
        }
        self.in_flight = false;
        !fail_open
    }

    /// The answer's tokens, as the settlement charges them, when they are an answer's whole
    /// size: the stream started, was not cut for its budget, and counted (or reported) some.
    pub fn answer(&self) -> Option<u64> {
        let output = self.usage().output;
        (self.held && !self.exhausted && output > 0).then_some(output)
    }

    /// Ends the stream (once): the adjustments that settle each budget to what the stream used
    /// (nothing, if it was never held), or None if it had ended already.
    pub fn end(&mut self) -> Option<Vec<Adjustment>> {
        if std::mem::replace(&mut self.ended, true) {
            return None;
        }
        let usage = if self.held { self.usage() } else { Usage::default() };
        let mut adjustments = Vec::new();
        for account in &self.accounts {
            account.settle_to(usage, &mut adjustments);
        }
        Some(adjustments)
    }
}

#[cfg(test)]
#[path = "ledger_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "ledger_cost_tests.rs"]
mod cost_tests;
