//! One error enum for the core. The binding turns it into the Python exception hierarchy
//! (`py/errors.rs`); the Redis backend maps redis-rs errors into it (`backend/redis/connection.rs`).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::keys::PER_USER;
use crate::rate::{HitOutcome, StartError, TooLarge, Unit};

/// Which pool refused an acquire, with what it saw.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejection {
    /// Pool name as users see it: `"per_user"`, `"global"` or a resource's name.
    pub limit: Arc<str>,
    pub capacity: u64,
    pub current: u64,
    pub retry_after_ms: u64,
    /// Whether `capacity` and `current` may be told to the client (`Config::disclose_usage`).
    pub usage_shown: bool,
}

#[derive(Debug, Clone)]
pub enum CoreError {
    /// A pool is full.
    Rejected(Rejection),
    /// A pool's line holds `max_waiting` waiters (`capacity`) already (`current`: waiting);
    /// `displaced`: the waiter had a place there, which went to another user's first waiter.
    LineFull { full: Rejection, displaced: bool },
    /// A request-rate policy refused (nothing was consumed anywhere); `refused` is set.
    RateLimited(HitOutcome),
    /// A stream's reservation is more than a budget's whole limit: it could never be admitted.
    ReservationTooLarge(TooLarge),
    /// A stream ran out of token budget (the policy's name) under `on_budget="cut"`.
    BudgetExhausted(String),
    /// An operator banned the user's streams (`revoke`) for this many ms more.
    Banned(u64),
    /// Redis did not answer (in time): the call may have run there.
    Unavailable(String),
    /// The call never left this process (no connection, the breaker open): it did not run.
    Unreached(String),
    /// Redis answered, but with an error (authentication, wrong type, read-only replica, ...).
    Backend(String),
    /// The caller passed a bad value (wrong types are reported by the binding before this).
    InvalidInput(String),
    /// `aclose()` was called on the manager.
    Closed,
    /// The API was used in a way that cannot work (a manager used across a fork).
    Misuse(String),
    /// A bug: a Rust panic caught at the bridge so the Python future is still resolved.
    Panic(String),
}

impl From<StartError> for CoreError {
    fn from(error: StartError) -> Self {
        match error {
            StartError::Invalid(message) => CoreError::InvalidInput(message),
            StartError::TooLarge(too_large) => CoreError::ReservationTooLarge(too_large),
        }
    }
}

impl fmt::Display for CoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CoreError::Rejected(r) if r.usage_shown => write!(
                f,
                "{} stream limit reached ({} of {} in use); retry in {} s",
                r.limit,
                r.current,
                r.capacity,
                retry_after_seconds(r.retry_after_ms)
            ),
            CoreError::Rejected(r) => write!(
                f,
                "{} stream limit reached; retry in {} s",
                r.limit,
                retry_after_seconds(r.retry_after_ms)
            ),
            CoreError::LineFull { full: r, displaced } => write!(
                f,
                "{}the line for {} is full ({} waiting, max_waiting={}); retry in {} s",
                if *displaced {
                    "this request's place in line went to another user's first waiter, as its user had the most places there: "
                } else {
                    ""
                },
                r.limit,
                r.current,
                r.capacity,
                retry_after_seconds(r.retry_after_ms)
            ),
            CoreError::RateLimited(outcome) => {
                let (index, retry_ms) = outcome.refused.unwrap_or_default();
                match outcome.decisions.get(index) {
                    Some(d) if d.policy.unit != Unit::Requests => write!(
                        f,
                        "{} {:?} cannot cover the stream's reservation ({} of {} {} per {} left); retry in {} s",
                        budget_kind(d.policy.unit),
                        &*d.policy.name,
                        d.remaining,
                        d.policy.limit,
                        budget_units(d.policy.unit),
                        d.policy.per_text(),
                        retry_after_seconds(retry_ms)
                    ),
                    Some(d) => write!(
                        f,
                        "rate limit {:?} reached ({} per {}); retry in {} s",
                        &*d.policy.name,
                        d.policy.limit,
                        d.policy.per_text(),
                        retry_after_seconds(retry_ms)
                    ),
                    None => f.write_str("rate limit reached"),
                }
            }
            CoreError::ReservationTooLarge(t) => write!(
                f,
                "the stream's reservation ({} prompt and {} answer tokens) takes {} {} of {} {:?}, more than its whole limit of {} per {}: it could never be admitted, however long the client waits; ask for fewer tokens (a smaller max_tokens)",
                t.input,
                t.output,
                t.units,
                budget_units(t.budget.unit),
                budget_kind(t.budget.unit),
                &*t.budget.name,
                t.budget.limit,
                t.budget.per_text()
            ),
            CoreError::BudgetExhausted(policy) => write!(
                f,
                "budget {policy:?} ran out during the stream: it was cut after its last item (on_budget=\"cut\"); the next stream is admitted once the budget's window frees room"
            ),
            CoreError::Banned(ms_left) => write!(
                f,
                "this user's streams were ended by the service's operator, and new ones are refused for {} s more",
                retry_after_seconds(*ms_left)
            ),
            CoreError::Unavailable(m)
            | CoreError::Unreached(m)
            | CoreError::Backend(m)
            | CoreError::InvalidInput(m)
            | CoreError::Misuse(m) => f.write_str(m),
            CoreError::Closed => f.write_str(
                "this StreamLeaseManager is shutting down (drain() or aclose() was called): the request should go to another worker; an app builds a new manager in each lifespan",
            ),
            CoreError::Panic(m) => write!(f, "internal error in fastapi_stream_lease's core (please report it): {m}"),
        }
    }
}

/// What a refusal calls a budget of `unit`: a token budget, or a budget in money.
fn budget_kind(unit: Unit) -> &'static str {
    match unit {
        Unit::Cost => "budget in money",
        _ => "token budget",
    }
}

/// What a budget of `unit` counts, as a refusal says it.
fn budget_units(unit: Unit) -> &'static str {
    match unit {
        Unit::Cost => "units",
        _ => "tokens",
    }
}

/// Whole seconds for a `Retry-After` header: never 0, rounded up.
pub fn retry_after_seconds(ms: u64) -> u64 {
    ms.div_ceil(1000).max(1)
}

impl CoreError {
    /// Redis is not there (whether or not the call left this process).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, CoreError::Unavailable(_) | CoreError::Unreached(_))
    }

    /// The same error, but a refusal by a shared pool (global, a resource) withholds its usage
    /// from the client; the user's own quota is still told.
    pub fn without_shared_usage(self) -> Self {
        match self {
            CoreError::Rejected(mut r) if &*r.limit != PER_USER => {
                r.usage_shown = false;
                CoreError::Rejected(r)
            }
            other => other,
        }
    }

    /// Refused without calling Redis: it failed moments ago and the breaker is open.
    pub fn breaker_open(target: &str, left: Duration) -> Self {
        CoreError::Unreached(format!(
            "Redis at {target} failed moments ago; not calling it again for {} ms (circuit breaker)",
            left.as_millis()
        ))
    }
}

pub type CoreResult<T> = Result<T, CoreError>;
