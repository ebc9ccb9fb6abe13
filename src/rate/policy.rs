//! What a rate policy is (a name, a limit per window, an algorithm, what it counts) and the
//! checks of the policies a call names.

use std::sync::Arc;

pub use super::calendar::Period;
use super::Thresholds;

/// Largest limit: counts stay exact as Lua numbers (doubles) far beyond it.
pub const MAX_LIMIT: u64 = 1_000_000_000_000;
/// Windows from 10 ms (ten 1 ms slices) to a leap year.
pub const MIN_WINDOW_MS: u64 = 10;
pub const MAX_WINDOW_MS: u64 = 366 * 24 * 3600 * 1000;
/// Slices of a sliding window (`lua/hit.lua`): every slice that overlaps the last window counts.
pub const SLICES: u64 = 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// No window of `per` seconds ever holds more than the limit (the default).
    SlidingWindow,
    /// The article's counter: a window starts with its first hit and ends `per` seconds later.
    FixedWindow,
    /// A fixed window from one UTC calendar boundary to the next (`calendar.rs`).
    Calendar(Period),
}

impl Algorithm {
    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "sliding_window" => Ok(Algorithm::SlidingWindow),
            "fixed_window" => Ok(Algorithm::FixedWindow),
            other => Err(format!(
                "unknown algorithm {other:?}: use \"sliding_window\" (the default) or \"fixed_window\""
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Algorithm::SlidingWindow => "sliding_window",
            // A calendar window is a fixed window; its period is in `per`.
            Algorithm::FixedWindow | Algorithm::Calendar(_) => "fixed_window",
        }
    }

    /// Its code in `lua/hit.lua` and in keys.
    pub fn code(self) -> &'static str {
        match self {
            Algorithm::SlidingWindow => "s",
            Algorithm::FixedWindow => "f",
            Algorithm::Calendar(period) => period.code(),
        }
    }
}

/// What a policy counts: requests (hits, stream starts), or an LLM's tokens (a budget, see
/// `budget/`): all of them, or only the prompt's or only the answer's, or their cost in a unit
/// of money the app chooses, from a price table (`budget/price.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    Requests,
    Tokens,
    InputTokens,
    OutputTokens,
    Cost,
}

impl Unit {
    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "requests" => Ok(Unit::Requests),
            "tokens" => Ok(Unit::Tokens),
            "input_tokens" => Ok(Unit::InputTokens),
            "output_tokens" => Ok(Unit::OutputTokens),
            "cost" => Ok(Unit::Cost),
            other => Err(format!(
                "unknown unit {other:?}: use \"requests\" (the default), \"tokens\", \"input_tokens\", \"output_tokens\" or \"cost\" (money, from a price table)"
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Unit::Requests => "requests",
            Unit::Tokens => "tokens",
            Unit::InputTokens => "input_tokens",
            Unit::OutputTokens => "output_tokens",
            Unit::Cost => "cost",
        }
    }

    /// Its code in keys (none for requests: a request rate's key carries no unit code).
    pub fn code(self) -> &'static str {
        match self {
            Unit::Requests => "",
            Unit::Tokens => "t",
            Unit::InputTokens => "i",
            Unit::OutputTokens => "o",
            Unit::Cost => "c",
        }
    }

    /// Tokens of a stream this unit counts, of `input` prompt and `output` answer tokens (none
    /// for a cost budget: its units come from a price, `budget::units_of`).
    pub fn of(self, input: u64, output: u64) -> u64 {
        match self {
            Unit::Requests | Unit::Cost => 0,
            Unit::Tokens => input + output,
            Unit::InputTokens => input,
            Unit::OutputTokens => output,
        }
    }
}

/// One policy: a name (its scope, part of the key), a limit per window, an algorithm, what it
/// counts, and whether it refuses (`enforce`; a dry run only counts and reports).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RatePolicy {
    pub name: Arc<str>,
    pub limit: u64,
    pub window_ms: u64,
    pub algorithm: Algorithm,
    pub unit: Unit,
    /// False: a dry run, counted and reported (`Decision::would_refuse`) but never refusing.
    pub enforce: bool,
    /// The thresholds of its limit at which an identity's use is told while the app listens
    /// (its own or else the manager's `alert_at`, set by the manager; empty as the app builds it).
    pub alert_at: Thresholds,
    /// The thresholds the app gave this policy (`RateLimit(alert_at=...)`), which it alerts at
    /// in place of the manager's (none: silent); None: the manager's.
    pub own_alert_at: Option<Thresholds>,
}

impl RatePolicy {
    pub fn new(
        name: &str,
        limit: u64,
        window_ms: u64,
        algorithm: Algorithm,
        unit: Unit,
    ) -> Result<Self, String> {
        check_name(name)?;
        if limit == 0 || limit > MAX_LIMIT {
            return Err(format!(
                "rate limit {name:?}: limit={limit} is out of range: use 1 to {MAX_LIMIT} (to block everyone, refuse the route itself)"
            ));
        }
        if !(MIN_WINDOW_MS..=MAX_WINDOW_MS).contains(&window_ms) {
            return Err(format!(
                "rate limit {name:?}: per={} s is out of range: use 0.01 s to one year ({} s)",
                window_ms as f64 / 1000.0,
                MAX_WINDOW_MS / 1000
            ));
        }
        if let Algorithm::Calendar(period) = algorithm {
            if window_ms != period.longest_ms() {
                return Err(format!(
                    "rate limit {name:?}: a calendar window of a {} lasts up to {} ms, not {window_ms}",
                    period.name(),
                    period.longest_ms()
                ));
            }
        }
        Ok(RatePolicy {
            name: name.into(),
            limit,
            window_ms,
            algorithm,
            unit,
            enforce: true,
            alert_at: Thresholds::default(),
            own_alert_at: None,
        })
    }

    /// A policy per UTC calendar `period`: a fixed window from one boundary to the next.
    pub fn calendar(name: &str, limit: u64, period: Period, unit: Unit) -> Result<Self, String> {
        RatePolicy::new(
            name,
            limit,
            period.longest_ms(),
            Algorithm::Calendar(period),
            unit,
        )
    }

    /// Its window in words: "60 s", or "UTC day" for a calendar window.
    pub fn per_text(&self) -> String {
        match self.algorithm {
            Algorithm::Calendar(period) => format!("UTC {}", period.name()),
            _ => format!("{} s", self.window_ms as f64 / 1000.0),
        }
    }

    /// ms from `unix_ms` (wall-clock time) until a fixed window that starts then would end.
    pub fn fixed_span_ms(&self, unix_ms: u64) -> u64 {
        match self.algorithm {
            Algorithm::Calendar(period) => period.next_boundary(unix_ms) - unix_ms,
            _ => self.window_ms,
        }
    }

    /// The same policy as a dry run when `enforce` is false. Only request rates can be dry runs:
    /// a token budget's reservation, top-ups and cut-off all rest on its refusals.
    pub fn enforcing(self, enforce: bool) -> Result<Self, String> {
        if !enforce && self.unit != Unit::Requests {
            return Err(format!(
                "rate limit {:?}: enforce=False is for request rates only; a budget of {} always enforces (roll it out with a limit high enough, then lower it)",
                &*self.name,
                self.unit.name()
            ));
        }
        Ok(RatePolicy { enforce, ..self })
    }
}

/// Policy names key the counters and appear in headers: short, and plain.
fn check_name(name: &str) -> Result<(), String> {
    let valid = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c));
    if valid {
        Ok(())
    } else {
        Err(format!(
            "rate limit name {name:?} is not valid: use 1 to 64 letters, digits, '_', '-' or '.'"
        ))
    }
}

/// Checks the policies of one hit: at least one, no name twice, a cost each can ever allow.
pub fn check_hit(policies: &[RatePolicy], cost: u64) -> Result<(), String> {
    check_costs(policies, &vec![cost; policies.len()], "cost")
}

/// Checks policies and what each is to take (`costs[i]` from `policies[i]`, called `what` in
/// the error): at least one policy, no name twice, each cost one its policy can ever allow.
pub fn check_costs(policies: &[RatePolicy], costs: &[u64], what: &str) -> Result<(), String> {
    if policies.is_empty() {
        return Err("pass at least one RateLimit".into());
    }
    for (i, (policy, cost)) in policies.iter().zip(costs).enumerate() {
        if policies[..i].iter().any(|p| p.name == policy.name) {
            return Err(format!(
                "rate limit {:?} is given twice in one call: give each policy its own name (each level its own: \"team_tokens\", \"user_tokens\"), as decisions, headers and usage() name them",
                policy.name
            ));
        }
        if *cost > policy.limit {
            return Err(format!(
                "{what}={cost} is more than the limit of {:?} ({}): it could never be allowed",
                policy.name, policy.limit
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
pub(super) mod tests {
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
        let fixed = |name, limit, window| {
            RatePolicy::new(name, limit, window, Algorithm::FixedWindow, Unit::Requests)
        };
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
        let sliding = |limit, window_ms| {
            RatePolicy::new("p", limit, window_ms, Algorithm::SlidingWindow, Unit::Requests)
        };
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
}
