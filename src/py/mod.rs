//! The Python binding: the only code that touches PyO3. It checks arguments, calls the core and
//! turns what the core returns into Python objects and awaitables.

mod args;
mod bridge;
mod budget;
mod client_address;
mod config;
mod errors;
mod lease;
mod manager;
mod rate;

use pyo3::prelude::*;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<config::LeaseConfig>()?;
    m.add_class::<lease::LeaseHandle>()?;
    m.add_class::<manager::Manager>()?;
    m.add_class::<rate::RateLimit>()?;
    m.add_class::<client_address::ProxyRule>()?;
    m.add_function(wrap_pyfunction!(rate::check_rate_limits, m)?)?;
    m.add_function(wrap_pyfunction!(redact_url, m)?)?;
    m.add_class::<bridge::LoopBridge>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("TOP_UP_INCREMENT", crate::budget::TOP_UP)?;
    Ok(())
}

/// A store URL with its credentials hidden (`redis://:***@host:6379/0`), for what operators see.
#[pyfunction]
fn redact_url(url: &str) -> String {
    crate::backend::redact(url)
}
