//! Rust futures to asyncio futures, without a Rust thread ever attaching to the interpreter.
//!
//! Each event loop gets a `LoopBridge` (`loops.rs`): a queue of finished results (`inbox.rs`)
//! and a socketpair whose read end the loop watches with `add_reader`. A tokio task pushes its
//! result and writes one byte (only if no wake-up is pending); the loop thread then drains the
//! queue and resolves many futures per wake-up. Panics resolve the future with an error. A
//! result nobody can receive is dropped, and what it owns (a granted lease) releases itself: its
//! future was cancelled, or dropped (futures are held weakly, so an abandoned one does not keep
//! its loop alive), or its loop closed and went away (the loop's weakref callback closes the
//! inbox).
//!
//! The other way, a call is not handed to the runtime at once: the loop's calls of one turn go
//! together when the turn ends (`LoopBridge::send_at_turn_end`), so the core's thread, asleep
//! between bursts, is woken once for them rather than once per call, and their Redis calls share
//! batches. Only a call that may wait long (an acquire that waits in line) is aborted with its
//! future, which takes a done callback per call; one round trip runs to its end. A release goes
//! at once, so that no closing loop can keep it from the store (`Sending`).
//!
//! Work that never waits (the embedded store's, a hit served from units held here) is not sent
//! at all: its outcome goes back in an awaitable already resolved (`ready.rs`).

mod inbox;
mod loops;
mod ready;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures_util::future::{AbortHandle, Abortable};
use futures_util::FutureExt;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyWeakrefReference;

use self::inbox::{Inbox, NOTICE};
pub use self::loops::LoopBridge;
use self::loops::{bridge_for, resolve, running_loop, Call};
use self::ready::Ready;
use crate::errors::CoreError;
use crate::runtime;
use crate::sync::lock;

/// Turns a finished result into a Python object on the loop thread.
pub type Delivery = Box<dyn FnOnce(Python<'_>) -> PyResult<Py<PyAny>> + Send>;
pub type Completion = Result<Delivery, CoreError>;

/// Cancels the Rust task behind an abortable future when the Python future is cancelled (its
/// resolver, dropped with the task, has the loop forget the future).
#[pyclass(frozen)]
struct AbortOnCancel {
    call: AbortHandle,
}

#[pymethods]
impl AbortOnCancel {
    fn __call__(&self, py: Python<'_>, future: &Bound<'_, PyAny>) -> PyResult<()> {
        if future.call_method0(intern!(py, "cancelled"))?.is_truthy()? {
            self.call.abort();
        }
        Ok(())
    }
}

/// Resolves an asyncio future from any thread: with a task's result (`spawn`), or on an event with
/// no task behind it (a lease lost). Dropped unused (its task aborted, its lease released
/// first), it has the loop forget the future.
pub struct Resolver {
    inbox: Arc<Inbox>,
    id: u64,
    used: bool,
}

impl Resolver {
    pub fn resolve(mut self, completion: Completion) {
        self.used = true;
        self.inbox.deliver(self.id, completion);
    }
}

impl Drop for Resolver {
    fn drop(&mut self) {
        if !self.used {
            self.inbox.forget(self.id);
        }
    }
}

/// An asyncio future of the running loop and what resolves it.
pub fn promise(py: Python<'_>) -> PyResult<(Bound<'_, PyAny>, Resolver)> {
    promise_on_loop(py).map(|promised| (promised.future, promised.resolver))
}

/// A future of the running loop, what resolves it, and the loop with its bridge.
struct Promised<'py> {
    future: Bound<'py, PyAny>,
    resolver: Resolver,
    event_loop: Bound<'py, PyAny>,
    bridge: Bound<'py, LoopBridge>,
}

fn promise_on_loop(py: Python<'_>) -> PyResult<Promised<'_>> {
    let event_loop = running_loop(py)?;
    let bridge = bridge_for(&event_loop)?.into_bound(py);
    let future = event_loop.call_method0(intern!(py, "create_future"))?;
    let shared = bridge.get();
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    lock(&shared.pending).insert(id, PyWeakrefReference::new(&future)?.unbind());
    let inbox = Arc::clone(&shared.inbox);
    let resolver = Resolver {
        inbox,
        id,
        used: false,
    };
    Ok(Promised {
        future,
        resolver,
        event_loop,
        bridge,
    })
}

/// When a call reaches the core's runtime, and whether cancelling its Python future stops it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Sending {
    /// At the end of the loop's turn; dropped with its future when that is cancelled (a waiter
    /// leaves its line). The abort costs a done callback on the future, run at every resolution.
    Abortable,
    /// At the end of the loop's turn, and run to its end: one round trip, where stopping it
    /// would save nothing (its answer, if nobody awaits it, is dropped).
    TurnEnd,
    /// At once, and run to its end even when no future can be made for it (outside a running
    /// loop): an acquire must finish so it can give back what it took, and a release once
    /// started must reach the store.
    AtOnce,
}

/// Runs `op` on the core's runtime as `sending` says and returns an asyncio future for its
/// result.
pub fn spawn<'py, F>(py: Python<'py>, op: F, sending: Sending) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = Completion> + Send + 'static,
{
    let Promised {
        future,
        resolver,
        event_loop,
        bridge,
    } = match promise_on_loop(py) {
        Ok(made) => made,
        Err(error) => {
            if sending == Sending::AtOnce {
                runtime::handle().spawn(op);
            }
            return Err(error);
        }
    };
    let task = AssertUnwindSafe(op).catch_unwind().map(move |outcome| {
        resolver
            .resolve(outcome.unwrap_or_else(|panic| Err(CoreError::Panic(panic_message(panic.as_ref())))));
    });
    let call: Call = match sending {
        Sending::AtOnce => {
            runtime::handle().spawn(task);
            return Ok(future);
        }
        Sending::TurnEnd => Box::pin(task),
        Sending::Abortable => {
            // Aborted, the task is dropped where it stands, and its resolver with it.
            let (call, registration) = AbortHandle::new_pair();
            future.call_method1(intern!(py, "add_done_callback"), (AbortOnCancel { call },))?;
            Box::pin(Abortable::new(task, registration).map(drop))
        }
    };
    LoopBridge::send_at_turn_end(&bridge, &event_loop, call)?;
    Ok(future)
}

/// Runs `op` on the core's runtime at once, with no future to resolve: the event loop is
/// woken only if it fails, to run `tell(error)` there. Outside a running loop a failure is
/// told to nobody.
pub fn spawn_told_of_failure<F>(
    py: Python<'_>,
    op: F,
    tell: impl FnOnce(Python<'_>, CoreError) -> PyResult<()> + Send + 'static,
) where
    F: Future<Output = Result<(), CoreError>> + Send + 'static,
{
    let inbox = running_loop(py)
        .and_then(|event_loop| bridge_for(&event_loop))
        .map(|bridge| Arc::clone(&bridge.get().inbox))
        .ok();
    runtime::handle().spawn(op.map(move |outcome| {
        if let (Err(error), Some(inbox)) = (outcome, inbox) {
            let notice: Delivery = Box::new(move |py: Python<'_>| {
                tell(py, error)?;
                Ok(py.None())
            });
            inbox.deliver(NOTICE, Ok(notice));
        }
    }));
}

/// The op that resolves with `deliver(value)` once `result` resolves.
///
/// A combinator, not an `async move { result.await }` block: such a block stores the future it
/// captured twice (the captured copy stays beside the one being polled), so every wrapping layer
/// would double the task, memory that every acquire in flight keeps (`manager/task_sizes.rs`).
pub fn delivering<T>(
    result: impl Future<Output = Result<T, CoreError>> + Send + 'static,
    deliver: impl FnOnce(T) -> Delivery + Send + 'static,
) -> impl Future<Output = Completion> + Send + 'static {
    result.map(|outcome| outcome.map(deliver))
}

/// Runs `op` and hands its result to Python as an awaitable. Work on the embedded store never
/// waits, so it finishes right here instead of taking a trip through the runtime.
pub fn submit<'py, F>(py: Python<'py>, op: F, embedded: bool, sending: Sending) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = Completion> + Send + 'static,
{
    if embedded {
        ready(py, at_once(op))
    } else {
        spawn(py, op, sending)
    }
}

/// The completion of work on the embedded store, which never waits.
pub fn at_once(op: impl Future<Output = Completion>) -> Completion {
    op.now_or_never().expect("the embedded store never waits")
}

/// An awaitable already resolved with `completion` (for work that never waits).
pub fn ready(py: Python<'_>, completion: Completion) -> PyResult<Bound<'_, PyAny>> {
    let outcome = delivered(py, completion);
    Ok(Bound::new(py, Ready::new(py, outcome))?.into_any())
}

/// An asyncio future of the running loop already resolved with `completion`: for an
/// awaitable the public API returns as it is (`Lease.release()`), which callers may hand to
/// what takes futures only (`asyncio.wait`), whichever store made it.
pub fn resolved_future(py: Python<'_>, completion: Completion) -> PyResult<Bound<'_, PyAny>> {
    let future = running_loop(py)?.call_method0(intern!(py, "create_future"))?;
    resolve(&future, completion);
    Ok(future)
}

/// The Python value of a completion, or its error.
fn delivered(py: Python<'_>, completion: Completion) -> PyResult<Py<PyAny>> {
    completion.map_err(PyErr::from).and_then(|deliver| deliver(py))
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}
