//! `AcquireArgs`: one acquire's arguments as one value, built by `StreamLeaseManager.acquire` and
//! checked for their types once, here, into the core's `AcquireRequest`.

use std::time::Duration;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use super::{args, budget, prices, rate};
use crate::backend::MAX_PRIORITY;
use crate::manager::{AcquireRequest, MAX_WEIGHT};

/// The arguments of one acquire, checked; the wait is the manager's default unless given.
#[pyclass(frozen, module = "fastapi_stream_lease._core")]
pub struct AcquireArgs {
    request: AcquireRequest,
    wait: Option<Duration>,
}

#[pymethods]
impl AcquireArgs {
    #[new]
    #[pyo3(signature = (*, user_id = None, weight = None, max_per_user = None, wait_timeout = None, resources = None, rate_limits = None, budgets = None, reserve = None, on_budget = None, priority = None, model = None, prices = None, prompt_tokens = None, max_tokens = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        user_id: Option<&Bound<'_, PyAny>>,
        weight: Option<&Bound<'_, PyAny>>,
        max_per_user: Option<&Bound<'_, PyAny>>,
        wait_timeout: Option<&Bound<'_, PyAny>>,
        resources: Option<&Bound<'_, PyAny>>,
        rate_limits: Option<&Bound<'_, PyAny>>,
        budgets: Option<&Bound<'_, PyAny>>,
        reserve: Option<&Bound<'_, PyAny>>,
        on_budget: Option<&Bound<'_, PyAny>>,
        priority: Option<&Bound<'_, PyAny>>,
        model: Option<&Bound<'_, PyAny>>,
        prices: Option<&Bound<'_, PyAny>>,
        prompt_tokens: Option<&Bound<'_, PyAny>>,
        max_tokens: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let (resources, resource_lines) = args::resources(resources)?
            .into_iter()
            .map(|(name, capacity, max_waiting)| ((name, capacity), max_waiting))
            .unzip();
        let identity = args::identity(user_id)?;
        let weight = args::weight(weight, MAX_WEIGHT)?;
        let max_per_user = args::optional_capacity("max_per_user", max_per_user)?;
        let wait = args::given(wait_timeout)
            .map(|wait| args::wait_seconds("wait_timeout", Some(wait), 0.0).map(Duration::from_secs_f64))
            .transpose()?;
        let keyed = |policies| {
            args::given(policies)
                .map(rate::keyed_policies_of)
                .transpose()
                .map(Option::unwrap_or_default)
        };
        // Whose each policy counts, in the start's order: the rate limits', then the budgets'.
        let (rate_limits, mut policy_identities): (Vec<_>, Vec<_>) = keyed(rate_limits)?.into_iter().unzip();
        let (budgets, budget_identities): (Vec<_>, Vec<_>) = keyed(budgets)?.into_iter().unzip();
        policy_identities.extend(budget_identities);
        let request = AcquireRequest {
            identity,
            resources,
            resource_lines,
            weight,
            max_per_user,
            wait: Duration::ZERO,
            rate_limits,
            budget: budget::request(
                budgets,
                reserve,
                on_budget,
                // reserve="auto" names the model for token budgets too, which need no price.
                match args::given(prices).is_none() && budget::sized_by_request(reserve) {
                    true => None,
                    false => prices::resolve(model, prices)?,
                },
                budget::Sizing {
                    model,
                    prompt_tokens,
                    max_tokens,
                },
            )?,
            policy_identities,
            priority: args::given(priority)
                .map(|p| args::int_in("priority", p, 0..=u64::from(MAX_PRIORITY)))
                .transpose()?
                .unwrap_or(0) as u8,
        };
        if request.identity.is_none() && request.resources.is_empty() {
            return Err(PyTypeError::new_err(
                "pass a user_id (a stream) or resources (shared capacity), or both",
            ));
        }
        Ok(AcquireArgs { request, wait })
    }
}

impl AcquireArgs {
    /// The core's request, waiting in line up to `default_wait` unless the call gave its own.
    pub fn request(&self, default_wait: Duration) -> AcquireRequest {
        AcquireRequest {
            wait: self.wait.unwrap_or(default_wait),
            ..self.request.clone()
        }
    }
}
