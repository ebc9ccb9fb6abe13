//! `_core.Manager`, the core behind `StreamLeaseManager`: arguments in, awaitables out.

use std::ffi::CString;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::acquire_args::AcquireArgs;
use super::args;
use super::bridge::{self, Sending};
use super::config::{LeaseConfig, PythonSide, SECRET_VARIABLE};
use super::errors::ErrorClasses;
use super::lease::LeaseHandle;
use super::{rate, rate_decision};
use crate::backend;
use crate::manager;
use crate::manager::HitCall;
use crate::rate::{HitOutcome, Thresholds, MAX_LIMIT};

/// The longest ban `revoke` takes: a longer one is an account decision, not a stream's.
const MAX_BAN_SECONDS: f64 = 30.0 * 86400.0;

/// Warned when a manager on Redis hashes user ids with an empty key (the embedded store keeps
/// them in this process).
fn unkeyed_identities() -> CString {
    CString::new(format!(
        "no identity_secret: user ids are hashed into Redis keys with an empty HMAC key, so anyone who can read the keys can test guessed user ids against them. Pass LeaseConfig(identity_secret=...) or set {SECRET_VARIABLE} to 16 or more random bytes, the same on every worker (from your secret store)."
    ))
    .expect("the message holds no NUL")
}

#[pyclass(frozen, weakref, module = "fastapi_stream_lease._core")]
pub struct Manager {
    core: Arc<manager::Manager>,
    /// The config's options the core never reads, handed back by `config`.
    python_side: Arc<PythonSide>,
}

#[pymethods]
impl Manager {
    #[new]
    #[pyo3(signature = (url, config, tls_ca_file = None))]
    fn new(
        py: Python<'_>,
        url: &str,
        config: PyRef<'_, LeaseConfig>,
        tls_ca_file: Option<&str>,
    ) -> PyResult<Self> {
        let python_side = config.python_side.clone();
        let config = config.config.clone();
        let ca_pem = tls_ca_file
            .map(|path| {
                std::fs::read(path).map_err(|e| {
                    PyValueError::new_err(format!(
                        "cannot read tls_ca_file {path:?} ({e}): pass the path of the PEM file of the CA that signed Redis' certificate"
                    ))
                })
            })
            .transpose()?;
        let backend = backend::open(url, config.redis_timeout(), ca_pem)?;
        if config.identity_secret.is_empty() && !backend.is_embedded() {
            // Level 2: the line that built the StreamLeaseManager, past its __init__.
            PyErr::warn(
                py,
                ErrorClasses::get(py)?.warning.bind(py),
                &unkeyed_identities(),
                2,
            )?;
        }
        Ok(Manager {
            core: Arc::new(manager::Manager::new(backend, config)),
            python_side,
        })
    }

    #[getter]
    fn config(&self) -> LeaseConfig {
        LeaseConfig {
            config: self.core.config().clone(),
            python_side: self.python_side.clone(),
        }
    }

    /// Where the leases live, without any password.
    #[getter]
    fn backend(&self) -> String {
        self.core.describe()
    }

    /// Starts an acquire (`AcquireArgs` holds its checked arguments); resolves to the held
    /// lease.
    fn acquire<'py>(
        &self,
        py: Python<'py>,
        arguments: PyRef<'py, AcquireArgs>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let default_wait = Duration::from_secs_f64(self.core.config().wait_timeout);
        let request = arguments.request(default_wait);
        let waits = !request.wait.is_zero();
        let acquired = self.core.acquire(request)?;
        let embedded = self.core.is_embedded();
        // Held as soon as granted, on the runtime; a result nobody receives (loop gone, future
        // cancelled), or a handle its caller never takes (`LeaseHandle::_take`), is dropped,
        // which releases the lease and gives back the start's rate units.
        let held = acquired.map(|outcome| {
            outcome.and_then(|mut granted| {
                let handle = granted.hold()?;
                Ok((granted, handle))
            })
        });
        let op = bridge::delivering(held, |(granted, handle)| {
            Box::new(move |py: Python<'_>| Ok(Py::new(py, LeaseHandle::new(handle, granted))?.into_any()))
        });
        // A waiter stops waiting when cancelled (its cleanup leaves the line); an acquire that
        // does not wait runs to completion, so it can give back what it took.
        if waits {
            bridge::spawn(py, op, Sending::Abortable)
        } else {
            bridge::submit(py, op, embedded, Sending::AtOnce)
        }
    }

    /// The answer tokens `reserve="auto"` reserves for `model` without `max_tokens` (before
    /// the budgets' cap): learned from its settled streams, else 1,024.
    #[pyo3(signature = (model, user_id = None))]
    fn answer_estimate<'py>(
        &self,
        py: Python<'py>,
        model: &Bound<'py, PyAny>,
        user_id: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let model = args::choice("model", Some(model))?.unwrap_or_default();
        let identity = args::identity(user_id)?;
        let estimate = self.core.answer_estimate(identity.as_deref(), &model)?;
        let op = bridge::delivering(estimate, |tokens| {
            Box::new(move |py: Python<'_>| Ok(tokens.into_pyobject(py)?.into_any().unbind()))
        });
        bridge::submit(py, op, self.core.is_embedded(), Sending::TurnEnd)
    }

    /// From now on, every hit and stream start reports which of `alert_at` (fractions of each
    /// policy's limit; a policy's own `RateLimit(alert_at=...)` in their place) it reached
    /// first in the window, across every worker (`RateDecision.thresholds_reached`). The first
    /// thresholds given hold.
    fn alert_thresholds(&self, alert_at: Vec<f64>) -> PyResult<()> {
        let thresholds = Thresholds::new(&alert_at).map_err(args::invalid)?;
        self.core.alert_thresholds(thresholds);
        Ok(())
    }

    /// One hit of `cost` against every policy of `user_id`, all or nothing; resolves to each
    /// policy's `RateDecision`, or raises `RateLimited` (`consume=False` only looks, and never
    /// raises for rate).
    #[pyo3(signature = (user_id, policies, cost, consume))]
    fn hit<'py>(
        &self,
        py: Python<'py>,
        user_id: &Bound<'py, PyAny>,
        policies: &Bound<'py, PyAny>,
        cost: &Bound<'py, PyAny>,
        consume: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.start_hit(py, user_id, policies, cost, consume, false)
    }

    /// `hit(..., consume=True)` whose decisions come as a list, not an awaitable, when the hit
    /// is allowed without waiting (units leased to this process serve it, or the embedded store
    /// counts it), so the caller needs no coroutine; otherwise what `hit` returns.
    fn hit_now<'py>(
        &self,
        py: Python<'py>,
        user_id: &Bound<'py, PyAny>,
        policies: &Bound<'py, PyAny>,
        cost: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.start_hit(py, user_id, policies, cost, true, true)
    }

    /// Forgets the counters of `policies` (each of `user_id`, or of the identity paired with it).
    fn forget_rates<'py>(
        &self,
        py: Python<'py>,
        user_id: &Bound<'py, PyAny>,
        policies: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let identity = required_identity(user_id)?;
        let forgotten = self
            .core
            .forget_rates(&identity, rate::keyed_policies_of(policies)?)?;
        let op = bridge::delivering(forgotten, |()| Box::new(|py: Python<'_>| Ok(py.None())));
        bridge::submit(py, op, self.core.is_embedded(), Sending::TurnEnd)
    }

    #[pyo3(signature = (user_id = None))]
    fn count<'py>(
        &self,
        py: Python<'py>,
        user_id: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let counted = self.core.count(args::identity(user_id)?.as_deref())?;
        let op = bridge::delivering(counted, |count| {
            Box::new(move |py: Python<'_>| Ok(count.into_pyobject(py)?.into_any().unbind()))
        });
        bridge::submit(py, op, self.core.is_embedded(), Sending::TurnEnd)
    }

    /// Stops renewal and releases every lease this process holds (one script call per 1,000,
    /// a few in flight).
    fn aclose<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let closed = self.core.close();
        let op = bridge::delivering(closed, |()| Box::new(|py: Python<'_>| Ok(py.None())));
        // Waits for the renewal loop and in-flight releases, so never finishes inline.
        bridge::spawn(py, op, Sending::AtOnce)
    }

    /// The keyed hash of `user_id` that the Redis keys carry (HMAC-SHA256 with
    /// `identity_secret`, 16 bytes in hex): what traces and the CLI show instead of the id.
    fn identity_digest(&self, user_id: &Bound<'_, PyAny>) -> PyResult<String> {
        Ok(self.core.identity_digest(&required_identity(user_id)?)?)
    }

    /// Slots in use across every worker in each shared pool (global, the resources this
    /// process has acquired), with its capacity: `[(pool, used, capacity)]`, one call.
    fn shared_usage<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let usage = self.core.shared_usage()?;
        let op = bridge::delivering(usage, |usage| {
            Box::new(move |py: Python<'_>| Ok(usage.into_pyobject(py)?.into_any().unbind()))
        });
        bridge::submit(py, op, self.core.is_embedded(), Sending::TurnEnd)
    }

    /// Slots this process holds per pool name (`per_user`, `global`, resources), for metrics.
    fn slots_by_pool(&self) -> Vec<(String, u64)> {
        self.core.slots_by_pool()
    }

    /// From now on, every lease its caller takes is counted and timed until its release, for a
    /// metrics reader (`collect_lease_times`); until then, neither costs a lease anything.
    fn time_leases(&self) {
        self.core.time_leases();
    }

    /// Leases taken since `time_leases()`; the seconds each lease released since the last call
    /// was held (taken out); held times not kept because too many waited for a collection.
    fn collect_lease_times(&self) -> (u64, Vec<f32>, u64) {
        let collected = self.core.collect_lease_times();
        (collected.taken, collected.held_seconds, collected.dropped)
    }

    /// Refuses new leases on this manager (a drain's first step): acquires get `ManagerClosed`.
    fn refuse_new(&self) {
        self.core.refuse_new();
    }

    /// Ends every live stream of `user_id` on every worker (this one at once, the others within
    /// one renewal period) with `LeaseRevoked`, and refuses the user's new streams with
    /// `UserBanned` for `ban_seconds`; resolves to how many leases the user had.
    #[pyo3(signature = (user_id, ban_seconds = None))]
    fn revoke<'py>(
        &self,
        py: Python<'py>,
        user_id: &Bound<'py, PyAny>,
        ban_seconds: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let identity = required_identity(user_id)?;
        let ban = args::seconds("ban_seconds", ban_seconds, 0.0)?;
        if !(0.0..=MAX_BAN_SECONDS).contains(&ban) {
            return Err(PyValueError::new_err(format!(
                "ban_seconds={ban} is out of range: use 0 (end the streams, ban nothing) to {MAX_BAN_SECONDS} (30 days)"
            )));
        }
        let revoked = self.core.revoke(&identity, Duration::from_secs_f64(ban))?;
        let op = bridge::delivering(revoked, |count| {
            Box::new(move |py: Python<'_>| Ok(count.into_pyobject(py)?.into_any().unbind()))
        });
        bridge::submit(py, op, self.core.is_embedded(), Sending::TurnEnd)
    }

    /// Ends every stream this manager holds the way a lost lease ends, with `LeaseRevoked`;
    /// returns how many.
    fn revoke_held(&self) -> usize {
        self.core.revoke_held()
    }

    /// Counters for monitoring: leases held by this process, lost and taken back so far, failed
    /// renewal calls, leases waiting for another release try, leases given up on release,
    /// the hash tags its holder is in, members pruned, whether the manager is closed and
    /// the breaker open, and this process's waiters in line.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let stats = self.core.stats();
        let dict = PyDict::new(py);
        dict.set_item("held", stats.leases.held)?;
        dict.set_item("lost", stats.leases.lost)?;
        dict.set_item("reclaimed", stats.leases.reclaimed)?;
        dict.set_item("revoked", stats.leases.revoked)?;
        dict.set_item("renew_failures", stats.leases.renew_failures)?;
        dict.set_item("unremoved", stats.leases.unremoved)?;
        dict.set_item("unreleasable", stats.leases.unreleasable)?;
        dict.set_item("tags", stats.leases.tags)?;
        dict.set_item("pruned", stats.leases.pruned)?;
        dict.set_item("closed", stats.leases.closed)?;
        dict.set_item("breaker_open", stats.breaker_open)?;
        dict.set_item("redis_calls", stats.calls.calls)?;
        dict.set_item("redis_call_failures", stats.calls.failed)?;
        dict.set_item("redis_call_micros", stats.calls.micros)?;
        dict.set_item("waiting", stats.waiting)?;
        dict.set_item("budget_streams", stats.budget_streams)?;
        dict.set_item("unsettled", stats.unsettled)?;
        dict.set_item("settlements_dropped", stats.settlements_dropped)?;
        Ok(dict)
    }
}

impl Manager {
    /// A hit's call: decided here (units leased to this process, or the embedded store), as an
    /// awaitable already resolved or, allowed and `served_as_list`, as the list itself; or sent
    /// to the store (an awaitable).
    fn start_hit<'py>(
        &self,
        py: Python<'py>,
        user_id: &Bound<'py, PyAny>,
        policies: &Bound<'py, PyAny>,
        cost: &Bound<'py, PyAny>,
        consume: bool,
        served_as_list: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let identity = required_identity(user_id)?;
        let (policies, built) = rate::keyed_policies_and_values(policies)?;
        let cost = args::int_in("cost", cost, 0..=MAX_LIMIT)?;
        let decisions_of = move |outcome: HitOutcome| -> bridge::Delivery {
            Box::new(move |py: Python<'_>| {
                Ok(rate_decision::decisions_showing(py, &outcome.decisions, &built)?
                    .into_any()
                    .unbind())
            })
        };
        match self.core.hit(&identity, policies, cost, consume)? {
            HitCall::Served(outcome) if served_as_list => Ok(decisions_of(outcome)(py)?.into_bound(py)),
            HitCall::Served(outcome) => bridge::ready(py, Ok(decisions_of(outcome))),
            HitCall::Sent(hit) if served_as_list && self.core.is_embedded() => {
                match bridge::at_once(bridge::delivering(hit, decisions_of)) {
                    Ok(deliver) => Ok(deliver(py)?.into_bound(py)),
                    failed => bridge::ready(py, failed),
                }
            }
            HitCall::Sent(hit) => bridge::submit(
                py,
                bridge::delivering(hit, decisions_of),
                self.core.is_embedded(),
                Sending::TurnEnd,
            ),
        }
    }
}

/// The identity a rate limit counts (never None: a hit needs someone to count).
fn required_identity(user_id: &Bound<'_, PyAny>) -> PyResult<String> {
    args::identity(Some(user_id))?.ok_or_else(|| {
        PyTypeError::new_err("a rate limit needs an identity (a user id, an IP address), got None")
    })
}
