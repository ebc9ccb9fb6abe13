//! The embedded store for one process (`memory://`): the same semantics as the Lua scripts,
//! on a monotonic clock, under one mutex. Nothing in it ever waits.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use super::{AcquireOutcome, InLine, Renewed, Waiter};
use crate::errors::Rejection;
use crate::keys::Pool;
use crate::lease::LeaseRecord;

/// Why `pool` refuses: what it holds, and when its earliest lease would expire.
fn refusal(pool: &Pool, entry: &MemoryPool, now: u64, ttl_ms: u64) -> Rejection {
    let retry_after_ms = entry
        .by_expiry
        .first()
        .map_or(ttl_ms, |(expiry, _)| expiry.saturating_sub(now).max(1));
    Rejection {
        limit: pool.name.clone(),
        capacity: pool.capacity,
        current: entry.used,
        retry_after_ms,
    }
}

#[derive(Default)]
struct MemoryPool {
    /// (expiry ms, lease id), oldest first, for purging.
    by_expiry: BTreeSet<(u64, String)>,
    /// lease id -> (expiry ms, weight)
    leases: HashMap<String, (u64, u64)>,
    used: u64,
}

impl MemoryPool {
    fn purge(&mut self, now: u64) {
        while let Some((expiry, _)) = self.by_expiry.first() {
            if *expiry > now {
                break;
            }
            let (_, id) = self.by_expiry.pop_first().expect("first() was Some");
            if let Some((_, weight)) = self.leases.remove(&id) {
                self.used -= weight;
            }
        }
    }

    fn insert(&mut self, id: &str, expiry: u64, weight: u64) {
        if let Some((old, old_weight)) = self.leases.insert(id.to_owned(), (expiry, weight)) {
            self.by_expiry.remove(&(old, id.to_owned()));
            self.used -= old_weight;
        }
        self.by_expiry.insert((expiry, id.to_owned()));
        self.used += weight;
    }

    fn remove(&mut self, id: &str) -> bool {
        match self.leases.remove(id) {
            Some((expiry, weight)) => {
                self.by_expiry.remove(&(expiry, id.to_owned()));
                self.used -= weight;
                true
            }
            None => false,
        }
    }

    fn expiry_of(&self, id: &str) -> Option<u64> {
        self.leases.get(id).map(|(expiry, _)| *expiry)
    }
}

/// The waiting line: waiter ids by ticket, first come first served.
#[derive(Default)]
struct MemoryLine {
    by_ticket: BTreeMap<u64, String>,
    /// waiter id -> (ticket, alive until ms)
    waiters: HashMap<String, (u64, u64)>,
    next_ticket: u64,
}

impl MemoryLine {
    fn purge(&mut self, now: u64) {
        let dead: Vec<String> = self
            .waiters
            .iter()
            .filter(|(_, (_, alive))| *alive <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in dead {
            self.leave(&id);
        }
    }

    /// Enters (or refreshes) a waiter; returns how many wait before it, and its ticket.
    fn enter(&mut self, waiter: &Waiter, now: u64) -> (usize, u64) {
        let next_ticket = &mut self.next_ticket;
        let by_ticket = &mut self.by_ticket;
        let (ticket, alive) = self.waiters.entry(waiter.id.clone()).or_insert_with(|| {
            *next_ticket += 1;
            by_ticket.insert(*next_ticket, waiter.id.clone());
            (*next_ticket, 0)
        });
        *alive = now + waiter.ttl_ms;
        let ticket = *ticket;
        (self.by_ticket.range(..ticket).count(), ticket)
    }

    fn leave(&mut self, id: &str) -> bool {
        match self.waiters.remove(id) {
            Some((ticket, _)) => self.by_ticket.remove(&ticket).is_some(),
            None => false,
        }
    }
}

pub struct MemoryBackend {
    pools: Mutex<HashMap<String, MemoryPool>>,
    line: Mutex<MemoryLine>,
    origin: Instant,
}

impl Default for MemoryBackend {
    fn default() -> Self {
        MemoryBackend {
            pools: Mutex::new(HashMap::new()),
            line: Mutex::new(MemoryLine::default()),
            origin: Instant::now(),
        }
    }
}

impl MemoryBackend {
    fn now_ms(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64
    }

    fn pools(&self) -> std::sync::MutexGuard<'_, HashMap<String, MemoryPool>> {
        self.pools.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The same decisions as `acquire.lua`: own quota refuses at once, shared pools make a
    /// waiter wait, and nobody passes an earlier waiter.
    pub fn acquire(&self, lease: &LeaseRecord, ttl_ms: u64, in_line: Option<InLine<'_>>) -> AcquireOutcome {
        let now = self.now_ms();
        let weight = u64::from(lease.weight);
        let pools = &lease.pools;
        let mut line = self.line.lock().unwrap_or_else(PoisonError::into_inner);
        let waiter = in_line.and_then(|l| l.waiter);
        let (ahead, ticket) = match in_line {
            Some(_) => {
                line.purge(now);
                waiter.map_or((line.by_ticket.len(), 0), |w| line.enter(w, now))
            }
            None => (0, 0),
        };
        let mut store = self.pools();
        // Check every pool before creating any, so refusals leave nothing behind.
        let mut used = Vec::with_capacity(pools.len());
        for (i, pool) in pools.iter().enumerate() {
            let Some(entry) = store.get_mut(&pool.key) else {
                used.push(0);
                continue;
            };
            entry.purge(now);
            if pool.capacity > 0 && entry.used + weight > pool.capacity {
                if i >= lease.own_pools && waiter.is_some() {
                    return AcquireOutcome::Wait(ticket);
                }
                if let Some(waiter) = waiter {
                    line.leave(&waiter.id);
                }
                return AcquireOutcome::Rejected(refusal(pool, entry, now, ttl_ms));
            }
            used.push(entry.used);
        }
        if ahead > 0 {
            if waiter.is_some() {
                return AcquireOutcome::Wait(ticket);
            }
            let shared = lease.own_pools.min(pools.len() - 1);
            let rejection = match store.get(&pools[shared].key) {
                Some(entry) => refusal(&pools[shared], entry, now, ttl_ms),
                None => Rejection {
                    limit: pools[shared].name.clone(),
                    capacity: pools[shared].capacity,
                    current: 0,
                    retry_after_ms: ttl_ms,
                },
            };
            return AcquireOutcome::Rejected(rejection);
        }
        for (pool, used) in pools.iter().zip(used.iter_mut()) {
            store
                .entry(pool.key.clone())
                .or_default()
                .insert(&lease.id, now + ttl_ms, weight);
            *used += weight;
        }
        if let Some(waiter) = waiter {
            line.leave(&waiter.id);
        }
        AcquireOutcome::Granted(used)
    }

    pub fn heartbeat(&self, waiter_ids: &[String], ttl_ms: u64) {
        let alive_until = self.now_ms() + ttl_ms;
        let mut line = self.line.lock().unwrap_or_else(PoisonError::into_inner);
        for id in waiter_ids {
            if let Some((_, alive)) = line.waiters.get_mut(id) {
                *alive = alive_until;
            }
        }
    }

    pub fn leave(&self, waiter_id: &str) {
        self.line
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .leave(waiter_id);
    }

    pub fn renew(&self, leases: &[Arc<LeaseRecord>], ttl_ms: u64) -> Renewed {
        let now = self.now_ms();
        let mut store = self.pools();
        let mut renewed = Renewed::default();
        for (position, lease) in leases.iter().enumerate() {
            let weight = u64::from(lease.weight);
            let held = lease.pools.iter().all(|pool| {
                store
                    .get(&pool.key)
                    .and_then(|p| p.expiry_of(&lease.id))
                    .is_some_and(|e| e > now)
            });
            if !held {
                // Clear what is left, then take it back only where every pool has room.
                let mut room = true;
                for pool in &lease.pools {
                    if let Some(entry) = store.get_mut(&pool.key) {
                        entry.remove(&lease.id);
                        entry.purge(now);
                        room &= pool.capacity == 0 || entry.used + weight <= pool.capacity;
                        if entry.leases.is_empty() {
                            store.remove(&pool.key);
                        }
                    }
                }
                if !room {
                    renewed.lost.push(position + 1);
                    continue;
                }
                renewed.reclaimed.push(position + 1);
            }
            for pool in &lease.pools {
                store
                    .entry(pool.key.clone())
                    .or_default()
                    .insert(&lease.id, now + ttl_ms, weight);
            }
        }
        renewed
    }

    pub fn release(&self, leases: &[Arc<LeaseRecord>]) -> u64 {
        let mut store = self.pools();
        let mut released = 0;
        for lease in leases {
            let mut present = false;
            for pool in &lease.pools {
                if let Some(entry) = store.get_mut(&pool.key) {
                    present |= entry.remove(&lease.id);
                    if entry.leases.is_empty() {
                        store.remove(&pool.key);
                    }
                }
            }
            released += u64::from(present);
        }
        released
    }

    pub fn count(&self, pool_key: &str) -> u64 {
        let now = self.now_ms();
        let mut store = self.pools();
        let Some(pool) = store.get_mut(pool_key) else {
            return 0;
        };
        pool.purge(now);
        let used = pool.used;
        if pool.leases.is_empty() {
            store.remove(pool_key);
        }
        used
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pools(user_cap: u64, global_cap: u64) -> Vec<Pool> {
        vec![
            Pool {
                name: "per_user".into(),
                key: "u".into(),
                capacity: user_cap,
            },
            Pool {
                name: "global".into(),
                key: "g".into(),
                capacity: global_cap,
            },
        ]
    }

    fn lease_in(pools: &[Pool], weight: u32) -> Arc<LeaseRecord> {
        Arc::new(LeaseRecord::new(pools.to_vec(), weight))
    }

    #[test]
    fn caps_hold_and_all_or_nothing() {
        let store = MemoryBackend::default();
        let p = pools(2, 0);
        assert_eq!(
            store.acquire(&lease_in(&p, 1), 10_000, None),
            AcquireOutcome::Granted(vec![1, 1])
        );
        assert_eq!(
            store.acquire(&lease_in(&p, 1), 10_000, None),
            AcquireOutcome::Granted(vec![2, 2])
        );
        let AcquireOutcome::Rejected(r) = store.acquire(&lease_in(&p, 1), 10_000, None) else {
            panic!("a third lease must be refused")
        };
        assert_eq!((&*r.limit, r.capacity, r.current), ("per_user", 2, 2));
        // The refused acquire took nothing from the global pool.
        assert_eq!(store.count("g"), 2);
        // A refusal by a full global pool creates no per-user pool.
        let other = vec![
            Pool {
                name: "per_user".into(),
                key: "u2".into(),
                capacity: 2,
            },
            Pool {
                name: "global".into(),
                key: "g".into(),
                capacity: 2,
            },
        ];
        assert!(matches!(
            store.acquire(&lease_in(&other, 1), 10_000, None),
            AcquireOutcome::Rejected(_)
        ));
        assert!(!store.pools().contains_key("u2"));
    }

    #[test]
    fn weights_count_in_every_pool() {
        let store = MemoryBackend::default();
        let p = pools(5, 4);
        assert!(matches!(
            store.acquire(&lease_in(&p, 3), 10_000, None),
            AcquireOutcome::Granted(_)
        ));
        assert!(matches!(
            store.acquire(&lease_in(&p, 2), 10_000, None),
            AcquireOutcome::Rejected(_)
        ));
        assert_eq!(store.count("u"), 3);
    }

    #[test]
    fn expired_leases_free_and_come_back_only_where_there_is_room() {
        let store = MemoryBackend::default();
        let p = pools(1, 0);
        let held = lease_in(&p, 1);
        assert!(matches!(
            store.acquire(&held, 0, None),
            AcquireOutcome::Granted(_)
        ));
        assert_eq!(store.count("u"), 0);
        // Expired but the pool has room: renewal takes it back.
        let renewed = store.renew(std::slice::from_ref(&held), 10_000);
        assert_eq!(
            renewed,
            Renewed {
                lost: vec![],
                reclaimed: vec![1]
            }
        );
        assert_eq!(store.count("u"), 1);
        // Expired and someone else took the slot: lost, and not re-added.
        store.release(std::slice::from_ref(&held));
        assert!(matches!(
            store.acquire(&held, 0, None),
            AcquireOutcome::Granted(_)
        ));
        assert!(matches!(
            store.acquire(&lease_in(&p, 1), 10_000, None),
            AcquireOutcome::Granted(_)
        ));
        assert_eq!(
            store.renew(&[held], 10_000),
            Renewed {
                lost: vec![1],
                reclaimed: vec![]
            }
        );
        assert_eq!(store.count("u"), 1);
    }

    #[test]
    fn release_is_idempotent() {
        let store = MemoryBackend::default();
        let held = lease_in(&pools(0, 0), 2);
        assert!(matches!(
            store.acquire(&held, 10_000, None),
            AcquireOutcome::Granted(_)
        ));
        assert_eq!(store.release(std::slice::from_ref(&held)), 1);
        assert_eq!(store.release(&[held]), 0);
        assert_eq!(store.count("g"), 0);
    }
}
