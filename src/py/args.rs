//! Arguments from Python: their types checked, with errors that say how to fix them. Value rules
//! that do not depend on Python (identities, resources) are the core's.

use std::ops::RangeInclusive;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyFloat, PyInt, PySequence, PyString};

use crate::rate::Thresholds;

/// Caps above this are bugs, not limits.
const MAX_CAPACITY: i64 = 1_000_000_000;

pub fn type_name(value: &Bound<'_, PyAny>) -> String {
    value
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// The value, unless absent or None.
pub fn given<'a, 'py>(value: Option<&'a Bound<'py, PyAny>>) -> Option<&'a Bound<'py, PyAny>> {
    value.filter(|v| !v.is_none())
}

pub fn seconds(name: &str, value: Option<&Bound<'_, PyAny>>, default: f64) -> PyResult<f64> {
    let Some(value) = given(value) else {
        return Ok(default);
    };
    let seconds = number(name, value)?;
    if !seconds.is_finite() {
        return Err(PyValueError::new_err(format!(
            "{name} must be finite, got {seconds}"
        )));
    }
    Ok(seconds)
}

/// A flag: True or False (not 1, not "yes"), or `default` when not given.
pub fn flag(name: &str, value: Option<&Bound<'_, PyAny>>, default: bool) -> PyResult<bool> {
    match given(value) {
        None => Ok(default),
        Some(value) => value.cast::<PyBool>().map(|flag| flag.is_true()).map_err(|_| {
            PyTypeError::new_err(format!(
                "{name} must be a boolean (True or False), got {} {}",
                type_name(value),
                value.repr().map_or_else(|_| "?".into(), |repr| repr.to_string())
            ))
        }),
    }
}

/// An int or float (not a bool) of seconds, unchecked.
fn number(name: &str, value: &Bound<'_, PyAny>) -> PyResult<f64> {
    if value.is_instance_of::<PyBool>()
        || !(value.is_instance_of::<PyInt>() || value.is_instance_of::<PyFloat>())
    {
        return Err(PyTypeError::new_err(format!(
            "{name} must be a number of seconds (int or float), got {} {}",
            type_name(value),
            value.repr()?
        )));
    }
    value.extract()
}

/// Seconds to wait in line: 0 (refuse at once) to an hour. `name` is the one the caller wrote
/// (`wait_timeout`, or 0.6's `acquire_timeout`).
pub fn wait_seconds(name: &str, value: Option<&Bound<'_, PyAny>>, default: f64) -> PyResult<f64> {
    let Some(value) = given(value) else {
        return Ok(default);
    };
    let seconds = number(name, value)?;
    if !(0.0..=3600.0).contains(&seconds) {
        return Err(PyValueError::new_err(format!(
            "{name}={seconds} is out of range: {name} must be a finite number >= 0 and at most 3600 (seconds to wait in line; 0 refuses at once)"
        )));
    }
    Ok(seconds)
}

/// A cap: 0 (no limit) to `MAX_CAPACITY`.
pub fn capacity(name: &str, value: Option<&Bound<'_, PyAny>>, default: u64) -> PyResult<u64> {
    let Some(value) = given(value) else {
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

/// An int in `range` (a bool is not one).
pub fn int_in(name: &str, value: &Bound<'_, PyAny>, range: RangeInclusive<u64>) -> PyResult<u64> {
    if value.is_instance_of::<PyBool>() || !value.is_instance_of::<PyInt>() {
        return Err(PyTypeError::new_err(format!(
            "{name} must be an int, got {} {}",
            type_name(value),
            value.repr()?
        )));
    }
    let out_of_range = || {
        PyValueError::new_err(format!(
            "{name}={} is out of range: use {} to {}",
            value.repr().map(|r| r.to_string()).unwrap_or_default(),
            range.start(),
            range.end()
        ))
    };
    let n: u64 = value.extract().map_err(|_| out_of_range())?;
    if range.contains(&n) {
        Ok(n)
    } else {
        Err(out_of_range())
    }
}

/// A core validation message as a ValueError.
/// A choice given by name (`algorithm`, `unit`, `on_budget`): None when left out.
pub fn choice(what: &str, value: Option<&Bound<'_, PyAny>>) -> PyResult<Option<String>> {
    match given(value) {
        None => Ok(None),
        Some(value) => match value.cast::<PyString>() {
            Ok(text) => utf8(what, text).map(Some),
            Err(_) => Err(PyTypeError::new_err(format!(
                "{what} must be a str, got {}",
                type_name(value)
            ))),
        },
    }
}

pub fn invalid(message: String) -> PyErr {
    PyValueError::new_err(message)
}

/// A per-call cap, if given.
pub fn optional_capacity(name: &str, value: Option<&Bound<'_, PyAny>>) -> PyResult<Option<u64>> {
    given(value).map(|v| capacity(name, Some(v), 0)).transpose()
}

/// Slots per pool: 1 to `max`.
pub fn weight(value: Option<&Bound<'_, PyAny>>, max: u32) -> PyResult<u32> {
    let Some(weight) = given(value) else {
        return Ok(1);
    };
    if weight.is_instance_of::<PyBool>() || !weight.is_instance_of::<PyInt>() {
        return Err(PyTypeError::new_err(format!(
            "weight must be an int, got {}",
            weight.repr()?
        )));
    }
    match weight.extract::<i64>() {
        Ok(w) if (1..=i64::from(max)).contains(&w) => Ok(w as u32),
        _ => Err(PyValueError::new_err(format!(
            "weight={} is out of range: use 1 to {max} slots",
            weight.repr()?
        ))),
    }
}

/// A user id: a str that UTF-8 can encode (the core checks its length). Errors name its type
/// and what is wrong, never its value: a user id may be a token.
pub fn identity(value: Option<&Bound<'_, PyAny>>) -> PyResult<Option<String>> {
    let Some(user_id) = given(value) else {
        return Ok(None);
    };
    let Ok(text) = user_id.cast::<PyString>() else {
        return Err(PyTypeError::new_err(format!(
            "user_id must be a str, got {}: pass str(...) if your ids are numbers",
            type_name(user_id)
        )));
    };
    utf8("user_id", text).map(Some)
}

/// A str as UTF-8. A lone surrogate is a ValueError naming the argument and where, never the
/// value (a user id may be a token, a secret is a secret).
pub fn utf8(name: &str, text: &Bound<'_, PyString>) -> PyResult<String> {
    text.to_str().map(str::to_owned).map_err(|error| {
        // The UnicodeEncodeError knows where (`start`); its message would show the character.
        let at = error
            .value(text.py())
            .getattr("start")
            .and_then(|start| start.extract::<usize>())
            .ok();
        PyValueError::new_err(format!(
            "{name} is not valid text: it holds a lone surrogate{}, which UTF-8 cannot encode (bytes decoded with errors=\"surrogateescape\"?); decode it strictly, or pass a clean str",
            at.map(|i| format!(" at index {i}")).unwrap_or_default()
        ))
    })
}

/// Resources as `(name, capacity)` pairs (the core checks names and capacities).
pub fn resources(value: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<(String, u64, Option<u64>)>> {
    let Some(value) = given(value) else {
        return Ok(Vec::new());
    };
    value
        .try_iter()?
        .map(|resource| {
            let (name, capacity, max_waiting): (Bound<'_, PyString>, u64, Option<u64>) =
                resource?.extract()?;
            Ok((utf8("resource name", &name)?, capacity, max_waiting))
        })
        .collect()
}

/// `alert_at` (the manager's or a policy's): a sequence of fractions of a limit, ints or floats,
/// whose values the core's `Thresholds` checks.
pub fn thresholds(value: &Bound<'_, PyAny>) -> PyResult<Thresholds> {
    let sequence = match value.cast::<PySequence>() {
        Ok(sequence) if !value.is_instance_of::<PyString>() && !value.is_instance_of::<PyBytes>() => sequence,
        _ => {
            return Err(PyTypeError::new_err(format!(
                "alert_at must be a sequence of fractions such as (0.8, 1.0), got {}",
                value.repr()?
            )))
        }
    };
    let mut fractions = Vec::new();
    for item in sequence.try_iter()? {
        let item = item?;
        if item.is_instance_of::<PyBool>()
            || !(item.is_instance_of::<PyInt>() || item.is_instance_of::<PyFloat>())
        {
            return Err(PyTypeError::new_err(format!(
                "alert_at holds fractions of a limit such as 0.8, got {}",
                item.repr()?
            )));
        }
        // An int too large for a float is out of range, as infinity is.
        fractions.push(item.extract::<f64>().unwrap_or(f64::INFINITY));
    }
    Thresholds::new(&fractions).map_err(invalid)
}
