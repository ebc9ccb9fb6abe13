//! The tokio runtime of the process. Its threads never attach to the Python interpreter, so
//! nothing they do can race the interpreter's shutdown.
//!
//! A forked child (gunicorn `--preload`, multiprocessing) inherits the parent's runtime without
//! its threads, so each process id gets a runtime of its own; the parent's is left untouched.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

use tokio::runtime::{Builder, Handle, Runtime};

/// One worker thread unless `TOKIO_WORKER_THREADS` (tokio's own variable) says otherwise. A
/// process serves one event loop, whose thread spends more CPU per call than the core does, so
/// a second worker adds no throughput; it moved tasks between threads instead, each move a
/// wake-up across cores: one worker spends a quarter less of the core's CPU per cycle of
/// acquire and release than two, at one stream at a time and under load alike
/// (benchmarks/README.md). Behind several workers of a web server, one thread per process also
/// keeps the threads fewer than the cores.
fn worker_threads() -> usize {
    std::env::var("TOKIO_WORKER_THREADS")
        .ok()
        .and_then(|threads| threads.trim().parse().ok())
        .filter(|&threads| threads > 0)
        .unwrap_or(1)
}

fn build() -> Runtime {
    Builder::new_multi_thread()
        .worker_threads(worker_threads())
        .thread_name("stream-lease")
        .enable_all()
        .build()
        .expect("fastapi_stream_lease could not start its tokio runtime")
}

/// This process's id, 0 until read (and again in a forked child, until it reads its own).
static PROCESS_ID: AtomicU32 = AtomicU32::new(0);

#[cfg(unix)]
extern "C" fn forget_process_id() {
    PROCESS_ID.store(0, Ordering::Relaxed);
}

/// This process's id. Every acquire and release asks (a forked child must use neither its
/// parent's runtime nor its leases), and getpid is a system call, costly in a sandbox (a fifth
/// of the client's time at 64 coroutines under gVisor): read once, and again after a fork.
pub fn process_id() -> u32 {
    let known = PROCESS_ID.load(Ordering::Relaxed);
    if known != 0 {
        return known;
    }
    #[cfg(unix)]
    {
        static WATCH_FORKS: std::sync::Once = std::sync::Once::new();
        // SAFETY: registers a handler that only stores to an atomic (async-signal-safe), run
        // in the child of every fork from now on; registered before any id is cached.
        WATCH_FORKS.call_once(|| unsafe {
            libc::pthread_atfork(None, None, Some(forget_process_id));
        });
    }
    let pid = std::process::id();
    PROCESS_ID.store(pid, Ordering::Relaxed);
    pid
}

pub fn handle() -> &'static Handle {
    static FIRST: OnceLock<(u32, Runtime)> = OnceLock::new();
    static FORKED: Mutex<Option<HashMap<u32, &'static Runtime>>> = Mutex::new(None);
    let pid = process_id();
    let (first_pid, first) = FIRST.get_or_init(|| (pid, build()));
    if *first_pid == pid {
        return first.handle();
    }
    let mut forked = FORKED.lock().unwrap_or_else(PoisonError::into_inner);
    forked
        .get_or_insert_with(HashMap::new)
        .entry(pid)
        .or_insert_with(|| Box::leak(Box::new(build())))
        .handle()
}

/// Runs `calls` with at most `in_flight` of them at once; their outputs in completion order.
/// Each call's timeout then covers its own work, not a queue of a hundred others.
pub async fn a_few_at_a_time<F: std::future::Future>(calls: Vec<F>, in_flight: usize) -> Vec<F::Output> {
    use futures_util::StreamExt;
    futures_util::stream::iter(calls)
        .buffer_unordered(in_flight)
        .collect()
        .await
}

/// The core's memory comes from mimalloc (v2, without asking for transparent huge pages: the
/// host's setting stands); Python's objects still come from Python's allocator. Held leases are
/// long-lived small objects allocated on the event loop's thread between short-lived bigger
/// ones (an acquire's task, 1.5 KB); glibc's malloc carved the leases out of the holes those
/// left, and the rest of each hole fitted nothing: 2.0 KB of RSS per lease at 100,000 held,
/// against 0.86 KB with mimalloc's size-segregated pages (`benchmarks/holding.py`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
