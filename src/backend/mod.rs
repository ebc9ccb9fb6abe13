//! Where pools live: the embedded in-memory store or Redis (standalone or cluster). Both give the
//! same answers; the manager talks to them only through `Backend`.

pub mod memory;
pub mod redis;

use std::sync::Arc;

use crate::errors::{CoreResult, Rejection};
use crate::keys::Pool;
use crate::lease::LeaseRecord;

pub use self::memory::MemoryBackend;
pub use self::redis::RedisBackend;

/// Leases per renew or release script call: bounds how long one script blocks Redis.
pub const BATCH_SIZE: usize = 1000;

#[derive(Debug, PartialEq)]
pub enum AcquireOutcome {
    /// Slots in use in each pool after the grant, in pool order.
    Granted(Vec<u64>),
    Rejected(Rejection),
}

pub enum Backend {
    Memory(MemoryBackend),
    Redis(Box<RedisBackend>),
}

impl Backend {
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
        pools: &[Pool],
        ttl_ms: u64,
    ) -> CoreResult<AcquireOutcome> {
        match self {
            Backend::Memory(m) => Ok(m.acquire(lease, pools, ttl_ms)),
            Backend::Redis(r) => r.acquire(lease, pools, ttl_ms).await,
        }
    }

    /// Extends every lease to now + `ttl_ms`; returns the positions of those found gone.
    pub async fn renew(&self, leases: &[Arc<LeaseRecord>], ttl_ms: u64) -> CoreResult<Vec<usize>> {
        match self {
            Backend::Memory(m) => Ok(m.renew(leases, ttl_ms)),
            Backend::Redis(r) => r.renew(leases, ttl_ms).await,
        }
    }

    /// Removes the leases (idempotent); returns how many were still there.
    pub async fn release(&self, leases: &[Arc<LeaseRecord>]) -> CoreResult<u64> {
        match self {
            Backend::Memory(m) => Ok(m.release(leases)),
            Backend::Redis(r) => r.release(leases).await,
        }
    }

    /// Slots in use in one pool, expired leases excluded.
    pub async fn count(&self, pool_key: &str) -> CoreResult<u64> {
        match self {
            Backend::Memory(m) => Ok(m.count(pool_key)),
            Backend::Redis(r) => r.count(pool_key).await,
        }
    }
}
