//! What one acquire asks for, checked before anything is sent: the pools it takes (its own quota
//! first, the resources last), the rate and budget policies its start counts against, and each
//! pool's line limit. `Manager::acquire` hands the checked request to `admit.rs`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::Either;
use futures_util::FutureExt;

use super::grant::Granted;
use super::Manager;
use crate::budget::BudgetRequest;
use crate::errors::{CoreError, CoreResult};
use crate::keys::{check_identity, check_resource, Pool};
use crate::lease::{LeaseRecord, Store};
use crate::rate::{AnswerKeys, RatePolicy};

/// A lease of weight w is w members per pool: keep scripts short (the binding checks weights).
pub const MAX_WEIGHT: u32 = 100;

/// What one acquire asks for; the binding has checked the types.
#[derive(Debug, Clone)]
pub struct AcquireRequest {
    /// The user whose stream this is (None: resources only).
    pub identity: Option<String>,
    /// Named shared capacity: (name, capacity).
    pub resources: Vec<(String, u64)>,
    /// The waiters each resource's line holds at most (None: `Config::max_waiting`).
    pub resource_lines: Vec<Option<u64>>,
    /// Slots taken in each pool.
    pub weight: u32,
    /// This call's cap on the user's own pool, in place of the configured one.
    pub max_per_user: Option<u64>,
    /// How long to wait in line for shared capacity.
    pub wait: Duration,
    /// Place in the lines: 0 to `MAX_PRIORITY`, higher first.
    pub priority: u8,
    /// Request-rate policies that the start counts against, in the same step.
    pub rate_limits: Vec<RatePolicy>,
    /// Token budgets the stream reserves from, in the same step.
    pub budget: Option<BudgetRequest>,
    /// Whose each policy counts, in the start's order (`rate_limits`, then the budget's
    /// policies): an identity of its own (a team, an API key), or None for the user's. Empty
    /// when every policy counts the user's.
    pub policy_identities: Vec<Option<String>>,
}

impl Manager {
    /// Checks the request and returns the admission to await (cancelling it never leaves a slot
    /// taken nor a place in line).
    pub fn acquire(
        self: &Arc<Self>,
        mut request: AcquireRequest,
    ) -> CoreResult<impl Future<Output = CoreResult<Granted>> + Send + 'static> {
        let record = Arc::new(LeaseRecord::new(
            self.pools_for(&request)?,
            request.weight,
            Store::Main,
        ));
        let answers_due = self.learn_answers(&mut request);
        let rates = self.rate_check(
            request.identity.as_deref(),
            request.rate_limits,
            request.budget.as_ref(),
            &request.policy_identities,
            record.pools.first().map(|pool| &*pool.key),
        )?;
        if self.leases.is_closed() {
            return Err(CoreError::Closed);
        }
        self.start_here()?;
        if let Some(key) = answers_due {
            self.read_answer_sizes(key);
        }
        let line_limits = self.line_limits(&record, &request.resource_lines);
        // A user's stream under `lease_global_slots` takes a slot of its slab first (boxed:
        // the default path's future stays its own size).
        let admitted = match self.slabs.as_ref().filter(|_| request.identity.is_some()) {
            None => Either::Left(Arc::clone(self).admit(
                record,
                rates,
                request.budget,
                request.wait,
                request.priority,
                line_limits,
            )),
            Some(slabs) => Either::Right(Box::pin(Arc::clone(self).admit_on_a_slot(
                Arc::clone(slabs),
                record,
                rates,
                request.budget,
                (request.wait, request.priority),
                line_limits,
            ))),
        };
        let disclose = self.config.disclose_usage;
        // A combinator, not an async block that awaits `admitted`: see `bridge::delivering`.
        Ok(admitted
            .map(move |granted| granted.map_err(|e| if disclose { e } else { e.without_shared_usage() })))
    }

    /// Sizes a budget's answer from the user's learned size (`answer_estimates.rs`) and names
    /// the histograms its settlement counts in, in the tag of its first budget's counter (the
    /// identity paired with that budget's, or the user's). Returns the histograms if a read of
    /// them is due.
    fn learn_answers(&self, request: &mut AcquireRequest) -> Option<AnswerKeys> {
        let identity = request.identity.as_deref()?;
        let budget = request.budget.as_mut()?;
        let first = budget.policies.first()?;
        let paired = request.policy_identities.get(request.rate_limits.len());
        let counted = paired.and_then(Option::as_deref).unwrap_or(identity);
        let counter = self.keys.rate_key(counted, first);
        let due = self.size_by_answers(budget, &counter, identity);
        due.then(|| budget.answers.clone()).flatten()
    }

    /// The pools a request takes, its own quota first; refuses what could never be granted.
    fn pools_for(&self, request: &AcquireRequest) -> CoreResult<Vec<Pool>> {
        let invalid = |message: String| CoreError::InvalidInput(message);
        if let Some(identity) = &request.identity {
            check_identity(identity).map_err(invalid)?;
        }
        for (name, capacity) in &request.resources {
            check_resource(name, *capacity).map_err(invalid)?;
        }
        if request.identity.is_some() && !request.resources.is_empty() && self.keys.users_tagged() {
            return Err(invalid(
                "resources and a user_id in one acquire need the users' pools in the global pool's hash tag: drop global_pool=False or lease_global_slots=True".into(),
            ));
        }
        let weight = request.weight;
        let mut pools = self
            .keys
            .pools_for(request.identity.as_deref(), &request.resources);
        // The resources come last.
        self.shared_pools
            .note(&pools[pools.len() - request.resources.len()..]);
        if let (Some(cap), Some(_)) = (request.max_per_user, &request.identity) {
            // A per-call cap (a paid tier, say): the user's pool is the same, only its limit moves.
            pools[0].capacity = cap;
        }
        if let Some(pool) = pools
            .iter()
            .find(|p| p.capacity > 0 && u64::from(weight) > p.capacity)
        {
            return Err(invalid(format!(
                "weight={weight} is more than the {} capacity of {}: such a lease could never be granted",
                pool.name, pool.capacity
            )));
        }
        Ok(pools)
    }

    /// Each pool's line limit: the configured one, or a resource's own (the resources come
    /// last).
    fn line_limits(&self, record: &LeaseRecord, resource_lines: &[Option<u64>]) -> Vec<u64> {
        let default = self.config.max_waiting;
        let mut limits = vec![default; record.pools.len() - resource_lines.len()];
        limits.extend(resource_lines.iter().map(|limit| limit.unwrap_or(default)));
        limits
    }
}
