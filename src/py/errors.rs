//! The one conversion of core errors into the Python exception hierarchy (defined in
//! `fastapi_stream_lease/errors.py`, all under `StreamLeaseError`; every refusal under
//! `StreamLeaseRejected`).

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

use super::rate;
use crate::errors::{retry_after_seconds, CoreError};

impl From<CoreError> for PyErr {
    fn from(error: CoreError) -> PyErr {
        Python::attach(|py| {
            let class = |name: &str| error_class(py, name);
            let made = match &error {
                CoreError::Rejected(r) => class("PoolFull").and_then(|cls| {
                    cls.call1((
                        error.to_string(),
                        &*r.limit,
                        r.usage_shown.then_some(r.capacity),
                        r.usage_shown.then_some(r.current),
                        retry_after_seconds(r.retry_after_ms),
                    ))
                }),
                CoreError::LineFull { full: r, displaced } => class("LineFull").and_then(|cls| {
                    cls.call1((
                        error.to_string(),
                        &*r.limit,
                        r.capacity,
                        r.current,
                        retry_after_seconds(r.retry_after_ms),
                        *displaced,
                    ))
                }),
                CoreError::RateLimited(outcome) => class("RateLimited").and_then(|cls| {
                    let (index, retry_ms) = outcome.refused.unwrap_or_default();
                    let policy = outcome.decisions.get(index).map_or("", |d| &*d.policy.name);
                    cls.call1((
                        error.to_string(),
                        policy,
                        rate::decisions(py, &outcome.decisions)?,
                        retry_after_seconds(retry_ms),
                    ))
                }),
                CoreError::BudgetExhausted(policy) => {
                    class("BudgetExhausted").and_then(|c| c.call1((error.to_string(), policy)))
                }
                CoreError::Banned(ms_left) => class("UserBanned")
                    .and_then(|c| c.call1((error.to_string(), retry_after_seconds(*ms_left)))),
                CoreError::Unavailable(m) | CoreError::Unreached(m) => {
                    class("BackendUnavailable").and_then(|c| c.call1((m,)))
                }
                CoreError::Backend(m) => class("BackendError").and_then(|c| c.call1((m,))),
                CoreError::InvalidInput(m) => return PyValueError::new_err(m.clone()),
                CoreError::Closed => class("ManagerClosed").and_then(|c| c.call1((error.to_string(),))),
                CoreError::Misuse(m) => return PyRuntimeError::new_err(m.clone()),
                CoreError::Panic(_) => return PyRuntimeError::new_err(error.to_string()),
            };
            match made {
                Ok(exc) => PyErr::from_value(exc),
                Err(e) => e,
            }
        })
    }
}

/// The exception and warning classes live in Python (the exceptions carry `as_response()`);
/// the module is imported once.
pub(super) fn error_class<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyType>> {
    static MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
    let module =
        MODULE.get_or_try_init(py, || py.import("fastapi_stream_lease.errors").map(Bound::unbind))?;
    module
        .bind(py)
        .getattr(name)?
        .cast_into::<PyType>()
        .map_err(|_| PyTypeError::new_err(format!("fastapi_stream_lease.errors.{name} is not a class")))
}
