//! fastapi_stream_lease's core: distributed, self-expiring concurrency leases.
//! This file is the table of contents; each module holds one concept, and each `use crate::`
//! points down this list (`docs/design.md` walks through them).

// The binding, the only code that touches Python.
mod py;

// Admitting leases, the leases this process holds, and the token budgets of their streams.
mod admission;
mod budget;
mod renewal;

// Where pools live, and what a lease is there.
mod backend;
mod lease;

// How the keys are laid out.
mod keys;

// Who the client of a connection is, behind reverse proxies (limits per address).
mod client_address;

// Values and tools shared by all of the above.
mod breaker;
mod config;
mod deadline;
mod errors;
mod fifo;
mod group_commit;
mod rate;
mod runtime;
mod sync;

use pyo3::prelude::*;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    py::register(m)
}
