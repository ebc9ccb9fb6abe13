//! Request-rate policies: at most `limit` units per window, counted per identity, every policy
//! of one hit decided together (Redis: `lua/hit.lua`; one process: `backend/memory.rs`).

use std::ops::Range;
use std::sync::Arc;

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
            Algorithm::FixedWindow => "fixed_window",
        }
    }

    /// Its code in `lua/hit.lua` and in keys.
    pub fn code(self) -> &'static str {
        match self {
            Algorithm::SlidingWindow => "s",
            Algorithm::FixedWindow => "f",
        }
    }
}

/// What a policy counts: requests (hits, stream starts), or an LLM's tokens (a budget, see
/// `budget.rs`): all of them, or only the prompt's or only the answer's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    Requests,
    Tokens,
    InputTokens,
    OutputTokens,
}

impl Unit {
    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "requests" => Ok(Unit::Requests),
            "tokens" => Ok(Unit::Tokens),
            "input_tokens" => Ok(Unit::InputTokens),
            "output_tokens" => Ok(Unit::OutputTokens),
            other => Err(format!(
                "unknown unit {other:?}: use \"requests\" (the default), \"tokens\", \"input_tokens\" or \"output_tokens\""
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Unit::Requests => "requests",
            Unit::Tokens => "tokens",
            Unit::InputTokens => "input_tokens",
            Unit::OutputTokens => "output_tokens",
        }
    }

    /// Its code in keys (none for requests, the first unit keys had).
    pub fn code(self) -> &'static str {
        match self {
            Unit::Requests => "",
            Unit::Tokens => "t",
            Unit::InputTokens => "i",
            Unit::OutputTokens => "o",
        }
    }

    /// Tokens of a stream this unit counts, of `input` prompt and `output` answer tokens.
    pub fn of(self, input: u64, output: u64) -> u64 {
        match self {
            Unit::Requests => 0,
            Unit::Tokens => input + output,
            Unit::InputTokens => input,
            Unit::OutputTokens => output,
        }
    }
}

/// One policy: a name (its scope, part of the key), a limit per window, an algorithm, and what
/// it counts.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RatePolicy {
    pub name: Arc<str>,
    pub limit: u64,
    pub window_ms: u64,
    pub algorithm: Algorithm,
    pub unit: Unit,
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
        Ok(RatePolicy {
            name: name.into(),
            limit,
            window_ms,
            algorithm,
            unit,
        })
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
                "rate limit {:?} is given twice in one call: give each policy its own name",
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

/// One stream's top-up of its token budgets (`budget/`), sent every round while it streams:
/// first, what `give_back[i]` lists is given back to `policies[i]` (`keys[i]` counts it): the
/// reservation of the tokens streamed since the last round, and a roll's; then the `moved`
/// tokens (streamed since the last round) are taken in the current bucket whatever the room,
/// so each token counts in the window of the time it streamed; then `want` more, as many as
/// every policy has room for, or all of them if `forced`.
pub struct TopUp {
    pub keys: Vec<String>,
    pub policies: Vec<RatePolicy>,
    pub give_back: Vec<Vec<(Bucket, u64)>>,
    pub moved: u64,
    pub want: u64,
    pub forced: bool,
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

/// What a top-up got: `granted` tokens (beyond the `moved` ones), the `room` its budgets have
/// left after it (the least of them), and per policy (in order; None when nothing was taken)
/// the bucket its share went to and for how many more ms, on the server's clock, that bucket
/// counts in the window.
#[derive(Debug, Clone, PartialEq)]
pub struct ToppedUp {
    pub granted: u64,
    pub room: u64,
    pub buckets: Vec<Option<(Bucket, u64)>>,
}

/// One change to a budget's counter when a stream is settled.
#[derive(Debug, Clone)]
pub struct Adjustment {
    pub key: String,
    pub policy: RatePolicy,
    pub tokens: u64,
    /// None: charge `tokens` now; else give back up to `tokens` from this bucket, while it
    /// still counts.
    pub refund_from: Option<Bucket>,
}

/// The changes that settle one stream (or give back late top-ups), applied at most once: a
/// call whose answer was lost is sent again, and the store recognises `id` (see `settle.lua`).
#[derive(Debug, Clone)]
pub struct Settlement {
    pub id: String,
    pub adjustments: Vec<Adjustment>,
}

impl Settlement {
    /// The refunds of a grant nobody took (`lease_id`'s), applied at most once like a
    /// settlement, under an id of their own: the lease's own settlement gives back its budgets'
    /// reservation, these its request-rate units or, for a grant never answered to its caller,
    /// everything.
    pub fn untaken(lease_id: &str, refunds: Vec<Adjustment>) -> Self {
        Settlement {
            id: format!("{lease_id}:untaken"),
            adjustments: refunds,
        }
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
}

impl Decision {
    pub fn new(policy: RatePolicy, used: u64, reset_ms: u64, bucket: Option<Bucket>) -> Self {
        Decision {
            remaining: policy.limit.saturating_sub(used),
            policy,
            used,
            reset_ms,
            bucket,
        }
    }
}

/// The answer to one hit: every policy's decision, and the first that refused, if any.
#[derive(Debug, Clone, PartialEq)]
pub struct HitOutcome {
    pub decisions: Vec<Decision>,
    /// Index (into `decisions`) of the first policy that refused, and when the cost fits again.
    pub refused: Option<(usize, u64)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(name: &str, limit: u64) -> RatePolicy {
        RatePolicy::new(name, limit, 60_000, Algorithm::SlidingWindow, Unit::Requests).unwrap()
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
}
