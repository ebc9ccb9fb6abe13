//! One error enum for the core and its single conversion into the Python exception hierarchy
//! (defined in `fastapi_stream_lease/errors.py`, all under `StreamLeaseError`).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

/// Which pool refused an acquire, with what it saw.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejection {
    /// Pool name as users see it: `"per_user"`, `"global"` or a resource's name.
    pub limit: Arc<str>,
    pub capacity: u64,
    pub current: u64,
    pub retry_after_ms: u64,
}

#[derive(Debug, Clone)]
pub enum CoreError {
    /// A pool is full.
    Rejected(Rejection),
    /// Redis could not be reached, or did not answer within the timeout.
    Unavailable(String),
    /// Redis answered, but with an error (authentication, wrong type, read-only replica, ...).
    Backend(String),
    /// The caller passed a bad value (wrong type is reported by `TypeError` before this).
    InvalidInput(String),
    /// `aclose()` was called on the manager.
    Closed,
    /// The API was used in a way that cannot work (a manager used across a fork).
    Misuse(String),
    /// A bug: a Rust panic caught at the bridge so the Python future still settles.
    Panic(String),
}

impl fmt::Display for CoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CoreError::Rejected(r) => write!(
                f,
                "{} stream limit reached ({} of {} in use); retry in {} s",
                r.limit,
                r.current,
                r.capacity,
                retry_after_seconds(r.retry_after_ms)
            ),
            CoreError::Unavailable(m)
            | CoreError::Backend(m)
            | CoreError::InvalidInput(m)
            | CoreError::Misuse(m) => {
                f.write_str(m)
            }
            CoreError::Closed => f.write_str(
                "this StreamLeaseManager was closed with aclose(); create a new one (for example in the app's lifespan)",
            ),
            CoreError::Panic(m) => write!(f, "internal error in fastapi_stream_lease's core (please report it): {m}"),
        }
    }
}

/// Whole seconds for a `Retry-After` header: never 0, rounded up.
pub fn retry_after_seconds(ms: u64) -> u64 {
    ms.div_ceil(1000).max(1)
}

impl CoreError {
    /// Maps a redis-rs error to what the user can act on. `target` names the server (no password).
    pub fn from_redis(err: &redis::RedisError, target: &str) -> Self {
        if err.is_timeout() {
            return CoreError::Unavailable(format!(
                "Redis at {target} did not answer in time ({err}); check that it is running and not overloaded, or raise LeaseConfig(redis_timeout=...)"
            ));
        }
        if matches!(
            err.kind(),
            redis::ErrorKind::MasterNameNotFoundBySentinel | redis::ErrorKind::NoValidReplicasFoundBySentinel
        ) {
            return CoreError::Unavailable(format!(
                "the sentinels of {target} name no reachable master ({err}); a failover may be under way"
            ));
        }
        if err.is_io_error() || err.is_connection_refusal() || err.is_connection_dropped() {
            return CoreError::Unavailable(format!(
                "cannot reach Redis at {target} ({err}); check the URL and that the server is running"
            ));
        }
        // A failed AUTH during the handshake has a kind but no server code.
        let code = match err.kind() {
            redis::ErrorKind::AuthenticationFailed => Some("NOAUTH"),
            _ => err.code(),
        };
        let hint = match code {
            Some("NOAUTH") | Some("WRONGPASS") => {
                "; put the right user and password in the URL (redis://user:password@host:port)"
            }
            Some("WRONGTYPE") => {
                "; another program uses keys under this key_prefix: choose another LeaseConfig(key_prefix=...)"
            }
            Some("READONLY") => "; the URL points at a replica: point it at the master",
            Some("CROSSSLOT") => "; this is a bug in fastapi_stream_lease's key layout, please report it",
            _ => "",
        };
        CoreError::Backend(format!("Redis at {target} answered with an error: {err}{hint}"))
    }

    /// Refused without calling Redis: it failed moments ago and the breaker is open.
    pub fn breaker_open(target: &str, left: Duration) -> Self {
        CoreError::Unavailable(format!(
            "Redis at {target} failed moments ago; not calling it again for {} ms (circuit breaker)",
            left.as_millis()
        ))
    }

    pub fn timeout(target: &str, after: Duration) -> Self {
        CoreError::Unavailable(format!(
            "Redis at {target} did not answer within {:.3} s; check that it is running and reachable, or raise LeaseConfig(redis_timeout=...)",
            after.as_secs_f64()
        ))
    }

    pub fn into_pyerr(self, py: Python<'_>) -> PyErr {
        let class = |name: &str| -> PyResult<Bound<'_, PyType>> { error_class(py, name) };
        let made = match &self {
            CoreError::Rejected(r) => class("StreamLeaseRejected").and_then(|cls| {
                cls.call1((
                    self.to_string(),
                    &*r.limit,
                    r.capacity,
                    r.current,
                    retry_after_seconds(r.retry_after_ms),
                ))
            }),
            CoreError::Unavailable(m) => class("BackendUnavailable").and_then(|c| c.call1((m,))),
            CoreError::Backend(m) => class("BackendError").and_then(|c| c.call1((m,))),
            CoreError::InvalidInput(m) => return PyValueError::new_err(m.clone()),
            CoreError::Closed => class("ManagerClosed").and_then(|c| c.call1((self.to_string(),))),
            CoreError::Misuse(m) => return PyRuntimeError::new_err(m.clone()),
            CoreError::Panic(_) => return PyRuntimeError::new_err(self.to_string()),
        };
        match made {
            Ok(exc) => PyErr::from_value(exc),
            Err(e) => e,
        }
    }
}

/// The exception classes live in Python (they carry `as_response()`); look each up once.
fn error_class<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyType>> {
    static MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
    let module =
        MODULE.get_or_try_init(py, || py.import("fastapi_stream_lease.errors").map(Bound::unbind))?;
    module
        .bind(py)
        .getattr(name)?
        .cast_into::<PyType>()
        .map_err(|_| PyTypeError::new_err(format!("fastapi_stream_lease.errors.{name} is not a class")))
}

pub type CoreResult<T> = Result<T, CoreError>;
