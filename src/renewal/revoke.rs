//! Revoked leases: an operator ends a user's streams in every process (`Manager::revoke`). Each
//! process ends those it holds and releases them: the one that revoked at once, the others when
//! they hear the revoke's tag on the revocations channel, or, if they missed it, when their
//! keep-alive finds the tag's revocation stamp changed; either way they list the revoked ids.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;

use super::{counters, Leases};
use crate::backend::{Kept, RoundReport};
use crate::errors::CoreResult;
use crate::lease::{LeaseRecord, Store};
use crate::runtime;
use crate::sync::lock;

/// How long a broken subscription to the revocations waits before subscribing again (the
/// keep-alive's stamp covers the gap).
const RESUBSCRIBE: Duration = Duration::from_secs(1);

/// The revocation watch of one manager: the channel its revokes are heard on, whether this
/// process listens there yet, and the stamps its keep-alives found last.
pub struct RevocationWatch {
    channel: String,
    listening: AtomicBool,
    seen: Mutex<Seen>,
}

impl RevocationWatch {
    pub fn new(channel: String) -> Self {
        RevocationWatch {
            channel,
            listening: AtomicBool::new(false),
            seen: Mutex::default(),
        }
    }
}

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
        let changed = lock(&self.revocations.seen).changed(kept);
        for holders in changed {
            if let Err(e) = self.end_listed_in(&holders).await {
                lock(&self.revocations.seen).again.insert(holders);
                report.failures.push(e);
            }
        }
    }

    /// Ends the leases held in a group (holders key) of the main store that it lists as
    /// revoked; asks nothing of the store when none is held there.
    async fn end_listed_in(self: &Arc<Self>, holders: &str) -> CoreResult<()> {
        if lock(&self.held).is_idle(Store::Main, holders) {
            return Ok(());
        }
        let revoked = self.stores.main().revoked(holders).await?;
        let bans: HashMap<String, u64> = revoked.into_iter().collect();
        let held = lock(&self.held).leases_of(Store::Main, holders);
        for record in &held {
            if let Some(&ban_ms) = bans.get(record.id.as_str()) {
                self.end_revoked(record, ban_ms);
            }
        }
        Ok(())
    }

    /// Starts (once: at the first lease held in a store shared with other processes) the task
    /// that hears the revokes of every process and ends the leases they list at once, until the
    /// keeper stops. When the subscription is down, the keep-alive's stamp still finds them.
    pub(super) fn hear_revocations(self: &Arc<Self>) {
        let watch = &self.revocations;
        if watch.listening.load(Ordering::Relaxed) || watch.listening.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(self);
        let stop = self.keeper.stop.clone();
        let stores = Arc::clone(&self.stores);
        let channel = watch.channel.clone();
        runtime::handle().spawn(async move {
            // Each subscription, the first included, looks once it is up for what was revoked
            // before: the first follows the first lease, and a revoke made while it was on its
            // way is published to no one here.
            while !stop.is_cancelled() {
                let (heard, mut tags) = mpsc::unbounded_channel();
                let heard = Box::new(move |tag| drop(heard.send(tag)));
                let listening = stores.main().listen_revocations(&channel, heard);
                let ending = async {
                    while let Some(tag) = tags.recv().await {
                        let Some(leases) = weak.upgrade() else { return };
                        // None: messages may have been missed; every group held is checked.
                        let groups = match tag {
                            Some(holders) => vec![holders],
                            None => lock(&leases.held).groups(Store::Main),
                        };
                        for holders in groups {
                            // A failure leaves it to the keep-alive's stamp.
                            let _ = leases.end_listed_in(&holders).await;
                        }
                    }
                };
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = listening => {}
                    () = ending => {}
                }
                if weak.strong_count() == 0 {
                    return;
                }
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(RESUBSCRIBE) => {}
                }
            }
        });
    }
}
