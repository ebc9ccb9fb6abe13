//! How an acquire ends: the store's outcome concluded into a grant, to be held and delivered, or
//! into the refusal the caller gets. A grant with budgets opens its stream's meter, holding what
//! it reserved.

use std::sync::Arc;

use super::Manager;
use crate::backend::AcquireOutcome;
use crate::budget::{Account, BudgetRequest, Budgets, Charge, Meter};
use crate::errors::{CoreError, CoreResult};
use crate::keys::PoolRole;
use crate::lease::{monotonic_ms, LeaseRecord};
use crate::rate::price::{answer_price, tokens_within};
use crate::rate::{Adjustment, Algorithm, Decision, HitOutcome, RateCheck, Unit};
use crate::renewal::{HeldLease, Leases};

/// A lease the store granted, to be held and delivered: dropped unheld (its caller gave up, the
/// manager closed), it is released; held but dropped undelivered, it gives back its start's rate
/// units (the `HeldLease` releases the lease).
pub struct Granted {
    record: Option<Arc<LeaseRecord>>,
    /// Once held, until delivered.
    held: Option<Arc<LeaseRecord>>,
    deadline_ms: u64,
    /// Whether the holder's other leases in the tag lived on through this grant.
    holder_was_alive: bool,
    fencing_token: Option<u64>,
    /// Each rate policy's decision, the start counted.
    rates: Vec<Decision>,
    /// The capped pools the client may be told about, after the grant.
    usage: Vec<PoolUsage>,
    /// The stream's token budgets, when granted with some.
    meter: Option<Arc<Meter>>,
    /// What the grant took from its request-rate policies, given back if nobody takes it (its
    /// budgets' reservation comes back with the release).
    rate_refunds: Vec<Adjustment>,
    leases: Arc<Leases>,
    budgets: Arc<Budgets>,
}

/// Slots in use in one capped pool (for the `RateLimit` headers' `concurrent-requests`).
#[derive(Debug, Clone)]
pub struct PoolUsage {
    pub name: Arc<str>,
    pub capacity: u64,
    pub used: u64,
}

impl Granted {
    /// The grant's fencing token, when the manager gives them: above every token given before
    /// in the lease's tag.
    pub fn fencing_token(&self) -> Option<u64> {
        self.fencing_token
    }

    /// What each rate policy said, the start counted (empty without rate limits).
    pub fn rate_decisions(&self) -> &[Decision] {
        &self.rates
    }

    /// The capped pools the client may be told about, with their use after the grant.
    pub fn usage(&self) -> &[PoolUsage] {
        &self.usage
    }

    /// The lease granted, until it is held: the request's record, or the local floor's when
    /// Redis did not answer.
    pub fn lease(&self) -> &Arc<LeaseRecord> {
        self.record.as_ref().expect("a Granted is held once")
    }

    /// The stream's token budgets (None without any).
    pub fn meter(&self) -> Option<&Arc<Meter>> {
        self.meter.as_ref()
    }

    /// Holds the lease (the renewal loop keeps it alive from now on), as soon as its grant
    /// arrives: a grant that waited for a busy event loop to take it would be held past its
    /// deadline, and so lost, though the store kept it.
    pub fn hold(&mut self) -> CoreResult<HeldLease> {
        let record = self.record.take().expect("a Granted is held once");
        let held = self
            .leases
            .hold(Arc::clone(&record), self.deadline_ms, self.holder_was_alive);
        match (&held, &self.meter) {
            (Ok(_), Some(meter)) => meter.hold(),
            (Ok(_), None) => {}
            (Err(_), _) => self.give_back(&record),
        }
        if held.is_ok() {
            self.held = Some(record);
        }
        held
    }

    /// The caller has the held lease: its start counts.
    pub fn delivered(mut self) {
        if let Some(record) = self.held.take() {
            self.leases.taken(&record);
        }
    }

    /// Nobody takes the grant: the stream never starts, so everything it took comes back (its
    /// slots and its whole reservation with the release, its start's rate units here).
    fn give_back(&mut self, record: &Arc<LeaseRecord>) {
        self.leases.release_in_background(record);
        self.budgets
            .give_back(record, std::mem::take(&mut self.rate_refunds));
    }
}

impl Drop for Granted {
    fn drop(&mut self) {
        if let Some(record) = self.record.take() {
            self.give_back(&record);
        } else if let Some(record) = self.held.take() {
            self.budgets
                .give_back(&record, std::mem::take(&mut self.rate_refunds));
        }
    }
}

impl Manager {
    /// The acquire's end: a grant, or the refusal (the lease marked released, out of flight).
    pub(super) fn conclude(
        &self,
        record: Arc<LeaseRecord>,
        outcome: AcquireOutcome,
        check: &RateCheck,
        budget: Option<&BudgetRequest>,
    ) -> CoreResult<Granted> {
        let refusal = match outcome {
            AcquireOutcome::Granted {
                entry_life_ms,
                fencing_token,
                rates,
                used,
                sent_at_ms,
            } => {
                // The request rates come first, the budgets (whose meter settles them) after.
                let budgets_from = check.policies.len() - budget.map_or(0, |b| b.policies.len());
                let meter = budget
                    .map(|budget| self.open_meter(&record, check, &rates, budgets_from, sent_at_ms, budget));
                return Ok(Granted {
                    held: None,
                    meter,
                    rate_refunds: check.refunds(&rates, 0..budgets_from),
                    usage: self.usage_shown(&record, &used),
                    record: Some(record),
                    deadline_ms: sent_at_ms.saturating_add(entry_life_ms.unwrap_or(self.config.lease_ms())),
                    holder_was_alive: entry_life_ms.is_some(),
                    fencing_token,
                    rates,
                    leases: Arc::clone(&self.leases),
                    budgets: Arc::clone(&self.budgets),
                });
            }
            AcquireOutcome::RateLimited(mut outcome) => {
                self.retry_when_reservations_end(&mut outcome, check);
                CoreError::RateLimited(outcome)
            }
            AcquireOutcome::Rejected(mut rejection) => {
                rejection.retry_after_ms = rejection.retry_after_ms.min(self.config.retry_after_ms());
                CoreError::Rejected(rejection)
            }
            AcquireOutcome::LineFull { mut full, displaced } => {
                full.retry_after_ms = full.retry_after_ms.clamp(1, self.config.retry_after_ms());
                CoreError::LineFull { full, displaced }
            }
            AcquireOutcome::Banned(ms_left) => CoreError::Banned(ms_left),
            AcquireOutcome::Wait(_) => unreachable!("only a waiter is told to wait, and it loops"),
        };
        record.mark_released();
        self.leases.flight_end(&record, false);
        Err(refusal)
    }

    /// A budget that refused a start for room that reservations of streams running here hold
    /// (its room and their unstreamed units cover the start) has them back when those streams
    /// end: its retry hint is a pool's (`retry_after`), if that is sooner than the window's.
    /// Reservations held by other processes are not seen here: their hint stays the window's.
    fn retry_when_reservations_end(&self, outcome: &mut HitOutcome, check: &RateCheck) {
        let Some((index, retry_ms)) = outcome.refused else {
            return;
        };
        let (Some(decision), Some(key), Some(&cost)) = (
            outcome.decisions.get(index),
            check.keys.get(index),
            check.costs.get(index),
        ) else {
            return;
        };
        if decision.policy.unit == Unit::Requests {
            return;
        }
        let held = self.budgets.unstreamed(key);
        if held > 0 && decision.remaining.saturating_add(held) >= cost {
            outcome.refused = Some((index, retry_ms.min(self.config.retry_after_ms())));
        }
    }

    /// The stream's meter, holding what the grant reserved from each budget (the policies from
    /// `budgets_from` on), with the room the budgets had left.
    fn open_meter(
        &self,
        record: &Arc<LeaseRecord>,
        check: &RateCheck,
        decisions: &[Decision],
        budgets_from: usize,
        sent_at_ms: u64,
        budget: &BudgetRequest,
    ) -> Arc<Meter> {
        let call = (sent_at_ms, monotonic_ms());
        let accounts = (budgets_from..check.policies.len())
            .map(|i| {
                let policy = &check.policies[i];
                // A retried call that found its grant made answers no bucket: its reservation
                // stays charged and the settlement charges the stream again (an over-count,
                // never an under-count).
                let reserved = match decisions.get(i) {
                    Some(Decision {
                        bucket: Some(bucket),
                        reset_ms,
                        ..
                    }) if check.costs[i] > 0 => {
                        // A slice counts at least a window after it was written to; a fixed
                        // window until its end, its reset.
                        let counts_ms = match policy.algorithm {
                            Algorithm::SlidingWindow => policy.window_ms,
                            Algorithm::FixedWindow | Algorithm::Calendar(_) => *reset_ms,
                        };
                        vec![Charge::new(*bucket, check.costs[i], policy, counts_ms, call)]
                    }
                    _ => Vec::new(),
                };
                Account::new(check.keys[i].clone(), policy.clone(), reserved)
            })
            .collect();
        // In answer tokens: a cost budget's units buy as many as its price allows.
        let room = decisions[budgets_from..]
            .iter()
            .map(|d| tokens_within(d.remaining, answer_price(d.policy.unit, budget.price.as_ref())))
            .min()
            .unwrap_or(u64::MAX);
        self.budgets.open(record, accounts, budget, room)
    }

    /// The capped pools a grant may tell the client about, with their slots in use after it:
    /// the user's own always, shared ones under `disclose_usage`.
    fn usage_shown(&self, record: &LeaseRecord, used: &[u64]) -> Vec<PoolUsage> {
        record
            .pools
            .iter()
            .zip(used)
            .filter(|(pool, _)| {
                pool.capacity > 0 && (pool.role == PoolRole::Own || self.config.disclose_usage)
            })
            .map(|(pool, used)| PoolUsage {
                name: pool.name.clone(),
                capacity: pool.capacity,
                used: *used,
            })
            .collect()
    }
}
