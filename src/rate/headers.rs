//! The IETF rate-limit headers (draft-ietf-httpapi-ratelimit-headers-11) of a request's hits and
//! of its streams' capped pools: `RateLimit-Policy` (each policy's quota `q` per window `w`
//! seconds; a pool's `q` slots of `qu="concurrent-requests"`) and `RateLimit` (each one's `r`
//! remaining and `t` seconds until units free up). Built once per response, before its first
//! byte (never in trailers).

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
/// Seconds are rounded up: a client that waits `t` finds the units back. Written piece by
/// piece, not through `format!`: they are built for every limited response.
pub fn rate_limit_headers(policies: &[PolicyState], pools: &[PoolState]) -> Option<(String, String)> {
    if policies.is_empty() && pools.is_empty() {
        return None;
    }
    let room = 40 * (policies.len() + pools.len());
    let (mut quotas, mut states) = (String::with_capacity(room), String::with_capacity(room));
    let mut number = itoa::Buffer::new();
    for policy in policies {
        member(&mut quotas, &mut states, &policy.name);
        parameter(&mut quotas, ";q=", number.format(policy.limit));
        parameter(&mut quotas, ";w=", number.format(whole_seconds(policy.window_s)));
        parameter(&mut states, ";r=", number.format(policy.remaining));
        parameter(&mut states, ";t=", number.format(whole_seconds(policy.reset_s)));
    }
    for pool in pools {
        member(&mut quotas, &mut states, &pool.name);
        parameter(&mut quotas, ";q=", number.format(pool.capacity));
        quotas.push_str(";qu=\"concurrent-requests\"");
        parameter(
            &mut states,
            ";r=",
            number.format(pool.capacity.saturating_sub(pool.used)),
        );
    }
    Some((quotas, states))
}

/// Starts a list member named `name` in both values: `"name"`, after `, ` unless it is the first.
fn member(quotas: &mut String, states: &mut String, name: &str) {
    for value in [quotas, states] {
        if !value.is_empty() {
            value.push_str(", ");
        }
        value.push('"');
        value.push_str(name);
        value.push('"');
    }
}

fn parameter(value: &mut String, key: &str, number: &str) {
    value.push_str(key);
    value.push_str(number);
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
