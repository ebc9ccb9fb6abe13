//! Where pools live: the embedded in-memory store or Redis (standalone, cluster or behind
//! Sentinel). Both give the same answers; the rest of the core talks to them only through the
//! `Backend` trait, whose default methods are what a store does that keeps its leases in this
//! process until they are released: nothing expires, no other process takes part.

mod acquire;
mod memory;
mod redis;
mod renewal;
mod stores;

use std::collections::HashSet;
use std::future::ready;
use std::sync::Arc;

use futures_util::future::BoxFuture;

use crate::config::GrantTerms;
use crate::errors::{CoreError, CoreResult};
use crate::keys::LineKeys;
use crate::lease::LeaseRecord;
use crate::rate::{HitOutcome, RateCheck, RatePolicy, Settlement, TopUp, ToppedUp};

pub use self::acquire::{AcquireOutcome, InLine, Placed, Waiter, MAX_PRIORITY};
pub use self::memory::MemoryBackend;
pub use self::redis::{
    acquire_call, parse_sentinel, redact, release_call, script_names, script_source, settle_call,
    KeysAndArgs, RedisBackend, HOLDER_IDS,
};
pub use self::renewal::{batches, Counted, Kept, RoundReport};
pub use self::stores::Stores;

/// Opens the store a URL names (nothing is connected yet).
pub fn open(
    url: &str,
    redis_timeout: std::time::Duration,
    ca_pem: Option<Vec<u8>>,
) -> CoreResult<Box<dyn Backend>> {
    match url.split_once("://") {
        Some(("memory", name)) => Ok(Box::new(MemoryBackend::named(name))),
        Some(("redis" | "rediss" | "unix" | "redis+unix" | "redis+cluster" | "rediss+cluster" | "redis+sentinel", _)) => {
            Ok(Box::new(RedisBackend::new(url, redis_timeout, ca_pem)?))
        }
        _ => Err(CoreError::InvalidInput(format!(
            "unsupported URL {:?}: use memory:// (or memory://<name>, shared by the managers of one process that name it), redis://host:port/db, rediss://host:port/db (TLS), unix:///path/to/socket, redis+cluster://host:port,host:port or redis+sentinel://host:port,host:port/master_name",
            redact(url)
        ))),
    }
}

/// The script calls a store made so far (none for the embedded store), for metrics.
#[derive(Debug, Clone, Copy, Default)]
pub struct CallStats {
    pub calls: u64,
    /// Those that failed: an error, a timeout, no connection.
    pub failed: u64,
    /// The time they took, in all, in microseconds.
    pub micros: u64,
}

/// A store's answer, already there: the embedded store never waits.
fn answered<'a, T: Send + 'a>(value: T) -> BoxFuture<'a, T> {
    Box::pin(ready(value))
}

/// What a store can do. Calls take a boxed future so that one manager holds either store
/// (`Box<dyn Backend>`, chosen by URL at run time).
pub trait Backend: Send + Sync {
    /// The store for messages: `memory://`, or the URL without its password.
    fn describe(&self) -> String;

    /// Whether a script call must stay within one cluster slot.
    fn is_cluster(&self) -> bool {
        false
    }

    /// Whether the store is in this process and never waits, so its calls can finish on the
    /// caller's thread.
    fn is_embedded(&self) -> bool {
        false
    }

    fn call_stats(&self) -> CallStats {
        CallStats::default()
    }

    /// Takes `weight` slots in every pool and the start from every rate policy, all or nothing.
    fn acquire<'a>(
        &'a self,
        lease: &'a Arc<LeaseRecord>,
        terms: GrantTerms,
        in_line: Option<InLine<'a>>,
        rates: &'a RateCheck,
    ) -> BoxFuture<'a, CoreResult<AcquireOutcome>>;

    /// Keeps this process's waiters alive in the line (`waiter_ids`: every waiter it has);
    /// returns those whose places went to other users' waiters, to wake.
    fn heartbeat<'a>(
        &'a self,
        line: &'a LineKeys,
        waiter_ids: &'a [String],
        ttl_ms: u64,
    ) -> BoxFuture<'a, CoreResult<Vec<String>>>;

    /// Takes a waiter out of the line (idempotent).
    fn leave<'a>(&'a self, line: &'a LineKeys, waiter_id: &'a str) -> BoxFuture<'a, CoreResult<()>>;

    /// Calls `woken` for every wake-up that a release in any process publishes, until the
    /// subscription breaks (the caller listens again). A store whose releases all happen in
    /// this process, which wakes its waiters itself, never returns.
    fn listen<'a>(
        &'a self,
        _line: &'a LineKeys,
        _woken: Box<dyn Fn() + Send + Sync + 'a>,
    ) -> BoxFuture<'a, CoreResult<()>> {
        Box::pin(std::future::pending())
    }

    /// Keeps the groups (holders keys) alive for `ttl_ms` more and says what each holder's count
    /// is; failures go to `report`. With `resync`, each count is first taken again from the
    /// pools (the group's leases were just checked). A store that keeps what it holds until
    /// released finds every group alive.
    fn keepalive<'a>(
        &'a self,
        groups: &'a [String],
        _resync: bool,
        _ttl_ms: u64,
        _period_ms: u64,
        report: &'a mut RoundReport,
    ) -> BoxFuture<'a, Vec<Kept>> {
        report.answered = true;
        let kept = groups.iter().map(|holders| Kept {
            holders: holders.clone(),
            alive: true,
            counted: None,
            revocations: 0,
        });
        answered(kept.collect())
    }

    /// The first step of a prune: the leases this holder has members of in a tag that are none
    /// of `keep` (lease ids), each with its weight as found; changes nothing. Only a store
    /// shared with other processes can have such.
    fn strays<'a>(
        &'a self,
        _holders: &'a str,
        _keep: &'a [String],
    ) -> BoxFuture<'a, CoreResult<Vec<(String, u32)>>> {
        answered(Ok(Vec::new()))
    }

    /// The second step: removes the members of `strays` (lease ids neither held nor in flight,
    /// never used again) this holder has in a tag, and counts its members again; returns how
    /// many were removed.
    fn prune<'a>(
        &'a self,
        _holders: &'a str,
        _strays: &'a [(String, u32)],
    ) -> BoxFuture<'a, CoreResult<u64>> {
        answered(Ok(0))
    }

    /// Checks leases one by one: those gone are taken back where capacity allows
    /// (`report.reclaimed`), else removed everywhere (`report.lost`). Returns the holders keys
    /// whose check failed. Only a store whose keep-alive finds a group not alive has any.
    fn reclaim<'a>(
        &'a self,
        _leases: &'a [Arc<LeaseRecord>],
        _ttl_ms: u64,
        _report: &'a mut RoundReport,
    ) -> BoxFuture<'a, HashSet<String>> {
        answered(HashSet::new())
    }

    /// Removes the leases of one batch (idempotent) and wakes the line's waiters in every
    /// process; returns whether each lease was still there, or the error the store met removing
    /// it (a key of another type among its pools: a retry would meet it again).
    fn release<'a>(
        &'a self,
        leases: &'a [Arc<LeaseRecord>],
        line: Option<&'a LineKeys>,
    ) -> BoxFuture<'a, CoreResult<Vec<CoreResult<bool>>>>;

    /// The manager's holder leaves the tags of `holders_keys` (one hash slot) where it holds
    /// nothing any more (its manager closes); returns how many. A store without holders has
    /// none to leave.
    fn depart<'a>(&'a self, _holders_keys: &'a [String]) -> BoxFuture<'a, CoreResult<u64>> {
        answered(Ok(0))
    }

    /// One hit of `cost` against every policy (`keys[i]` counts `policies[i]`, all in one hash
    /// tag), all or nothing; `consume: false` only looks. An allowed hit also takes up to
    /// `aheads[i]` units of `policies[i]` for this process (`HitOutcome::ahead`; `aheads` empty:
    /// none), where the store is shared: the embedded store takes none.
    fn hit<'a>(
        &'a self,
        keys: &'a [String],
        policies: &'a [RatePolicy],
        cost: u64,
        aheads: &'a [u64],
        consume: bool,
    ) -> BoxFuture<'a, CoreResult<HitOutcome>>;

    /// Tops up streams' token budgets, all in one call (one hash tag on a cluster).
    fn top_up<'a>(&'a self, top_ups: &'a [&'a TopUp]) -> BoxFuture<'a, CoreResult<Vec<ToppedUp>>>;

    /// Settles one ended stream's budgets (charges, refunds to their buckets), at most once
    /// however often it is sent.
    fn settle<'a>(&'a self, settlement: &'a Settlement) -> BoxFuture<'a, CoreResult<()>>;

    /// The counts of a model's histogram of answer sizes (`model`), by bucket
    /// (`rate::answer_sizes`), as settlements counted them, then those of an identity's own
    /// when `own` is given.
    fn answer_sizes<'a>(
        &'a self,
        model: &'a str,
        own: Option<&'a str>,
    ) -> BoxFuture<'a, CoreResult<Vec<u64>>>;

    /// Revokes every lease in a user's own pool (`pool_key`, its tag's `holders`) in every
    /// process, and bans the user's new streams for `ban_ms` (0: none); returns how many leases.
    /// Their holders end them: here at once (the caller), elsewhere when they hear the tag on
    /// `channel` (`listen_revocations`), or at their next keep-alive, which finds the tag's
    /// revocation stamp changed; they list them with `revoked`.
    fn revoke<'a>(
        &'a self,
        pool_key: &'a str,
        holders: &'a str,
        ban_ms: u64,
        remember_ms: u64,
        channel: &'a str,
    ) -> BoxFuture<'a, CoreResult<u64>>;

    /// Calls `heard` with the tag (holders key) of every revoke any process publishes on
    /// `channel`, or with None where messages may have been missed (once subscribed: what was
    /// published before reached no one here), until the subscription breaks (the caller listens
    /// again). A store whose revocations end its leases at once never returns.
    fn listen_revocations<'a>(
        &'a self,
        _channel: &'a str,
        _heard: Box<dyn Fn(Option<String>) + Send + Sync + 'a>,
    ) -> BoxFuture<'a, CoreResult<()>> {
        Box::pin(std::future::pending())
    }

    /// The ids of the leases revoked in a tag (`holders`) lately, each with the ms its user's
    /// new streams are still banned for (0: none). A store whose revocations end its leases at
    /// once lists none.
    fn revoked<'a>(&'a self, _holders: &'a str) -> BoxFuture<'a, CoreResult<Vec<(String, u64)>>> {
        answered(Ok(Vec::new()))
    }

    /// Forgets the counters (support staff giving a user a fresh allowance).
    fn forget_rates<'a>(&'a self, keys: &'a [String]) -> BoxFuture<'a, CoreResult<()>>;

    /// Slots in use in pools of one hash tag (at least one), leases of dead holders excluded
    /// (Redis: as far as reaped; `ttl_ms`, this manager's lease duration, sizes the clock-step
    /// guard). One call.
    fn count<'a>(&'a self, pool_keys: &'a [String], ttl_ms: u64) -> BoxFuture<'a, CoreResult<Vec<u64>>>;
}
