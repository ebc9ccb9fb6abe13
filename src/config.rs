//! `LeaseConfig`: every knob, validated once at construction with errors that say how to fix them.

use std::time::Duration;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyFloat, PyInt, PyString};

use crate::keys::Pool;

const MIN_LEASE_SECONDS: f64 = 1.0;
const MAX_LEASE_SECONDS: f64 = 86_400.0;
const MAX_CAPACITY: i64 = 1_000_000_000;
const MAX_PREFIX_LEN: usize = 128;

/// Limits and timings of a `StreamLeaseManager`. Immutable; validated when built.
#[pyclass(frozen, eq, module = "fastapi_stream_lease")]
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseConfig {
    #[pyo3(get)]
    pub lease_seconds: f64,
    #[pyo3(get)]
    pub max_per_user: u64,
    #[pyo3(get)]
    pub max_global: u64,
    /// Keep a pool across every user (`max_global`, `get_active_count()`). Without it, each
    /// user's keys get a hash tag of their own and spread across Redis Cluster shards.
    #[pyo3(get)]
    pub global_pool: bool,
    #[pyo3(get)]
    pub key_prefix: String,
    #[pyo3(get)]
    pub renew_every: f64,
    #[pyo3(get)]
    pub redis_timeout: f64,
    /// How long an acquire waits in line for shared capacity (global) before it is refused.
    #[pyo3(get)]
    pub wait_timeout: f64,
    /// Upper bound of the `Retry-After` given with a rejection (sooner if a lease expires sooner).
    #[pyo3(get)]
    pub retry_after: f64,
    /// What a lost lease does to its stream: `"cancel"` ends it with `LeaseLost`, `"continue"`
    /// only records it (`lease.lost`).
    #[pyo3(get)]
    pub on_lost: String,
    /// When Redis is unreachable: `"closed"` refuses new streams (503), `"open"` admits them
    /// against this process's share of the caps (`fallback_workers`).
    #[pyo3(get)]
    pub failure_mode: String,
    /// Worker processes sharing the caps; under `failure_mode="open"` each enforces its share.
    #[pyo3(get)]
    pub fallback_workers: u64,
    /// Keys the identity hash (HMAC-SHA256); never readable back from Python.
    pub identity_secret: Vec<u8>,
}

#[pymethods]
impl LeaseConfig {
    #[new]
    #[pyo3(signature = (
        lease_seconds = None,
        max_per_user = None,
        max_global = None,
        key_prefix = None,
        *,
        global_pool = true,
        renew_every = None,
        redis_timeout = None,
        wait_timeout = None,
        retry_after = None,
        on_lost = None,
        failure_mode = None,
        fallback_workers = None,
        identity_secret = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn py_new(
        lease_seconds: Option<&Bound<'_, PyAny>>,
        max_per_user: Option<&Bound<'_, PyAny>>,
        max_global: Option<&Bound<'_, PyAny>>,
        key_prefix: Option<&Bound<'_, PyAny>>,
        global_pool: bool,
        renew_every: Option<&Bound<'_, PyAny>>,
        redis_timeout: Option<&Bound<'_, PyAny>>,
        wait_timeout: Option<&Bound<'_, PyAny>>,
        retry_after: Option<&Bound<'_, PyAny>>,
        on_lost: Option<&Bound<'_, PyAny>>,
        failure_mode: Option<&Bound<'_, PyAny>>,
        fallback_workers: Option<&Bound<'_, PyAny>>,
        identity_secret: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let lease_seconds = seconds_field("lease_seconds", lease_seconds, 30.0)?;
        if !(MIN_LEASE_SECONDS..=MAX_LEASE_SECONDS).contains(&lease_seconds) {
            return Err(PyValueError::new_err(format!(
                "lease_seconds={lease_seconds} is out of range: use {MIN_LEASE_SECONDS} to {MAX_LEASE_SECONDS} seconds (a lease is how long a slot survives a dead holder; 10 to 60 is typical)"
            )));
        }
        let renew_every = seconds_field("renew_every", renew_every, lease_seconds / 3.0)?;
        if !(renew_every > 0.0 && renew_every <= lease_seconds / 2.0) {
            return Err(PyValueError::new_err(format!(
                "renew_every={renew_every} must be above 0 and at most lease_seconds / 2 = {} so a lease is renewed at least twice before it expires; leave it unset for lease_seconds / 3",
                lease_seconds / 2.0
            )));
        }
        let redis_timeout = seconds_field("redis_timeout", redis_timeout, 1.0)?;
        if !(0.001..=60.0).contains(&redis_timeout) {
            return Err(PyValueError::new_err(format!(
                "redis_timeout={redis_timeout} is out of range: use 0.001 to 60 seconds (it bounds every Redis call)"
            )));
        }
        let wait_timeout = wait_seconds(wait_timeout, 0.0)?;
        let retry_after = seconds_field("retry_after", retry_after, 5.0)?;
        if !(1.0..=3600.0).contains(&retry_after) {
            return Err(PyValueError::new_err(format!(
                "retry_after={retry_after} is out of range: use 1 to 3600 seconds (the longest Retry-After a rejected client is told)"
            )));
        }
        Ok(LeaseConfig {
            lease_seconds,
            max_per_user: capacity_field("max_per_user", max_per_user, 3)?,
            max_global: match (global_pool, capacity_field("max_global", max_global, 1000)?) {
                (true, limit) => limit,
                (false, _) if max_global.is_none_or(|v| v.is_none()) => 0,
                (false, 0) => 0,
                (false, _) => {
                    return Err(PyValueError::new_err(
                        "max_global needs the global pool: drop global_pool=False, or max_global",
                    ))
                }
            },
            global_pool,
            key_prefix: prefix_field(key_prefix)?,
            renew_every,
            redis_timeout,
            wait_timeout,
            retry_after,
            on_lost: choice_field("on_lost", on_lost, &["cancel", "continue"])?,
            failure_mode: choice_field("failure_mode", failure_mode, &["closed", "open"])?,
            fallback_workers: match capacity_field("fallback_workers", fallback_workers, 1)? {
                0 => return Err(PyValueError::new_err("fallback_workers must be at least 1")),
                n => n,
            },
            identity_secret: secret_field(identity_secret)?,
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "LeaseConfig(lease_seconds={:?}, max_per_user={}, max_global={}, global_pool={}, key_prefix={:?}, renew_every={:?}, redis_timeout={:?}, wait_timeout={:?}, retry_after={:?}, on_lost={:?}, failure_mode={:?}, fallback_workers={}, identity_secret={})",
            self.lease_seconds,
            self.max_per_user,
            self.max_global,
            if self.global_pool { "True" } else { "False" },
            self.key_prefix,
            self.renew_every,
            self.redis_timeout,
            self.wait_timeout,
            self.retry_after,
            self.on_lost,
            self.failure_mode,
            self.fallback_workers,
            if self.identity_secret.is_empty() { "None" } else { "'***'" },
        )
    }
}

impl LeaseConfig {
    pub fn lease_duration(&self) -> Duration {
        Duration::from_secs_f64(self.lease_seconds)
    }

    pub fn renew_period(&self) -> Duration {
        Duration::from_secs_f64(self.renew_every)
    }

    pub fn redis_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.redis_timeout)
    }

    pub fn retry_after_ms(&self) -> u64 {
        (self.retry_after * 1000.0).round() as u64
    }

    pub fn fail_open(&self) -> bool {
        self.failure_mode == "open"
    }

    /// This process's share of each cap while Redis is down (unlimited stays unlimited).
    pub fn local_floor(&self, pools: &[Pool]) -> Vec<Pool> {
        pools
            .iter()
            .map(|pool| Pool {
                capacity: pool.capacity.div_ceil(self.fallback_workers),
                ..pool.clone()
            })
            .collect()
    }

    pub fn cancel_on_lost(&self) -> bool {
        self.on_lost == "cancel"
    }

    pub fn lease_ms(&self) -> u64 {
        (self.lease_seconds * 1000.0).round() as u64
    }
}

fn type_name(value: &Bound<'_, PyAny>) -> String {
    value
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

fn seconds_field(name: &str, value: Option<&Bound<'_, PyAny>>, default: f64) -> PyResult<f64> {
    let Some(value) = value.filter(|v| !v.is_none()) else {
        return Ok(default);
    };
    if value.is_instance_of::<PyBool>()
        || !(value.is_instance_of::<PyInt>() || value.is_instance_of::<PyFloat>())
    {
        return Err(PyTypeError::new_err(format!(
            "{name} must be a number of seconds (int or float), got {} {}",
            type_name(value),
            value.repr()?
        )));
    }
    let seconds: f64 = value.extract()?;
    if !seconds.is_finite() {
        return Err(PyValueError::new_err(format!(
            "{name} must be finite, got {seconds}"
        )));
    }
    Ok(seconds)
}

/// Seconds to wait in line: 0 (refuse at once) to an hour.
pub fn wait_seconds(value: Option<&Bound<'_, PyAny>>, default: f64) -> PyResult<f64> {
    let seconds = seconds_field("wait_timeout", value, default)?;
    if !(0.0..=3600.0).contains(&seconds) {
        return Err(PyValueError::new_err(format!(
            "wait_timeout={seconds} is out of range: use 0 (refuse at once) to 3600 seconds"
        )));
    }
    Ok(seconds)
}

pub fn capacity_field(name: &str, value: Option<&Bound<'_, PyAny>>, default: u64) -> PyResult<u64> {
    let Some(value) = value.filter(|v| !v.is_none()) else {
        return Ok(default);
    };
    if value.is_instance_of::<PyBool>() || !value.is_instance_of::<PyInt>() {
        return Err(PyTypeError::new_err(format!(
            "{name} must be an int, got {} {}",
            type_name(value),
            value.repr()?
        )));
    }
    let n: i64 = value
        .extract()
        .map_err(|_| PyValueError::new_err(format!("{name} is too large: use at most {MAX_CAPACITY}")))?;
    if !(0..=MAX_CAPACITY).contains(&n) {
        return Err(PyValueError::new_err(format!(
            "{name}={n} is out of range: use 0 (no limit) to {MAX_CAPACITY}"
        )));
    }
    Ok(n as u64)
}

fn prefix_field(value: Option<&Bound<'_, PyAny>>) -> PyResult<String> {
    let Some(value) = value.filter(|v| !v.is_none()) else {
        return Ok("stream_lease".into());
    };
    let Ok(prefix) = value.cast::<PyString>() else {
        return Err(PyTypeError::new_err(format!(
            "key_prefix must be a str, got {} {}",
            type_name(value),
            value.repr()?
        )));
    };
    let prefix = prefix.to_str()?.to_owned();
    if prefix.is_empty() || prefix.len() > MAX_PREFIX_LEN {
        return Err(PyValueError::new_err(format!(
            "key_prefix must be 1 to {MAX_PREFIX_LEN} bytes long, got {} bytes",
            prefix.len()
        )));
    }
    if let Some(bad) = prefix
        .chars()
        .find(|c| matches!(c, '{' | '}') || c.is_whitespace() || c.is_control())
    {
        return Err(PyValueError::new_err(format!(
            "key_prefix {prefix:?} contains {bad:?}: braces are added by the library (Redis Cluster hash tags) and whitespace is not allowed; use letters, digits, ':', '_', '-' or '.'"
        )));
    }
    Ok(prefix)
}

/// One of `choices`; the first is the default.
fn choice_field(name: &str, value: Option<&Bound<'_, PyAny>>, choices: &[&str]) -> PyResult<String> {
    let Some(value) = value.filter(|v| !v.is_none()) else {
        return Ok(choices[0].to_owned());
    };
    match value.cast::<PyString>().ok().map(|s| s.to_string()) {
        Some(choice) if choices.contains(&choice.as_str()) => Ok(choice),
        _ => Err(PyValueError::new_err(format!(
            "{name} must be one of {choices:?}, got {}",
            value.repr()?
        ))),
    }
}

fn secret_field(value: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<u8>> {
    let Some(value) = value.filter(|v| !v.is_none()) else {
        return Ok(Vec::new());
    };
    let secret = if let Ok(s) = value.cast::<PyString>() {
        s.to_str()?.as_bytes().to_vec()
    } else if let Ok(b) = value.cast::<PyBytes>() {
        b.as_bytes().to_vec()
    } else {
        return Err(PyTypeError::new_err(format!(
            "identity_secret must be str or bytes, got {}",
            type_name(value)
        )));
    };
    if secret.is_empty() {
        return Err(PyValueError::new_err(
            "identity_secret is empty: pass None for no secret, or at least 16 random bytes",
        ));
    }
    Ok(secret)
}
