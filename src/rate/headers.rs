//! The IETF rate-limit headers (draft-ietf-httpapi-ratelimit-headers-11) of a request's hits and
//! of its streams' capped pools: `RateLimit-Policy` (each policy's quota `q` per window `w`
//! seconds; a pool's `q` slots of `qu="concurrent-requests"`) and `RateLimit` (each one's `r`
//! remaining and `t` seconds until units free up). Built once per response, before its first
//! byte (never in trailers).

use std::fmt::Write;
use std::sync::Arc;

/// What one policy's decision shows in the headers.
pub struct PolicyState {
    pub name: Arc<str>,
    pub limit: u64,
    /// The window, in seconds.
    pub window_s: f64,
    pub remaining: u64,
    /// Seconds until the next units free up.
    pub reset_s: f64,
}

/// A capped pool a stream took a slot in: its name, capacity and slots in use.
pub struct PoolState {
    pub name: String,
    pub capacity: u64,
    pub used: u64,
}

/// The `RateLimit-Policy` and `RateLimit` values, or None when there is nothing to tell.
/// Seconds are rounded up: a client that waits `t` finds the units back.
pub fn rate_limit_headers(policies: &[PolicyState], pools: &[PoolState]) -> Option<(String, String)> {
    if policies.is_empty() && pools.is_empty() {
        return None;
    }
    let (mut quotas, mut states) = (String::new(), String::new());
    for policy in policies {
        let separator = if quotas.is_empty() { "" } else { ", " };
        // Writing to a String cannot fail.
        let _ = write!(
            quotas,
            "{separator}\"{}\";q={};w={}",
            policy.name,
            policy.limit,
            whole_seconds(policy.window_s)
        );
        let _ = write!(
            states,
            "{separator}\"{}\";r={};t={}",
            policy.name,
            policy.remaining,
            whole_seconds(policy.reset_s)
        );
    }
    for pool in pools {
        let separator = if quotas.is_empty() { "" } else { ", " };
        let _ = write!(
            quotas,
            "{separator}\"{}\";q={};qu=\"concurrent-requests\"",
            pool.name, pool.capacity
        );
        let _ = write!(
            states,
            "{separator}\"{}\";r={}",
            pool.name,
            pool.capacity.saturating_sub(pool.used)
        );
    }
    Some((quotas, states))
}

fn whole_seconds(seconds: f64) -> u64 {
    seconds.max(0.0).ceil() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_and_pools_in_order_seconds_rounded_up() {
        let policies = [
            PolicyState {
                name: "per_minute".into(),
                limit: 10,
                window_s: 60.0,
                remaining: 7,
                reset_s: 12.2,
            },
            PolicyState {
                name: "per_day".into(),
                limit: 1000,
                window_s: 86_400.0,
                remaining: 990,
                reset_s: 0.0,
            },
        ];
        let pools = [PoolState {
            name: "gpu".into(),
            capacity: 4,
            used: 5,
        }];
        let (quotas, states) = rate_limit_headers(&policies, &pools).unwrap();
        assert_eq!(
            quotas,
            "\"per_minute\";q=10;w=60, \"per_day\";q=1000;w=86400, \"gpu\";q=4;qu=\"concurrent-requests\""
        );
        assert_eq!(
            states,
            "\"per_minute\";r=7;t=13, \"per_day\";r=990;t=0, \"gpu\";r=0"
        );
    }

    #[test]
    fn nothing_to_tell() {
        assert!(rate_limit_headers(&[], &[]).is_none());
    }
}
