use super::*;
use std::collections::HashMap;

use crate::rate::{Period, Unit, MAX_WINDOW_MS};

fn policy(name: &str, limit: u64, algorithm: Algorithm) -> RatePolicy {
    RatePolicy::new(name, limit, 60_000, algorithm, Unit::Requests).unwrap()
}

/// A seeded random number below its argument (a linear congruential generator).
fn random_from(mut seed: u64) -> impl FnMut(u64) -> u64 {
    move |below: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % below
    }
}

/// Hits at random times never put more than the limit in any window (the sliding window's
/// promise), and a refusal's retry time is when the hit would really fit.
#[test]
fn no_window_ever_holds_more_than_the_limit() {
    let mut random = random_from(0x5eed);
    for _ in 0..20 {
        let limit = 1 + random(20);
        let window = 10 * (1 + random(100));
        let policy = RatePolicy::new("p", limit, window, Algorithm::SlidingWindow, Unit::Requests).unwrap();
        let mut counters = RateCounters::default();
        let keys = ["k".to_owned()];
        let mut now = MAX_WINDOW_MS;
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        for _ in 0..2000 {
            now += random(window / 4 + 1);
            let cost = 1 + random(limit);
            let outcome = counters.hit_at(now, &keys, std::slice::from_ref(&policy), &[cost], true);
            match outcome.refused {
                None => admitted.push((now, cost)),
                Some((_, retry)) => assert!(retry > 0 && retry <= window + window / SLICES),
            }
            let in_window: u64 = admitted
                .iter()
                .filter(|(at, _)| *at + window > now)
                .map(|(_, cost)| cost)
                .sum();
            assert!(in_window <= limit, "{in_window} > {limit} in {window} ms");
        }
    }
}

/// A calendar day's counter ends at midnight UTC, whenever its first hit came: a hit one
/// minute before midnight is reset a minute later, in a new window.
#[test]
fn a_calendar_day_ends_at_midnight_utc_not_a_day_after_its_first_hit() {
    let mut counters = RateCounters::default();
    let day = RatePolicy::calendar("day", 2, crate::rate::Period::Day, Unit::Requests).unwrap();
    let keys = ["k".to_owned()];
    let policies = std::slice::from_ref(&day);
    // A hit `after` ms past 2026-12-02 23:59 UTC (the store's first call), of `cost`.
    let mut hit = |after: u64, cost: u64| {
        counters.unix_ms = 1_796_255_940_000 + after;
        counters.hit_at(MAX_WINDOW_MS + after, &keys, policies, &[cost], true)
    };
    let first = hit(0, 2);
    assert_eq!((first.refused, first.decisions[0].reset_ms), (None, 60_000));
    let full = hit(59_999, 1);
    assert_eq!(full.refused, Some((0, 1)), "full until midnight, 1 ms away");
    let next_day = hit(60_000, 1);
    assert_eq!(next_day.refused, None);
    assert_eq!(
        next_day.decisions[0].reset_ms, 86_400_000,
        "the new day ends at the next midnight"
    );
}

/// Hits at random times across real UTC boundaries (the days around a year's end, the Monday
/// midnights of twelve weeks, the months of a leap year) on the wall clock: no calendar period ever
/// counts more than the limit, a hit is refused only when its period is full (each period starts
/// with a fresh allowance, at its boundary), and `reset` is the time left to the boundary.
#[test]
fn no_calendar_period_ever_counts_more_than_the_limit() {
    let mut random = random_from(0xca1e);
    let hour = 3_600_000;
    // 2026-12-31 22:00, 2026-12-06 12:00 (a Sunday), 2027-12-15 00:00 UTC.
    for (period, start, step) in [
        (Period::Day, 1_798_754_400_000, hour / 6),
        (Period::Week, 1_796_558_400_000, 2 * hour),
        (Period::Month, 1_828_828_800_000, 8 * hour),
    ] {
        let limit = 1 + random(30);
        let policy = RatePolicy::calendar("p", limit, period, Unit::Requests).unwrap();
        let mut counters = RateCounters::default();
        let keys = ["k".to_owned()];
        let (mut unix_ms, mut now) = (start, MAX_WINDOW_MS);
        let mut used: HashMap<u64, u64> = HashMap::new(); // period end -> units counted in it
        for _ in 0..2000 {
            let elapsed = random(step);
            (unix_ms, now) = (unix_ms + elapsed, now + elapsed);
            counters.unix_ms = unix_ms;
            let cost = 1 + random(limit);
            let outcome = counters.hit_at(now, &keys, std::slice::from_ref(&policy), &[cost], true);
            let end = period.next_boundary(unix_ms);
            let in_period = used.entry(end).or_default();
            match outcome.refused {
                None => {
                    *in_period += cost;
                    assert_eq!(
                        outcome.decisions[0].reset_ms,
                        end - unix_ms,
                        "reset at the boundary"
                    );
                }
                Some((_, retry)) => {
                    assert!(*in_period + cost > limit, "refused with room in the {period:?}");
                    assert_eq!(retry, end - unix_ms, "retry at the boundary");
                }
            }
            assert!(
                *in_period <= limit,
                "{in_period} > {limit} in the {period:?} to {end}"
            );
        }
        assert!(used.len() > 4, "the hits ran across {period:?} boundaries");
    }
}

#[test]
fn a_refused_hit_consumes_from_no_policy() {
    let mut counters = RateCounters::default();
    let minute = policy("minute", 5, Algorithm::SlidingWindow);
    let day = policy("day", 3, Algorithm::FixedWindow);
    let keys = ["m".to_owned(), "d".to_owned()];
    let both = [minute.clone(), day.clone()];
    for left in (0..3).rev() {
        let outcome = counters.hit(&keys, &both, &[1, 1], true);
        assert_eq!(outcome.refused, None);
        assert_eq!(outcome.decisions[1].remaining, left);
    }
    let outcome = counters.hit(&keys, &both, &[1, 1], true);
    let (index, retry) = outcome.refused.unwrap();
    assert_eq!(index, 1);
    assert!(retry > 59_000 && retry <= 60_000, "{retry}");
    assert_eq!(outcome.decisions[0].remaining, 2, "the minute lost nothing");
    let alone = counters.hit(&keys[..1], &both[..1], &[2], true);
    assert_eq!((alone.refused, alone.decisions[0].remaining), (None, 0));
    counters.reset(&keys);
    assert_eq!(
        counters.hit(&keys, &both, &[0, 0], false).decisions[0].remaining,
        5
    );
}

#[test]
fn a_dry_run_counts_past_its_limit_and_never_refuses_while_an_enforced_policy_does() {
    let mut counters = RateCounters::default();
    let dry = policy("dry", 2, Algorithm::SlidingWindow)
        .enforcing(false)
        .unwrap();
    let enforced = policy("enforced", 4, Algorithm::FixedWindow);
    let keys = ["d".to_owned(), "e".to_owned()];
    let both = [dry, enforced];
    let over: Vec<(Option<usize>, u64, bool)> = (0..5)
        .map(|_| {
            let outcome = counters.hit(&keys, &both, &[1, 1], true);
            let dry = &outcome.decisions[0];
            (outcome.refused.map(|(i, _)| i), dry.used, dry.would_refuse)
        })
        .collect();
    assert_eq!(
        over,
        [
            (None, 1, false),
            (None, 2, false),
            (None, 3, true),
            (None, 4, true),
            (Some(1), 4, true),
        ],
        "the dry run counts every allowed hit; only the enforced policy refuses"
    );
}
