//! The IETF rate-limit headers of a request's decisions and streams, for the HTTP forms: the
//! values for `rate_limit_headers()`, and the fields a response's start gets added.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use super::rate_decision::RateDecision;
use crate::rate::{rate_limit_headers, PoolState};

/// The `RateLimit-Policy` and `RateLimit` header values of `decisions` (`RateDecision` values)
/// and of a stream's capped `pools` (name, capacity, slots in use); None when both are empty.
#[pyfunction]
pub fn rate_limit_header_values(
    decisions: &Bound<'_, PyAny>,
    pools: &Bound<'_, PyAny>,
) -> PyResult<Option<(String, String)>> {
    let policies = decisions
        .try_iter()?
        .map(|decision| Ok(decision?.cast::<RateDecision>()?.get().header_state()))
        .collect::<PyResult<Vec<_>>>()?;
    let pools = pools
        .try_iter()?
        .map(|pool| {
            let (name, capacity, used) = pool?.extract()?;
            Ok(PoolState { name, capacity, used })
        })
        .collect::<PyResult<Vec<_>>>()?;
    Ok(rate_limit_headers(&policies, &pools))
}

/// The `ratelimit-policy` and `ratelimit` fields of `decisions` and `pools` as an ASGI
/// response start lists its headers (lowercase names, Latin-1 bytes), less those the start's
/// own `headers` name already: what a response's start gets added.
#[pyfunction]
pub fn rate_limit_header_fields<'py>(
    decisions: &Bound<'py, PyAny>,
    pools: &Bound<'py, PyAny>,
    headers: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyList>> {
    let py = decisions.py();
    let fields = PyList::empty(py);
    let Some((policy, state)) = rate_limit_header_values(decisions, pools)? else {
        return Ok(fields);
    };
    let (mut has_policy, mut has_state) = (false, false);
    for field in headers.try_iter()? {
        let name = field?.get_item(0)?;
        if let Ok(name) = name.cast::<PyBytes>() {
            let name = name.as_bytes();
            has_policy |= name.eq_ignore_ascii_case(b"ratelimit-policy");
            has_state |= name.eq_ignore_ascii_case(b"ratelimit");
        }
    }
    for (present, name, value) in [
        (has_policy, "ratelimit-policy", policy),
        (has_state, "ratelimit", state),
    ] {
        if !present {
            let value = PyBytes::new(py, value.as_bytes());
            fields.append((PyBytes::new(py, name.as_bytes()), value))?;
        }
    }
    Ok(fields)
}
