//! The local floor: while Redis does not answer, under `FailureMode::Open`, each process admits
//! against its share of every cap (`fallback_workers`), counting the slots it already holds
//! there (its Redis leases stream on during the outage); under `Closed` it refuses.

use std::sync::Arc;

use super::grant::Granted;
use super::Manager;
use crate::backend::AcquireOutcome;
use crate::budget::BudgetRequest;
use crate::config::FailureMode;
use crate::errors::{CoreError, CoreResult, Rejection};
use crate::keys::Pool;
use crate::lease::{LeaseRecord, Store};
use crate::rate::RateCheck;

/// This process's share of a cap while Redis is down: rounded down, so the shares of all
/// workers add up to at most the cap (unlimited stays unlimited).
pub(super) fn local_share(capacity: u64, workers: u64) -> u64 {
    capacity / workers
}

/// A pool's share here, and the slots this process holds of it in Redis.
type Share = (u64, u64);

impl Manager {
    /// Redis did not answer: refuse (`FailureMode::Closed`), or admit on the local floor
    /// (`Open`).
    pub(super) async fn admit_locally(
        &self,
        record: &LeaseRecord,
        rates: &RateCheck,
        budget: Option<&BudgetRequest>,
        unavailable: CoreError,
    ) -> CoreResult<Granted> {
        if self.config.failure_mode == FailureMode::Closed {
            return Err(unavailable);
        }
        let rates = RateCheck {
            policies: self.rate_shares(&rates.policies, &rates.costs)?,
            ..rates.clone()
        };
        let fallback = self.stores.get(Store::Fallback);
        let mut pools = Vec::with_capacity(record.pools.len());
        let mut shares = Vec::with_capacity(record.pools.len());
        for pool in &record.pools {
            let (left, share) = self.left_of_share(pool, record.weight).await?;
            pools.push(Pool {
                capacity: left,
                ..pool.clone()
            });
            shares.push(share);
        }
        let local = Arc::new(LeaseRecord::new(pools, record.weight, Store::Fallback));
        let mut outcome = fallback
            .acquire(&local, self.config.grant_terms(), None, &rates)
            .await?;
        if let AcquireOutcome::Rejected(rejection) = &mut outcome {
            // Said in terms of the share, not of what was left of it.
            if let Some(i) = local.pools.iter().position(|p| p.name == rejection.limit) {
                let (share, redis_slots) = shares[i];
                rejection.capacity = share;
                rejection.current += redis_slots;
            }
        }
        self.conclude(local, outcome, &rates, budget)
    }

    /// What is left of this process's share of `pool` for the fallback store to check its own
    /// leases against (0: no limit), with the share; refused when `weight` does not fit.
    async fn left_of_share(&self, pool: &Pool, weight: u32) -> CoreResult<(u64, Share)> {
        if pool.capacity == 0 {
            return Ok((0, (0, 0)));
        }
        let share = local_share(pool.capacity, self.config.fallback_workers);
        let local_slots = self
            .stores
            .get(Store::Fallback)
            .count(&[pool.key.to_string()], self.config.lease_ms())
            .await?[0];
        let redis_slots = self.leases.slots_in(&pool.key).saturating_sub(local_slots);
        let left = share.saturating_sub(redis_slots);
        if left < u64::from(weight) {
            return Err(CoreError::Rejected(Rejection {
                limit: pool.name.clone(),
                capacity: share,
                current: share.min(redis_slots + local_slots),
                retry_after_ms: self.config.retry_after_ms(),
                usage_shown: true,
            }));
        }
        Ok((left, (share, redis_slots)))
    }
}
