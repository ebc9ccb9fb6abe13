//! fastapi_stream_lease's core: distributed, self-expiring concurrency leases.
//! This file is the table of contents; each module holds one concept, and each `use crate::`
//! points down this list (`layering.rs` checks it; `docs/design.md` walks through them).

// The binding, the only code that touches Python.
mod py;

// The manager: admits leases, counts pools, revokes, drains and closes.
mod manager;

// The leases this process holds: kept alive, found lost, released.
mod renewal;

// The token budgets of streams: reserved, topped up, settled.
mod budget;

// Where pools live (Redis, the embedded store), and what a lease is there.
mod backend;
mod lease;

// Tools the stores share: the circuit breaker, deadlines, batched calls.
mod breaker;
mod deadline;
mod group_commit;

// What a call answers when it fails, naming the pools and policies it met.
mod errors;

// How the keys are laid out.
mod keys;

// The settings.
mod config;

// Who the client of a connection is, behind reverse proxies (limits per address).
mod client_address;

// Plain values and tools every module above may use.
mod fifo;
mod rate;
mod runtime;
mod sync;

#[cfg(test)]
mod file_lengths;
#[cfg(test)]
mod layering;

use pyo3::prelude::*;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    py::register(m)
}
