//! The options of `LeaseConfig` that only the Python layer reads.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyString;

use super::super::args::{self, type_name};

/// The options of the 0.6 API that the core never reads: its response headers and its
/// lifecycle hooks (run by the Python layer, off the hot path), and the failure policy object
/// given (its fallback mode became `failure_mode`).
#[derive(Debug)]
pub struct PythonSide {
    pub(super) include_lease_headers: bool,
    pub(super) hook_queue_size: u64,
    pub(super) on_acquired: Option<Py<PyAny>>,
    pub(super) on_rejected: Option<Py<PyAny>>,
    pub(super) on_lost: Option<Py<PyAny>>,
    pub(super) on_released: Option<Py<PyAny>>,
    pub(super) on_backend_error: Option<Py<PyAny>>,
    pub(super) failure_policy: Option<Py<PyAny>>,
}

impl PythonSide {
    fn objects(&self) -> [&Option<Py<PyAny>>; 6] {
        [
            &self.on_acquired,
            &self.on_rejected,
            &self.on_lost,
            &self.on_released,
            &self.on_backend_error,
            &self.failure_policy,
        ]
    }
}

/// Two configs are equal with the same hooks and policy objects (by identity: a callable has
/// no other equality worth trusting).
impl PartialEq for PythonSide {
    fn eq(&self, other: &Self) -> bool {
        let same = |a: &Option<Py<PyAny>>, b: &Option<Py<PyAny>>| match (a, b) {
            (None, None) => true,
            (Some(a), Some(b)) => a.as_ptr() == b.as_ptr(),
            _ => false,
        };
        self.include_lease_headers == other.include_lease_headers
            && self.hook_queue_size == other.hook_queue_size
            && self
                .objects()
                .iter()
                .zip(other.objects())
                .all(|(a, b)| same(a, b))
    }
}

/// The events a hook queue holds by default before it drops new ones (0.6's default).
const HOOK_QUEUE_SIZE: u64 = 1024;

/// A lifecycle hook: a callable (sync or async), or None.
fn hook_field(name: &str, value: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Py<PyAny>>> {
    match args::given(value) {
        None => Ok(None),
        Some(hook) if hook.is_callable() => Ok(Some(hook.clone().unbind())),
        Some(other) => Err(PyTypeError::new_err(format!(
            "{name} must be callable (a function or a coroutine function), got {} {}",
            type_name(other),
            other.repr()?
        ))),
    }
}

impl PythonSide {
    /// The Python side of the arguments: the hooks in the order `[on_acquired, on_rejected,
    /// on_lost, on_released, on_backend_error]` (an `on_lost` given as a str is the core's
    /// choice, not a hook).
    pub fn of(
        include_lease_headers: bool,
        hook_queue_size: Option<&Bound<'_, PyAny>>,
        hooks: [Option<&Bound<'_, PyAny>>; 5],
        failure_policy: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let [on_acquired, on_rejected, on_lost, on_released, on_backend_error] = hooks;
        let on_lost = args::given(on_lost).filter(|hook| !hook.is_instance_of::<PyString>());
        Ok(PythonSide {
            include_lease_headers,
            hook_queue_size: match args::capacity("hook_queue_size", hook_queue_size, HOOK_QUEUE_SIZE)? {
                0 => return Err(PyValueError::new_err("hook_queue_size must be greater than 0: it is how many hook events wait before new ones are dropped")),
                n => n,
            },
            on_acquired: hook_field("on_acquired", on_acquired)?,
            on_rejected: hook_field("on_rejected", on_rejected)?,
            on_lost: hook_field("on_lost", on_lost)?,
            on_released: hook_field("on_released", on_released)?,
            on_backend_error: hook_field("on_backend_error", on_backend_error)?,
            failure_policy: args::given(failure_policy).map(|policy| policy.clone().unbind()),
        })
    }

    /// Whether an `on_lost` hook was given (0.6's: a lost lease then ends its stream).
    pub fn has_lost_hook(&self) -> bool {
        self.on_lost.is_some()
    }
}
