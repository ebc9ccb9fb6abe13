//! The renewal round's calls: one keep-alive per hash tag (many tags per call), and the check of
//! leases one by one for tags where the holder's entry lapsed or grants went missing.

use std::collections::HashSet;
use std::sync::Arc;

use super::{batch_invocation, lock, scripts, unexpected_reply, RedisBackend};
use crate::backend::{batches, Group, RoundReport};
use crate::errors::CoreResult;
use crate::lease::LeaseRecord;
use crate::runtime::a_few_at_a_time;

/// Hash tags kept alive per keep-alive call (standalone; a cluster takes one per call).
const TAGS_PER_KEEPALIVE: usize = 1000;

/// Script calls of one renewal round in flight at once, so acquires are not queued behind it.
const RENEW_CALLS_IN_FLIGHT: usize = 2;

impl RedisBackend {
    /// Keep-alive calls for many groups, a few in flight at once; the groups kept alive go to
    /// `report.renewed`, failures to `report.failures`; returns the groups to check one by one.
    pub async fn keepalive_all(
        &self,
        groups: &[Group],
        resync: bool,
        ttl_ms: u64,
        period_ms: u64,
        report: &mut RoundReport,
    ) -> Vec<Group> {
        if !resync {
            // A round's first keep-alive: scans of tags no longer held are over.
            let tags: HashSet<&str> = groups.iter().map(|g| g.holders.as_str()).collect();
            lock(&self.cursors).retain(|tag, _| tags.contains(tag.as_str()));
        }
        let per_call = if self.is_cluster() { 1 } else { TAGS_PER_KEEPALIVE };
        // Futures built first, then streamed: a closure inside the stream would not be `Send`.
        let calls: Vec<_> = groups
            .chunks(per_call)
            .map(|chunk| async move { (chunk, self.keepalive(chunk, resync, ttl_ms, period_ms).await) })
            .collect();
        let outcomes = a_few_at_a_time(calls, RENEW_CALLS_IN_FLIGHT).await;
        let mut stale = Vec::new();
        for (chunk, outcome) in outcomes {
            match outcome {
                Ok(flags) => {
                    report.answered = true;
                    for (group, alive) in chunk.iter().zip(flags) {
                        if alive {
                            report.renewed.push(group.holders.clone());
                        } else {
                            stale.push(group.clone());
                        }
                    }
                }
                Err(e) => report.failures.push(e),
            }
        }
        stale
    }

    /// Extends this holder's entry in each group's tag; false for a tag where it had expired or
    /// vanished, or where grants it knows of are missing. With `resync`, first raises each tag's
    /// count of granted members to what this process knows (its leases were just checked).
    async fn keepalive(
        &self,
        groups: &[Group],
        resync: bool,
        ttl_ms: u64,
        period_ms: u64,
    ) -> CoreResult<Vec<bool>> {
        let mut invocation = scripts::KEEPALIVE.prepare_invoke();
        invocation
            .arg(self.holder)
            .arg(ttl_ms)
            .arg(period_ms)
            .arg(u8::from(resync));
        {
            let cursors = lock(&self.cursors);
            for group in groups {
                invocation.key(&group.holders);
                invocation
                    .arg(cursors.get(&group.holders).map_or("0", String::as_str))
                    .arg(group.granted);
            }
        }
        let reply: Vec<String> = self.link.run(&invocation).await?;
        if reply.len() != 2 * groups.len() {
            return Err(unexpected_reply("keep-alive", &reply));
        }
        let mut cursors = lock(&self.cursors);
        Ok(groups
            .iter()
            .zip(reply.chunks(2))
            .map(|(group, pair)| {
                if pair[1] == "0" {
                    cursors.remove(&group.holders);
                } else {
                    cursors.insert(group.holders.clone(), pair[1].clone());
                }
                pair[0] == "1"
            })
            .collect())
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
                    self.link.run::<(Vec<usize>, Vec<usize>)>(&invocation).await,
                )
            })
            .collect();
        let checks = a_few_at_a_time(checks, RENEW_CALLS_IN_FLIGHT).await;
        let mut failed = HashSet::new();
        for (batch, outcome) in checks {
            match outcome {
                Ok((lost, reclaimed)) => {
                    report.answered = true;
                    // 1-based positions in the batch.
                    let at = |position: &usize| batch.get(position.wrapping_sub(1)).map(Arc::clone);
                    report.lost.extend(lost.iter().filter_map(at));
                    report.reclaimed.extend(reclaimed.iter().filter_map(at));
                }
                Err(e) => {
                    report.failures.push(e);
                    failed.extend(batch.iter().map(|lease| lease.holders.clone()));
                }
            }
        }
        failed
    }
}
