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
    /// Each process takes units of this policy ahead of its hits, and serves hits from them
    /// without a round trip (`leased_units.rs`); false: every hit is counted in the store.
    pub lease_units: bool,
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
            lease_units: false,
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

    /// The same policy, leasing its units to each process when `lease_units` is true. Only
    /// request rates lease units: a token budget's units are reserved and settled per stream.
    pub fn leasing(self, lease_units: bool) -> Result<Self, String> {
        if lease_units && self.unit != Unit::Requests {
            return Err(format!(
                "rate limit {:?}: lease_units=True is for request rates only; a budget of {} reserves its tokens per stream",
                &*self.name,
                self.unit.name()
            ));
        }
        Ok(RatePolicy { lease_units, ..self })
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
#[path = "policy_tests.rs"]
pub(super) mod tests;
