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
    let mut builder = Builder::new_multi_thread();
    builder
        .worker_threads(worker_threads())
        .thread_name("stream-lease")
        .enable_all();
    #[cfg(target_os = "linux")]
    if worker_threads() == 1 {
        builder.on_thread_park(near_the_loop::known);
    }
    builder
        .build()
        .expect("fastapi_stream_lease could not start its tokio runtime")
}

/// Keeps the core's one worker thread on the CPU of the event loop that hands it calls. A hand-off
/// between two threads on one CPU costs about 10 µs; one that wakes the other CPU, idle, 56 to
/// 87 µs on a virtual machine, most of what a call costs at one stream at a time
/// (docs/performance.md). Kept there, the worker wakes on the CPU the loop has just left to
/// sleep; under load the two share it, and a web server's other worker processes the other CPUs.
/// With more worker threads (`TOKIO_WORKER_THREADS`), they are left where the kernel puts them.
#[cfg(target_os = "linux")]
pub mod near_the_loop {
    use std::cell::Cell;
    use std::sync::atomic::{AtomicI32, Ordering};
    use std::sync::Mutex;

    use crate::sync::lock;

    /// The worker threads by process (a forked child has runtimes and threads of its own, and
    /// must never move its parent's): (process id, thread id).
    static WORKERS: Mutex<Vec<(u32, libc::pid_t)>> = Mutex::new(Vec::new());
    /// The CPU the workers were last moved to, -1 before.
    static CPU: AtomicI32 = AtomicI32::new(-1);

    /// Called by each worker as it parks: the first time, it makes itself known (and is moved
    /// at the next call).
    pub fn known() {
        thread_local!(static KNOWN: Cell<bool> = const { Cell::new(false) });
        if !KNOWN.replace(true) {
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() };
            lock(&WORKERS).push((super::process_id(), tid));
            CPU.store(-1, Ordering::Relaxed);
        }
    }

    /// Moves the worker to the caller's CPU if it is elsewhere (a read of the CPU, through the
    /// vDSO, when it is not).
    pub fn follow_caller() {
        // SAFETY: sched_getcpu has no preconditions.
        let cpu = unsafe { libc::sched_getcpu() };
        if cpu < 0 || CPU.swap(cpu, Ordering::Relaxed) == cpu {
            return;
        }
        // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET writes within it for a CPU number
        // the kernel gave.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        unsafe { libc::CPU_SET(cpu as usize, &mut set) };
        let pid = super::process_id();
        for &(_, tid) in lock(&WORKERS).iter().filter(|(of, _)| *of == pid) {
            // SAFETY: `set` is a valid cpu_set_t of its size; a thread that ended or a CPU the
            // process may not use fails with an error, left as it is (the worker stays put).
            unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) };
        }
    }
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
