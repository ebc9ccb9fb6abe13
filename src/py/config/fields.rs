//! The checks of `LeaseConfig`'s fields that take more than a range: timings that depend on
//! each other, names, choices, and settings with two names (this package's and the 0.6 API's).

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyString};

use super::super::args::{self, type_name};
use crate::config::FailureMode;

const MIN_LEASE_SECONDS: f64 = 0.1;
const MAX_LEASE_SECONDS: f64 = 86_400.0;
const MAX_PREFIX_LEN: usize = 128;

/// The timings, checked against each other: a lease outlives two renewals, and a refusal's
/// `Retry-After` is bounded.
pub struct Timings {
    pub lease_seconds: f64,
    pub renew_every: f64,
    pub redis_timeout: f64,
    pub retry_after: f64,
}

impl Timings {
    pub fn of(
        lease_seconds: Option<&Bound<'_, PyAny>>,
        renew_every: Option<&Bound<'_, PyAny>>,
        redis_timeout: Option<&Bound<'_, PyAny>>,
        retry_after: Option<&Bound<'_, PyAny>>,
        retry_after_seconds: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let lease_seconds = args::seconds("lease_seconds", lease_seconds, 30.0)?;
        if !(MIN_LEASE_SECONDS..=MAX_LEASE_SECONDS).contains(&lease_seconds) {
            return Err(PyValueError::new_err(format!(
            "lease_seconds={lease_seconds} is out of range: use {MIN_LEASE_SECONDS} to {MAX_LEASE_SECONDS} seconds (a lease is how long a slot survives a dead holder; 10 to 60 is typical)"
        )));
        }
        let renew_every = args::seconds("renew_every", renew_every, lease_seconds / 3.0)?;
        if !(renew_every > 0.0 && renew_every <= lease_seconds / 2.0) {
            return Err(PyValueError::new_err(format!(
            "renew_every={renew_every} must be above 0 and at most lease_seconds / 2 = {} so a lease is renewed at least twice before it expires; leave it unset for lease_seconds / 3",
            lease_seconds / 2.0
        )));
        }
        let redis_timeout = args::seconds("redis_timeout", redis_timeout, 1.0)?;
        if !(0.001..=60.0).contains(&redis_timeout) {
            return Err(PyValueError::new_err(format!(
            "redis_timeout={redis_timeout} is out of range: use 0.001 to 60 seconds (it bounds every Redis call)"
        )));
        }
        let (retry_after_name, retry_after) = one_of_two_names(
            ("retry_after", retry_after),
            ("retry_after_seconds", retry_after_seconds),
        )?;
        let retry_after = args::seconds(retry_after_name, retry_after, 5.0)?;
        if !(1.0..=3600.0).contains(&retry_after) {
            let negative = if retry_after < 0.0 {
                format!(" {retry_after_name} cannot be negative;")
            } else {
                String::new()
            };
            return Err(PyValueError::new_err(format!(
            "{retry_after_name}={retry_after} is out of range:{negative} use 1 to 3600 seconds (the longest Retry-After a rejected client is told)"
        )));
        }
        Ok(Timings {
            lease_seconds,
            renew_every,
            redis_timeout,
            retry_after,
        })
    }
}

pub fn prefix_field(value: Option<&Bound<'_, PyAny>>) -> PyResult<String> {
    let Some(value) = args::given(value) else {
        return Ok("stream_lease".into());
    };
    let Ok(prefix) = value.cast::<PyString>() else {
        return Err(PyTypeError::new_err(format!(
            "key_prefix must be a str, got {} {}",
            type_name(value),
            value.repr()?
        )));
    };
    let prefix = args::utf8("key_prefix", prefix)?;
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

/// A value that has two names (this package's and the 0.6 API's): whichever was given, with
/// its name; refused when both were.
pub type Named<'a, 'py> = (&'static str, Option<&'a Bound<'py, PyAny>>);

pub fn one_of_two_names<'a, 'py>(ours: Named<'a, 'py>, theirs: Named<'a, 'py>) -> PyResult<Named<'a, 'py>> {
    match (args::given(ours.1), args::given(theirs.1)) {
        (Some(_), Some(_)) => Err(PyValueError::new_err(format!(
            "{} and {} are one setting ({} is its 0.6 name): pass one of them",
            ours.0, theirs.0, theirs.0
        ))),
        (None, Some(value)) => Ok((theirs.0, Some(value))),
        _ => Ok(ours),
    }
}

/// `failure_mode`, or 0.6's `fail_open` or `failure_policy.fallback_mode`: those given must
/// agree.
pub fn failure_mode_field(
    failure_mode: Option<&Bound<'_, PyAny>>,
    fail_open: Option<&Bound<'_, PyAny>>,
    failure_policy: Option<&Bound<'_, PyAny>>,
) -> PyResult<FailureMode> {
    let choices = [("closed", FailureMode::Closed), ("open", FailureMode::Open)];
    let mut given: Vec<(String, FailureMode)> = Vec::new();
    if let Some(mode) = args::given(failure_mode) {
        let chosen = choice_field("failure_mode", Some(mode), &choices)?;
        given.push((format!("failure_mode={}", mode.repr()?), chosen));
    }
    if let Some(open) = args::given(fail_open) {
        if !open.is_instance_of::<PyBool>() {
            return Err(PyTypeError::new_err(format!(
                "fail_open must be a bool, got {} {}",
                type_name(open),
                open.repr()?
            )));
        }
        let mode = if open.is_truthy()? {
            FailureMode::Open
        } else {
            FailureMode::Closed
        };
        given.push((format!("fail_open={}", open.repr()?), mode));
    }
    if let Some(policy) = args::given(failure_policy) {
        let fallback = match policy.cast::<PyDict>() {
            Ok(dict) => dict.get_item("fallback_mode")?,
            Err(_) => policy.getattr("fallback_mode").ok(),
        };
        let Some(fallback) = fallback else {
            return Err(PyTypeError::new_err(format!(
                "failure_policy must be a BackendFailurePolicy (or a dict with fallback_mode), got {}",
                type_name(policy)
            )));
        };
        let mode = match fallback.extract::<String>().as_deref() {
            Ok("fail_open") => FailureMode::Open,
            Ok("fail_closed") => FailureMode::Closed,
            _ => {
                return Err(PyValueError::new_err(format!(
                    "failure_policy.fallback_mode must be FallbackMode.FAIL_OPEN or FallbackMode.FAIL_CLOSED, got {}",
                    fallback.repr()?
                )))
            }
        };
        given.push(("failure_policy".into(), mode));
    }
    let Some((first_name, first)) = given.first() else {
        return Ok(FailureMode::Closed);
    };
    match given.iter().find(|(_, mode)| mode != first) {
        None => Ok(*first),
        Some((other, _)) => Err(PyValueError::new_err(format!(
            "{first_name} and {other} disagree on what to do when Redis is down: pass one of them"
        ))),
    }
}

/// One of `choices`, by name; the first is the default.
pub fn choice_field<T: Copy>(
    name: &str,
    value: Option<&Bound<'_, PyAny>>,
    choices: &[(&str, T)],
) -> PyResult<T> {
    let Some(value) = args::given(value) else {
        return Ok(choices[0].1);
    };
    let given = value.cast::<PyString>().ok().map(|s| s.to_string());
    match choices
        .iter()
        .find(|(choice, _)| given.as_deref() == Some(*choice))
    {
        Some((_, chosen)) => Ok(*chosen),
        None => {
            let names: Vec<&str> = choices.iter().map(|(choice, _)| *choice).collect();
            Err(PyValueError::new_err(format!(
                "{name} must be one of {names:?}, got {}",
                value.repr()?
            )))
        }
    }
}
