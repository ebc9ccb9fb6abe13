//! The settings of a manager, as plain values. The binding (`py/config.rs`) checks what Python
//! passes and builds them; choices given as strings there are enums here.

use std::time::Duration;

use crate::client_address::ProxyRule;

/// What a lost lease does to its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnLost {
    /// End it with `LeaseLost`.
    Cancel,
    /// Only record it (`lease.lost`).
    Continue,
}

/// What acquires do while Redis is unreachable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureMode {
    /// Refuse new streams (503).
    Closed,
    /// Admit them against this process's share of the caps (`fallback_workers`).
    Open,
}

/// The order of a pool's line within one priority.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineOrder {
    /// Users take turns (round robin), first come first served within a user.
    Fair,
    /// First come, first served.
    Arrival,
}

impl LineOrder {
    /// Its name, as `LeaseConfig(line_order=...)` takes it.
    pub fn code(self) -> &'static str {
        match self {
            LineOrder::Fair => "fair",
            LineOrder::Arrival => "arrival",
        }
    }
}

/// What every grant of a manager comes with: how long it lives unless renewed, and whether it
/// takes a fencing token (`LeaseConfig(fencing_tokens=True)`; on Redis one `INCR` per grant,
/// so a manager that does not ask pays nothing for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrantTerms {
    pub ttl_ms: u64,
    pub fencing: bool,
    /// How often the holder's entry is renewed: an acquire leaves an entry with two periods
    /// left or more to the keep-alive (`acquire.lua`'s `grant`).
    pub renew_every_ms: u64,
    /// When the process knows its holder's entry in the lease's tag lives until at least (in
    /// `monotonic_ms`, two renewal periods away or more): the acquire trusts it, reads no clock
    /// and leaves the entry alone, and the grant is dated from it (the protocol model's
    /// `EntryCheck::TrustKnown`). None: the acquire reads the entry.
    pub entry_known_until_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub lease_seconds: f64,
    pub max_per_user: u64,
    pub max_global: u64,
    /// Keep a pool across every user (`max_global`, `get_active_count()`). Without it, each
    /// user's keys get a hash tag of their own and spread across Redis Cluster shards.
    pub global_pool: bool,
    /// Each process takes the global pool's slots in slabs and starts its streams from them
    /// (`manager/slabs.rs`); the users' own keys then get hash tags of their own, as without a
    /// global pool. On Redis only: the embedded store serves one process, exactly already.
    pub lease_global_slots: bool,
    pub key_prefix: String,
    pub renew_every: f64,
    pub redis_timeout: f64,
    /// How long an acquire waits in line for shared capacity before it is refused.
    pub wait_timeout: f64,
    pub line_order: LineOrder,
    /// Waiters a pool's line holds at most (0: no limit); one more is refused at once.
    pub max_waiting: u64,
    /// A user over its own `max_per_user` waits in its own line (with `wait_timeout`) instead
    /// of being refused at once.
    pub wait_for_own_quota: bool,
    /// Upper bound of the `Retry-After` given with a rejection (sooner if a slot frees sooner).
    pub retry_after: f64,
    pub on_lost: OnLost,
    pub failure_mode: FailureMode,
    /// Worker processes sharing the caps; under `FailureMode::Open` each enforces its share.
    pub fallback_workers: u64,
    /// Keys the identity hash (HMAC-SHA256).
    pub identity_secret: Vec<u8>,
    /// Whether a refusal by a shared pool (global, a resource) tells the client its capacity and
    /// usage (the body, the RateLimit headers). The user's own quota is always told.
    pub disclose_usage: bool,
    /// False: every request-rate policy is a dry run (`RatePolicy::enforce`); budgets still refuse.
    pub enforce_rate_limits: bool,
    /// Give each grant a fencing token (`lease.fencing_token`).
    pub fencing_tokens: bool,
    /// The reverse proxies, and the header they write, that a client's address is read from.
    pub proxy_rule: ProxyRule,
}

impl Config {
    pub fn renew_period(&self) -> Duration {
        Duration::from_secs_f64(self.renew_every)
    }

    pub fn redis_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.redis_timeout)
    }

    pub fn retry_after_ms(&self) -> u64 {
        (self.retry_after * 1000.0).round() as u64
    }

    pub fn lease_ms(&self) -> u64 {
        (self.lease_seconds * 1000.0).round() as u64
    }

    /// What each grant comes with.
    pub fn grant_terms(&self) -> GrantTerms {
        GrantTerms {
            ttl_ms: self.lease_ms(),
            fencing: self.fencing_tokens,
            renew_every_ms: self.renew_period().as_millis() as u64,
            entry_known_until_ms: None,
        }
    }
}
