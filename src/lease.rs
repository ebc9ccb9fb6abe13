//! A held lease: its record (shared with the renewal loop) and the Python `Lease` handle, which
//! releases the lease when it is dropped without an explicit release.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use crate::manager::ManagerShared;

const HELD: u8 = 0;
const LOST: u8 = 1;
const RELEASED: u8 = 2;

/// What the backends store and the renewal loop renews.
#[derive(Debug)]
pub struct LeaseRecord {
    pub id: String,
    /// The keys of the pools this lease takes a slot in.
    pub pool_keys: Vec<String>,
    pub weight: u32,
    state: AtomicU8,
}

impl LeaseRecord {
    pub fn new(pool_keys: Vec<String>, weight: u32) -> Self {
        LeaseRecord {
            id: uuid::Uuid::new_v4().simple().to_string(),
            pool_keys,
            weight,
            state: AtomicU8::new(HELD),
        }
    }

    /// Held -> lost; false if it was released (or already lost) meanwhile.
    pub fn mark_lost(&self) -> bool {
        self.state
            .compare_exchange(HELD, LOST, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Held or lost -> released; true only for the one call that made the change.
    pub fn mark_released(&self) -> bool {
        self.state.swap(RELEASED, Ordering::AcqRel) != RELEASED
    }

    pub fn is_lost(&self) -> bool {
        self.state.load(Ordering::Acquire) == LOST
    }

    pub fn is_released(&self) -> bool {
        self.state.load(Ordering::Acquire) == RELEASED
    }
}

/// A slot held in every pool of one acquire, renewed by the manager until released.
#[pyclass(frozen, module = "fastapi_stream_lease")]
pub struct Lease {
    record: Arc<LeaseRecord>,
    manager: Arc<ManagerShared>,
}

impl Lease {
    pub fn new(record: Arc<LeaseRecord>, manager: Arc<ManagerShared>) -> Self {
        Lease { record, manager }
    }
}

#[pymethods]
impl Lease {
    /// Random id of this lease (the member stored in each pool).
    #[getter]
    fn lease_id(&self) -> &str {
        &self.record.id
    }

    /// Slots this lease takes in each pool.
    #[getter]
    fn weight(&self) -> u32 {
        self.record.weight
    }

    /// True once renewal found the lease gone from the store (expired during an outage, evicted).
    #[getter]
    fn lost(&self) -> bool {
        self.record.is_lost()
    }

    /// True once `release()` ran (or the manager was closed).
    #[getter]
    fn released(&self) -> bool {
        self.record.is_released()
    }

    /// Releases the lease now and returns an awaitable that resolves when the store confirms
    /// (True if it was still there). Safe to call twice; cancelling the await does not stop it.
    fn release<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.manager.release_awaitable(py, &self.record)
    }

    /// Starts the release without waiting for it; True if this call released the lease.
    fn release_nowait(&self) -> bool {
        self.manager.release_in_background(&self.record)
    }

    /// Wraps a stream (async or sync iterable) in an async generator that releases this lease
    /// when the stream ends, raises, is cancelled or is closed (client disconnect).
    fn wrap<'py>(slf: &Bound<'py, Self>, stream: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        static WRAP_STREAM: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
        WRAP_STREAM
            .import(slf.py(), "fastapi_stream_lease._wrap", "wrap_stream")?
            .call1((slf, stream))
    }

    fn __repr__(&self) -> String {
        let state = if self.record.is_released() {
            "released"
        } else if self.record.is_lost() {
            "lost"
        } else {
            "held"
        };
        format!("<Lease {} weight={} {state}>", self.record.id, self.record.weight)
    }
}

impl Drop for Lease {
    /// A lease dropped while held (never released, garbage collected) frees its slot.
    fn drop(&mut self) {
        self.manager.release_in_background(&self.record);
    }
}
