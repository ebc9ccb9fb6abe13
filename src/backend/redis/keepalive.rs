//! The renewal round's calls: one keep-alive per hash tag (`lua/keepalive.lua`, many tags per
//! call), the prune of members no lease holds (`lua/strays.lua`, then `lua/prune.lua`), the
//! check of leases one by one for tags where the holder's entry lapsed or grants went missing
//! (`lua/reclaim.lua`), and the holder's leave when its manager closes (`lua/depart.lua`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::layout::{unexpected_reply, TALLY_UNIT_BITS};
use super::release::reclaim_invocation;
use super::scripts::{self, Invocation};
use super::RedisBackend;
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

/// keepalive.lua's call: the holder, the lease duration and renewal period in ms, whether to
/// count again; per group its holders key and where the scan of its pools goes on ("0": from
/// the start).
fn keepalive_invocation(
    groups: &[String],
    cursors: &HashMap<String, String>,
    holder: u64,
    resync: bool,
    ttl_ms: u64,
    period_ms: u64,
) -> Invocation {
    let mut invocation = scripts::KEEPALIVE.prepare_invoke();
    invocation
        .arg(holder)
        .arg(ttl_ms)
        .arg(period_ms)
        .arg(u8::from(resync));
    for holders in groups {
        invocation.key(holders);
        invocation.arg(cursors.get(holders).map_or("0", String::as_str));
    }
    invocation
}

/// A holder's tally split into its count of members and the sum of their ids (each below half a
/// unit in size while the holder has fewer than 2^19 members in the tag). A count may go below 0
/// while a holder registers again; it is then short, and so is a sum below 0.
fn split_tally(tally: i64) -> Counted {
    let unit = 1i128 << TALLY_UNIT_BITS;
    let members = (i128::from(tally) + unit / 2).div_euclid(unit);
    let ids = i128::from(tally) - members * unit;
    Counted {
        members: members.max(0) as u64,
        ids: ids.max(0) as u64,
    }
}

/// keepalive.lua's reply: per group, whether its entry was alive, the holder's tally (its count
/// of members and sum of their ids), where the scan goes on ("0": done) and the tag's revocation
/// stamp.
fn decode_keepalive(groups: &[String], reply: &[String]) -> CoreResult<Vec<(Kept, String)>> {
    if reply.len() != 4 * groups.len() {
        return Err(unexpected_reply("keep-alive", &reply));
    }
    let number = |text: &str| {
        text.parse::<i64>()
            .map_err(|_| unexpected_reply("keep-alive", &reply))
    };
    groups
        .iter()
        .zip(reply.chunks(4))
        .map(|(holders, tag)| {
            let [alive, tally, cursor, revocations] = tag else {
                unreachable!("chunks of 4")
            };
            let kept = Kept {
                holders: holders.clone(),
                alive: alive == "1",
                counted: Some(split_tally(number(tally)?)),
                revocations: number(revocations)?.max(0) as u64,
            };
            Ok((kept, cursor.clone()))
        })
        .collect()
}

/// strays.lua's call, the first step of a prune (it changes nothing): lists the leases the
/// holder has members of in a tag that are none of `keep`, each with the highest unit found,
/// at most `STRAYS_PER_CALL`.
pub fn strays_invocation(holders: &str, keep: &[String], holder: u64) -> Invocation {
    let mut invocation = scripts::STRAYS.prepare_invoke();
    invocation.key(holders).arg(holder).arg(STRAYS_PER_CALL).arg(keep);
    invocation
}

/// prune.lua's call, the second step: removes the members of `strays` (lease ids and weights)
/// the holder has in a tag, then counts its members again. Replies with how many it removed.
pub fn prune_invocation(holders: &str, strays: &[(String, u32)], holder: u64) -> Invocation {
    let mut invocation = scripts::PRUNE.prepare_invoke();
    invocation.key(holders).arg(holder);
    for (id, weight) in strays {
        invocation.arg(id).arg(*weight);
    }
    invocation
}

/// depart.lua's call: the holder leaves the tags of `holders_keys` where it holds nothing.
/// Replies with how many.
pub fn depart_invocation(holders_keys: &[String], holder: u64) -> Invocation {
    let mut invocation = scripts::DEPART.prepare_invoke();
    invocation.key(holders_keys).arg(holder);
    invocation
}

impl RedisBackend {
    /// Keep-alive calls for many groups, a few in flight at once; failures go to
    /// `report.failures`, the others say what each tag holds.
    pub(super) async fn keepalive_all(
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
        let per_call = if self.link.is_cluster() {
            1
        } else {
            TAGS_PER_KEEPALIVE
        };
        // Futures built first, then streamed: a closure inside the stream would not be `Send`.
        let calls: Vec<_> = groups
            .chunks(per_call)
            .map(|chunk| self.keepalive_call(chunk, resync, ttl_ms, period_ms))
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
    async fn keepalive_call(
        &self,
        groups: &[String],
        resync: bool,
        ttl_ms: u64,
        period_ms: u64,
    ) -> CoreResult<Vec<Kept>> {
        let invocation = keepalive_invocation(
            groups,
            &lock(&self.cursors),
            self.holder,
            resync,
            ttl_ms,
            period_ms,
        );
        let reply: Vec<String> = self.link.run(&invocation).await?;
        let decoded = decode_keepalive(groups, &reply)?;
        let mut cursors = lock(&self.cursors);
        Ok(decoded
            .into_iter()
            .map(|(kept, cursor)| {
                if cursor == "0" {
                    cursors.remove(&kept.holders);
                } else {
                    cursors.insert(kept.holders.clone(), cursor);
                }
                kept
            })
            .collect())
    }

    /// Checks leases one by one, in batches of one slot each (the leases come group by group,
    /// so in runs of one tag); returns the holders keys whose check failed.
    pub(super) async fn reclaim_batches(
        &self,
        leases: &[Arc<LeaseRecord>],
        ttl_ms: u64,
        report: &mut RoundReport,
    ) -> HashSet<String> {
        let checks: Vec<_> = batches(leases, self.link.is_cluster())
            .into_iter()
            .map(|batch| async move {
                let invocation = reclaim_invocation(batch, self.holder, ttl_ms);
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

#[cfg(test)]
mod tests {
    use super::super::layout::read;
    use super::*;

    #[test]
    fn a_keepalive_goes_on_each_scan_where_it_stopped() {
        let groups = ["{a}:holders".to_owned(), "{b}:holders".to_owned()];
        let cursors = HashMap::from([("{b}:holders".to_owned(), "42".to_owned())]);
        let call = keepalive_invocation(&groups, &cursors, 7, true, 30_000, 10_000);
        assert_eq!(read::keys(&call), ["{a}:holders", "{b}:holders"]);
        assert_eq!(read::args(&call), ["7", "30000", "10000", "1", "0", "42"]);
    }

    #[test]
    fn a_tally_splits_into_its_count_and_sum_of_ids() {
        let unit = 1i64 << TALLY_UNIT_BITS;
        let most = (1i64 << 19) - 1; // members, each with the largest id value
        let ids = most * ((1 << 24) - 1);
        assert_eq!(
            split_tally(most * unit + ids),
            Counted {
                members: most as u64,
                ids: ids as u64
            }
        );
        assert_eq!(
            split_tally(2 * unit - 5),
            Counted { members: 2, ids: 0 },
            "a sum below 0 is short"
        );
        assert_eq!(split_tally(0), Counted { members: 0, ids: 0 });
    }

    #[test]
    fn a_keepalive_reply_says_what_each_tag_holds() {
        let groups = ["{a}:holders".to_owned(), "{b}:holders".to_owned()];
        let unit = 1i64 << TALLY_UNIT_BITS;
        let (three_members, short) = (3 * unit + 99, -2 * unit + 5);
        let (three_members, short) = (three_members.to_string(), short.to_string());
        let reply: Vec<String> = ["1", &three_members, "0", "0", "0", &short, "17", "4"]
            .map(String::from)
            .to_vec();
        let decoded = decode_keepalive(&groups, &reply).expect("decoded");
        let (a, b) = (&decoded[0], &decoded[1]);
        assert!(a.0.alive && !b.0.alive);
        assert_eq!(a.0.counted, Some(Counted { members: 3, ids: 99 }));
        assert_eq!(
            b.0.counted,
            Some(Counted { members: 0, ids: 5 }),
            "a count below 0 is short"
        );
        assert_eq!((a.1.as_str(), b.1.as_str()), ("0", "17"));
        assert_eq!((a.0.revocations, b.0.revocations), (0, 4));
        assert!(decode_keepalive(&groups, &reply[..4]).is_err());
        let mut garbled = reply.clone();
        garbled[1] = "many".into();
        assert!(decode_keepalive(&groups, &garbled).is_err());
    }

    #[test]
    fn a_prune_lists_then_removes_what_no_lease_holds() {
        let keep = ["held".to_owned()];
        let strays = strays_invocation("{a}:holders", &keep, 7);
        assert_eq!(
            (read::keys(&strays), read::args(&strays)),
            (vec!["{a}:holders"], vec!["7", "1000", "held"])
        );
        let prune = prune_invocation("{a}:holders", &[("gone".into(), 2)], 7);
        assert_eq!(read::args(&prune), ["7", "gone", "2"]);
    }

    #[test]
    fn a_departure_names_the_holders_keys_and_the_holder() {
        let call = depart_invocation(&["{a}:holders".to_owned()], 7);
        assert_eq!(
            (read::keys(&call), read::args(&call)),
            (vec!["{a}:holders"], vec!["7"])
        );
    }
}
