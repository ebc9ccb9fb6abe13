//! `RateDecision`: what one policy said about a hit, made by the core without running Python
//! (a hit builds one per policy; a Python dataclass cost its `__init__` on every request).

use std::hash::{DefaultHasher, Hash, Hasher};

use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use super::rate::RateLimit;
use crate::rate::{Decision, PolicyState, RatePolicy, Thresholds};

/// What one policy said about a hit: its ``limit`` (the policy's, or this process's share of it
/// while Redis is down under ``failure_mode="open"``), ``remaining`` units in its window after
/// the hit (before it, when refused or only looked at), ``reset``, seconds until its next units
/// free up (0 when nothing is in use), ``used``, the units in its window (above the limit when a
/// token budget's stream finished past it, or a dry run counted past it), and
/// ``would_refuse``: the policy had no room for the hit's cost, so it refused, or, a dry run
/// (``RateLimit(enforce=False)``, ``LeaseConfig(enforce_rate_limits=False)``), would have.
/// ``thresholds_reached``: the policy's ``alert_at`` fractions (its own, else the manager's)
/// this hit or start brought the use to first in the window, across every worker (empty
/// unless the manager has ``on_threshold`` or telemetry). Immutable; equal when every field is.
#[pyclass(frozen, module = "fastapi_stream_lease")]
pub struct RateDecision {
    #[pyo3(get)]
    policy: Py<RateLimit>,
    #[pyo3(get)]
    limit: u64,
    #[pyo3(get)]
    remaining: u64,
    #[pyo3(get)]
    reset: f64,
    #[pyo3(get)]
    used: u64,
    #[pyo3(get)]
    would_refuse: bool,
    thresholds_reached: Vec<f64>,
}

impl RateDecision {
    /// The decision as Python sees it, its policy as the app built it (the thresholds applied
    /// are the manager's doing; the policy's own stay in `own_alert_at`).
    pub fn of(py: Python<'_>, decision: &Decision) -> PyResult<Py<RateDecision>> {
        Self::showing(py, decision, None)
    }

    /// `of`, its policy `built` itself (the value the app passed) where that is what the
    /// decision's policy shows, as it is unless the manager changed it (a dry run for every
    /// policy, a share of the limit while Redis is down): a hit then makes no `RateLimit`.
    fn showing(
        py: Python<'_>,
        decision: &Decision,
        built: Option<&Py<RateLimit>>,
    ) -> PyResult<Py<RateDecision>> {
        let policy = RatePolicy {
            alert_at: Thresholds::default(),
            ..decision.policy.clone()
        };
        let policy = match built {
            Some(built) if built.get().policy == policy => built.clone_ref(py),
            _ => Py::new(py, RateLimit { policy })?,
        };
        let made = RateDecision {
            policy,
            limit: decision.policy.limit,
            remaining: decision.remaining,
            reset: decision.reset_ms as f64 / 1000.0,
            used: decision.used,
            would_refuse: decision.would_refuse,
            thresholds_reached: decision.thresholds_reached.clone(),
        };
        Py::new(py, made)
    }

    /// What the rate-limit headers show of it.
    pub fn header_state(&self) -> PolicyState {
        let policy = &self.policy.get().policy;
        PolicyState {
            name: policy.name.clone(),
            limit: self.limit,
            window_s: policy.window_ms as f64 / 1000.0,
            remaining: self.remaining,
            reset_s: self.reset,
        }
    }

    fn fields(&self) -> (&RateLimit, u64, u64, u64, u64, bool, &[f64]) {
        (
            self.policy.get(),
            self.limit,
            self.remaining,
            self.reset.to_bits(),
            self.used,
            self.would_refuse,
            &self.thresholds_reached,
        )
    }
}

#[pymethods]
impl RateDecision {
    #[new]
    #[pyo3(
        signature = (policy, limit, remaining, reset, used, would_refuse = false, thresholds_reached = Vec::new()),
        text_signature = "(policy, limit, remaining, reset, used, would_refuse=False, thresholds_reached=())"
    )]
    fn py_new(
        policy: Py<RateLimit>,
        limit: u64,
        remaining: u64,
        reset: f64,
        used: u64,
        would_refuse: bool,
        thresholds_reached: Vec<f64>,
    ) -> Self {
        RateDecision {
            policy,
            limit,
            remaining,
            reset,
            used,
            would_refuse,
            thresholds_reached,
        }
    }

    #[getter]
    fn thresholds_reached<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.thresholds_reached)
    }

    fn __eq__(&self, other: PyRef<'_, RateDecision>) -> bool {
        self.fields() == other.fields()
    }

    fn __hash__(&self) -> u64 {
        let (policy, limit, remaining, reset, used, would_refuse, thresholds) = self.fields();
        let mut hasher = DefaultHasher::new();
        (policy, limit, remaining, reset, used, would_refuse).hash(&mut hasher);
        thresholds.iter().for_each(|t| t.to_bits().hash(&mut hasher));
        hasher.finish()
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let policy = self.policy.bind(py).repr()?;
        let thresholds = self.thresholds_reached(py)?.repr()?;
        let would_refuse = if self.would_refuse { "True" } else { "False" };
        Ok(format!(
            "RateDecision(policy={policy}, limit={}, remaining={}, reset={:?}, used={}, would_refuse={would_refuse}, thresholds_reached={thresholds})",
            self.limit, self.remaining, self.reset, self.used
        ))
    }
}

/// The decisions as `RateDecision` values.
pub fn decisions<'py>(py: Python<'py>, decisions: &[Decision]) -> PyResult<Bound<'py, PyList>> {
    decisions_showing(py, decisions, &[])
}

/// The decisions of a call whose policies were `built` (the app's `RateLimit` values, in the
/// decisions' order) as `RateDecision` values that show them.
pub fn decisions_showing<'py>(
    py: Python<'py>,
    decisions: &[Decision],
    built: &[Py<RateLimit>],
) -> PyResult<Bound<'py, PyList>> {
    let items = decisions
        .iter()
        .enumerate()
        .map(|(i, d)| RateDecision::showing(py, d, built.get(i)))
        .collect::<PyResult<Vec<_>>>()?;
    PyList::new(py, items)
}
