//! The embedded store's admission decisions: the same as `lua/acquire.lua`, under one mutex.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use super::{MemoryBackend, State};
use crate::backend::{AcquireOutcome, InLine};
use crate::errors::Rejection;
use crate::keys::{Pool, PoolRole};
use crate::lease::{monotonic_ms, LeaseRecord};
use crate::rate::RateCheck;

/// Why `pool` refuses, with `used` slots taken. A slot frees only when a lease is released, so
/// the caller's `retry_after` bounds the wait it suggests.
fn refusal(pool: &Pool, used: u64) -> Rejection {
    Rejection {
        limit: pool.name.clone(),
        capacity: pool.capacity,
        current: used,
        retry_after_ms: u64::MAX,
        usage_shown: true,
    }
}

/// A full line's refusal: the line of `lease`'s pool i, with `waiting` waiters; `displaced`: the
/// waiter's place there went to another user's waiter.
fn line_full(
    lease: &LeaseRecord,
    in_line: &InLine<'_>,
    i: usize,
    waiting: u64,
    estimate_ms: Option<u64>,
    displaced: bool,
) -> AcquireOutcome {
    AcquireOutcome::LineFull {
        full: Rejection {
            limit: lease.pools[i].name.clone(),
            capacity: in_line.max_waiting.get(i).copied().unwrap_or(0),
            current: waiting,
            retry_after_ms: estimate_ms.unwrap_or(u64::MAX),
            usage_shown: true,
        },
        displaced,
    }
}

/// The next fencing token of the store: this machine's clock in µs, or the last token plus 1
/// when that is not above it (numbers like those of `acquire.lua`, which adds 1 per grant and
/// takes the clock when it lags). One for the whole store, not one per tag: it orders every two
/// of its leases all the same, and keeps no entry per tag.
fn next_fencing_token(last: &mut u64) -> u64 {
    let clock_us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_micros() as u64);
    *last = clock_us.max(*last + 1);
    *last
}

/// The ms left of a ban on the user of `lease` (the pool of its own quota), if any.
fn ban_left(bans: &HashMap<String, Instant>, lease: &LeaseRecord) -> Option<u64> {
    let own = lease.pools.first().filter(|_| lease.own_pools > 0)?;
    let left = bans.get(&*own.key)?.checked_duration_since(Instant::now())?;
    Some((left.as_millis() as u64).max(1))
}

impl MemoryBackend {
    /// The same decisions as `acquire.lua`: a banned user and a start over a rate limit are
    /// refused first, the caller's own quota refuses at once, and a shared pool without room
    /// beyond what the waiters before the request need makes a waiter wait and refuses others.
    /// A grant takes a fencing token when `fencing` asks for one.
    pub fn decide(
        &self,
        lease: &LeaseRecord,
        fencing: bool,
        in_line: Option<InLine<'_>>,
        rates: &RateCheck,
    ) -> AcquireOutcome {
        let weight = u64::from(lease.weight);
        let mut state = self.state();
        let State {
            pools: store,
            line,
            bans,
            fenced,
        } = &mut *state;
        let waiter = in_line.and_then(|l| l.waiter);
        if let Some((i, waiting, estimate_ms)) = waiter.and_then(|w| line.given_up(w, &lease.pools)) {
            let in_line = in_line.expect("a waiter is in a line");
            return line_full(lease, &in_line, i, waiting, estimate_ms, true);
        }
        if let Some(left) = ban_left(bans, lease) {
            if let Some(waiter) = waiter {
                line.leave(&waiter.id);
            }
            return AcquireOutcome::Banned(left);
        }
        // Locked after the state, as everywhere: both decide together.
        let mut counters = self.rates();
        let looked = counters.hit(&rates.keys, &rates.policies, &rates.costs, false);
        if looked.refused.is_some() {
            if let Some(waiter) = waiter {
                line.leave(&waiter.id);
            }
            return AcquireOutcome::RateLimited(looked);
        }
        // Each capped shared pool has its own line: only its earlier waiters' needs count.
        let own_waits = in_line.is_some_and(|l| l.own_waits);
        let lined: Vec<&Pool> = lease
            .pools
            .iter()
            .filter(|pool| pool.capacity > 0 && (pool.role == PoolRole::Shared || own_waits))
            .collect();
        let user = match (lease.own_pools, waiter) {
            (1.., _) => &*lease.pools[0].key,
            (0, Some(waiter)) => waiter.id.as_str(),
            (0, None) => "",
        };
        // Check every pool before touching any, so refusals leave nothing behind.
        let used: Vec<u64> = lease
            .pools
            .iter()
            .map(|pool| store.get(&*pool.key).map_or(0, |entry| entry.used))
            .collect();
        if let (Some(in_line), Some(waiter)) = (&in_line, waiter) {
            if !line.has(waiter) {
                // A new waiter's places count against its user's own quota (see the script's
                // beyond_quota); then a full line may make room for it.
                if let Some(capacity) = lease
                    .pools
                    .first()
                    .map(|own| own.capacity)
                    .filter(|c| lease.own_pools > 0 && *c > 0)
                {
                    let waiting = line.users_waiting(user);
                    let held = if own_waits { 0 } else { used[0] };
                    if held + waiting + weight > capacity {
                        return AcquireOutcome::Rejected(refusal(
                            &lease.pools[0],
                            (held + waiting).min(capacity),
                        ));
                    }
                }
                if let Some((i, waiting, estimate_ms)) = line.make_room(user, &lease.pools, in_line) {
                    return line_full(lease, in_line, i, waiting, estimate_ms, false);
                }
            }
            line.enter(waiter, user, weight, &lined, in_line);
        }
        let mut passing = Vec::new();
        let full = lease
            .pools
            .iter()
            .zip(&used)
            .enumerate()
            .find_map(|(i, (pool, used))| {
                let promised = match &in_line {
                    Some(in_line) if lined.contains(&pool) => {
                        line.promised(pool, *used, waiter, user, in_line, &mut passing)
                    }
                    // The user's waiters keep their room in its own quota.
                    Some(_) if pool.role == PoolRole::Own && waiter.is_none() => line.users_waiting(user),
                    _ => 0,
                };
                (pool.capacity > 0 && used + promised + weight > pool.capacity)
                    .then(|| (i, pool, (used + promised).min(pool.capacity)))
            });
        if let Some((i, pool, taken)) = full {
            if let (true, Some(waiter)) = (pool.role == PoolRole::Shared || own_waits, waiter) {
                return AcquireOutcome::Wait(line.placed(waiter, &lease.pools, (i, taken)));
            }
            if let Some(waiter) = waiter {
                line.leave(&waiter.id);
            }
            return AcquireOutcome::Rejected(refusal(pool, taken));
        }
        for pool in &lease.pools {
            let entry = store.entry(Arc::clone(&pool.key)).or_default();
            if entry.leases.insert(lease.id, weight).is_none() {
                entry.used += weight;
            }
        }
        line.passed(&passing, weight);
        if let Some(waiter) = waiter {
            line.served(waiter);
            line.leave(&waiter.id);
        }
        AcquireOutcome::Granted {
            used: used.iter().map(|used| used + weight).collect(),
            entry_life_ms: Some(u64::MAX), // nothing here expires
            fencing_token: fencing.then(|| next_fencing_token(fenced)),
            rates: counters
                .hit(&rates.keys, &rates.policies, &rates.costs, true)
                .decisions,
            sent_at_ms: monotonic_ms(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::Store;

    fn pool(name: &str, key: &str, capacity: u64, role: PoolRole) -> Pool {
        Pool::new(name, key.into(), capacity, role)
    }

    fn pools(user_cap: u64, global_cap: u64) -> Vec<Pool> {
        vec![
            pool("per_user", "u", user_cap, PoolRole::Own),
            pool("global", "g", global_cap, PoolRole::Shared),
        ]
    }

    fn lease_in(pools: &[Pool], weight: u32) -> Arc<LeaseRecord> {
        Arc::new(LeaseRecord::new(pools.to_vec(), weight, Store::Main))
    }

    #[test]
    fn caps_hold_and_all_or_nothing() {
        let store = MemoryBackend::default();
        let p = pools(2, 0);
        let used = |outcome| match outcome {
            AcquireOutcome::Granted {
                used,
                entry_life_ms: Some(u64::MAX),
                rates,
                ..
            } if rates.is_empty() => used,
            other => panic!("not granted: {other:?}"),
        };
        assert_eq!(
            used(store.decide(&lease_in(&p, 1), false, None, &RateCheck::default())),
            vec![1, 1]
        );
        assert_eq!(
            used(store.decide(&lease_in(&p, 1), false, None, &RateCheck::default())),
            vec![2, 2]
        );
        let AcquireOutcome::Rejected(r) = store.decide(&lease_in(&p, 1), false, None, &RateCheck::default())
        else {
            panic!("a third lease must be refused")
        };
        assert_eq!((&*r.limit, r.capacity, r.current), ("per_user", 2, 2));
        // The refused acquire took nothing from the global pool.
        assert_eq!(store.used("g"), 2);
        // A refusal by a full global pool creates no per-user pool.
        let other = vec![
            pool("per_user", "u2", 2, PoolRole::Own),
            pool("global", "g", 2, PoolRole::Shared),
        ];
        assert!(matches!(
            store.decide(&lease_in(&other, 1), false, None, &RateCheck::default()),
            AcquireOutcome::Rejected(_)
        ));
        assert!(!store.state().pools.contains_key("u2"));
    }

    #[test]
    fn fencing_tokens_grow_even_where_the_clock_does_not() {
        let ahead_of_the_clock = u64::MAX / 2;
        let mut last = ahead_of_the_clock;
        assert_eq!(next_fencing_token(&mut last), ahead_of_the_clock + 1);
        let mut last = 0;
        let first = next_fencing_token(&mut last);
        assert!(first > 1_600_000_000_000_000, "the clock in µs: {first}");
        assert!(next_fencing_token(&mut last) > first);
    }

    #[test]
    fn weights_count_in_every_pool() {
        let store = MemoryBackend::default();
        let p = pools(5, 4);
        assert!(matches!(
            store.decide(&lease_in(&p, 3), false, None, &RateCheck::default()),
            AcquireOutcome::Granted { .. }
        ));
        assert!(matches!(
            store.decide(&lease_in(&p, 2), false, None, &RateCheck::default()),
            AcquireOutcome::Rejected(_)
        ));
        assert_eq!(store.used("u"), 3);
    }

    #[test]
    fn release_is_idempotent_and_leaves_no_pool_behind() {
        let store = MemoryBackend::default();
        let held = lease_in(&pools(0, 0), 2);
        assert!(matches!(
            store.decide(&held, false, None, &RateCheck::default()),
            AcquireOutcome::Granted { .. }
        ));
        assert_eq!(store.remove(std::slice::from_ref(&held)), [true]);
        assert_eq!(store.remove(&[held]), [false]);
        assert_eq!(store.used("g"), 0);
        assert!(store.state().pools.is_empty());
    }
}
