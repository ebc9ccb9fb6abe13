//! Rust futures to asyncio futures, without a Rust thread ever attaching to the interpreter.
//!
//! Each event loop gets a `LoopBridge`: a queue of finished results and a socketpair whose read
//! end the loop watches with `add_reader`. A tokio task pushes its result and writes one byte (only
//! if no wake-up is pending); the loop thread then drains the queue and settles many futures per
//! wake-up. Panics settle the future with an error. A result nobody can receive is dropped, and
//! what it owns (a granted lease) releases itself: its future was cancelled, or dropped (futures
//! are held weakly, so an abandoned one does not keep its loop alive), or its loop closed and went
//! away (the loop's weakref callback closes the inbox).

use std::collections::HashMap;
use std::future::Future;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use futures_util::FutureExt;
use pyo3::exceptions::PyRuntimeError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyWeakrefMethods, PyWeakrefReference};
use tokio::task::AbortHandle;

use crate::errors::CoreError;
use crate::runtime;
use crate::sync::lock;

/// Turns a finished result into a Python object on the loop thread.
pub type Delivery = Box<dyn FnOnce(Python<'_>) -> PyResult<Py<PyAny>> + Send>;
pub type Completion = Result<Delivery, CoreError>;

/// Futures forgotten (their lease released before it was lost) before the loop is woken just to
/// drop its hold on them.
const FORGOTTEN_BEFORE_A_WAKE_UP: usize = 64;

/// The half of a bridge that tokio tasks touch: plain Rust data only.
struct Inbox {
    /// Results for the loop's futures by id; None forgets a future nothing will settle.
    finished: Mutex<Vec<(u64, Option<Completion>)>>,
    wake_pending: AtomicBool,
    waker: UnixStream,
    /// The loop closed or went away: results are dropped on arrival (a grant releases itself).
    closed: AtomicBool,
}

impl Inbox {
    fn deliver(&self, id: u64, completion: Completion) {
        let mut finished = lock(&self.finished);
        if self.closed.load(Ordering::Acquire) {
            drop(finished);
            drop(completion);
            return;
        }
        finished.push((id, Some(completion)));
        self.wake(&finished);
    }

    /// Lets the loop drop its hold on a future nothing will settle, at its next wake-up: no
    /// need to wake it for that, unless forgotten futures pile up (a loop that nothing else
    /// wakes, the embedded store's, would keep them all).
    fn forget(&self, id: u64) {
        let mut finished = lock(&self.finished);
        if self.closed.load(Ordering::Acquire) {
            return;
        }
        finished.push((id, None));
        if finished.len() >= FORGOTTEN_BEFORE_A_WAKE_UP {
            self.wake(&finished);
        }
    }

    /// Wakes the loop unless a wake-up is pending. Takes the guard of `finished` to be written
    /// under the lock that `close` takes, so never after the loop's end is gone (no SIGPIPE).
    fn wake(&self, _finished: &MutexGuard<'_, Vec<(u64, Option<Completion>)>>) {
        if !self.wake_pending.swap(true, Ordering::AcqRel) {
            // WouldBlock means the socket already holds unread bytes: the loop will wake anyway.
            let _ = (&self.waker).write(&[1]);
        }
    }

    /// Drops what waits for a loop that will not run again, and what comes later.
    fn close(&self) {
        let stranded = {
            let mut finished = lock(&self.finished);
            self.closed.store(true, Ordering::Release);
            std::mem::take(&mut *finished)
        };
        drop(stranded); // outside the lock: grants release themselves
    }
}

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
    inbox: Arc<Inbox>,
    wakeup: UnixStream,
    /// The futures waiting for a result, held weakly.
    pending: Mutex<HashMap<u64, Py<PyWeakrefReference>>>,
    next_id: AtomicU64,
}

#[pymethods]
impl LoopBridge {
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
            let future = lock(&self.pending).remove(&id);
            if let (Some(future), Some(completion)) = (future, completion) {
                if let Some(future) = future.bind(py).upgrade() {
                    settle(&future, completion);
                }
            }
        }
    }
}

/// Settles `future` unless it was cancelled; a dropped completion cleans up after itself.
fn settle(future: &Bound<'_, PyAny>, completion: Completion) {
    let py = future.py();
    let done = future
        .call_method0(intern!(py, "done"))
        .and_then(|d| d.is_truthy())
        .unwrap_or(true);
    if done {
        return;
    }
    let outcome = match completion.map_err(PyErr::from).and_then(|deliver| deliver(py)) {
        Ok(value) => future.call_method1(intern!(py, "set_result"), (value,)),
        Err(error) => future.call_method1(intern!(py, "set_exception"), (error.into_value(py),)),
    };
    if let Err(err) = outcome {
        err.write_unraisable(py, Some(future));
    }
}

/// Cancels the Rust task behind an abortable future when the Python future is cancelled (its
/// settler, dropped with the task, has the loop forget the future).
#[pyclass(frozen)]
struct AbortOnCancel {
    task: AbortHandle,
}

#[pymethods]
impl AbortOnCancel {
    fn __call__(&self, py: Python<'_>, future: &Bound<'_, PyAny>) -> PyResult<()> {
        if future.call_method0(intern!(py, "cancelled"))?.is_truthy()? {
            self.task.abort();
        }
        Ok(())
    }
}

/// One bridge per live event loop; entries of dead or closed loops are pruned as loops come.
static BRIDGES: Mutex<Vec<(Py<PyWeakrefReference>, Py<LoopBridge>)>> = Mutex::new(Vec::new());

fn running_loop(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
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

fn bridge_for<'py>(event_loop: &Bound<'py, PyAny>) -> PyResult<Py<LoopBridge>> {
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
    let inbox = Arc::new(Inbox {
        finished: Mutex::new(Vec::new()),
        wake_pending: AtomicBool::new(false),
        waker,
        closed: AtomicBool::new(false),
    });
    let bridge = Py::new(
        py,
        LoopBridge {
            inbox: Arc::clone(&inbox),
            wakeup,
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
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

/// Settles an asyncio future from any thread: with a task's result (`spawn`), or on an event with
/// no task behind it (a lease lost). Dropped unused (its task aborted, its lease released
/// first), it has the loop forget the future.
pub struct Settler {
    inbox: Arc<Inbox>,
    id: u64,
    used: bool,
}

impl Settler {
    pub fn settle(mut self, completion: Completion) {
        self.used = true;
        self.inbox.deliver(self.id, completion);
    }
}

impl Drop for Settler {
    fn drop(&mut self) {
        if !self.used {
            self.inbox.forget(self.id);
        }
    }
}

/// An asyncio future of the running loop and what settles it.
pub fn promise(py: Python<'_>) -> PyResult<(Bound<'_, PyAny>, Settler)> {
    let event_loop = running_loop(py)?;
    let bridge = bridge_for(&event_loop)?;
    let future = event_loop.call_method0(intern!(py, "create_future"))?;
    let shared = bridge.get();
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    lock(&shared.pending).insert(id, PyWeakrefReference::new(&future)?.unbind());
    let inbox = Arc::clone(&shared.inbox);
    Ok((
        future,
        Settler {
            inbox,
            id,
            used: false,
        },
    ))
}

/// Runs `op` on the core's runtime and returns an asyncio future for its result.
/// An `abortable` op is cancelled with its Python future; the others run to their end, even
/// when no future can be made for them (outside a running loop): an acquire must finish so it
/// can give back what it took, and a release once started must reach the store.
pub fn spawn<'py, F>(py: Python<'py>, op: F, abortable: bool) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = Completion> + Send + 'static,
{
    let (future, settler) = match promise(py) {
        Ok(made) => made,
        Err(error) => {
            if !abortable {
                runtime::handle().spawn(op);
            }
            return Err(error);
        }
    };
    let task = runtime::handle().spawn(AssertUnwindSafe(op).catch_unwind().map(move |outcome| {
        settler.settle(outcome.unwrap_or_else(|panic| Err(CoreError::Panic(panic_message(panic.as_ref())))));
    }));
    if abortable {
        let on_cancel = AbortOnCancel {
            task: task.abort_handle(),
        };
        future.call_method1(intern!(py, "add_done_callback"), (on_cancel,))?;
    }
    Ok(future)
}

/// The op that settles with `deliver(value)` once `result` resolves.
///
/// A combinator, not an `async move { result.await }` block: such a block stores the future it
/// captured twice (the captured copy stays beside the one being polled), so every wrapping layer
/// doubled the task; an acquire's had grown to 40 KB, memory that 64 acquires in flight kept.
pub fn delivering<T>(
    result: impl Future<Output = Result<T, CoreError>> + Send + 'static,
    deliver: impl FnOnce(T) -> Delivery + Send + 'static,
) -> impl Future<Output = Completion> + Send + 'static {
    result.map(|outcome| outcome.map(deliver))
}

/// Runs `op` and hands its result to Python as an awaitable. Work on the embedded store never
/// waits, so it finishes right here instead of taking a trip through the runtime.
pub fn submit<'py, F>(py: Python<'py>, op: F, embedded: bool, abortable: bool) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = Completion> + Send + 'static,
{
    if embedded {
        ready(py, op.now_or_never().expect("the embedded store never waits"))
    } else {
        spawn(py, op, abortable)
    }
}

/// An asyncio future already settled with `completion` (for work that never waits).
pub fn ready(py: Python<'_>, completion: Completion) -> PyResult<Bound<'_, PyAny>> {
    let future = running_loop(py)?.call_method0(intern!(py, "create_future"))?;
    settle(&future, completion);
    Ok(future)
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inbox() -> (Inbox, UnixStream) {
        let (waker, wakeup) = UnixStream::pair().unwrap();
        waker.set_nonblocking(true).unwrap();
        wakeup.set_nonblocking(true).unwrap();
        let inbox = Inbox {
            finished: Mutex::new(Vec::new()),
            wake_pending: AtomicBool::new(false),
            waker,
            closed: AtomicBool::new(false),
        };
        (inbox, wakeup)
    }

    fn woken(wakeup: &UnixStream) -> bool {
        (&*wakeup).read(&mut [0u8; 8]).is_ok()
    }

    #[test]
    fn forgotten_futures_wake_the_loop_only_when_they_pile_up() {
        let (inbox, wakeup) = inbox();
        for id in 1..FORGOTTEN_BEFORE_A_WAKE_UP as u64 {
            inbox.forget(id);
        }
        assert!(!woken(&wakeup), "a forgotten future alone does not wake the loop");
        inbox.forget(0);
        assert!(
            woken(&wakeup),
            "a pile of them does, so a loop nothing else wakes drops them"
        );
        assert_eq!(lock(&inbox.finished).len(), FORGOTTEN_BEFORE_A_WAKE_UP);
    }

    #[test]
    fn a_closed_inbox_keeps_nothing() {
        let (inbox, wakeup) = inbox();
        inbox.close();
        inbox.forget(1);
        inbox.deliver(2, Err(CoreError::Panic("unused".into())));
        assert!(lock(&inbox.finished).is_empty());
        assert!(!woken(&wakeup));
    }
}
