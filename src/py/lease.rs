//! The core handle behind the Python `Lease` (`fastapi_stream_lease/lease.py`), which adds
//! `wrap()` and the lost watch. Dropped without a release, it frees its slot.

use std::sync::{Arc, Mutex};

use futures_util::FutureExt;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyList};

use super::bridge::Sending;
use super::{bridge, budget, rate_decision};
use crate::budget::{Meter, Usage};
use crate::errors::{retry_after_seconds, CoreError};
use crate::manager::{Granted, PoolUsage};
use crate::rate::Decision;
use crate::renewal::{HeldLease, Releasing, NEVER};
use crate::sync::lock;

/// A slot held in every pool of one acquire, renewed by the manager until released.
#[pyclass(frozen, module = "fastapi_stream_lease._core")]
pub struct LeaseHandle {
    held: HeldLease,
    fencing_token: Option<u64>,
    /// What the acquire's rate policies said, the start counted.
    rates: Vec<Decision>,
    /// The capped pools the client may be told about: (name, capacity, slots in use).
    usage: Vec<PoolUsage>,
    /// The stream's token budgets (None without any).
    meter: Option<Arc<Meter>>,
    /// The grant, until its caller takes the handle (`_take`): a handle its caller never took
    /// (the awaiting task cancelled after the grant came, before it ran again) gives back its
    /// start's rate units when dropped, as its release gives back the rest.
    untaken: Mutex<Option<Granted>>,
}

impl LeaseHandle {
    /// The handle of `granted`, held by `held`.
    pub fn new(held: HeldLease, granted: Granted) -> Self {
        LeaseHandle {
            held,
            fencing_token: granted.fencing_token(),
            rates: granted.rate_decisions().to_vec(),
            usage: granted.usage().to_vec(),
            meter: granted.meter().cloned(),
            untaken: Mutex::new(Some(granted)),
        }
    }
}

impl LeaseHandle {
    fn meter(&self) -> PyResult<&Arc<Meter>> {
        self.meter.as_ref().ok_or_else(|| {
            pyo3::exceptions::PyRuntimeError::new_err(
                "this lease has no token budget: acquire it with budgets=[RateLimit(..., unit=\"tokens\")] to count tokens",
            )
        })
    }
}

#[pymethods]
impl LeaseHandle {
    /// The caller has the handle: its start counts from now on.
    fn _take(&self) {
        if let Some(granted) = lock(&self.untaken).take() {
            granted.delivered();
        }
    }

    /// Random id of this lease (the member stored in each pool).
    #[getter]
    fn lease_id(&self) -> &str {
        &self.held.record().id
    }

    /// Slots this lease takes in each pool.
    #[getter]
    fn weight(&self) -> u32 {
        self.held.record().weight
    }

    /// The grant's fencing token: larger than every token given before to a lease that shares
    /// a pool with this one.
    #[getter]
    fn fencing_token(&self) -> PyResult<u64> {
        self.fencing_token.ok_or_else(|| {
            pyo3::exceptions::PyRuntimeError::new_err(
                "this lease has no fencing token: its manager gives them with LeaseConfig(fencing_tokens=True) (on Redis one INCR per grant)",
            )
        })
    }

    /// What each rate policy of the acquire said (`RateDecision`s), the start counted.
    #[getter]
    fn rate_decisions<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        rate_decision::decisions(py, &self.rates)
    }

    /// The capped pools of the grant the client may be told about (the user's own always,
    /// shared ones under `disclose_usage`): `(name, capacity, slots in use)` after the grant.
    #[getter]
    fn pool_usage(&self) -> Vec<(String, u64, u64)> {
        self.usage
            .iter()
            .map(|u| (u.name.to_string(), u.capacity, u.used))
            .collect()
    }

    /// When the store drops the lease unless renewed, in seconds on the clock of
    /// `monotonic()` (`inf` where it never drops leases: the embedded stores); None once
    /// released or lost.
    #[getter]
    fn deadline(&self) -> Option<f64> {
        self.held.deadline_ms().map(|ms| match ms {
            NEVER => f64::INFINITY,
            ms => ms as f64 / 1000.0,
        })
    }

    /// True once renewal found the lease gone from the store.
    #[getter]
    fn lost(&self) -> bool {
        self.held.record().is_lost()
    }

    /// True once the lease was revoked (a drain or an operator ended its stream).
    #[getter]
    fn revoked(&self) -> bool {
        self.held.record().is_revoked()
    }

    /// Seconds its user's new streams were banned for when it was revoked (0: no ban).
    #[getter]
    fn revoked_ban_seconds(&self) -> u64 {
        match self.held.record().revoked_ban_ms() {
            0 => 0,
            ms => retry_after_seconds(ms),
        }
    }

    /// True once `release()` ran (or the manager was closed).
    #[getter]
    fn released(&self) -> bool {
        self.held.record().is_released()
    }

    /// Releases the lease now; the awaitable resolves to True if the store still had it.
    fn release<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        fn deliver(removed: bool) -> bridge::Delivery {
            Box::new(move |py: Python<'_>| Ok(PyBool::new(py, removed).to_owned().into_any().unbind()))
        }
        match self.held.release() {
            Releasing::Done(released) => bridge::resolved_future(py, released.map(deliver)),
            Releasing::Call(call) => bridge::spawn(py, bridge::delivering(call, deliver), Sending::AtOnce),
        }
    }

    /// Starts the release without waiting for it; True if this call released the lease.
    fn release_nowait(&self) -> bool {
        self.held.release_nowait()
    }

    /// Releases the lease where its stream ends, without waiting for the store's answer: the
    /// event loop is woken only when the release fails, to log it (the lease is released again
    /// at the next keep-alive, or expires by itself).
    fn release_at_end(&self, py: Python<'_>) -> PyResult<()> {
        match self.held.release() {
            Releasing::Done(Ok(_)) => Ok(()),
            Releasing::Done(Err(error)) => release_failed(py, error),
            Releasing::Call(call) => {
                bridge::spawn_told_of_failure(py, call.map(|outcome| outcome.map(drop)), release_failed);
                Ok(())
            }
        }
    }

    /// Counts `tokens` of the answer streamed (no I/O). Raises `BudgetExhausted` once the
    /// budget ran out under `on_budget="cut"`, and after the release.
    fn consume(&self, tokens: &Bound<'_, PyAny>) -> PyResult<()> {
        let tokens = budget::tokens("tokens", tokens)?;
        Ok(self.meter()?.consume(tokens)?)
    }

    /// The model's own figures for the stream, replacing the estimate and the count:
    /// `cached_input_tokens` of the prompt's were read from the provider's cache.
    fn report_usage(
        &self,
        input_tokens: &Bound<'_, PyAny>,
        output_tokens: &Bound<'_, PyAny>,
        cached_input_tokens: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let input = budget::tokens("input_tokens", input_tokens)?;
        let output = budget::tokens("output_tokens", output_tokens)?;
        let cached_input = budget::tokens("cached_input_tokens", cached_input_tokens)?;
        if cached_input > input {
            return Err(PyValueError::new_err(format!(
                "cached_input_tokens={cached_input} is more than input_tokens={input}: the cached tokens are the part of the prompt's tokens read from the cache (OpenAI's prompt_tokens_details.cached_tokens)"
            )));
        }
        let usage = Usage {
            input,
            cached_input,
            output,
        };
        Ok(self.meter()?.report(usage)?)
    }

    /// Tokens used so far, (prompt, answer); None without budgets.
    #[getter]
    fn tokens_used(&self) -> Option<(u64, u64)> {
        self.meter.as_ref().map(|meter| meter.used())
    }

    /// ((prompt, answer) as estimated at admission, answer tokens counted); None without
    /// budgets. What `Lease.report_usage` checks a model's figures against.
    #[getter]
    fn tokens_references(&self) -> Option<((u64, u64), u64)> {
        self.meter.as_ref().map(|meter| meter.references())
    }

    /// True once the budget ran out mid-stream under `on_budget="cut"`.
    #[getter]
    fn budget_exhausted(&self) -> bool {
        self.meter.as_ref().is_some_and(|meter| meter.is_exhausted())
    }

    /// True while the stream should wait for a top-up before its next item (`budget_ready()`).
    #[getter]
    fn budget_waiting(&self) -> bool {
        self.meter.as_ref().is_some_and(|meter| meter.is_waiting())
    }

    /// Resolves once the stream may go on: at once, unless it streamed past its reservation
    /// while a top-up is under way; then when it answers. Raises `BudgetExhausted` if the
    /// budget ran out (under `on_budget="cut"`).
    fn budget_ready<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let meter = Arc::clone(self.meter()?);
        let ready = async move {
            meter.ready().await;
            if meter.is_exhausted() {
                return Err(meter.exhausted_error());
            }
            Ok(Box::new(|py: Python<'_>| Ok(py.None())) as bridge::Delivery)
        };
        bridge::spawn(py, ready, Sending::Abortable)
    }

    /// Resolves when the lease is lost (never, if it is released first). Cancelling the
    /// awaitable stops the wait.
    fn wait_lost<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        // No task waits for it: the renewal loop resolves the future when it finds the lease
        // lost (a task per stream cost a wake-up of the core's thread, and another to cancel it).
        let (lost, resolver) = bridge::promise(py)?;
        self.held.when_lost(Box::new(move || {
            resolver.resolve(Ok(Box::new(|py: Python<'_>| Ok(py.None()))));
        }));
        Ok(lost)
    }
}

/// Logs a release at a stream's end that failed (`fastapi_stream_lease.lease.release_failed`).
fn release_failed(py: Python<'_>, error: CoreError) -> PyResult<()> {
    static LOG: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    LOG.import(py, "fastapi_stream_lease.lease", "release_failed")?
        .call1((PyErr::from(error).into_value(py),))?;
    Ok(())
}
