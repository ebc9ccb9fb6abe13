//! Revoked leases: an operator ends a user's streams in every process (`Manager::revoke`). Each
//! process ends those it holds and releases them: the one that revoked at once, the others when
//! their keep-alive finds a tag's revocation stamp changed and lists the revoked ids.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::{counters, Leases};
use crate::backend::{Kept, RoundReport};
use crate::lease::{LeaseRecord, Store};
use crate::sync::lock;

/// The revocation stamp seen last per group (holders key) of the main store.
#[derive(Default)]
pub struct Seen {
    counts: HashMap<String, u64>,
    /// Groups whose count changed last round, checked once more: a grant in flight then (made
    /// before the revocation, answered after the check) is held now.
    again: HashSet<String>,
}

impl Seen {
    /// The groups to check after a keep-alive found these counts; groups not kept are
    /// forgotten (checked again when next seen with a count above 0).
    fn changed(&mut self, kept: &[Kept]) -> Vec<String> {
        let mut check = std::mem::take(&mut self.again);
        let mut counts = HashMap::with_capacity(kept.len());
        for tag in kept {
            if self.counts.get(&tag.holders).copied().unwrap_or(0) != tag.revocations {
                check.insert(tag.holders.clone());
                self.again.insert(tag.holders.clone());
            }
            counts.insert(tag.holders.clone(), tag.revocations);
        }
        self.counts = counts;
        check.into_iter().collect()
    }
}

impl Leases {
    /// Ends a revoked lease the way a lost one ends (its stream gets `LeaseRevoked`, told of
    /// its user's ban of `ban_ms`) and releases it; false if it was released or lost already.
    pub(super) fn end_revoked(self: &Arc<Self>, record: &Arc<LeaseRecord>, ban_ms: u64) -> bool {
        if !record.mark_revoked(ban_ms) {
            return false;
        }
        counters::add(&self.counts.revoked, 1);
        self.release_in_background(record);
        true
    }

    /// Ends the leases held here in a user's own pool (`pool_key`), in both stores, the user's
    /// new streams banned for `ban_ms`; returns how many.
    pub fn revoke_user(self: &Arc<Self>, pool_key: &str, ban_ms: u64) -> usize {
        let held = lock(&self.held).all();
        held.iter()
            .filter(|record| record.own_pools > 0 && &*record.pools[0].key == pool_key)
            .filter(|record| self.end_revoked(record, ban_ms))
            .count()
    }

    /// After the main store's keep-alive: in each group whose revocation stamp changed,
    /// ends the leases held that are listed as revoked. A failed listing is made again next
    /// round.
    pub(super) async fn end_listed(self: &Arc<Self>, kept: &[Kept], report: &mut RoundReport) {
        let changed = lock(&self.seen_revocations).changed(kept);
        let backend = self.stores.get(Store::Main);
        for holders in changed {
            match backend.revoked(&holders).await {
                Ok(revoked) => {
                    let bans: HashMap<String, u64> = revoked.into_iter().collect();
                    let held = lock(&self.held).leases_of(Store::Main, &holders);
                    for record in &held {
                        if let Some(&ban_ms) = bans.get(record.id.as_str()) {
                            self.end_revoked(record, ban_ms);
                        }
                    }
                }
                Err(e) => {
                    lock(&self.seen_revocations).again.insert(holders);
                    report.failures.push(e);
                }
            }
        }
    }
}
