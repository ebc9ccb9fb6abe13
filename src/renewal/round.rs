//! One renewal round (see `docs/design.md`): each store's groups are kept alive (Redis: one
//! keep-alive per hash tag, which also reads the holder's count of members there); a group whose
//! holder entry lapsed, or whose count is below what this process holds, has its leases checked
//! one by one (taken back where capacity allows, else lost) and its count taken again; a group
//! whose count is above what it holds and has in flight is checked so too (the excess may hide
//! members missing), and has the extra members pruned at the next round, in two steps: the
//! leases listed (`strays.lua`) that are neither held nor in flight by then are removed by id
//! (`prune.lua`). Then leases whose removal failed are removed again, and the tags idle for a
//! whole round are left. A failed call leaves its leases to the next round, and to their
//! deadlines.

use std::sync::Arc;

use super::{counters, Leases};
use crate::backend::RoundReport;
use crate::lease::{monotonic_ms, LeaseRecord, Store};
use crate::sync::lock;

impl Leases {
    pub(super) async fn renew_held(self: &Arc<Self>) {
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
                    if store == Store::Main {
                        self.joined.entry_renewed(holders, Some(sent_at + self.ttl_ms));
                    }
                }
            }
            counters::add(&self.counts.renew_failures, report.failures.len() as u64);
            counters::add(&self.counts.pruned, report.pruned);
            for record in &report.reclaimed {
                if record.is_released() {
                    released_meanwhile.push(Arc::clone(record));
                } else {
                    counters::add(&self.counts.reclaimed, 1);
                }
            }
            for record in &report.lost {
                self.lose(record, false); // the check removed it everywhere
            }
            for record in &report.revoked {
                self.end_revoked(record, 0);
            }
        }
        released_meanwhile.extend(self.retries.take_all());
        if !released_meanwhile.is_empty() {
            // What fails is kept for the next round.
            let _ = self.release_all(&released_meanwhile).await;
        }
        self.leave_idle_tags().await;
    }

    /// Keeps one store's groups alive; checks the leases of groups short of members one by one
    /// and counts them again; prunes the members of groups that have too many.
    async fn renew_store(self: &Arc<Self>, store: Store) -> RoundReport {
        let backend = self.stores.get(store);
        let period_ms = self.period.as_millis() as u64;
        let mut report = RoundReport::default();
        // Counts found in excess last round are judged now that their calls in flight are over.
        let (groups, excess) = {
            let mut held = lock(&self.held);
            let excess = match store {
                Store::Main => held.tallies.take_excess(),
                Store::Fallback => Vec::new(),
            };
            if store == Store::Main {
                held.tallies.open_windows();
            }
            (held.groups(store), excess)
        };
        let kept = backend
            .keepalive(&groups, false, self.ttl_ms, period_ms, &mut report)
            .await;
        if store == Store::Main {
            self.end_listed(&kept, &mut report).await;
        }
        let mut short = Vec::new();
        {
            let mut held = lock(&self.held);
            for tag in kept {
                let is_short = tag
                    .counted
                    .is_some_and(|counted| held.tallies.close_window(&tag.holders, counted));
                if tag.alive {
                    report.renewed.push(tag.holders.clone());
                } else if store == Store::Main {
                    self.joined.entry_renewed(&tag.holders, None);
                }
                if !tag.alive || is_short {
                    short.push(tag.holders);
                }
            }
        }
        self.prune_excess(store, excess, &mut report).await;
        if !short.is_empty() {
            self.check_short(store, short, &mut report).await;
        }
        report
    }

    /// Prunes the members this holder does not hold from the groups whose count was in excess.
    async fn prune_excess(&self, store: Store, excess: Vec<String>, report: &mut RoundReport) {
        let backend = self.stores.get(store);
        for holders in excess {
            let keep = {
                let held = lock(&self.held);
                let mut keep: Vec<String> = held
                    .leases_of(store, &holders)
                    .iter()
                    .map(|lease| lease.id.to_string())
                    .collect();
                keep.extend(held.tallies.in_flight(&holders));
                keep
            };
            // Two steps (the protocol model checks them): the leases listed are filtered against
            // what is held and in flight when the list comes back, since an acquire sent after
            // `keep` was taken may have been granted before the list; the rest are removed by id.
            let strays = match backend.strays(&holders, &keep).await {
                Ok(listed) => lock(&self.held).strays(store, &holders, listed),
                Err(e) => {
                    report.failures.push(e);
                    continue;
                }
            };
            if strays.is_empty() {
                continue;
            }
            match backend.prune(&holders, &strays).await {
                Ok(removed) => report.pruned += removed,
                Err(e) => report.failures.push(e),
            }
        }
    }

    /// Checks the leases of groups short of members one by one (taken back where capacity
    /// allows, else lost) and counts those groups again.
    async fn check_short(&self, store: Store, short: Vec<String>, report: &mut RoundReport) {
        let backend = self.stores.get(store);
        let period_ms = self.period.as_millis() as u64;
        let check: Vec<Arc<LeaseRecord>> = {
            let held = lock(&self.held);
            short
                .iter()
                .flat_map(|holders| held.leases_of(store, holders))
                .filter(|lease| !lease.is_released())
                .collect()
        };
        let failed = backend.reclaim(&check, self.ttl_ms, report).await;
        // A group left unchecked keeps its shortfall, so the next round checks it again.
        let checked: Vec<String> = short
            .into_iter()
            .filter(|holders| !failed.contains(holders))
            .collect();
        let mut recounted = RoundReport::default();
        for tag in backend
            .keepalive(&checked, true, self.ttl_ms, period_ms, &mut recounted)
            .await
        {
            if tag.alive {
                report.renewed.push(tag.holders);
            }
        }
        report.failures.append(&mut recounted.failures);
        report.answered |= recounted.answered;
    }
}
