//! Where pools live: the embedded in-memory store or Redis (standalone, cluster or behind
//! Sentinel). Both give the same answers; the rest of the core talks to them only through
//! `Backend`.

mod memory;
mod redis;

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;

use crate::breaker::{Breaker, Permit};
use crate::config::LineOrder;
use crate::errors::{CoreError, CoreResult, Rejection};
use crate::keys::LineKeys;
use crate::lease::{LeaseRecord, Store};
use crate::rate::{Decision, HitOutcome, RateCheck, RatePolicy, Settlement, TopUp, ToppedUp};

pub use self::memory::MemoryBackend;
pub use self::redis::{redact, RedisBackend};

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
    Granted {
        /// Slots in use in each pool after the grant, in pool order.
        used: Vec<u64>,
        /// Whether the holder's entry was live when the lease was added: its other leases in the
        /// tag lived on (false: it had expired or vanished, and they may have been reaped).
        holder_was_alive: bool,
        /// Each rate policy's decision, the start counted.
        rates: Vec<Decision>,
        /// When the call left this process (monotonic ms): the store decided later, so the
        /// lease lives at least a lease duration from then.
        sent_at_ms: u64,
    },
    Rejected(Rejection),
    /// A rate policy refused the start (nothing was taken anywhere).
    RateLimited(HitOutcome),
    /// The caller is in line: try again when woken.
    Wait(Placed),
    /// A pool's line is full (`max_waiting`): `capacity` is the limit, `current` the waiters;
    /// `displaced`: the waiter's place there went to another user's first waiter.
    LineFull {
        full: Rejection,
        displaced: bool,
    },
    /// An operator banned the user's streams for this many ms more (`revoke`).
    Banned(u64),
}

/// The script calls a backend made so far (none for the embedded store), for metrics.
#[derive(Debug, Clone, Copy, Default)]
pub struct CallStats {
    pub calls: u64,
    /// Those that failed: an error, a timeout, no connection.
    pub failed: u64,
    /// The time they took, in all, in microseconds.
    pub micros: u64,
}

/// One caller waiting in line; it must call again within `ttl_ms` or be dropped from the line.
#[derive(Debug)]
pub struct Waiter {
    pub id: String,
    pub ttl_ms: u64,
}

/// How an acquire stands to the line: a waiter in it, or a newcomer who must not take room an
/// earlier waiter needs.
#[derive(Debug, Clone, Copy)]
pub struct InLine<'a> {
    pub line: &'a LineKeys,
    pub waiter: Option<&'a Waiter>,
    /// 0 to `MAX_PRIORITY`, higher first.
    pub priority: u8,
    pub order: LineOrder,
    /// Waiters each pool's line holds at most, in pool order (0: no limit).
    pub max_waiting: &'a [u64],
    /// A full own pool makes a waiter wait (in its own line) instead of refusing it.
    pub own_waits: bool,
}

/// The highest priority an acquire may ask for.
pub const MAX_PRIORITY: u8 = 9;

/// Where a waiter stands: its ticket, and its place in the line of each of its pools (0 for a
/// pool without a line); lower places are earlier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub ticket: u64,
    pub places: Vec<u64>,
}

/// What Redis counts for a holder in a tag (`<tag>:holders:<id>:members`): its members, and the
/// sum of their ids (`LeaseRecord::id_value` per member).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counted {
    pub members: u64,
    pub ids: u64,
}

/// What one keep-alive found for one group (the leases of one holders key, one hash tag).
#[derive(Debug, Clone, PartialEq)]
pub struct Kept {
    pub holders: String,
    /// The holder's entry was live, and is extended; else its leases must be checked one by one.
    pub alive: bool,
    /// What Redis counts for the holder in the tag (None for the embedded stores, which never
    /// lose a member).
    pub counted: Option<Counted>,
    /// The tag's revocation stamp (`revoke`, which never repeats a value; always 0 in the
    /// embedded stores, whose revocations end this process's leases at once).
    pub revocations: u64,
}

/// What the calls of one renewal round found. Groups whose calls failed are not renewed: their
/// deadlines decide.
#[derive(Default)]
pub struct RoundReport {
    /// Holders keys of the groups kept alive (their remaining leases all extended).
    pub renewed: Vec<String>,
    /// Members removed because their holder held no lease of theirs.
    pub pruned: u64,
    /// Found gone and taken back.
    pub reclaimed: Vec<Arc<LeaseRecord>>,
    /// Found gone with no room to take them back (now removed everywhere).
    pub lost: Vec<Arc<LeaseRecord>>,
    /// Found gone and revoked by an operator, so never taken back (now removed everywhere).
    pub revoked: Vec<Arc<LeaseRecord>>,
    pub failures: Vec<CoreError>,
    /// Whether any call got an answer (for the circuit breaker).
    pub answered: bool,
}

pub enum Backend {
    Memory(Box<MemoryBackend>),
    Redis(Box<RedisBackend>),
}

impl Backend {
    /// Opens the backend a URL names (nothing is connected yet).
    pub fn open(url: &str, redis_timeout: std::time::Duration, ca_pem: Option<Vec<u8>>) -> CoreResult<Self> {
        match url.split_once("://").map(|(scheme, _)| scheme) {
            Some("memory") => Ok(Backend::Memory(Box::default())),
            Some("redis" | "rediss" | "unix" | "redis+unix" | "redis+cluster" | "rediss+cluster" | "redis+sentinel") => {
                RedisBackend::new(url, redis_timeout, ca_pem).map(|redis| Backend::Redis(Box::new(redis)))
            }
            _ => Err(CoreError::InvalidInput(format!(
                "unsupported URL {:?}: use memory://, redis://host:port/db, rediss://host:port/db (TLS), unix:///path/to/socket, redis+cluster://host:port,host:port or redis+sentinel://host:port,host:port/master_name",
                redis::redact(url)
            ))),
        }
    }

    /// Whether a script call must stay within one cluster slot.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Backend::Redis(r) if r.is_cluster())
    }

    /// The embedded backend never waits, so its calls can finish on the caller's thread.
    pub fn is_embedded(&self) -> bool {
        matches!(self, Backend::Memory(_))
    }

    pub fn call_stats(&self) -> CallStats {
        match self {
            Backend::Memory(_) => CallStats::default(),
            Backend::Redis(r) => r.call_stats(),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Backend::Memory(_) => "memory://".into(),
            Backend::Redis(r) => r.target().into(),
        }
    }

    /// Takes `weight` slots in every pool and the start from every rate policy, all or nothing.
    pub async fn acquire(
        &self,
        lease: &Arc<LeaseRecord>,
        ttl_ms: u64,
        in_line: Option<InLine<'_>>,
        rates: &RateCheck,
    ) -> CoreResult<AcquireOutcome> {
        match self {
            Backend::Memory(m) => Ok(m.acquire(lease, in_line, rates)),
            Backend::Redis(r) => r.acquire(lease, ttl_ms, in_line, rates).await,
        }
    }

    /// Keeps this process's waiters alive in the line (`waiter_ids`: every waiter it has);
    /// returns those whose places went to other users' waiters, to wake. The embedded store's
    /// waiters live and die with the process: it only says which were displaced.
    pub async fn heartbeat(
        &self,
        line: &LineKeys,
        waiter_ids: &[String],
        ttl_ms: u64,
    ) -> CoreResult<Vec<String>> {
        match self {
            Backend::Memory(m) => Ok(m.displaced()),
            Backend::Redis(r) => r.heartbeat(line, waiter_ids, ttl_ms).await,
        }
    }

    /// Takes a waiter out of the line (idempotent).
    pub async fn leave(&self, line: &LineKeys, waiter_id: &str) -> CoreResult<()> {
        match self {
            Backend::Memory(m) => {
                m.leave(waiter_id);
                Ok(())
            }
            Backend::Redis(r) => r.leave(line, waiter_id).await,
        }
    }

    /// Calls `woken` for every wake-up that a release in any process publishes, until the
    /// subscription breaks (the caller listens again); on a cluster, a sharded subscription on
    /// the node of the line's slot. The embedded store's releases happen in this process, which
    /// wakes its waiters itself: it never returns.
    pub async fn listen(&self, line: &LineKeys, woken: impl Fn()) -> CoreResult<()> {
        match self {
            Backend::Memory(_) => std::future::pending().await,
            Backend::Redis(r) => r.listen(line, woken).await,
        }
    }

    /// Keeps the groups (holders keys) alive for `ttl_ms` more and says what each holder's count
    /// is; failures go to `report`. With `resync`, each count is first taken again from the
    /// pools (the group's leases were just checked). The embedded store keeps what it holds until
    /// released: every group is alive.
    pub async fn keepalive(
        &self,
        groups: &[String],
        resync: bool,
        ttl_ms: u64,
        period_ms: u64,
        report: &mut RoundReport,
    ) -> Vec<Kept> {
        match self {
            Backend::Memory(_) => {
                report.answered = true;
                groups
                    .iter()
                    .map(|holders| Kept {
                        holders: holders.clone(),
                        alive: true,
                        counted: None,
                        revocations: 0,
                    })
                    .collect()
            }
            Backend::Redis(r) => r.keepalive_all(groups, resync, ttl_ms, period_ms, report).await,
        }
    }

    /// The first step of a prune: the leases this holder has members of in a tag that are none
    /// of `keep` (lease ids), each with its weight as found; changes nothing. Only Redis can
    /// have such.
    pub async fn strays(&self, holders: &str, keep: &[String]) -> CoreResult<Vec<(String, u32)>> {
        match self {
            Backend::Memory(_) => Ok(Vec::new()),
            Backend::Redis(r) => r.strays(holders, keep).await,
        }
    }

    /// The second step: removes the members of `strays` (lease ids neither held nor in flight,
    /// never used again) this holder has in a tag, and counts its members again; returns how
    /// many were removed.
    pub async fn prune(&self, holders: &str, strays: &[(String, u32)]) -> CoreResult<u64> {
        match self {
            Backend::Memory(_) => Ok(0),
            Backend::Redis(r) => r.prune(holders, strays).await,
        }
    }

    /// Checks leases one by one: those gone are taken back where capacity allows
    /// (`report.reclaimed`), else removed everywhere (`report.lost`). Returns the holders keys
    /// whose check failed. Only Redis ever reports a group to check.
    pub async fn reclaim(
        &self,
        leases: &[Arc<LeaseRecord>],
        ttl_ms: u64,
        report: &mut RoundReport,
    ) -> HashSet<String> {
        match self {
            Backend::Memory(_) => HashSet::new(),
            Backend::Redis(r) => r.reclaim(leases, ttl_ms, report).await,
        }
    }

    /// Removes the leases of one batch (idempotent) and wakes the line's waiters in every
    /// process; returns whether each lease was still there, or the error Redis met removing it
    /// (a key of another type among its pools: a retry would meet it again).
    pub async fn release(
        &self,
        leases: &[Arc<LeaseRecord>],
        line: Option<&LineKeys>,
    ) -> CoreResult<Vec<CoreResult<bool>>> {
        match self {
            Backend::Memory(m) => Ok(m.release(leases).into_iter().map(Ok).collect()),
            Backend::Redis(r) => r.release(leases, line).await,
        }
    }

    /// The manager's holder leaves the tags of `holders_keys` (one hash slot) where it holds
    /// nothing any more (its manager closes); the embedded store keeps no holders.
    pub async fn depart(&self, holders_keys: &[String]) -> CoreResult<u64> {
        match self {
            Backend::Memory(_) => Ok(0),
            Backend::Redis(r) => r.depart(holders_keys).await,
        }
    }

    /// One hit of `cost` against every policy (`keys[i]` counts `policies[i]`, all in one hash
    /// tag), all or nothing; `consume: false` only looks.
    pub async fn hit(
        &self,
        keys: &[String],
        policies: &[RatePolicy],
        cost: u64,
        consume: bool,
    ) -> CoreResult<HitOutcome> {
        match self {
            Backend::Memory(m) => Ok(m.hit(keys, policies, cost, consume)),
            Backend::Redis(r) => r.hit(keys, policies, cost, consume).await,
        }
    }

    /// Tops up streams' token budgets, all in one call (one hash tag on a cluster).
    pub async fn top_up(&self, top_ups: &[&TopUp]) -> CoreResult<Vec<ToppedUp>> {
        match self {
            Backend::Memory(m) => Ok(m.top_up(top_ups)),
            Backend::Redis(r) => r.top_up(top_ups).await,
        }
    }

    /// Settles one ended stream's budgets (charges, refunds to their buckets), at most once
    /// however often it is sent.
    pub async fn settle(&self, settlement: &Settlement) -> CoreResult<()> {
        match self {
            Backend::Memory(m) => {
                m.settle(&settlement.adjustments);
                Ok(())
            }
            Backend::Redis(r) => r.settle(settlement).await,
        }
    }

    /// Revokes every lease in a user's own pool (`pool_key`, its tag's `holders`) in every
    /// process, and bans the user's new streams for `ban_ms` (0: none); returns how many leases.
    /// Their holders end them: here at once (the caller), elsewhere at their next keep-alive,
    /// which finds the tag's revocation stamp changed and lists them (`revoked`).
    pub async fn revoke(
        &self,
        pool_key: &str,
        holders: &str,
        ban_ms: u64,
        remember_ms: u64,
    ) -> CoreResult<u64> {
        match self {
            Backend::Memory(m) => Ok(m.revoke(pool_key, ban_ms)),
            Backend::Redis(r) => r.revoke(pool_key, holders, ban_ms, remember_ms).await,
        }
    }

    /// The ids of the leases revoked in a tag (`holders`) lately.
    pub async fn revoked(&self, holders: &str) -> CoreResult<Vec<String>> {
        match self {
            Backend::Memory(_) => Ok(Vec::new()),
            Backend::Redis(r) => r.revoked(holders).await,
        }
    }

    /// Forgets the counters (support staff giving a user a fresh allowance).
    pub async fn forget_rates(&self, keys: &[String]) -> CoreResult<()> {
        match self {
            Backend::Memory(m) => {
                m.forget_rates(keys);
                Ok(())
            }
            Backend::Redis(r) => r.forget_rates(keys).await,
        }
    }

    /// Slots in use in pools of one hash tag (at least one), leases of dead holders excluded
    /// (Redis: as far as reaped; `ttl_ms`, this manager's lease duration, sizes the clock-step
    /// guard). One call.
    pub async fn count(&self, pool_keys: &[String], ttl_ms: u64) -> CoreResult<Vec<u64>> {
        match self {
            Backend::Memory(m) => Ok(pool_keys.iter().map(|key| m.count(key)).collect()),
            Backend::Redis(r) => r.count(pool_keys, ttl_ms).await,
        }
    }
}

/// The manager's backend behind its circuit breaker, and the local floor that admits while it
/// is down.
pub struct Stores {
    main: Backend,
    fallback: Backend,
    breaker: Breaker,
}

impl Stores {
    pub fn new(main: Backend) -> Self {
        Stores {
            main,
            fallback: Backend::Memory(Box::default()),
            breaker: Breaker::default(),
        }
    }

    pub fn get(&self, store: Store) -> &Backend {
        match store {
            Store::Main => &self.main,
            Store::Fallback => &self.fallback,
        }
    }

    pub fn main(&self) -> &Backend {
        &self.main
    }

    pub fn breaker(&self) -> &Breaker {
        &self.breaker
    }

    /// Runs one call on a store. Calls to the main store go through the breaker: refused without
    /// a call while it is open (a dead server would cost each one the full timeout), and their
    /// outcome feeds it.
    pub async fn call<'a, T, Call>(
        &'a self,
        store: Store,
        call: impl FnOnce(&'a Backend) -> Call,
    ) -> CoreResult<T>
    where
        Call: Future<Output = CoreResult<T>> + 'a,
    {
        let backend = self.get(store);
        if store == Store::Fallback {
            return call(backend).await;
        }
        if let Permit::Wait(left) = self.breaker.admit() {
            return Err(CoreError::breaker_open(&backend.describe(), left));
        }
        let outcome = call(backend).await;
        self.breaker.observe(&outcome);
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{Pool, PoolRole};

    fn lease_in(key: String, weight: u32) -> Arc<LeaseRecord> {
        let pool = Pool::new("global", key, 0, PoolRole::Shared);
        Arc::new(LeaseRecord::new(vec![pool], weight, Store::Main))
    }

    #[test]
    fn batches_bound_the_members_per_call() {
        let leases: Vec<_> = (0..2500).map(|_| lease_in("k".into(), 1)).collect();
        let sizes: Vec<usize> = batches(&leases, false).iter().map(|b| b.len()).collect();
        assert_eq!(sizes, vec![1000, 1000, 500]);
        let heavy: Vec<_> = (0..25).map(|_| lease_in("k".into(), 100)).collect();
        let heavy_sizes: Vec<usize> = batches(&heavy, false).iter().map(|b| b.len()).collect();
        assert_eq!(heavy_sizes, vec![10, 10, 5]);
        assert!(batches(&[], true).is_empty());
        let tagged = |tag: &str| lease_in(format!("{{{tag}}}:user"), 1);
        let spread = vec![tagged("a"), tagged("a"), tagged("b")];
        let sizes: Vec<usize> = batches(&spread, true).iter().map(|b| b.len()).collect();
        assert_eq!(sizes, vec![2, 1]);
    }
}
