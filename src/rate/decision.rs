//! What a hit is checked against and what each policy answered: the decisions, the buckets
//! the units went to, and what a grant nobody took gives back.

use std::ops::Range;

use super::{Adjustment, RatePolicy};

/// The rate policies a stream's start counts against, with the caller's counters (`keys[i]`
/// counts `policies[i]`, which takes `costs[i]`); empty for an acquire without rate limits.
#[derive(Debug, Clone, Default)]
pub struct RateCheck {
    pub keys: Vec<String>,
    pub policies: Vec<RatePolicy>,
    /// Units the start takes from each policy: 1 per request rate, the reservation per budget.
    pub costs: Vec<u64>,
}

impl RateCheck {
    /// Refunds of what a grant took from the policies in `policies` (indexes; `decisions`: the
    /// grant's, in the same order), to the buckets it went to: what a grant nobody takes gives
    /// back. A policy that took nothing (a resent call's grant) has nothing to give back.
    pub fn refunds(&self, decisions: &[Decision], policies: Range<usize>) -> Vec<Adjustment> {
        policies
            .filter_map(|i| {
                let bucket = decisions.get(i)?.bucket?;
                (self.costs[i] > 0).then(|| Adjustment {
                    key: self.keys[i].clone(),
                    policy: self.policies[i].clone(),
                    tokens: self.costs[i],
                    refund_from: Some(bucket),
                })
            })
            .collect()
    }
}

/// Where taken units went, so a budget's refund finds them: the `slot` (a sliding window's
/// slice, a fixed window's end in ms) in the counter of that `epoch` (when a sliding counter was
/// made; 0 for a fixed window, whose end tells it), so a refund never lands in a counter rebuilt
/// since (a reset, a restart).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    pub slot: u64,
    pub epoch: u64,
}

impl Bucket {
    /// From a script's (slot, epoch); None when nothing was taken (slot 0).
    pub fn of(slot: u64, epoch: u64) -> Option<Self> {
        (slot != 0).then_some(Bucket { slot, epoch })
    }
}

/// What one policy said about a hit.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub policy: RatePolicy,
    /// Units in use in the window after the hit (before it, when refused or only looked at).
    pub used: u64,
    /// Units left: the limit less `used`, or 0.
    pub remaining: u64,
    /// When the next units free up, in ms (0: nothing in use).
    pub reset_ms: u64,
    /// Where the hit's units went (None when nothing was taken).
    pub bucket: Option<Bucket>,
    /// The policy had no room for the hit's cost: it refused, or would have were it enforced
    /// (a dry run counts the hit anyway).
    pub would_refuse: bool,
    /// The policy's alert thresholds (`RatePolicy::alert_at`) this hit's units reached first in
    /// the window, across every worker: each is in one decision per window.
    pub thresholds_reached: Vec<f64>,
}

impl Decision {
    pub fn new(policy: RatePolicy, used: u64, reset_ms: u64, bucket: Option<Bucket>) -> Self {
        Decision {
            remaining: policy.limit.saturating_sub(used),
            policy,
            used,
            reset_ms,
            bucket,
            would_refuse: false,
            thresholds_reached: Vec::new(),
        }
    }

    /// The same decision, saying whether the policy had no room for the cost.
    pub fn refusing(self, would_refuse: bool) -> Self {
        Decision { would_refuse, ..self }
    }

    /// The same decision, having reached first the policy's thresholds whose bits are set in
    /// `told` (bit 0: the first of `alert_at`).
    pub fn telling(self, told: u64) -> Self {
        if told == 0 {
            return self;
        }
        let thresholds_reached = self.policy.alert_at.of_bits(told);
        Decision {
            thresholds_reached,
            ..self
        }
    }
}

/// The answer to one hit: every policy's decision, and the first that refused, if any.
#[derive(Debug, Clone, PartialEq)]
pub struct HitOutcome {
    pub decisions: Vec<Decision>,
    /// Index (into `decisions`) of the first policy that refused, and when the cost fits again.
    pub refused: Option<(usize, u64)>,
    /// What each policy took ahead for this process (`RatePolicy::lease_units`), in order;
    /// empty when the hit asked none for any.
    pub ahead: Vec<Ahead>,
}

/// Units a policy took beyond a hit's cost, for its process to serve hits from: counted in the
/// store's `used` already, in the bucket of the hit's cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ahead {
    pub units: u64,
    /// For how many ms, on the store's clock, their bucket stays the one units go to (a sliding
    /// window's slice, a fixed window): served later, a unit would count in a bucket that the
    /// window may have left.
    pub fresh_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::super::policy::tests::{budget, policy};
    use super::*;
    use crate::rate::{Settlement, Unit};

    #[test]
    fn a_decision_says_what_is_left_and_never_less_than_nothing() {
        let bucket = Bucket::of(3, 9);
        let taken = Decision::new(policy("m", 5), 2, 1_500, bucket);
        assert_eq!(
            (taken.remaining, taken.reset_ms, taken.bucket),
            (3, 1_500, bucket)
        );
        assert_eq!(
            Decision::new(policy("m", 5), 7, 0, None).remaining,
            0,
            "over the limit"
        );
    }

    #[test]
    fn a_bucket_exists_only_where_units_were_taken() {
        assert_eq!(Bucket::of(0, 9), None, "slot 0: nothing was taken");
        assert_eq!(Bucket::of(4, 0), Some(Bucket { slot: 4, epoch: 0 }));
    }

    #[test]
    fn an_untaken_grant_gives_back_only_what_its_policies_took_to_the_buckets_it_went_to() {
        let check = RateCheck {
            keys: vec!["k0".into(), "k1".into(), "k2".into()],
            policies: vec![
                policy("rpm", 10),
                policy("rph", 100),
                budget("tpm", 1_000, Unit::Tokens),
            ],
            costs: vec![1, 1, 0],
        };
        let decisions = [
            Decision::new(policy("rpm", 10), 1, 0, Bucket::of(5, 1)),
            Decision::new(policy("rph", 100), 1, 0, None), // a resent call's grant took nothing
            Decision::new(budget("tpm", 1_000, Unit::Tokens), 0, 0, Bucket::of(6, 1)),
        ];
        let refunds = check.refunds(&decisions, 0..3);
        let given: Vec<(&str, u64, Option<Bucket>)> = refunds
            .iter()
            .map(|a| (a.key.as_str(), a.tokens, a.refund_from))
            .collect();
        assert_eq!(given, [("k0", 1, Bucket::of(5, 1))]);
        assert!(check.refunds(&decisions, 1..3).is_empty());
        assert!(
            check.refunds(&decisions[..1], 0..3).len() == 1,
            "decisions missing: nothing"
        );
        let settlement = Settlement::untaken("lease", refunds);
        assert_eq!(settlement.id, "lease:untaken");
    }
}
