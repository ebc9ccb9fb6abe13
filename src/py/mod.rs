//! The Python binding: the only code that touches PyO3. It checks arguments, calls the core and
//! turns what the core returns into Python objects and awaitables.

mod acquire_args;
mod args;
mod bridge;
mod budget;
mod client_address;
mod config;
mod errors;
mod lease;
mod manager;
mod prices;
mod rate;
mod rate_decision;
mod rate_headers;
mod script_calls;
mod scripts;
mod settle_call;

use pyo3::prelude::*;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<acquire_args::AcquireArgs>()?;
    m.add_class::<config::LeaseConfig>()?;
    m.add_class::<lease::LeaseHandle>()?;
    m.add_class::<manager::Manager>()?;
    m.add_class::<rate::RateLimit>()?;
    m.add_class::<rate_decision::RateDecision>()?;
    m.add_class::<prices::Prices>()?;
    m.add_class::<client_address::ProxyRule>()?;
    m.add_function(wrap_pyfunction!(rate::check_rate_limits, m)?)?;
    m.add_function(wrap_pyfunction!(rate::checked_thresholds, m)?)?;
    m.add_function(wrap_pyfunction!(rate_headers::rate_limit_header_fields, m)?)?;
    m.add_function(wrap_pyfunction!(rate_headers::rate_limit_header_values, m)?)?;
    m.add_function(wrap_pyfunction!(redact_url, m)?)?;
    m.add_function(wrap_pyfunction!(sentinel_url, m)?)?;
    m.add_function(wrap_pyfunction!(monotonic, m)?)?;
    m.add_function(wrap_pyfunction!(script_calls::acquire_call, m)?)?;
    m.add_function(wrap_pyfunction!(script_calls::release_call, m)?)?;
    m.add_function(wrap_pyfunction!(scripts::source, m)?)?;
    m.add_function(wrap_pyfunction!(settle_call::settle_call, m)?)?;
    m.add_class::<bridge::LoopBridge>()?;
    m.add("__version__", python_version(env!("CARGO_PKG_VERSION")))?;
    m.add("TOP_UP_INCREMENT", crate::budget::TOP_UP)?;
    Ok(())
}

/// A store URL with its credentials hidden (`redis://:***@host:6379/0`), for what operators see.
#[pyfunction]
fn redact_url(url: &str) -> String {
    crate::backend::redact(url)
}

/// The parts of a `redis+sentinel://` URL as the manager reads them (its credentials
/// percent-decoded): `(sentinels, master, db, user, password, sentinel_user,
/// sentinel_password)`, for the command line's redis-py client.
#[pyfunction]
#[allow(clippy::type_complexity)]
fn sentinel_url(
    url: &str,
) -> PyResult<(
    Vec<(String, u16)>,
    String,
    i64,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
)> {
    let parsed = crate::backend::parse_sentinel(url)?;
    Ok((
        parsed.sentinels,
        parsed.master,
        parsed.db,
        parsed.user,
        parsed.password,
        parsed.sentinel_user,
        parsed.sentinel_password,
    ))
}

/// Seconds on the core's monotonic clock, whose origin is its own: deadlines the core gives
/// (`LeaseHandle.deadline`) are on it.
#[pyfunction]
fn monotonic() -> f64 {
    crate::lease::monotonic_seconds()
}

/// The version as Python spells it (PEP 440), as maturin gives it to the distribution: Cargo's
/// `1.0.0-alpha.1` is `1.0.0a1`, so `__version__` and the installed metadata agree.
fn python_version(cargo: &str) -> String {
    let Some((release, pre)) = cargo.split_once('-') else {
        return cargo.to_owned();
    };
    let (kind, number) = pre.split_once('.').unwrap_or((pre, "0"));
    let kind = match kind {
        "alpha" => "a",
        "beta" => "b",
        other => other,
    };
    format!("{release}{kind}{number}")
}

#[cfg(test)]
mod tests {
    use super::python_version;

    #[test]
    fn cargo_pre_releases_read_as_pep_440() {
        assert_eq!(python_version("1.0.0-alpha.1"), "1.0.0a1");
        assert_eq!(python_version("1.0.0-beta.2"), "1.0.0b2");
        assert_eq!(python_version("1.0.0-rc.1"), "1.0.0rc1");
        assert_eq!(python_version("1.0.0"), "1.0.0");
    }
}
