//! Where pools live: the embedded in-memory store or Redis (standalone or cluster). Both give the
//! same answers; the manager talks to them only through `Backend`.

pub mod memory;
pub mod redis;

use std::sync::Arc;

use crate::errors::{CoreError, CoreResult, Rejection};
use crate::lease::LeaseRecord;

pub use self::memory::MemoryBackend;
pub use self::redis::RedisBackend;

/// Members (a lease of weight w is w members per pool) per reclaim or release script call:
/// bounds how long one script blocks Redis.
const BATCH_UNITS: u64 = 1000;

/// Splits leases into script-call batches of at most `BATCH_UNITS` members (at least one lease).
/// With `one_slot`, a batch also never mixes hash tags (Redis Cluster runs a script on one slot
/// only); the caller sorts the leases by tag first.
pub fn batches(leases: &[Arc<LeaseRecord>], one_slot: bool) -> Vec<&[Arc<LeaseRecord>]> {
    let mut batches = Vec::new();
    let (mut start, mut units) = (0, 0);
    for (i, lease) in leases.iter().enumerate() {
        let weight = u64::from(lease.weight);
        let new_slot = one_slot && lease.hash_tag() != leases[start].hash_tag();
        if i > start && (units + weight > BATCH_UNITS || new_slot) {
            batches.push(&leases[start..i]);
            (start, units) = (i, 0);
        }
        units += weight;
    }
    if start < leases.len() {
        batches.push(&leases[start..]);
    }
    batches
}

#[derive(Debug, PartialEq)]
pub enum AcquireOutcome {
    /// Slots in use in each pool after the grant, in pool order.
    Granted(Vec<u64>),
    Rejected(Rejection),
    /// The caller is in line with this ticket (lower is earlier): try again when woken.
    Wait(u64),
}

/// The first-come-first-served line of a manager's shared pools, and the channel on which a
/// release wakes the waiters of every process.
#[derive(Debug, Clone)]
pub struct Line {
    /// The line (waiter ids by ticket), the liveness of the processes with waiters (by expiry),
    /// the ticket counter.
    pub keys: [String; 3],
    pub channel: String,
}

/// One caller waiting in line; it must call again within `ttl_ms` or be dropped from the line.
#[derive(Debug)]
pub struct Waiter {
    pub id: String,
    pub ttl_ms: u64,
}

/// How an acquire stands to the line: a waiter in it, or a newcomer who must not jump it.
#[derive(Debug, Clone, Copy)]
pub struct InLine<'a> {
    pub line: &'a Line,
    pub waiter: Option<&'a Waiter>,
}

/// What one check of leases, one by one, found (positions in the batch).
#[derive(Debug, Default, PartialEq)]
pub struct Renewed {
    /// 1-based positions of the leases found gone with no room to take them back.
    pub lost: Vec<usize>,
    /// 1-based positions of the leases found gone and taken back.
    pub reclaimed: Vec<usize>,
}

/// The leases of one group (one holders key), fetched only when a round needs them one by one.
pub type LeasesOf<'a> = &'a (dyn Fn(&str) -> Vec<Arc<LeaseRecord>> + Sync);

/// What a renewal round found. Groups whose calls failed are not renewed: their deadlines decide.
#[derive(Default)]
pub struct RenewRound {
    /// Holders keys of the groups kept alive (their remaining leases all extended).
    pub renewed: Vec<String>,
    /// Found gone and taken back.
    pub reclaimed: Vec<Arc<LeaseRecord>>,
    /// Found gone with no room to take them back (now removed everywhere).
    pub lost: Vec<Arc<LeaseRecord>>,
    pub failures: Vec<CoreError>,
    /// Whether any call got an answer (for the circuit breaker).
    pub answered: bool,
}

impl RenewRound {
    /// Files the leases of one batch checked one by one under what the store said about them.
    pub fn record(&mut self, batch: &[Arc<LeaseRecord>], checked: &Renewed) {
        self.answered = true;
        let at = |position: &usize| batch.get(position.wrapping_sub(1)).map(Arc::clone);
        self.lost.extend(checked.lost.iter().filter_map(at));
        self.reclaimed.extend(checked.reclaimed.iter().filter_map(at));
    }
}

pub enum Backend {
    Memory(MemoryBackend),
    Redis(Box<RedisBackend>),
}

impl Backend {
    /// Whether a script call must stay within one cluster slot.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Backend::Redis(r) if r.is_cluster())
    }

    /// The embedded backend never waits, so its calls can finish on the caller's thread.
    pub fn is_embedded(&self) -> bool {
        matches!(self, Backend::Memory(_))
    }

    pub fn describe(&self) -> String {
        match self {
            Backend::Memory(_) => "memory://".into(),
            Backend::Redis(r) => r.target().into(),
        }
    }

    /// Takes `weight` slots in every pool, all or nothing.
    pub async fn acquire(
        &self,
        lease: &LeaseRecord,
        ttl_ms: u64,
        in_line: Option<InLine<'_>>,
    ) -> CoreResult<AcquireOutcome> {
        match self {
            Backend::Memory(m) => Ok(m.acquire(lease, ttl_ms, in_line)),
            Backend::Redis(r) => r.acquire(lease, ttl_ms, in_line).await,
        }
    }

    /// Keeps this process's waiters alive in the line (`waiter_ids`: every waiter it has).
    pub async fn heartbeat(&self, line: &Line, waiter_ids: &[String], ttl_ms: u64) -> CoreResult<()> {
        match self {
            Backend::Memory(m) => {
                m.heartbeat(waiter_ids, ttl_ms);
                Ok(())
            }
            Backend::Redis(r) => r.heartbeat(line, waiter_ids, ttl_ms).await,
        }
    }

    /// Takes a waiter out of the line (idempotent).
    pub async fn leave(&self, line: &Line, waiter_id: &str) -> CoreResult<()> {
        match self {
            Backend::Memory(m) => {
                m.leave(waiter_id);
                Ok(())
            }
            Backend::Redis(r) => r.leave(line, waiter_id).await,
        }
    }

    /// Keeps every lease of the groups alive for `ttl_ms` more (the embedded store lease by
    /// lease, Redis with one keep-alive per group), taking back those found gone where capacity
    /// allows. A group is its holders key and the members granted to it that this process knows
    /// of (Redis checks that none is missing).
    pub async fn renew(
        &self,
        groups: &[(String, u64)],
        leases_of: LeasesOf<'_>,
        ttl_ms: u64,
        period_ms: u64,
    ) -> RenewRound {
        match self {
            Backend::Memory(m) => {
                let mut round = RenewRound::default();
                for (holders, _) in groups {
                    let leases = leases_of(holders);
                    round.record(&leases, &m.renew(&leases, ttl_ms));
                    round.renewed.push(holders.clone());
                }
                round
            }
            Backend::Redis(r) => r.renew(groups, leases_of, ttl_ms, period_ms).await,
        }
    }

    /// Removes the leases of one batch (idempotent) and wakes the line's waiters in every
    /// process; returns how many leases were still there.
    pub async fn release(&self, leases: &[Arc<LeaseRecord>], line: Option<&Line>) -> CoreResult<u64> {
        match self {
            Backend::Memory(m) => Ok(m.release(leases)),
            Backend::Redis(r) => r.release(leases, line).await,
        }
    }

    /// Slots in use in one pool, leases of dead holders excluded (Redis: as far as reaped).
    pub async fn count(&self, pool_key: &str) -> CoreResult<u64> {
        match self {
            Backend::Memory(m) => Ok(m.count(pool_key)),
            Backend::Redis(r) => r.count(pool_key).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::Pool;

    #[test]
    fn batches_bound_the_members_per_call() {
        let pool = Pool {
            name: "global".into(),
            key: "k".into(),
            capacity: 0,
        };
        let lease = |weight| Arc::new(LeaseRecord::new(vec![pool.clone()], weight));
        let leases: Vec<_> = (0..2500).map(|_| lease(1)).collect();
        let sizes: Vec<usize> = batches(&leases, false).iter().map(|b| b.len()).collect();
        assert_eq!(sizes, vec![1000, 1000, 500]);
        let heavy: Vec<_> = (0..25).map(|_| lease(100)).collect();
        let heavy_sizes: Vec<usize> = batches(&heavy, false).iter().map(|b| b.len()).collect();
        assert_eq!(heavy_sizes, vec![10, 10, 5]);
        assert!(batches(&[], true).is_empty());
        let tagged = |tag: &str| {
            let pool = Pool {
                name: "per_user".into(),
                key: format!("{{{tag}}}:user"),
                capacity: 0,
            };
            Arc::new(LeaseRecord::new(vec![pool], 1))
        };
        let spread = vec![tagged("a"), tagged("a"), tagged("b")];
        let sizes: Vec<usize> = batches(&spread, true).iter().map(|b| b.len()).collect();
        assert_eq!(sizes, vec![2, 1]);
    }
}
