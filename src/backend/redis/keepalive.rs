//! The renewal round's calls: one keep-alive per hash tag (many tags per call), and the check of
//! leases one by one for tags where the holder's entry lapsed or grants went missing.

use std::collections::HashSet;
use std::sync::Arc;

use super::{batch_invocation, scripts, unexpected_reply, RedisBackend};
use crate::backend::{batches, Counted, Kept, RoundReport};
use crate::errors::CoreResult;
use crate::lease::LeaseRecord;
use crate::runtime::a_few_at_a_time;
use crate::sync::lock;

/// Hash tags kept alive per keep-alive call (standalone; a cluster takes one per call).
const TAGS_PER_KEEPALIVE: usize = 1000;

/// Lease ids one prune lists (and removes) at most; more wait for the next round's prune.
const STRAYS_PER_CALL: usize = 1000;

/// Script calls of one renewal round in flight at once, so acquires are not queued behind it.
const RENEW_CALLS_IN_FLIGHT: usize = 2;

impl RedisBackend {
    /// Keep-alive calls for many groups, a few in flight at once; failures go to
    /// `report.failures`, the others say what each tag holds.
    pub async fn keepalive_all(
        &self,
        groups: &[String],
        resync: bool,
        ttl_ms: u64,
        period_ms: u64,
        report: &mut RoundReport,
    ) -> Vec<Kept> {
        if !resync {
            // A round's first keep-alive: scans of tags no longer held are over.
            let tags: HashSet<&str> = groups.iter().map(String::as_str).collect();
            lock(&self.cursors).retain(|tag, _| tags.contains(tag.as_str()));
        }
        let per_call = if self.is_cluster() { 1 } else { TAGS_PER_KEEPALIVE };
        // Futures built first, then streamed: a closure inside the stream would not be `Send`.
        let calls: Vec<_> = groups
            .chunks(per_call)
            .map(|chunk| self.keepalive(chunk, resync, ttl_ms, period_ms))
            .collect();
        let outcomes = a_few_at_a_time(calls, RENEW_CALLS_IN_FLIGHT).await;
        let mut kept = Vec::with_capacity(groups.len());
        for outcome in outcomes {
            match outcome {
                Ok(tags) => {
                    report.answered = true;
                    kept.extend(tags);
                }
                Err(e) => report.failures.push(e),
            }
        }
        kept
    }

    /// Extends this holder's entry in each group's tag where it is live, and reads its count.
    async fn keepalive(
        &self,
        groups: &[String],
        resync: bool,
        ttl_ms: u64,
        period_ms: u64,
    ) -> CoreResult<Vec<Kept>> {
        let mut invocation = scripts::KEEPALIVE.prepare_invoke();
        invocation
            .arg(self.holder)
            .arg(ttl_ms)
            .arg(period_ms)
            .arg(u8::from(resync));
        {
            let cursors = lock(&self.cursors);
            for holders in groups {
                invocation.key(holders);
                invocation.arg(cursors.get(holders).map_or("0", String::as_str));
            }
        }
        let reply: Vec<String> = self.link.run(&invocation).await?;
        if reply.len() != 5 * groups.len() {
            return Err(unexpected_reply("keep-alive", &reply));
        }
        let mut cursors = lock(&self.cursors);
        groups
            .iter()
            .zip(reply.chunks(5))
            .map(|(holders, tag)| {
                let [alive, members, ids, cursor, revocations] = tag else {
                    unreachable!("chunks of 5")
                };
                let number = |text: &str| {
                    text.parse::<i64>()
                        .map_err(|_| unexpected_reply("keep-alive", &reply))
                };
                if cursor == "0" {
                    cursors.remove(holders);
                } else {
                    cursors.insert(holders.clone(), cursor.clone());
                }
                Ok(Kept {
                    holders: holders.clone(),
                    alive: alive == "1",
                    // A count may go below 0 while a holder registers again; it is then short.
                    counted: Some(Counted {
                        members: number(members)?.max(0) as u64,
                        ids: number(ids)?.max(0) as u64,
                    }),
                    revocations: number(revocations)?.max(0) as u64,
                })
            })
            .collect()
    }

    /// Lists the leases this holder has members of in a tag that are none of `keep`, with the
    /// highest unit of each found (`lua/strays.lua`, the first step of a prune; changes nothing).
    pub async fn strays(&self, holders: &str, keep: &[String]) -> CoreResult<Vec<(String, u32)>> {
        let mut invocation = scripts::STRAYS.prepare_invoke();
        invocation
            .key(holders)
            .arg(self.holder)
            .arg(STRAYS_PER_CALL)
            .arg(keep);
        self.link.run(&invocation).await
    }

    /// Removes the members of `strays` (lease ids and weights) this holder has in a tag, then
    /// counts its members again (`lua/prune.lua`, the second step of a prune).
    pub async fn prune(&self, holders: &str, strays: &[(String, u32)]) -> CoreResult<u64> {
        let mut invocation = scripts::PRUNE.prepare_invoke();
        invocation.key(holders).arg(self.holder);
        for (id, weight) in strays {
            invocation.arg(id).arg(*weight);
        }
        self.link.run(&invocation).await
    }

    /// Checks leases one by one (`lua/reclaim.lua`), in batches of one slot each (the leases
    /// come group by group, so in runs of one tag); returns the holders keys whose check failed.
    pub async fn reclaim(
        &self,
        leases: &[Arc<LeaseRecord>],
        ttl_ms: u64,
        report: &mut RoundReport,
    ) -> HashSet<String> {
        let checks: Vec<_> = batches(leases, self.is_cluster())
            .into_iter()
            .map(|batch| async move {
                let invocation = batch_invocation(&scripts::RECLAIM, batch, true, |invocation| {
                    invocation.arg(self.holder).arg(ttl_ms);
                });
                (
                    batch,
                    self.link
                        .run::<(Vec<usize>, Vec<usize>, Vec<usize>)>(&invocation)
                        .await,
                )
            })
            .collect();
        let checks = a_few_at_a_time(checks, RENEW_CALLS_IN_FLIGHT).await;
        let mut failed = HashSet::new();
        for (batch, outcome) in checks {
            match outcome {
                Ok((lost, reclaimed, revoked)) => {
                    report.answered = true;
                    // 1-based positions in the batch.
                    let at = |position: &usize| batch.get(position.wrapping_sub(1)).map(Arc::clone);
                    report.lost.extend(lost.iter().filter_map(at));
                    report.reclaimed.extend(reclaimed.iter().filter_map(at));
                    report.revoked.extend(revoked.iter().filter_map(at));
                }
                Err(e) => {
                    report.failures.push(e);
                    failed.extend(batch.iter().map(|lease| lease.holders.to_string()));
                }
            }
        }
        failed
    }
}
