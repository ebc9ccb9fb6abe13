use std::collections::BTreeMap;

use super::*;
use crate::rate::{Ahead, Algorithm, Unit};

fn leasing(limit: u64, algorithm: Algorithm) -> RatePolicy {
    RatePolicy::new("api", limit, 1_000, algorithm, Unit::Requests)
        .and_then(|policy| policy.leasing(true))
        .expect("a policy")
}

/// The hit `serve` served, if it did.
fn served_by(
    leased: &LeasedUnits,
    keys: &[String],
    policies: &[RatePolicy],
    cost: u64,
    now: Instant,
) -> Option<HitOutcome> {
    match leased.serve(keys, policies, cost, now) {
        Serving::Served(outcome) => Some(outcome),
        Serving::Refilling(_) | Serving::Send(_) => None,
    }
}

/// The units a hit `serve` sends to the store asks for ahead (none when it waits for another's).
fn asked_by(leased: &LeasedUnits, keys: &[String], policies: &[RatePolicy], now: Instant) -> Vec<u64> {
    match leased.serve(keys, policies, 1, now) {
        Serving::Send(aheads) => aheads,
        Serving::Refilling(_) => Vec::new(),
        Serving::Served(_) => panic!("served: nothing to ask"),
    }
}

/// A counter seen at `t0` (a first hit, sent to the store) and its second hit 1 ms later, sent
/// asking for units ahead, answered with `ahead` of them fresh for `fresh_ms`.
fn holding(leased: &LeasedUnits, policy: &RatePolicy, ahead: u64, fresh_ms: u64, t0: Instant) {
    let (keys, policies) = (["k".to_owned()], [policy.clone()]);
    leased.keep(&keys, &policies, &[], &mut answered(policy, 1, 0, 0, 7), t0);
    let aheads = asked_by(leased, &keys, &policies, t0 + ms(1));
    let mut second = answered(policy, 2 + ahead, ahead, fresh_ms, 7);
    leased.keep(&keys, &policies, &aheads, &mut second, t0 + ms(1));
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// What a store answers a hit that took `ahead` units ahead, `used` in use after it.
fn answered(policy: &RatePolicy, used: u64, ahead: u64, fresh_ms: u64, slot: u64) -> HitOutcome {
    HitOutcome {
        decisions: vec![Decision::new(policy.clone(), used, 900, Bucket::of(slot, 1))],
        refused: None,
        ahead: vec![Ahead {
            units: ahead,
            fresh_ms,
        }],
    }
}

#[test]
fn an_identity_seen_once_is_counted_in_the_store_and_asks_nothing_ahead() {
    let leased = LeasedUnits::default();
    let (keys, policies, t0) = (
        ["k".to_owned()],
        [leasing(1_000, Algorithm::FixedWindow)],
        Instant::now(),
    );
    assert!(served_by(&leased, &keys, &policies, 1, t0).is_none());
    assert!(asked_by(&leased, &keys, &policies, t0).is_empty(), "cold: none");
    let plain = [RatePolicy {
        lease_units: false,
        ..policies[0].clone()
    }];
    assert!(asked_by(&leased, &keys, &plain, t0).is_empty());
    assert!(served_by(&leased, &keys, &plain, 1, t0).is_none());
}

#[test]
fn a_busy_identity_takes_units_ahead_and_is_served_here_until_they_run_out() {
    let leased = LeasedUnits::default();
    let policy = leasing(1_000, Algorithm::FixedWindow);
    let (keys, policies, t0) = (["k".to_owned()], [policy.clone()], Instant::now());
    let mut first = answered(&policy, 1, 0, 0, 7);
    assert!(leased.keep(&keys, &policies, &[], &mut first, t0).is_empty());
    // Its next hit 10 ms later: two hits in 10 ms, so 20 for the next 100 ms.
    let aheads = asked_by(&leased, &keys, &policies, t0 + ms(10));
    assert_eq!(aheads, [20]);
    assert!(
        asked_by(&leased, &keys, &policies, t0 + ms(10)).is_empty(),
        "asked already"
    );
    let mut second = answered(&policy, 22, 20, 500, 7);
    leased.keep(&keys, &policies, &aheads, &mut second, t0 + ms(10));
    let decision = &second.decisions[0];
    assert_eq!(
        (decision.used, decision.remaining),
        (22, 1_000 - 2),
        "taken, and the units held here this identity's to use"
    );
    for served in 1..=20 {
        let outcome = served_by(&leased, &keys, &policies, 1, t0 + ms(20)).expect("served here");
        assert_eq!(outcome.decisions[0].used, 22, "counted already");
        assert_eq!(outcome.decisions[0].remaining, 1_000 - 2 - served);
    }
    assert!(
        served_by(&leased, &keys, &policies, 1, t0 + ms(20)).is_none(),
        "none left"
    );
}

#[test]
fn a_hit_that_finds_units_asked_for_waits_for_that_answer_instead_of_a_round_trip() {
    let leased = LeasedUnits::default();
    let policy = leasing(1_000, Algorithm::FixedWindow);
    let (keys, policies, t0) = (["k".to_owned()], [policy.clone()], Instant::now());
    leased.keep(&keys, &policies, &[], &mut answered(&policy, 1, 0, 0, 7), t0);
    let aheads = asked_by(&leased, &keys, &policies, t0 + ms(10));
    let Serving::Refilling(refilled) = leased.serve(&keys, &policies, 1, t0 + ms(11)) else {
        panic!("a call in flight asked for units: wait for it");
    };
    assert!(!refilled.has_changed().expect("told"));
    leased.keep(
        &keys,
        &policies,
        &aheads,
        &mut answered(&policy, 22, 20, 500, 7),
        t0 + ms(10),
    );
    assert!(refilled.has_changed().expect("told"), "its answer is told");
    assert!(served_by(&leased, &keys, &policies, 1, t0 + ms(12)).is_some());

    let failing = LeasedUnits::default();
    failing.keep(&keys, &policies, &[], &mut answered(&policy, 1, 0, 0, 7), t0);
    let aheads = asked_by(&failing, &keys, &policies, t0 + ms(10));
    let Serving::Refilling(refilled) = failing.serve(&keys, &policies, 1, t0 + ms(11)) else {
        panic!("a call in flight asked for units: wait for it");
    };
    failing.unasked(&keys, &aheads);
    assert!(refilled.has_changed().expect("told"), "a failed call is told too");
    assert!(
        matches!(failing.serve(&keys, &policies, 1, t0 + ms(12)), Serving::Send(_)),
        "nothing asked any more: to the store"
    );
}

#[test]
fn units_are_served_only_while_their_bucket_is_current() {
    let leased = LeasedUnits::default();
    let policy = leasing(1_000, Algorithm::SlidingWindow);
    let (keys, policies, t0) = (["k".to_owned()], [policy.clone()], Instant::now());
    holding(&leased, &policy, 50, 30, t0);
    assert!(served_by(&leased, &keys, &policies, 1, t0 + ms(30)).is_some());
    assert!(
        served_by(&leased, &keys, &policies, 1, t0 + ms(31)).is_none(),
        "its slice has ended"
    );
    let (given_back, left) = leased.give_back_idle(t0 + ms(31));
    assert_eq!(left, 1);
    let given: Vec<(u64, Option<Bucket>)> = given_back.iter().map(|a| (a.tokens, a.refund_from)).collect();
    assert_eq!(
        given,
        [(49, Bucket::of(7, 1))],
        "a past slice still counts: given back there"
    );
}

#[test]
fn a_slab_never_holds_more_than_a_tenth_of_the_limit_however_many_calls_ask() {
    let leased = LeasedUnits::default();
    let policy = leasing(100, Algorithm::FixedWindow);
    let (keys, policies, t0) = (["k".to_owned()], [policy.clone()], Instant::now());
    leased.keep(&keys, &policies, &[], &mut answered(&policy, 1, 0, 0, 7), t0);
    let asked: u64 = (0..64)
        .map(|_| {
            asked_by(&leased, &keys, &policies, t0 + ms(1))
                .first()
                .copied()
                .unwrap_or(0)
        })
        .sum();
    assert_eq!(asked, 10);
    leased.unasked(&keys, &[10]);
    assert_eq!(
        asked_by(&leased, &keys, &policies, t0 + ms(1)),
        [10],
        "a failed call asked nothing"
    );
}

#[test]
fn unused_units_go_back_when_idle_and_at_close_but_not_to_a_fixed_window_that_ended() {
    let leased = LeasedUnits::default();
    let policy = leasing(1_000, Algorithm::FixedWindow);
    let (keys, policies, t0) = (["k".to_owned()], [policy.clone()], Instant::now());
    holding(&leased, &policy, 50, 5_000, t0);
    served_by(&leased, &keys, &policies, 1, t0 + ms(2)).expect("served");
    let (nothing, _) = leased.give_back_idle(t0 + ms(500));
    assert!(nothing.is_empty(), "not idle yet");
    let (given_back, left) = leased.give_back_idle(t0 + ms(2) + IDLE);
    assert_eq!((given_back.len(), given_back[0].tokens, left), (1, 49, 0));

    let closing = LeasedUnits::default();
    holding(&closing, &policy, 50, 100, t0);
    assert_eq!(closing.give_back_all(t0 + ms(50))[0].tokens, 50);
    holding(&closing, &policy, 50, 100, t0);
    assert!(
        closing.give_back_all(t0 + ms(200)).is_empty(),
        "its window has ended"
    );
}

/// A store that counts as `lua/prelude/rates.lua` does, on a fixed window of 1 s: a hit takes
/// its cost and up to half the room it leaves ahead.
struct Store {
    limit: u64,
    used: BTreeMap<u64, u64>,
}

impl Store {
    fn hit(&mut self, policy: &RatePolicy, ahead: u64, at_ms: u64) -> HitOutcome {
        let window = at_ms / 1_000;
        let used = self.used.entry(window).or_default();
        let fresh_ms = (window + 1) * 1_000 - at_ms;
        if *used + 1 > self.limit {
            let mut refused = answered(policy, *used, 0, 0, 0);
            refused.refused = Some((0, fresh_ms));
            return refused;
        }
        let taken = ahead.min((self.limit - *used - 1) / 2);
        *used += 1 + taken;
        answered(policy, *used, taken, fresh_ms, window + 1)
    }
}

/// What happens to a hit in the simulation below: it arrives at its process, its call (sent at
/// `sent` ms, asking `aheads`) reaches the store, the store's answer comes back.
enum Step {
    Arrives,
    Reaches {
        aheads: Vec<u64>,
        sent: u64,
    },
    Answered {
        aheads: Vec<u64>,
        answer: HitOutcome,
        sent: u64,
    },
}

/// Processes hitting one identity at random times, each call to the store taking a random
/// time there and back: no unit is served outside the window it was counted in, and no window
/// serves more than the limit.
#[test]
fn randomized_hits_from_many_processes_never_serve_more_than_the_limit_in_a_window() {
    let mut seed = 0x9E37_79B9_7F4A_7C15_u64;
    let mut random = move |below: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % below
    };
    for round in 0..20 {
        let limit = 20 + random(2_000);
        let policy = leasing(limit, Algorithm::FixedWindow);
        let (keys, policies) = (["k".to_owned()], [policy.clone()]);
        let processes: Vec<LeasedUnits> = (0..1 + random(4)).map(|_| LeasedUnits::default()).collect();
        let mut store = Store {
            limit,
            used: BTreeMap::new(),
        };
        let t0 = Instant::now();
        // By time in ms (then in the order made): which process, and what happens.
        let mut events: BTreeMap<(u64, u64), (usize, Step)> = BTreeMap::new();
        let mut order = 0;
        for _ in 0..500 + random(3_000) {
            order += 1;
            let process = random(processes.len() as u64) as usize;
            events.insert((random(4_000), order), (process, Step::Arrives));
        }
        let mut served: BTreeMap<u64, u64> = BTreeMap::new();
        let mut served_here = 0;
        let mut waiting = vec![0; processes.len()];
        while let Some(((at, _), (p, step))) = events.pop_first() {
            let leased = &processes[p];
            order += 1;
            match step {
                Step::Arrives => match leased.serve(&keys, &policies, 1, t0 + ms(at)) {
                    Serving::Served(here) => {
                        let counted_in = here.decisions[0].bucket.expect("a bucket").slot - 1;
                        assert_eq!(counted_in, at / 1_000, "round {round}: served outside its window");
                        assert!(here.decisions[0].used <= limit);
                        *served.entry(at / 1_000).or_default() += 1;
                        served_here += 1;
                    }
                    Serving::Refilling(_) => waiting[p] += 1,
                    Serving::Send(aheads) => {
                        events.insert((at + random(3), order), (p, Step::Reaches { aheads, sent: at }));
                    }
                },
                Step::Reaches { aheads, sent } => {
                    let answer = store.hit(&policy, aheads.first().copied().unwrap_or(0), at);
                    if answer.refused.is_none() {
                        *served.entry(at / 1_000).or_default() += 1;
                    }
                    let answered = Step::Answered { aheads, answer, sent };
                    events.insert((at + random(3), order), (p, answered));
                }
                Step::Answered {
                    aheads,
                    mut answer,
                    sent,
                } => {
                    leased.keep(&keys, &policies, &aheads, &mut answer, t0 + ms(sent));
                    // The hits that waited for an answer try again.
                    for _ in 0..std::mem::take(&mut waiting[p]) {
                        order += 1;
                        events.insert((at, order), (p, Step::Arrives));
                    }
                }
            }
        }
        let allowed: u64 = served.values().sum();
        assert!(
            served_here * 3 > allowed * 2,
            "round {round}: {served_here} of {allowed} served here"
        );
        for (window, count) in &served {
            let counted = store.used.get(window).copied().unwrap_or(0);
            assert!(
                *count <= counted && counted <= limit,
                "round {round}: window {window} served {count}, counted {counted}, limit {limit}"
            );
        }
    }
}
