//! The one conversion of core errors into the Python exception hierarchy (defined in
//! `fastapi_stream_lease/errors.py`, all under `StreamLeaseError`; every refusal under
//! `StreamLeaseRejected`). The classes are looked up once, on first need, and kept.

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

use super::rate_decision;
use crate::errors::{retry_after_seconds, CoreError};

impl From<CoreError> for PyErr {
    fn from(error: CoreError) -> PyErr {
        Python::attach(|py| {
            let classes = match ErrorClasses::get(py) {
                Ok(classes) => classes,
                Err(e) => return e,
            };
            let made = match &error {
                CoreError::Rejected(r) => classes.pool_full.bind(py).call1((
                    error.to_string(),
                    &*r.limit,
                    r.usage_shown.then_some(r.capacity),
                    r.usage_shown.then_some(r.current),
                    retry_after_seconds(r.retry_after_ms),
                )),
                CoreError::LineFull { full: r, displaced } => classes.line_full.bind(py).call1((
                    error.to_string(),
                    &*r.limit,
                    r.capacity,
                    r.current,
                    retry_after_seconds(r.retry_after_ms),
                    *displaced,
                )),
                CoreError::RateLimited(outcome) => {
                    let (index, retry_ms) = outcome.refused.unwrap_or_default();
                    let policy = outcome.decisions.get(index).map_or("", |d| &*d.policy.name);
                    rate_decision::decisions(py, &outcome.decisions).and_then(|decisions| {
                        classes.rate_limited.bind(py).call1((
                            error.to_string(),
                            policy,
                            decisions,
                            retry_after_seconds(retry_ms),
                        ))
                    })
                }
                CoreError::ReservationTooLarge(t) => classes.reservation_too_large.bind(py).call1((
                    error.to_string(),
                    &*t.budget.name,
                    t.units,
                    t.budget.limit,
                )),
                CoreError::BudgetExhausted(policy) => classes
                    .budget_exhausted
                    .bind(py)
                    .call1((error.to_string(), policy)),
                CoreError::Banned(ms_left) => classes
                    .user_banned
                    .bind(py)
                    .call1((error.to_string(), retry_after_seconds(*ms_left))),
                CoreError::Unavailable(m) | CoreError::Unreached(m) => {
                    classes.backend_unavailable.bind(py).call1((m,))
                }
                CoreError::Backend(m) => classes.backend_error.bind(py).call1((m,)),
                CoreError::InvalidInput(m) => return PyValueError::new_err(m.clone()),
                CoreError::Closed => classes.manager_closed.bind(py).call1((error.to_string(),)),
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

/// The exception and warning classes the core raises and warns with. They live in Python (the
/// exceptions carry `as_response()`): looked up once, on first need.
pub(super) struct ErrorClasses {
    pool_full: Py<PyType>,
    line_full: Py<PyType>,
    rate_limited: Py<PyType>,
    budget_exhausted: Py<PyType>,
    reservation_too_large: Py<PyType>,
    user_banned: Py<PyType>,
    backend_unavailable: Py<PyType>,
    backend_error: Py<PyType>,
    manager_closed: Py<PyType>,
    pub warning: Py<PyType>,
}

impl ErrorClasses {
    pub fn get(py: Python<'_>) -> PyResult<&ErrorClasses> {
        static CLASSES: PyOnceLock<ErrorClasses> = PyOnceLock::new();
        CLASSES.get_or_try_init(py, || {
            let module = py.import("fastapi_stream_lease.errors")?;
            let class = |name: &str| -> PyResult<Py<PyType>> {
                module
                    .getattr(name)?
                    .cast_into::<PyType>()
                    .map(Bound::unbind)
                    .map_err(|_| {
                        PyTypeError::new_err(format!("fastapi_stream_lease.errors.{name} is not a class"))
                    })
            };
            Ok(ErrorClasses {
                pool_full: class("PoolFull")?,
                line_full: class("LineFull")?,
                rate_limited: class("RateLimited")?,
                budget_exhausted: class("BudgetExhausted")?,
                reservation_too_large: class("ReservationTooLarge")?,
                user_banned: class("UserBanned")?,
                backend_unavailable: class("BackendUnavailable")?,
                backend_error: class("BackendError")?,
                manager_closed: class("ManagerClosed")?,
                warning: class("StreamLeaseWarning")?,
            })
        })
    }
}
