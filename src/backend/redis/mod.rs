//! Redis, standalone, cluster or behind Sentinel: the store's facade. Each script's call and
//! reply is in the file named after it (`acquire.rs`, `release.rs`, `keepalive.rs`, `hit.rs`,
//! `budget.rs`, `line.rs`, `revoke.rs`, `count.rs`; the layout they share in `layout.rs`), the
//! batching of acquires and hits in `batched.rs`, the connection in `connection.rs` (its
//! subscriptions in `subscription.rs`), URLs in `url.rs`, the scripts in `scripts.rs` (their
//! text in `src/lua/`; keys and states in `docs/design.md`).

mod acquire;
mod batched;
mod budget;
mod connection;
mod count;
mod credentials;
mod hit;
mod keepalive;
mod layout;
mod line;
mod link_errors;
mod release;
mod revoke;
mod scripts;
mod sentinel_url;
mod subscription;
mod url;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use redis::Value;

use self::acquire::{acquire_request, decode_acquire, AcquireUndo, Asked};
use self::batched::{BatchedCalls, Replied};
use self::connection::Link;
use self::layout::unexpected_reply;
use self::line::{heartbeat_invocation, leave_invocation, wake_channel};
use self::subscription::Sharding;
use super::{AcquireOutcome, Backend, CallStats, InLine, Kept, RoundReport};
use crate::config::GrantTerms;
use crate::errors::{CoreError, CoreResult};
use crate::group_commit::GroupCommit;
use crate::keys::{self, LineKeys};
use crate::lease::LeaseRecord;
use crate::rate::{HitOutcome, RateCheck, RatePolicy, Settlement, TopUp, ToppedUp};

pub use self::acquire::acquire_call;
pub use self::budget::settle_call;
pub use self::credentials::redact;
pub use self::layout::KeysAndArgs;
pub use self::release::release_call;
pub use self::scripts::{script_names, script_source};
pub use self::sentinel_url::parse_sentinel;

/// Holder ids stay below 2^48: exact as Redis scores, and printed the same by Lua and Rust.
pub const HOLDER_IDS: u64 = 1 << 48;

pub struct RedisBackend {
    link: Arc<Link>,
    /// Acquires (hits) that come while one is in flight go together, decided in order by one
    /// call.
    acquires: Arc<GroupCommit<BatchedCalls>>,
    hits: Arc<GroupCommit<BatchedCalls>>,
    /// This manager's holder id: it scores its leases in every pool and keeps them alive with
    /// one entry per hash tag (see `docs/design.md`).
    holder: u64,
    /// Where each tag's keep-alive goes on refreshing the holder's pools (absent: from the start).
    cursors: Mutex<HashMap<String, String>>,
}

impl RedisBackend {
    pub fn new(url: &str, timeout: Duration, ca_pem: Option<Vec<u8>>) -> CoreResult<Self> {
        scripts::prepare_all();
        let link = Arc::new(url::open(url, timeout, ca_pem)?);
        let holder =
            1 + u64::from_le_bytes(uuid::Uuid::new_v4().as_bytes()[..8].try_into().expect("8 bytes"))
                % (HOLDER_IDS - 1);
        Ok(RedisBackend {
            acquires: BatchedCalls::of(&scripts::ACQUIRE, &link, holder),
            hits: BatchedCalls::of(&scripts::HIT, &link, holder),
            link,
            holder,
            cursors: Mutex::new(HashMap::new()),
        })
    }
}

impl Backend for RedisBackend {
    fn describe(&self) -> String {
        self.link.errors.target().to_owned()
    }

    fn is_cluster(&self) -> bool {
        self.link.is_cluster()
    }

    fn call_stats(&self) -> CallStats {
        self.link.call_stats()
    }

    fn acquire<'a>(
        &'a self,
        lease: &'a Arc<LeaseRecord>,
        terms: GrantTerms,
        in_line: Option<InLine<'a>>,
        rates: &'a RateCheck,
    ) -> BoxFuture<'a, CoreResult<AcquireOutcome>> {
        Box::pin(async move {
            let asked = Asked {
                terms,
                in_line,
                rates,
                channel: in_line.map_or(String::new(), |l| wake_channel(l.line, self.is_cluster())),
                holder: self.holder,
            };
            let mut request = acquire_request(lease, &asked);
            request.undo = Some(Box::new(AcquireUndo {
                lease: Arc::clone(lease),
                waiter: in_line.and_then(|l| l.waiter.map(|w| (l.line.clone(), w.id.clone()))),
                rates: rates.clone(),
            }));
            let Replied { sent_at_ms, reply } = self.acquires.submit(request).await?;
            decode_acquire(
                &reply,
                lease,
                in_line,
                &rates.policies,
                sent_at_ms,
                terms.entry_known_until_ms,
            )
        })
    }

    fn heartbeat<'a>(
        &'a self,
        line: &'a LineKeys,
        waiter_ids: &'a [String],
        ttl_ms: u64,
    ) -> BoxFuture<'a, CoreResult<Vec<String>>> {
        Box::pin(async move {
            let invocation = heartbeat_invocation(line, waiter_ids, ttl_ms, self.holder);
            self.link.run(&invocation).await
        })
    }

    fn leave<'a>(&'a self, line: &'a LineKeys, waiter_id: &'a str) -> BoxFuture<'a, CoreResult<()>> {
        Box::pin(async move {
            let invocation = leave_invocation(line, waiter_id, self.holder);
            self.link.run::<u64>(&invocation).await.map(drop)
        })
    }

    /// On a cluster the channel is sharded (SSUBSCRIBE).
    fn listen<'a>(
        &'a self,
        line: &'a LineKeys,
        woken: Box<dyn Fn() + Send + Sync + 'a>,
    ) -> BoxFuture<'a, CoreResult<()>> {
        Box::pin(async move {
            let mut subscription = self.link.subscribe(&line.channel, Sharding::OnCluster).await?;
            while subscription.next().await.is_some() {
                woken();
            }
            Ok(())
        })
    }

    fn keepalive<'a>(
        &'a self,
        groups: &'a [String],
        resync: bool,
        ttl_ms: u64,
        period_ms: u64,
        report: &'a mut RoundReport,
    ) -> BoxFuture<'a, Vec<Kept>> {
        Box::pin(self.keepalive_all(groups, resync, ttl_ms, period_ms, report))
    }

    fn strays<'a>(
        &'a self,
        holders: &'a str,
        keep: &'a [String],
    ) -> BoxFuture<'a, CoreResult<Vec<(String, u32)>>> {
        Box::pin(async move {
            let invocation = keepalive::strays_invocation(holders, keep, self.holder);
            self.link.run(&invocation).await
        })
    }

    fn prune<'a>(&'a self, holders: &'a str, strays: &'a [(String, u32)]) -> BoxFuture<'a, CoreResult<u64>> {
        Box::pin(async move {
            let invocation = keepalive::prune_invocation(holders, strays, self.holder);
            self.link.run(&invocation).await
        })
    }

    fn reclaim<'a>(
        &'a self,
        leases: &'a [Arc<LeaseRecord>],
        ttl_ms: u64,
        report: &'a mut RoundReport,
    ) -> BoxFuture<'a, HashSet<String>> {
        Box::pin(self.reclaim_batches(leases, ttl_ms, report))
    }

    fn release<'a>(
        &'a self,
        leases: &'a [Arc<LeaseRecord>],
        line: Option<&'a LineKeys>,
    ) -> BoxFuture<'a, CoreResult<Vec<CoreResult<bool>>>> {
        Box::pin(async move {
            // A cluster's batch is of one slot: the line joins it only when it shares that slot
            // (without a global pool, users' own tags have no line).
            let cluster = self.is_cluster();
            let line = line.filter(|line| {
                !cluster
                    || leases
                        .first()
                        .is_some_and(|lease| keys::hash_tag(&line.line) == lease.hash_tag())
            });
            let line = line.map(|line| (line, wake_channel(line, cluster)));
            let invocation = release::release_invocation(leases, line, self.holder);
            let reply: Value = self.link.run(&invocation).await?;
            let answers = release::decode_release(&reply, leases.len())
                .ok_or_else(|| unexpected_reply("release", &reply))?;
            Ok(answers
                .into_iter()
                .map(|answer| answer.map_err(|message| self.link.errors.error_text(&message)))
                .collect())
        })
    }

    fn depart<'a>(&'a self, holders_keys: &'a [String]) -> BoxFuture<'a, CoreResult<u64>> {
        Box::pin(async move {
            let invocation = keepalive::depart_invocation(holders_keys, self.holder);
            self.link.run(&invocation).await
        })
    }

    fn hit<'a>(
        &'a self,
        keys: &'a [String],
        policies: &'a [RatePolicy],
        cost: u64,
        aheads: &'a [u64],
        consume: bool,
    ) -> BoxFuture<'a, CoreResult<HitOutcome>> {
        Box::pin(async move {
            let Some(request) = hit::hit_request(keys, policies, cost, aheads, consume) else {
                return Err(CoreError::Panic("a hit without a policy".into()));
            };
            let Replied { reply, .. } = self.hits.submit(request).await?;
            hit::decode_hit(&reply, policies, aheads)
        })
    }

    fn top_up<'a>(&'a self, top_ups: &'a [&'a TopUp]) -> BoxFuture<'a, CoreResult<Vec<ToppedUp>>> {
        Box::pin(async move {
            let reply: Vec<u64> = self.link.run(&budget::top_up_invocation(top_ups)).await?;
            budget::decode_top_up(&reply, top_ups)
        })
    }

    fn settle<'a>(&'a self, settlement: &'a Settlement) -> BoxFuture<'a, CoreResult<()>> {
        Box::pin(async move {
            match budget::settle_invocation(settlement) {
                Some(invocation) => self.link.run::<i64>(&invocation).await.map(drop),
                None => Ok(()),
            }
        })
    }

    fn answer_sizes<'a>(
        &'a self,
        model: &'a str,
        own: Option<&'a str>,
    ) -> BoxFuture<'a, CoreResult<Vec<u64>>> {
        Box::pin(async move { self.link.run(&budget::answers_invocation(model, own)).await })
    }

    fn revoke<'a>(
        &'a self,
        pool_key: &'a str,
        holders: &'a str,
        ban_ms: u64,
        remember_ms: u64,
        channel: &'a str,
    ) -> BoxFuture<'a, CoreResult<u64>> {
        Box::pin(async move {
            let invocation = revoke::revoke_invocation(pool_key, holders, ban_ms, remember_ms, channel);
            self.link.run(&invocation).await
        })
    }

    fn listen_revocations<'a>(
        &'a self,
        channel: &'a str,
        heard: Box<dyn Fn(Option<String>) + Send + Sync + 'a>,
    ) -> BoxFuture<'a, CoreResult<()>> {
        Box::pin(async move {
            let mut subscription = self.link.subscribe(channel, Sharding::Plain).await?;
            // Whatever was published before it was up is looked for now.
            heard(None);
            while let Some(message) = subscription.next().await {
                heard(message);
            }
            Ok(())
        })
    }

    fn revoked<'a>(&'a self, holders: &'a str) -> BoxFuture<'a, CoreResult<Vec<(String, u64)>>> {
        Box::pin(async move {
            let reply: Vec<String> = self.link.run(&revoke::revoked_invocation(holders)).await?;
            revoke::decode_revoked(&reply)
        })
    }

    fn forget_rates<'a>(&'a self, keys: &'a [String]) -> BoxFuture<'a, CoreResult<()>> {
        Box::pin(async move {
            let invocation = hit::forget_invocation(keys);
            self.link.run::<u64>(&invocation).await.map(drop)
        })
    }

    fn count<'a>(&'a self, pool_keys: &'a [String], ttl_ms: u64) -> BoxFuture<'a, CoreResult<Vec<u64>>> {
        Box::pin(async move {
            let counts: Vec<u64> = self.link.run(&count::count_invocation(pool_keys, ttl_ms)).await?;
            count::decode_count(counts, pool_keys.len())
        })
    }
}
