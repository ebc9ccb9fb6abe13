//! A held lease: its record (shared with the renewal loop) and the Python `Lease` handle, which
//! releases the lease when it is dropped without an explicit release.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use tokio::sync::Notify;

use crate::bridge;
use crate::keys::{self, Pool, PER_USER};
use crate::manager::ManagerShared;

/// State bits: a lease can be lost and later released; both stay visible.
const LOST: u8 = 1;
const RELEASED: u8 = 2;

/// Milliseconds on this process's monotonic clock (deadlines never follow wall-clock jumps).
pub fn monotonic_ms() -> u64 {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    ORIGIN.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// What the backends store and the renewal loop renews.
#[derive(Debug)]
pub struct LeaseRecord {
    pub id: String,
    /// The pools this lease takes a slot in (keys and capacities, to take it back if lost).
    pub pools: Vec<Pool>,
    /// The holders key of the pools' hash tag (they all share one).
    pub holders: String,
    /// How many of the first pools are the holder's own quota (refuse at once, never wait).
    pub own_pools: usize,
    pub weight: u32,
    /// Admitted by this process's local floor while Redis was down (`failure_mode="open"`).
    pub local: bool,
    state: AtomicU8,
    /// Woken when the lease becomes lost or released.
    changed: Notify,
}

impl LeaseRecord {
    pub fn new(pools: Vec<Pool>, weight: u32) -> Self {
        Self::build(pools, weight, false)
    }

    pub fn local(pools: Vec<Pool>, weight: u32) -> Self {
        Self::build(pools, weight, true)
    }

    fn build(pools: Vec<Pool>, weight: u32, local: bool) -> Self {
        LeaseRecord {
            id: uuid::Uuid::new_v4().simple().to_string(),
            holders: keys::holders_key(pools.first().map_or("", |pool| pool.key.as_str())),
            own_pools: usize::from(pools.first().is_some_and(|p| &*p.name == PER_USER)),
            pools,
            weight,
            local,
            state: AtomicU8::new(0),
            changed: Notify::new(),
        }
    }

    /// The members this lease has in the store: `weight` in each of its pools.
    pub fn units(&self) -> u64 {
        u64::from(self.weight) * self.pools.len() as u64
    }

    /// The `{hash tag}` all this lease's keys share (its Redis Cluster slot).
    pub fn hash_tag(&self) -> &str {
        keys::hash_tag(&self.holders)
    }

    /// Held -> lost; false if it was released (or already lost) meanwhile.
    pub fn mark_lost(&self) -> bool {
        let lost = self
            .state
            .compare_exchange(0, LOST, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if lost {
            self.changed.notify_waiters();
        }
        lost
    }

    /// Held or lost -> released; true only for the one call that made the change.
    pub fn mark_released(&self) -> bool {
        let released = self.state.fetch_or(RELEASED, Ordering::AcqRel) & RELEASED == 0;
        if released {
            self.changed.notify_waiters();
        }
        released
    }

    pub fn is_lost(&self) -> bool {
        self.state.load(Ordering::Acquire) & LOST != 0
    }

    pub fn is_released(&self) -> bool {
        self.state.load(Ordering::Acquire) & RELEASED != 0
    }

    /// Resolves once the lease is lost; never if it is released first.
    pub async fn lost(&self) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.is_lost() {
                return;
            }
            if self.is_released() {
                std::future::pending::<()>().await;
            }
            changed.await;
        }
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

    /// Whether a lost lease ends its stream (`LeaseConfig(on_lost="cancel")`).
    #[getter]
    fn _cancel_on_lost(&self) -> bool {
        self.manager.config.cancel_on_lost()
    }

    /// An awaitable that resolves when the lease is lost (never, if it is released first).
    /// Cancelling it stops the wait.
    fn _wait_lost<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let record = Arc::clone(&self.record);
        let wait = async move {
            record.lost().await;
            Ok(Box::new(|py: Python<'_>| Ok(py.None())) as bridge::Delivery)
        };
        bridge::spawn(py, wait, true)
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
        let state = match (self.record.is_lost(), self.record.is_released()) {
            (true, true) => "lost, released",
            (true, false) => "lost",
            (false, true) => "released",
            (false, false) => "held",
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
