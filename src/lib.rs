//! fastapi_stream_lease's core: distributed, self-expiring concurrency leases.
//! This file is the table of contents; each module holds one concept.

mod backend;
mod breaker;
mod bridge;
mod config;
mod errors;
mod held;
mod keys;
mod lease;
mod manager;
mod renewal;
mod runtime;
mod scripts;
mod waiting;

use pyo3::prelude::*;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<config::LeaseConfig>()?;
    m.add_class::<lease::Lease>()?;
    m.add_class::<manager::Manager>()?;
    m.add_class::<bridge::LoopBridge>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
