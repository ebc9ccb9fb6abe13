//! One bridge per live event loop: the loop watches the read end of a socketpair with
//! `add_reader` and, when woken, drains its inbox and resolves many futures per wake-up. Bridges
//! of dead or closed loops are pruned as loops come; a loop that is garbage collected closes
//! its inbox.

use std::collections::HashMap;
use std::future::Future;
use std::io::{ErrorKind, Read};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use pyo3::exceptions::PyRuntimeError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyWeakrefMethods, PyWeakrefReference};

use super::inbox::{Inbox, NOTICE};
use super::Completion;
use crate::runtime;
use crate::sync::lock;

/// A call's task, handed to the core's runtime when its loop's turn ends.
pub(super) type Call = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Closes a bridge's inbox when its event loop is garbage collected.
#[pyclass(frozen)]
struct LoopGone {
    inbox: Arc<Inbox>,
}

#[pymethods]
impl LoopGone {
    fn __call__(&self, _loop_ref: &Bound<'_, PyAny>) {
        self.inbox.close();
    }
}

#[pyclass(frozen, module = "fastapi_stream_lease._core")]
pub struct LoopBridge {
    pub(super) inbox: Arc<Inbox>,
    wakeup: UnixStream,
    /// The futures waiting for a result, held weakly.
    pub(super) pending: Mutex<HashMap<u64, Py<PyWeakrefReference>>>,
    pub(super) next_id: AtomicU64,
    /// The calls made in the loop's current turn, sent when it ends.
    calls: Mutex<Vec<Call>>,
}

#[pymethods]
impl LoopBridge {
    /// Hands the turn's calls to the core's runtime (the loop runs it when the turn ends): one
    /// wake-up of the core's thread for all of them.
    fn _send_calls(&self) {
        let calls = std::mem::take(&mut *lock(&self.calls));
        let runtime = runtime::handle();
        for call in calls {
            runtime.spawn(call);
        }
    }

    /// Called by the event loop when the wake-up socket is readable.
    fn _drain(&self, py: Python<'_>) {
        let mut sink = [0u8; 512];
        loop {
            match (&self.wakeup).read(&mut sink) {
                Ok(n) if n == sink.len() => continue,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                _ => break,
            }
        }
        // Cleared before taking the queue, so a result pushed after the take writes a new byte.
        self.inbox.wake_pending.store(false, Ordering::Release);
        let finished = std::mem::take(&mut *lock(&self.inbox.finished));
        for (id, completion) in finished {
            if id == NOTICE {
                if let Some(Ok(notice)) = completion {
                    if let Err(error) = notice(py) {
                        error.write_unraisable(py, None);
                    }
                }
                continue;
            }
            let future = lock(&self.pending).remove(&id);
            if let (Some(future), Some(completion)) = (future, completion) {
                if let Some(future) = future.bind(py).upgrade() {
                    resolve(&future, completion);
                }
            }
        }
    }
}

impl LoopBridge {
    /// Queues `call` for the end of the turn of `event_loop` (the bridge's); on a loop that
    /// takes no more callbacks (closed), sends it at once.
    pub(super) fn send_at_turn_end(
        bridge: &Bound<'_, LoopBridge>,
        event_loop: &Bound<'_, PyAny>,
        call: Call,
    ) -> PyResult<()> {
        let first = {
            let mut calls = lock(&bridge.get().calls);
            calls.push(call);
            calls.len() == 1
        };
        if first {
            let py = bridge.py();
            let send = bridge.getattr(intern!(py, "_send_calls"))?;
            if event_loop
                .call_method1(intern!(py, "call_soon"), (send,))
                .is_err()
            {
                bridge.get()._send_calls();
            }
        }
        Ok(())
    }
}

/// Resolves `future` unless it was cancelled; a dropped completion cleans up after itself.
pub(super) fn resolve(future: &Bound<'_, PyAny>, completion: Completion) {
    let py = future.py();
    let done = future
        .call_method0(intern!(py, "done"))
        .and_then(|d| d.is_truthy())
        .unwrap_or(true);
    if done {
        return;
    }
    let outcome = match super::delivered(py, completion) {
        Ok(value) => future.call_method1(intern!(py, "set_result"), (value,)),
        Err(error) => future.call_method1(intern!(py, "set_exception"), (error.into_value(py),)),
    };
    if let Err(err) = outcome {
        err.write_unraisable(py, Some(future));
    }
}

/// One bridge per live event loop; entries of dead or closed loops are pruned as loops come.
static BRIDGES: Mutex<Vec<(Py<PyWeakrefReference>, Py<LoopBridge>)>> = Mutex::new(Vec::new());

pub(super) fn running_loop(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    static GET_RUNNING_LOOP: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    GET_RUNNING_LOOP
        .import(py, "asyncio", "get_running_loop")?
        .call0()
        .map_err(|_| {
            PyRuntimeError::new_err(
                "fastapi_stream_lease calls must be awaited inside a running asyncio event loop",
            )
        })
}

pub(super) fn bridge_for<'py>(event_loop: &Bound<'py, PyAny>) -> PyResult<Py<LoopBridge>> {
    let py = event_loop.py();
    {
        let bridges = lock(&BRIDGES);
        for (loop_ref, bridge) in bridges.iter() {
            if loop_ref.bind(py).upgrade().is_some_and(|l| l.is(event_loop)) {
                return Ok(bridge.clone_ref(py));
            }
        }
    }
    let (waker, wakeup) = UnixStream::pair()?;
    waker.set_nonblocking(true)?;
    wakeup.set_nonblocking(true)?;
    let fd = wakeup.as_raw_fd();
    let inbox = Arc::new(Inbox::new(waker));
    let bridge = Py::new(
        py,
        LoopBridge {
            inbox: Arc::clone(&inbox),
            wakeup,
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            calls: Mutex::new(Vec::new()),
        },
    )?;
    event_loop.call_method1(
        intern!(py, "add_reader"),
        (fd, bridge.bind(py).getattr(intern!(py, "_drain"))?),
    )?;

    // Prune bridges of dead or closed loops. `is_closed()` runs Python code (other threads may
    // register their loops meanwhile), so decide outside the lock and remove only those.
    let known: Vec<Py<PyWeakrefReference>> = lock(&BRIDGES).iter().map(|(r, _)| r.clone_ref(py)).collect();
    let mut finished = Vec::new();
    for loop_ref in known {
        let done = match loop_ref.bind(py).upgrade() {
            Some(l) => l.call_method0(intern!(py, "is_closed"))?.is_truthy()?,
            None => true,
        };
        if done {
            finished.push(loop_ref);
        }
    }
    let loop_ref = PyWeakrefReference::new_with(event_loop, LoopGone { inbox })?.unbind();
    let removed: Vec<_> = {
        let mut bridges = lock(&BRIDGES);
        let (gone, kept) = std::mem::take(&mut *bridges)
            .into_iter()
            .partition(|(r, _)| finished.iter().any(|f| f.is(r)));
        *bridges = kept;
        bridges.push((loop_ref, bridge.clone_ref(py)));
        gone
    };
    for (_, bridge) in &removed {
        bridge.get().inbox.close();
    }
    drop(removed); // outside the lock: dropping a bridge may run Python code
    Ok(bridge)
}
