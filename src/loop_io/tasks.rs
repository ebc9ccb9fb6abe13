//! `LoopTasks`: a single-threaded executor of the core's futures on one event loop's thread.
//! A task woken on that thread is queued and runs at the loop's next turn through the binding
//! (which runs the queue after every call and callback it serves there); woken from another
//! thread (a tokio timer, a reply read by tokio), it is queued and the loop is woken once, by
//! the wake-up the binding gives (its socketpair), until the loop runs its queue again.

use std::any::{Any, TypeId};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Wake, Waker};
use std::thread::ThreadId;

use super::connections::LoopConnections;
use crate::runtime;
use crate::sync::lock;

type Boxed = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What stops a task (`LoopTasks::spawn_abortable`).
pub type Abort = Box<dyn Fn() + Send + Sync>;

/// The tasks of one event loop, and what they keep per loop (its connections, its batches).
#[derive(Clone)]
pub struct LoopTasks {
    shared: Arc<Shared>,
}

pub(super) struct Shared {
    /// The loop's thread: wakers from any other thread also wake the loop.
    owner: ThreadId,
    ready: Mutex<VecDeque<Arc<Task>>>,
    /// Every unfinished task, so that closing drops them all (a task waiting on something that
    /// never comes would otherwise keep itself alive through its own waker).
    live: Mutex<HashMap<u64, Arc<Task>>>,
    next_id: AtomicU64,
    /// The loop is woken from another thread once until it runs its queue again.
    wake_sent: AtomicBool,
    pub(super) wake_loop: Box<dyn Fn() + Send + Sync>,
    pub(super) closed: AtomicBool,
    /// The loop's turns so far, for the relief to tell a blocked loop (`relief.rs`).
    pub(super) turns: AtomicU64,
    /// Held by whoever runs the queue: the loop, or the relief while the loop is blocked.
    pub(super) runner: Mutex<()>,
    pub(super) relief_started: AtomicBool,
    /// What the core keeps per loop (a store's batches), by its owner (`owner_id`) and type,
    /// made on first use on the loop's thread.
    locals: Mutex<HashMap<(u64, TypeId), Arc<dyn Any + Send + Sync>>>,
    connections: LoopConnections,
}

struct Task {
    id: u64,
    future: Mutex<Option<Boxed>>,
    /// In the ready queue (or being run): a wake-up then queues nothing more.
    queued: AtomicBool,
    tasks: Weak<Shared>,
}

impl Wake for Task {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.queued.swap(true, Ordering::AcqRel) {
            return;
        }
        let Some(shared) = self.tasks.upgrade() else {
            return;
        };
        if shared.closed.load(Ordering::Acquire) {
            return;
        }
        lock(&shared.ready).push_back(Arc::clone(self));
        if std::thread::current().id() != shared.owner && !shared.wake_sent.swap(true, Ordering::AcqRel) {
            (shared.wake_loop)();
        }
    }
}

thread_local! {
    /// The tasks being run on this thread (set while `run_ready` runs).
    static RUNNING: std::cell::RefCell<Option<LoopTasks>> = const { std::cell::RefCell::new(None) };
}

/// Clears `RUNNING` when a run ends, a panicking one included.
struct Running;

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING.with(|running| *running.borrow_mut() = None);
    }
}

/// The loop whose tasks this thread is running now, if any: what a task polled there uses to
/// reach its loop's connection and batches.
pub fn here() -> Option<LoopTasks> {
    RUNNING.with(|running| running.borrow().clone())
}

impl LoopTasks {
    /// The tasks of the loop whose thread calls this; `wake_loop` wakes that loop from another
    /// thread (the loop then has the binding call `run_ready`).
    pub fn new(wake_loop: impl Fn() + Send + Sync + 'static) -> Self {
        LoopTasks {
            shared: Arc::new(Shared {
                owner: std::thread::current().id(),
                ready: Mutex::new(VecDeque::new()),
                live: Mutex::new(HashMap::new()),
                next_id: AtomicU64::new(0),
                wake_sent: AtomicBool::new(false),
                wake_loop: Box::new(wake_loop),
                closed: AtomicBool::new(false),
                turns: AtomicU64::new(0),
                runner: Mutex::new(()),
                relief_started: AtomicBool::new(false),
                locals: Mutex::new(HashMap::new()),
                connections: LoopConnections::default(),
            }),
        }
    }

    pub(super) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The loop's Redis connections: its tasks call on them, the binding watches them.
    pub fn connections(&self) -> &LoopConnections {
        &self.shared.connections
    }

    pub(super) fn from_shared(shared: Arc<Shared>) -> Self {
        LoopTasks { shared }
    }

    /// Queues `future` to run at the next `run_ready`; once the loop closed, it runs on the
    /// core's runtime instead, so that it finishes (and gives back what it took).
    pub fn spawn(&self, future: impl Future<Output = ()> + Send + 'static) {
        if let Err(future) = self.queue(Box::pin(future)) {
            runtime::handle().spawn(future);
        }
    }

    /// As `spawn`, and returns what stops the task: its future is dropped (at once, or when a
    /// poll under way ends), which ends it; on the core's runtime, tokio's abort.
    pub fn spawn_abortable(&self, future: impl Future<Output = ()> + Send + 'static) -> Abort {
        match self.queue(Box::pin(future)) {
            Ok(id) => {
                let tasks = Arc::downgrade(&self.shared);
                Box::new(move || {
                    let task = tasks.upgrade().and_then(|shared| lock(&shared.live).remove(&id));
                    if let Some(task) = task {
                        let future = lock(&task.future).take();
                        drop(future);
                    }
                })
            }
            Err(future) => {
                let task = runtime::handle().spawn(future).abort_handle();
                Box::new(move || task.abort())
            }
        }
    }

    /// Queues `future` as a task of the loop (its id); the future back once the loop closed.
    fn queue(&self, future: Boxed) -> Result<u64, Boxed> {
        if self.shared.closed.load(Ordering::Acquire) {
            return Err(future);
        }
        let task = Arc::new(Task {
            id: self.shared.next_id.fetch_add(1, Ordering::Relaxed),
            future: Mutex::new(Some(future)),
            queued: AtomicBool::new(true),
            tasks: Arc::downgrade(&self.shared),
        });
        let id = task.id;
        lock(&self.shared.live).insert(id, Arc::clone(&task));
        lock(&self.shared.ready).push_back(task);
        Ok(id)
    }

    /// Runs the queued tasks, those they wake included, until none is queued; on the loop's
    /// thread, inside the core's runtime (so tokio's timers and spawns work from here). A call
    /// from inside a task (nested) only leaves the queue to the outer one. Counts a turn of the
    /// loop.
    pub fn run_ready(&self) {
        if RUNNING.with(|running| running.borrow().is_some()) {
            return;
        }
        // Cleared on every run, an empty one included: a task woken from another thread while
        // an earlier run ran it leaves the flag set and the queue empty, and a flag left set
        // would keep every later wake-up from waking the loop.
        self.shared.wake_sent.store(false, Ordering::Release);
        self.shared.turns.fetch_add(1, Ordering::Relaxed);
        if !self.has_ready() {
            return;
        }
        let runner = lock(&self.shared.runner);
        self.run_queue(&runner);
    }

    /// Runs the queue until it is empty, on this thread, by whoever holds the runner.
    pub(super) fn run_queue(&self, _runner: &std::sync::MutexGuard<'_, ()>) {
        RUNNING.with(|running| *running.borrow_mut() = Some(self.clone()));
        let _running = Running;
        let _runtime = runtime::handle().enter();
        loop {
            let Some(task) = lock(&self.shared.ready).pop_front() else {
                break;
            };
            // Cleared before the poll: a wake-up during the poll queues the task again.
            task.queued.store(false, Ordering::Release);
            let waker = Waker::from(Arc::clone(&task));
            let mut slot = lock(&task.future);
            let done = match slot.as_mut() {
                Some(future) => future.as_mut().poll(&mut Context::from_waker(&waker)).is_ready(),
                None => false,
            };
            if done {
                let finished = slot.take();
                drop(slot);
                lock(&self.shared.live).remove(&task.id);
                drop(finished);
            }
        }
    }

    /// Whether tasks wait in the queue.
    pub fn has_ready(&self) -> bool {
        !lock(&self.shared.ready).is_empty()
    }

    /// The `T` that `owner` (an `owner_id`) keeps on this loop, made by `make` on first use.
    pub fn local<T: Send + Sync + 'static>(&self, owner: u64, make: impl FnOnce() -> Arc<T>) -> Arc<T> {
        let key = (owner, TypeId::of::<T>());
        let mut locals = lock(&self.shared.locals);
        if let Some(kept) = locals
            .get(&key)
            .and_then(|kept| Arc::clone(kept).downcast::<T>().ok())
        {
            return kept;
        }
        let made = make();
        locals.insert(key, Arc::clone(&made) as Arc<dyn Any + Send + Sync>);
        made
    }

    /// A handle that spawns on this loop while it lives, without keeping it alive.
    pub fn place(&self) -> LoopPlace {
        LoopPlace(Arc::downgrade(&self.shared))
    }

    /// The loop closed or went away: its connections fail the calls in flight, and its tasks
    /// finish on the core's runtime (an acquire whose reply is lost gives back what its call may
    /// have taken, as one whose connection broke; batches still queued go on tokio's
    /// connection), so none hangs or leaks a lease.
    pub fn close(&self) {
        self.shared.closed.store(true, Ordering::Release);
        self.shared.connections.close_all();
        let tasks: Vec<Arc<Task>> = lock(&self.shared.live).drain().map(|(_, task)| task).collect();
        lock(&self.shared.ready).clear();
        for task in tasks {
            let future = lock(&task.future).take();
            if let Some(future) = future {
                runtime::handle().spawn(future);
            }
        }
        let locals = std::mem::take(&mut *lock(&self.shared.locals));
        drop(locals);
    }
}

/// Where a task of a loop goes: spawned there while the loop lives, on the core's runtime once
/// it closed or went away.
#[derive(Clone)]
pub struct LoopPlace(Weak<Shared>);

impl LoopPlace {
    pub fn spawn(&self, future: impl Future<Output = ()> + Send + 'static) {
        match self.0.upgrade() {
            Some(shared) => LoopTasks { shared }.spawn(future),
            None => drop(runtime::handle().spawn(future)),
        }
    }
}

#[cfg(test)]
#[path = "tasks_tests.rs"]
mod tests;
