//! Request rates: `lua/hit.lua` (one hit against every policy, decided in batches) and
//! `lua/forget.lua` (counters forgotten), and each policy's part of a call and of its reply, as
//! acquire.lua takes and gives them too.

use super::batched::OneCall;
use super::layout::{unexpected_reply, Shape};
use super::scripts::{self, Invocation};
use crate::errors::CoreResult;
use crate::rate::{Ahead, Bucket, Decision, HitOutcome, RatePolicy};

/// Each rate policy as the scripts take it (the prelude's RATE_ARGS): algorithm, limit, window
/// in ms, its cost (followed, in the same argument, by the units to take ahead, `aheads[i]`,
/// when there are any: "1 40"), enforce (1; 0: a dry run) followed, in the same argument, by the
/// units at which its alert thresholds are reached (none while nobody listens: "1", else "1 8
/// 10"). `aheads`: empty, or one per policy.
pub fn rate_args(invocation: &mut Invocation, policies: &[RatePolicy], costs: &[u64], aheads: &[u64]) {
    for (i, (policy, cost)) in policies.iter().zip(costs).enumerate() {
        invocation
            .arg(policy.algorithm.code())
            .arg(policy.limit)
            .arg(policy.window_ms);
        match aheads.get(i) {
            Some(&ahead) if ahead > 0 => {
                let mut cost_and_ahead = Shape::default();
                cost_and_ahead.push(*cost);
                cost_and_ahead.push(ahead);
                invocation.arg(cost_and_ahead.into_arg());
            }
            _ => {
                invocation.arg(cost);
            }
        }
        if policy.alert_at.is_empty() {
            invocation.arg(u8::from(policy.enforce));
        } else {
            let mut enforce_and_marks = Shape::default();
            enforce_and_marks.push(u8::from(policy.enforce));
            for mark in policy.alert_at.marks(policy.limit) {
                enforce_and_marks.push(mark);
            }
            invocation.arg(enforce_and_marks.into_arg());
        }
    }
}

/// Numbers per policy in a reply: used, reset_ms, bucket, epoch, flags (1: no room for the
/// cost; plus twice the bits of the alert thresholds the hit reached first in the window).
pub const RATE_ANSWER_LEN: usize = 5;

/// Numbers a policy asked for units ahead adds to its answer: how many it took, and for how
/// many ms they may be served.
const AHEAD_ANSWER_LEN: usize = 2;

/// The policies' decisions from a reply's answers, `RATE_ANSWER_LEN` numbers each.
pub fn decisions(policies: &[RatePolicy], answers: &[u64]) -> Vec<Decision> {
    policies
        .iter()
        .zip(answers.chunks(RATE_ANSWER_LEN))
        .map(|(policy, a)| decision(policy, a))
        .collect()
}

fn decision(policy: &RatePolicy, a: &[u64]) -> Decision {
    Decision::new(policy.clone(), a[0], a[1], Bucket::of(a[2], a[3]))
        .refusing(a[4] & 1 == 1)
        .telling(a[4] >> 1)
}

/// hit.lua's request: the counters (`keys[i]` counts `policies[i]`), whether it counts or only
/// looks, each policy with `cost` and `aheads[i]` units to take ahead (`aheads` empty: none).
/// None without a policy.
pub fn hit_request(
    keys: &[String],
    policies: &[RatePolicy],
    cost: u64,
    aheads: &[u64],
    consume: bool,
) -> Option<OneCall> {
    let first_key = keys.first()?;
    let mut invocation = scripts::HIT.prepare_invoke();
    invocation.key(keys).arg(u8::from(consume));
    rate_args(&mut invocation, policies, &vec![cost; policies.len()], aheads);
    Some(OneCall::of(invocation, None, first_key, None))
}

/// hit.lua's reply to one request: the 1-based index of the policy that refused (0: none) and
/// when the cost fits again, then each policy's answer, with what it took ahead when
/// `aheads[i]` asked for any.
pub fn decode_hit(reply: &[u64], policies: &[RatePolicy], aheads: &[u64]) -> CoreResult<HitOutcome> {
    let [refused, retry_ms, answers @ ..] = reply else {
        return Err(unexpected_reply("hit", &reply));
    };
    let mut per_policy = answers;
    let asked = |i: usize| aheads.get(i).is_some_and(|&ahead| ahead > 0);
    let expected: usize = (0..policies.len())
        .map(|i| RATE_ANSWER_LEN + if asked(i) { AHEAD_ANSWER_LEN } else { 0 })
        .sum();
    if per_policy.len() != expected || *refused as usize > policies.len() {
        return Err(unexpected_reply("hit", &reply));
    }
    let mut decisions = Vec::with_capacity(policies.len());
    let mut ahead = Vec::new();
    for (i, policy) in policies.iter().enumerate() {
        let (answer, rest) = per_policy.split_at(RATE_ANSWER_LEN);
        decisions.push(decision(policy, answer));
        per_policy = rest;
        if asked(i) {
            let (taken, rest) = per_policy.split_at(AHEAD_ANSWER_LEN);
            ahead.resize(i, Ahead::default());
            ahead.push(Ahead {
                units: taken[0],
                fresh_ms: taken[1],
            });
            per_policy = rest;
        }
    }
    if !ahead.is_empty() {
        ahead.resize(policies.len(), Ahead::default());
    }
    Ok(HitOutcome {
        decisions,
        refused: (*refused > 0).then(|| (*refused as usize - 1, *retry_ms)),
        ahead,
    })
}

/// forget.lua's call: the counters to forget. Replies with a number.
pub fn forget_invocation(keys: &[String]) -> Invocation {
    let mut invocation = scripts::FORGET.prepare_invoke();
    invocation.key(keys);
    invocation
}

#[cfg(test)]
pub mod tests {
    use super::super::layout::read;
    use super::*;
    use crate::rate::{Algorithm, Thresholds, Unit};

    pub fn policy(name: &str, limit: u64) -> RatePolicy {
        RatePolicy::new(name, limit, 60_000, Algorithm::FixedWindow, Unit::Requests).expect("a policy")
    }

    #[test]
    fn a_hit_sends_each_policy_with_its_cost_and_whether_it_refuses() {
        let keys = ["{u}:a".to_owned(), "{u}:b".to_owned()];
        let policies = [
            policy("a", 10),
            policy("b", 20).enforcing(false).expect("a dry run"),
        ];
        let request = hit_request(&keys, &policies, 3, &[], true).expect("a request");
        assert_eq!(request.tag, "u");
        let args: Vec<&str> = request.args.iter().map(|arg| read::text(arg)).collect();
        assert_eq!(
            args,
            ["1", "f", "10", "60000", "3", "1", "f", "20", "60000", "3", "0"]
        );
        assert!(hit_request(&[], &[], 1, &[], true).is_none());
    }

    #[test]
    fn a_policy_with_alert_thresholds_sends_their_marks_after_enforce_and_reads_back_those_told() {
        let alerting = RatePolicy {
            alert_at: Thresholds::new(&[0.8, 1.0]).expect("thresholds"),
            ..policy("a", 9)
        };
        let keys = ["{u}:a".to_owned(), "{u}:b".to_owned()];
        let request =
            hit_request(&keys, &[alerting.clone(), policy("b", 20)], 1, &[], true).expect("a request");
        assert_eq!(read::text(&request.args[5]), "1 8 9");
        assert_eq!(read::text(&request.args[10]), "1", "no thresholds: enforce alone");
        let reply = [0, 0, 9, 100, 7, 0, 0b100, 20, 500, 0, 0, 0];
        let outcome = decode_hit(&reply, &[alerting, policy("b", 20)], &[]).expect("decoded");
        assert_eq!(outcome.decisions[0].thresholds_reached, [1.0]);
        assert!(!outcome.decisions[0].would_refuse);
        assert!(outcome.decisions[1].thresholds_reached.is_empty());
    }

    #[test]
    fn a_hit_reply_says_which_policy_refused_and_each_decision() {
        let policies = [policy("a", 10), policy("b", 20)];
        let allowed =
            decode_hit(&[0, 0, 4, 100, 7, 1, 0, 20, 500, 0, 0, 0], &policies, &[]).expect("decoded");
        assert_eq!(allowed.refused, None);
        assert_eq!(allowed.decisions[0].remaining, 6);
        assert_eq!(allowed.decisions[0].bucket, Bucket::of(7, 1));
        assert_eq!(allowed.decisions[1].bucket, None, "slot 0: nothing taken");
        assert!(!allowed.decisions[0].would_refuse);
        let refused =
            decode_hit(&[2, 900, 4, 100, 7, 1, 0, 20, 500, 0, 0, 1], &policies, &[]).expect("decoded");
        assert_eq!(refused.refused, Some((1, 900)));
        assert!(refused.decisions[1].would_refuse);
    }

    #[test]
    fn a_dry_run_over_its_limit_is_reported_in_an_allowed_hit() {
        let policies = [
            policy("a", 10),
            policy("dry", 2).enforcing(false).expect("a dry run"),
        ];
        let reply = [0, 0, 4, 100, 7, 1, 0, 3, 500, 7, 1, 1];
        let allowed = decode_hit(&reply, &policies, &[]).expect("decoded");
        assert_eq!(allowed.refused, None);
        let dry = &allowed.decisions[1];
        assert_eq!((dry.used, dry.remaining, dry.would_refuse), (3, 0, true));
    }

    #[test]
    fn a_policy_asked_for_units_ahead_sends_them_with_its_cost_and_reads_back_what_it_took() {
        let keys = ["{u}:a".to_owned(), "{u}:b".to_owned()];
        let policies = [policy("a", 100), policy("b", 1_000)];
        let request = hit_request(&keys, &policies, 1, &[0, 40], true).expect("a request");
        let args: Vec<&str> = request.args.iter().map(|arg| read::text(arg)).collect();
        assert_eq!(args[4], "1", "none asked: the cost alone");
        assert_eq!(args[9], "1 40");
        let reply = [0, 0, 4, 100, 7, 1, 0, 21, 500, 7, 1, 0, 20, 350];
        let outcome = decode_hit(&reply, &policies, &[0, 40]).expect("decoded");
        assert_eq!(outcome.decisions[1].used, 21);
        assert_eq!(
            outcome.ahead,
            [
                Ahead::default(),
                Ahead {
                    units: 20,
                    fresh_ms: 350
                }
            ]
        );
        assert!(
            decode_hit(&reply[..12], &policies, &[0, 40]).is_err(),
            "what it took is missing"
        );
    }

    #[test]
    fn a_hit_reply_of_another_shape_is_an_error() {
        let policies = [policy("a", 10)];
        for reply in [&[][..], &[0, 0, 1, 2, 3, 4], &[2, 0, 1, 2, 3, 4, 0]] {
            assert!(decode_hit(reply, &policies, &[]).is_err(), "{reply:?}");
        }
    }
}
