//! Request-rate hits: every policy of one identity decided in one call (Redis: `lua/hit.lua`),
//! through the circuit breaker, or here from units this process holds ahead
//! (`rate::LeasedUnits`); while Redis is down, as `failure_mode` says: refused (503), or
//! counted in this process against its share of each limit.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Manager;
use crate::budget::BudgetRequest;
use crate::config::FailureMode;
use crate::errors::{CoreError, CoreResult};
use crate::keys::{check_identity, check_policy_identity, hash_tag};
use crate::lease::Store;
use crate::rate::{
    check_hit, local_shares, start_costs, Adjustment, HitOutcome, RateCheck, RatePolicy, Reservation,
    Serving, Settlement, Thresholds, Unit,
};
use crate::runtime;

/// How often units held ahead are looked at, to give back those idle (`rate::LeasedUnits`).
const LEASED_UNITS_SWEEP: Duration = Duration::from_millis(250);

/// A hit: decided here already, or the call that decides it.
pub enum HitCall<F> {
    Served(HitOutcome),
    Sent(F),
}

impl Manager {
    /// Checks the hit and returns the call to await: `cost` units from every policy if all of
    /// them allow it, none otherwise and `CoreError::RateLimited` (`consume: false` only looks,
    /// and never fails for rate). Each policy counts `identity`, or the identity paired with it
    /// (a login's per-IP and per-user-and-IP pair). A hit whose policies all lease units and
    /// hold enough here is served at once; one of a policy that does not lease them is counted
    /// in the store as without the option.
    pub fn hit(
        self: &Arc<Self>,
        identity: &str,
        keyed: Vec<(RatePolicy, Option<String>)>,
        cost: u64,
        consume: bool,
    ) -> CoreResult<HitCall<impl Future<Output = CoreResult<HitOutcome>> + Send + 'static>> {
        let (policies, identities): (Vec<RatePolicy>, Vec<Option<String>>) = keyed.into_iter().unzip();
        let policies = self.as_configured(policies);
        check_hit(&policies, cost).map_err(CoreError::InvalidInput)?;
        if let Some(budget) = policies.iter().find(|p| consume && p.unit != Unit::Requests) {
            return Err(CoreError::InvalidInput(format!(
                "budget {:?} counts {}: a stream reserves and is charged its tokens through acquire(budgets=...); usage() and peek() look at it",
                &*budget.name,
                budget.unit.name()
            )));
        }
        let keys = self.counter_keys(identity, &policies, &identities, None)?;
        self.start_here()?;
        // The embedded store is this process's: nothing to lease there.
        let leasing = consume && !self.is_embedded() && policies.iter().all(|policy| policy.lease_units);
        let (mut refilling, mut aheads) = (None, Vec::new());
        if leasing {
            match self.leased_units.serve(&keys, &policies, cost, Instant::now()) {
                Serving::Served(served) => return Ok(HitCall::Served(served)),
                Serving::Refilling(refilled) => refilling = Some(refilled),
                Serving::Send(asked) => aheads = asked,
            }
        }
        let manager = Arc::clone(self);
        Ok(HitCall::Sent(async move {
            // Each answer to a call that asked for units ahead tells (an error: the units were
            // forgotten); the hit is served then, or waits for the next such call, or is sent.
            while let Some(mut refilled) = refilling.take() {
                if refilled.changed().await.is_err() {
                    break;
                }
                match manager.leased_units.serve(&keys, &policies, cost, Instant::now()) {
                    Serving::Served(served) => return Ok(served),
                    Serving::Refilling(next) => refilling = Some(next),
                    Serving::Send(asked) => aheads = asked,
                }
            }
            let sent_at = Instant::now();
            let outcome = manager
                .stores
                .call(Store::Main, |main| {
                    main.hit(&keys, &policies, cost, &aheads, consume)
                })
                .await;
            let outcome = match outcome {
                Err(error) if error.is_unavailable() && manager.config.failure_mode == FailureMode::Open => {
                    manager.hit_locally(&keys, &policies, cost, consume).await
                }
                other => other,
            };
            let outcome = match outcome {
                Ok(mut outcome) if leasing => {
                    let given_back =
                        manager
                            .leased_units
                            .keep(&keys, &policies, &aheads, &mut outcome, sent_at);
                    manager.give_back_in_background(given_back);
                    manager.sweep_leased_units();
                    outcome
                }
                Ok(outcome) => outcome,
                Err(error) => {
                    manager.leased_units.unasked(&keys, &aheads);
                    return Err(error);
                }
            };
            match outcome.refused {
                Some(_) if consume => Err(CoreError::RateLimited(outcome)),
                _ => Ok(outcome),
            }
        }))
    }

    /// Gives back units held ahead, each to its bucket, at most once (`settle.lua`); one that
    /// fails stays counted until its bucket ends.
    fn give_back_units(&self, given_back: Vec<Adjustment>) -> Vec<impl Future<Output = ()> + Send + 'static> {
        given_back
            .into_iter()
            .map(|adjustment| {
                let stores = Arc::clone(&self.stores);
                let settlement = Settlement {
                    id: format!("units:{}", uuid::Uuid::new_v4().simple()),
                    adjustments: vec![adjustment],
                    answer: None,
                };
                async move {
                    let _ = stores.call(Store::Main, |main| main.settle(&settlement)).await;
                }
            })
            .collect()
    }

    /// Gives units back without waiting for it.
    fn give_back_in_background(&self, given_back: Vec<Adjustment>) {
        for giving in self.give_back_units(given_back) {
            runtime::handle().spawn(giving);
        }
    }

    /// Looks at the units held ahead every `LEASED_UNITS_SWEEP` while there are any, giving back
    /// the idle ones (one sweeper per manager, none while nothing is held).
    fn sweep_leased_units(self: &Arc<Self>) {
        if !self.leased_units.start_sweeping() {
            return;
        }
        let manager = Arc::downgrade(self);
        runtime::handle().spawn(async move {
            loop {
                tokio::time::sleep(LEASED_UNITS_SWEEP).await;
                let Some(manager) = manager.upgrade() else {
                    return;
                };
                let (given_back, left) = manager.leased_units.give_back_idle(Instant::now());
                manager.give_back_in_background(given_back);
                if left == 0 && manager.leased_units.stop_sweeping() {
                    return;
                }
            }
        });
    }

    /// Gives back every unit held ahead (the manager closes).
    pub(super) fn give_back_all_units(&self) -> Vec<impl Future<Output = ()> + Send + 'static> {
        self.give_back_units(self.leased_units.give_back_all(Instant::now()))
    }

    /// Forgets the counters of `keyed` policies, each of `identity` or of the identity paired
    /// with it (a fresh allowance).
    pub fn forget_rates(
        self: &Arc<Self>,
        identity: &str,
        keyed: Vec<(RatePolicy, Option<String>)>,
    ) -> CoreResult<impl Future<Output = CoreResult<()>> + Send + 'static> {
        let (policies, identities): (Vec<RatePolicy>, Vec<Option<String>>) = keyed.into_iter().unzip();
        check_hit(&policies, 0).map_err(CoreError::InvalidInput)?;
        let keys = self.counter_keys(identity, &policies, &identities, None)?;
        self.start_here()?;
        self.leased_units.forget(&keys);
        let manager = Arc::clone(self);
        Ok(async move {
            manager
                .stores
                .call(Store::Main, |main| main.forget_rates(&keys))
                .await
        })
    }

    /// From now on, every hit and start reports which thresholds of each policy's limit (its
    /// own, else `thresholds`) it reached first in the window (`Decision::thresholds_reached`).
    /// The first thresholds given hold.
    pub fn alert_thresholds(&self, thresholds: Thresholds) {
        let _ = self.alert_at.set(thresholds);
    }

    /// The policies as this manager applies them: every request rate a dry run under
    /// `enforce_rate_limits=false` (budgets keep refusing), each alerting while the app listens
    /// (the manager's thresholds are set) at its own thresholds or else the manager's.
    fn as_configured(&self, policies: Vec<RatePolicy>) -> Vec<RatePolicy> {
        let listening = self.alert_at.get();
        if self.config.enforce_rate_limits && listening.is_none() {
            return policies;
        }
        policies
            .into_iter()
            .map(|policy| RatePolicy {
                enforce: policy.enforce && (self.config.enforce_rate_limits || policy.unit != Unit::Requests),
                alert_at: listening
                    .map(|managers| policy.own_alert_at.as_ref().unwrap_or(managers).clone())
                    .unwrap_or_default(),
                ..policy
            })
            .collect()
    }

    /// The counter of each policy (`policies[i]`) for the identity it counts: its own
    /// (`identities[i]`, a team or an API key) or else `identity`. On a Redis Cluster one script
    /// call takes them all, with the other keys of the call (`along`: a key of the start's
    /// pools), so they must share a hash tag: every identity's keys do under a global pool's
    /// tag, each has a tag of its own without one (`keys.rs`).
    fn counter_keys(
        &self,
        identity: &str,
        policies: &[RatePolicy],
        identities: &[Option<String>],
        along: Option<&str>,
    ) -> CoreResult<Vec<String>> {
        // One digest per identity in a row: most hits count one identity in every policy.
        let mut digested: Option<(&str, String)> = None;
        let keys = policies
            .iter()
            .enumerate()
            .map(|(i, policy)| {
                let counted = match identities.get(i).and_then(Option::as_deref) {
                    Some(own) => check_policy_identity(policy, own).map(|()| own),
                    None => check_identity(identity).map(|()| identity),
                };
                let counted = counted.map_err(CoreError::InvalidInput)?;
                let digest = match &digested {
                    Some((known, digest)) if *known == counted => digest,
                    _ => &digested.insert((counted, self.keys.identity_digest(counted))).1,
                };
                Ok(self.keys.rate_key_of_digest(digest, policy))
            })
            .collect::<CoreResult<Vec<String>>>()?;
        let tag = hash_tag(along.unwrap_or(&keys[0]));
        if self.stores.main().is_cluster() && keys.iter().any(|k| hash_tag(k) != tag) {
            return Err(CoreError::InvalidInput(
                "the policies of several identities in one call need one hash tag on a Redis Cluster: keep every identity's counters in the global pool's tag (global_pool=True, lease_global_slots=False), or count them in separate calls".into(),
            ));
        }
        Ok(keys)
    }

    /// The rate check of a stream's start: one unit from each request-rate policy, then its
    /// reservation from each token budget (the last policies), each counting the identity
    /// paired with it in `identities` (in the same order), or else the user's; `pool` is a key
    /// of the start's pools, whose slot the counters share.
    pub(super) fn rate_check(
        &self,
        identity: Option<&str>,
        rate_limits: Vec<RatePolicy>,
        budget: Option<&BudgetRequest>,
        identities: &[Option<String>],
        pool: Option<&str>,
    ) -> CoreResult<RateCheck> {
        let reservation = budget.map(|b| Reservation {
            budgets: &b.policies,
            input: b.input,
            output: b.output,
            price: b.price,
        });
        let (policies, costs) = start_costs(rate_limits, reservation)?;
        let policies = self.as_configured(policies);
        if policies.is_empty() {
            return Ok(RateCheck::default());
        }
        let Some(identity) = identity else {
            return Err(CoreError::InvalidInput(
                "rate_limits and budgets count a user's streams: pass a user_id with them".into(),
            ));
        };
        Ok(RateCheck {
            keys: self.counter_keys(identity, &policies, identities, pool)?,
            costs,
            policies,
        })
    }

    /// While Redis is down (`failure_mode="open"`): this process's share of each policy, or
    /// the refusal of a share too small for its cost (see `rate::local_shares`).
    pub(super) fn rate_shares(&self, policies: &[RatePolicy], costs: &[u64]) -> CoreResult<Vec<RatePolicy>> {
        local_shares(
            policies,
            costs,
            self.config.fallback_workers,
            self.config.retry_after_ms(),
        )
        .map_err(CoreError::RateLimited)
    }

    /// While Redis is down (`failure_mode="open"`): the same hit in this process, against its
    /// share of each limit.
    async fn hit_locally(
        &self,
        keys: &[String],
        policies: &[RatePolicy],
        cost: u64,
        consume: bool,
    ) -> CoreResult<HitOutcome> {
        let shares = self.rate_shares(policies, &vec![cost; policies.len()])?;
        let fallback = self.stores.get(Store::Fallback);
        fallback.hit(keys, &shares, cost, &[], consume).await
    }
}
