//! One renewal round (see `docs/design.md`): each store's groups are kept alive (Redis: one
//! keep-alive per hash tag); the leases of groups found stale are checked one by one, taken back
//! where capacity allows, else lost; the counts of granted members of the groups checked are
//! brought up to date; then leases whose removal failed are removed again. A failed call leaves
//! its leases to the next round, and to their deadlines.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{lock, Leases};
use crate::backend::{Group, RoundReport};
use crate::lease::{monotonic_ms, LeaseRecord, Store};

impl Leases {
    pub(super) async fn renew_held(&self) {
        let sent_at = monotonic_ms();
        // The keep-alive does not wait for the breaker: one call per period per 1,000 tags costs
        // a dead server little, and it is what keeps live streams alive the moment Redis is back.
        let breaker = self.stores.breaker();
        let (fallback, main) = tokio::join!(self.renew_store(Store::Fallback), self.renew_store(Store::Main));
        if let Some(failure) = main.failures.first() {
            breaker.observe::<()>(&Err(failure.clone()));
        }
        if main.answered {
            breaker.observe(&Ok(()));
        }
        // A lease released after this round's snapshot but before its check was found gone
        // and, with room, taken back: give it back again.
        let mut released_meanwhile = Vec::new();
        for (store, report) in [(Store::Fallback, fallback), (Store::Main, main)] {
            {
                let mut held = lock(&self.held);
                for holders in &report.renewed {
                    held.extend(store, holders, sent_at + self.ttl_ms);
                }
            }
            self.renew_failures
                .fetch_add(report.failures.len() as u64, Ordering::Relaxed);
            for record in &report.reclaimed {
                if record.is_released() {
                    released_meanwhile.push(Arc::clone(record));
                } else {
                    lock(&self.held).taken_back(record);
                    self.reclaimed.fetch_add(1, Ordering::Relaxed);
                }
            }
            for record in &report.lost {
                self.lose(record, false); // the check removed it everywhere
            }
        }
        let unremoved: Vec<_> = std::mem::take(&mut *lock(&self.unremoved))
            .into_values()
            .collect();
        released_meanwhile.extend(unremoved);
        if !released_meanwhile.is_empty() {
            // What fails is kept for the next round.
            let _ = self.release_all(&released_meanwhile).await;
        }
    }

    /// Keeps one store's groups alive; checks the leases of stale groups one by one, then
    /// resyncs those groups' counts of granted members.
    async fn renew_store(&self, store: Store) -> RoundReport {
        let backend = self.stores.get(store);
        let period_ms = self.period.as_millis() as u64;
        let groups = lock(&self.held).groups(store);
        let mut report = RoundReport::default();
        let stale = backend
            .keepalive(&groups, false, self.ttl_ms, period_ms, &mut report)
            .await;
        if stale.is_empty() {
            return report;
        }
        let check: Vec<Arc<LeaseRecord>> = {
            let held = lock(&self.held);
            stale
                .iter()
                .flat_map(|group| held.leases_of(store, &group.holders))
                .filter(|lease| !lease.is_released())
                .collect()
        };
        let failed = backend.reclaim(&check, self.ttl_ms, &mut report).await;
        // Leases taken back were granted again (the held set counts them after this round).
        let mut taken_back: HashMap<&str, u64> = HashMap::new();
        for lease in &report.reclaimed {
            *taken_back.entry(lease.holders.as_str()).or_default() += lease.units();
        }
        // A group left unchecked keeps its shortfall, so the next round checks it again.
        let checked: Vec<Group> = stale
            .iter()
            .filter(|group| !failed.contains(&group.holders))
            .map(|group| Group {
                holders: group.holders.clone(),
                granted: group.granted + taken_back.get(group.holders.as_str()).copied().unwrap_or(0),
            })
            .collect();
        let mut resynced = RoundReport::default();
        backend
            .keepalive(&checked, true, self.ttl_ms, period_ms, &mut resynced)
            .await;
        report.renewed.append(&mut resynced.renewed);
        report.failures.append(&mut resynced.failures);
        report.answered |= resynced.answered;
        report
    }
}
