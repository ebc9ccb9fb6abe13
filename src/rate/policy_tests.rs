//! Tests of `policy.rs`; `policy` and `budget` build the policies other modules' tests use.

use super::*;

/// A sliding minute of requests.
pub fn policy(name: &str, limit: u64) -> RatePolicy {
    RatePolicy::new(name, limit, 60_000, Algorithm::SlidingWindow, Unit::Requests).unwrap()
}

/// A fixed minute of `unit`.
pub fn budget(name: &str, limit: u64, unit: Unit) -> RatePolicy {
    RatePolicy::new(name, limit, 60_000, Algorithm::FixedWindow, unit).unwrap()
}

#[test]
fn bad_policies_are_refused_clearly() {
    let err = |r: Result<RatePolicy, String>| r.unwrap_err();
    let fixed =
        |name, limit, window| RatePolicy::new(name, limit, window, Algorithm::FixedWindow, Unit::Requests);
    assert!(err(fixed("a b", 1, 1000)).contains("not valid"));
    assert!(err(fixed("a", 0, 1000)).contains("out of range"));
    assert!(err(fixed("a", 1, 5)).contains("per=0.005 s"));
    assert!(Unit::parse("bytes").unwrap_err().contains("unknown unit"));
    assert!(Algorithm::parse("leaky")
        .unwrap_err()
        .contains("unknown algorithm"));
    let twice = check_hit(&[policy("m", 5), policy("m", 9)], 1).unwrap_err();
    assert!(twice.contains("twice"));
    assert!(check_hit(&[policy("m", 5)], 6)
        .unwrap_err()
        .contains("never be allowed"));
    assert!(check_hit(&[], 1).is_err());
    assert!(check_hit(&[policy("m", 5), policy("d", 100)], 5).is_ok());
}

#[test]
fn limits_and_windows_are_accepted_exactly_within_their_bounds() {
    let sliding =
        |limit, window_ms| RatePolicy::new("p", limit, window_ms, Algorithm::SlidingWindow, Unit::Requests);
    assert!(sliding(1, MIN_WINDOW_MS).is_ok());
    assert!(sliding(MAX_LIMIT, MAX_WINDOW_MS).is_ok());
    assert!(sliding(MAX_LIMIT + 1, 60_000)
        .unwrap_err()
        .contains("use 1 to 1000000000000"));
    assert!(sliding(1, MIN_WINDOW_MS - 1)
        .unwrap_err()
        .contains("use 0.01 s to one year (31622400 s)"));
    assert!(sliding(1, MAX_WINDOW_MS + 1).is_err());
}

#[test]
fn a_name_is_one_to_64_letters_digits_underscores_dashes_or_dots() {
    assert!(check_name("tokens_per_day-v2.1").is_ok());
    assert!(check_name(&"n".repeat(64)).is_ok());
    for bad in ["", &"n".repeat(65), "a:b", "a/b", "é", "{tag}"] {
        assert!(
            check_name(bad).unwrap_err().contains("use 1 to 64 letters"),
            "{bad:?}"
        );
    }
}

#[test]
fn names_and_codes_of_algorithms_and_units_parse_back() {
    for algorithm in [Algorithm::SlidingWindow, Algorithm::FixedWindow] {
        assert_eq!(Algorithm::parse(algorithm.name()), Ok(algorithm));
    }
    let calendars = [Period::Day, Period::Week, Period::Month].map(Algorithm::Calendar);
    for calendar in calendars {
        assert_eq!(calendar.name(), "fixed_window");
    }
    let units = [
        Unit::Requests,
        Unit::Tokens,
        Unit::InputTokens,
        Unit::OutputTokens,
    ];
    for unit in units {
        assert_eq!(Unit::parse(unit.name()), Ok(unit));
    }
    // Codes tell counters apart in keys: no two alike.
    let codes: Vec<&str> = units.iter().map(|u| u.code()).collect();
    assert_eq!(codes, ["", "t", "i", "o"]);
    let mut codes: Vec<&str> = [Algorithm::SlidingWindow, Algorithm::FixedWindow]
        .into_iter()
        .chain(calendars)
        .map(Algorithm::code)
        .collect();
    codes.sort_unstable();
    codes.dedup();
    assert_eq!(codes.len(), 5, "no two algorithms share a code");
}

#[test]
fn a_calendar_window_lasts_up_to_its_longest_period_and_ends_at_the_boundary() {
    let month = RatePolicy::calendar("m", 5, Period::Month, Unit::Tokens).unwrap();
    assert_eq!(month.window_ms, 31 * 86_400_000);
    assert_eq!(month.per_text(), "UTC month");
    // 2027-01-31 12:00 UTC: half a day to 2027-02-01.
    let jan_31_noon = 1_801_396_800_000;
    assert_eq!(month.fixed_span_ms(jan_31_noon), 43_200_000);
    assert_eq!(policy("rpm", 5).per_text(), "60 s");
    assert_eq!(budget("tpm", 5, Unit::Tokens).fixed_span_ms(jan_31_noon), 60_000);
    let odd = RatePolicy::new("d", 5, 1_000, Algorithm::Calendar(Period::Day), Unit::Requests);
    assert!(odd.unwrap_err().contains("calendar window of a day"));
}

#[test]
fn only_a_request_rate_can_be_a_dry_run() {
    let dry = policy("rpm", 5).enforcing(false).unwrap();
    assert!(!dry.enforce);
    assert!(policy("rpm", 5).enforce, "enforced unless told");
    let error = budget("tpm", 1_000, Unit::Tokens).enforcing(false).unwrap_err();
    assert!(
        error.contains("enforce=False is for request rates only"),
        "{error}"
    );
    assert!(budget("tpm", 1_000, Unit::Tokens).enforcing(true).is_ok());
}

#[test]
fn a_unit_counts_its_share_of_a_streams_tokens() {
    assert_eq!(Unit::Requests.of(100, 20), 0);
    assert_eq!(Unit::Tokens.of(100, 20), 120);
    assert_eq!(Unit::InputTokens.of(100, 20), 100);
    assert_eq!(Unit::OutputTokens.of(100, 20), 20);
}

#[test]
fn a_reservation_is_checked_against_each_budget_and_named_in_the_error() {
    let policies = [policy("rpm", 10), budget("tpm", 1_000, Unit::Tokens)];
    assert!(check_costs(&policies, &[1, 1_000], "reserve").is_ok());
    let error = check_costs(&policies, &[1, 1_001], "reserve").unwrap_err();
    assert_eq!(
        error,
        "reserve=1001 is more than the limit of \"tpm\" (1000): it could never be allowed"
    );
}
