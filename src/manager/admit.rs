//! Admitting a lease: from the main backend while it answers, waiting in line up to `wait` for
//! shared capacity; when the backend does not answer (or the breaker is open), refused under
//! `FailureMode::Closed`, or admitted against this process's local floor under `Open`
//! (`local_floor.rs`). How the acquire ends is `grant.rs`'s; a cancelled one is undone by its
//! `CancelGuard`.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::cancel_guard::CancelGuard;
use super::grant::Granted;
use super::waiting::{waiter_id, LocalTurn, RECHECK_WAITING, WAITER_TTL};
use super::Manager;
use crate::backend::{AcquireOutcome, InLine, Placed, Waiter};
use crate::budget::BudgetRequest;
use crate::errors::{CoreError, CoreResult, Rejection};
use crate::keys::{self, LineKeys};
use crate::lease::{LeaseRecord, Store};
use crate::rate::RateCheck;

/// Where an acquire stands in the line: what it asks of each pool's line, and its turn among
/// this process's waiters (set once in line: the earliest one here speaks for all of them).
struct Place<'a> {
    line: Option<&'a LineKeys>,
    waiter: Option<&'a Waiter>,
    priority: u8,
    limits: Vec<u64>,
    turn: Option<LocalTurn<'a>>,
    /// The pool that had no room at the last try, and its slots in use (see `Placed::full`).
    full: Option<(usize, u64)>,
}

impl Manager {
    pub(super) async fn admit(
        self: Arc<Self>,
        record: Arc<LeaseRecord>,
        rates: RateCheck,
        budget: Option<BudgetRequest>,
        wait: Duration,
        priority: u8,
        line_limits: Vec<u64>,
    ) -> CoreResult<Granted> {
        let budget = budget.as_ref();
        let deadline = Instant::now() + wait;
        let line = self.line_for(&record);
        let waiter = self.waiter_for(line, wait);
        let mut place = Place {
            line,
            waiter: waiter.as_ref(),
            priority,
            limits: line_limits,
            turn: None,
            full: None,
        };
        let _present = waiter.as_ref().map(|w| self.local_line.arrive(&w.id));
        let mut freed = self.leases.subscribe();
        let mut guard = CancelGuard::new(&self, &record, waiter.as_ref());
        loop {
            // A drain or a close ends every waiting acquire at once; the guard gives up its
            // place in the line.
            if self.leases.is_closed() {
                return Err(CoreError::Closed);
            }
            if let Some(turn) = place.turn.as_ref().filter(|t| !t.has_turn()) {
                if self.until_turn(turn, deadline).await {
                    continue;
                }
                return Err(self.waited_too_long(&record, place.full, wait));
            }
            freed.borrow_and_update();
            match self.send_acquire(&record, &place, &rates, &mut guard).await {
                Ok(AcquireOutcome::Wait(placed)) => self.stay_in_line(&record, placed, &mut place),
                Ok(outcome) => {
                    guard.disarm();
                    if place.waiter.is_some() {
                        self.leases.wake(); // a grant from the line: the next may fit too
                    }
                    return self.conclude(Arc::clone(&record), outcome, &rates, budget);
                }
                Err(unavailable) if unavailable.is_unavailable() => {
                    drop(guard);
                    // Boxed, as the heartbeat: rare paths whose futures would otherwise size
                    // every acquire's task (the largest variant sets the size of an async fn's
                    // state).
                    return Box::pin(self.admit_locally(&record, &rates, budget, unavailable)).await;
                }
                Err(other) => return Err(other),
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(self.waited_too_long(&record, place.full, wait));
            }
            if Box::pin(self.heartbeat_found_displaced()).await {
                continue;
            }
            self.until_freed(&mut freed, deadline - now).await;
        }
    }

    /// The line an acquire may wait in: the lines live in the shared pools' tag, so a stream of
    /// a user's own tag (no global pool) has no shared pool to wait for, and is refused at once
    /// when its own is full.
    fn line_for(&self, record: &LeaseRecord) -> Option<&LineKeys> {
        self.line
            .as_ref()
            .filter(|line| keys::hash_tag(&line.line) == record.hash_tag())
    }

    /// The waiter an acquire that may wait is in line (None: it may not); it starts the
    /// listener that wakes this process's waiters for releases anywhere.
    fn waiter_for(&self, line: Option<&LineKeys>, wait: Duration) -> Option<Waiter> {
        let line = line.filter(|_| !wait.is_zero())?;
        self.local_line
            .listen(&self.stores, &self.leases, line, &self.listener_stop);
        Some(Waiter {
            id: waiter_id(),
            ttl_ms: WAITER_TTL.as_millis() as u64,
        })
    }

    /// One acquire call; the guard learns whether it may have run. Until its outcome is known,
    /// the lease is in flight.
    async fn send_acquire(
        &self,
        record: &Arc<LeaseRecord>,
        place: &Place<'_>,
        rates: &RateCheck,
        guard: &mut CancelGuard<'_>,
    ) -> CoreResult<AcquireOutcome> {
        let in_line = place.line.map(|line| InLine {
            line,
            waiter: place.waiter,
            priority: place.priority,
            order: self.config.line_order,
            max_waiting: &place.limits,
            own_waits: self.config.wait_for_own_quota,
        });
        let mut terms = self.config.grant_terms();
        self.leases.flight_start(record);
        // An entry with two renewal periods left or more is left to the keep-alive anyway
        // (`acquire.lua`'s `grant`): known to live that long, it is not read either.
        terms.entry_known_until_ms = self.leases.entry_known_until(record, 2 * terms.renew_every_ms);
        let outcome = self
            .stores
            .call(Store::Main, |main| main.acquire(record, terms, in_line, rates))
            .await;
        if !matches!(outcome, Err(CoreError::Unreached(_))) {
            guard.sent();
        }
        outcome
    }

    /// Told to wait, the script added nothing: while it waits, the lease is not in flight (else
    /// its weight would hide members its holder does not hold from the keep-alive's count for
    /// as long as anyone of this process waits). A waiter taken out of the shared line (its
    /// process was late to keep it alive) came back with a later ticket: it takes that place
    /// here too, so this process's order stays the shared line's.
    fn stay_in_line<'a>(&'a self, record: &LeaseRecord, placed: Placed, place: &mut Place<'a>) {
        self.leases.flight_end(record, false);
        place.full = Some(placed.full);
        let same = place.turn.as_ref().is_some_and(|t| t.ticket() == placed.ticket);
        let Some(waiter) = place.waiter.filter(|_| !same) else {
            return;
        };
        drop(place.turn.take());
        let places = record
            .pools
            .iter()
            .zip(placed.places)
            .filter(|(_, at)| *at > 0)
            .map(|(pool, at)| (pool.key.to_string(), at))
            .collect();
        place.turn = Some(self.local_line.join(placed.ticket, places, &waiter.id));
    }

    /// The periodic check, when due, keeps this process's waiters alive in the shared line;
    /// true if it found this process's waiters displaced (their places went to other users'
    /// waiters: they learn it at once, and this one may be among them).
    async fn heartbeat_found_displaced(&self) -> bool {
        let (Some(line), true) = (&self.line, self.local_line.heartbeat_due()) else {
            return false;
        };
        let ids = self.local_line.ids();
        let ttl_ms = WAITER_TTL.as_millis() as u64;
        let displaced = self
            .stores
            .call(Store::Main, |main| main.heartbeat(line, &ids, ttl_ms))
            .await;
        displaced.is_ok_and(|ids| self.local_line.displace(&ids))
    }

    /// Waits for this waiter's turn among this process's waiters, or the close of the manager;
    /// false if `deadline` came first.
    async fn until_turn(&self, turn: &LocalTurn<'_>, deadline: Instant) -> bool {
        tokio::select! {
            _ = turn.turn.notified() => true,
            _ = self.leases.closing() => true,
            _ = tokio::time::sleep_until(deadline) => false,
        }
    }

    /// Waits for a release anywhere, the close of the manager, or the periodic check (which
    /// bounds a lost wake-up), at most `left`.
    async fn until_freed(&self, freed: &mut watch::Receiver<u64>, left: Duration) {
        tokio::select! {
            _ = freed.changed() => {}
            _ = self.leases.closing() => {}
            _ = tokio::time::sleep(RECHECK_WAITING.min(left)) => {}
        }
    }

    /// The refusal for a waiter whose time ran out: the pool that had no room at its last try
    /// (its own quota under `wait_for_own_quota`, or a shared pool), with the slots it had in
    /// use; a shared pool, full, if it never got an answer (its turn among this process's
    /// waiters never came).
    fn waited_too_long(
        &self,
        record: &LeaseRecord,
        full: Option<(usize, u64)>,
        waited: Duration,
    ) -> CoreError {
        let shared = || {
            let index = record.own_pools.min(record.pools.len() - 1);
            (index, record.pools[index].capacity)
        };
        let (index, current) = full
            .filter(|(i, _)| *i < record.pools.len())
            .unwrap_or_else(shared);
        let pool = &record.pools[index];
        CoreError::Rejected(Rejection {
            limit: pool.name.clone(),
            capacity: pool.capacity,
            current,
            retry_after_ms: self.config.retry_after_ms().min(waited.as_millis() as u64).max(1),
            usage_shown: true,
        })
    }
}
