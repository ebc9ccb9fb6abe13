//! The top-up loop, one per manager: every `TOP_UP_EVERY` while streams are open (and woken
//! from its sleep by a meter that opens while none was), it runs a round, sending the
//! top-ups of every stream that streamed or needs more together (one call per store, per hash
//! tag on a cluster), and tries again the settlements and give-backs whose call failed.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use tokio::task::JoinHandle;

use super::{Budgets, Meter, TOP_UP_EVERY};
use crate::config::FailureMode;
use crate::keys::hash_tag;
use crate::lease::{monotonic_ms, Store};
use crate::rate::{Settlement, TopUp};
use crate::runtime;
use crate::sync::lock;

/// Top-ups per script call at most (bounds how long one call blocks Redis).
const TOP_UPS_PER_CALL: usize = 500;

/// A due stream and its top-up.
type Due = (Arc<Meter>, TopUp);

pub(super) fn start(budgets: &Arc<Budgets>) -> JoinHandle<()> {
    let weak: Weak<Budgets> = Arc::downgrade(budgets);
    let (due, stop) = (Arc::clone(&budgets.due), budgets.stop.clone());
    runtime::handle().spawn(async move {
        loop {
            // While streams are open a round runs every period, wanted or not: it moves what
            // they streamed into the current bucket and rolls reservations about to leave their
            // window (see `Meter::take_due`). With none open, the loop sleeps until a meter
            // opens or a settlement waits for another try.
            let open = weak
                .upgrade()
                .is_some_and(|budgets| !lock(&budgets.meters).is_empty());
            if !open {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = due.notified() => {}
                }
            }
            let Some(budgets) = weak.upgrade() else { break };
            budgets.round().await;
            drop(budgets);
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(TOP_UP_EVERY) => {}
            }
        }
    })
}

impl Budgets {
    async fn round(&self) {
        let now_ms = monotonic_ms();
        let due: Vec<Due> = lock(&self.meters)
            .values()
            .filter_map(|meter| meter.take_due(now_ms).map(|top_up| (Arc::clone(meter), top_up)))
            .collect();
        // One call per store (and per hash tag on a cluster: a script runs on one slot).
        let mut calls: HashMap<(Store, &str), Vec<&Due>> = HashMap::new();
        for entry in &due {
            let (meter, top_up) = entry;
            let tag = match self.stores.get(meter.store).is_cluster() {
                true => top_up.keys.first().map_or("", |key| hash_tag(key)),
                false => "",
            };
            calls.entry((meter.store, tag)).or_default().push(entry);
        }
        let sends = calls.into_iter().flat_map(|((store, _), entries)| {
            let chunks: Vec<Vec<_>> = entries.chunks(TOP_UPS_PER_CALL).map(<[_]>::to_vec).collect();
            chunks
                .into_iter()
                .map(move |chunk| self.send_top_ups(store, chunk))
        });
        futures_util::future::join_all(sends).await;
        // Under way from before the queue is emptied, so the adjustments taken out of it count
        // as not applied (`counts`) until their calls return.
        let _under_way = self.calls.token();
        let retries = std::mem::take(&mut *lock(&self.retries));
        for (store, settlement) in retries {
            self.send_adjustments(store, settlement).await;
        }
    }

    /// One call's top-ups, and their answers to the meters (a call that failed: granted here
    /// under `failure_mode="open"`, else tried again next round).
    async fn send_top_ups(&self, store: Store, chunk: Vec<&Due>) {
        // Under way too: a stream that ends while its top-up is in flight has the top-up given
        // back when the answer comes (the refunds below).
        let _under_way = self.calls.token();
        let top_ups: Vec<&TopUp> = chunk.iter().map(|(_, top_up)| top_up).collect();
        let sent_at = monotonic_ms();
        let answers = self.stores.call(store, |backend| backend.top_up(&top_ups)).await;
        let Ok(answers) = answers else {
            let fail_open = self.failure_mode == FailureMode::Open;
            for (meter, top_up) in chunk {
                meter.top_up_failed(top_up.want, fail_open);
            }
            return;
        };
        // Top-ups of streams settled meanwhile are given back, in one call.
        let call = (sent_at, monotonic_ms());
        let mut refunds = Vec::new();
        for ((meter, top_up), answer) in chunk.into_iter().zip(answers) {
            refunds.extend(meter.topped_up(top_up.want, &answer, call));
        }
        if !refunds.is_empty() {
            let id = uuid::Uuid::new_v4().simple().to_string();
            let settlement = Settlement {
                id,
                adjustments: refunds,
                answer: None,
            };
            self.send_adjustments(store, settlement).await;
        }
    }
}
