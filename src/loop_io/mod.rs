//! The core's Redis I/O on an event loop's own thread (opt-in, behind the switch
//! `STREAM_LEASE_IO_ON_LOOP_THREAD=1`): the loop's tasks (`tasks.rs`, a single-threaded
//! executor the binding runs when the loop wakes it), the Redis connections it holds
//! (`connections.rs`, one per store) and each of them (`connection.rs`, non-blocking, watched by
//! the loop's selector, on a TCP or Unix socket, `socket.rs`), and the relief of a loop its
//! application blocks (`relief.rs`). A call then crosses no thread: the loop writes the
//! command, reads the reply and resolves its future in one turn. Plain Rust: the binding
//! (`py/bridge/`) watches the sockets and runs the tasks.

mod connection;
mod connections;
mod relief;
mod socket;
mod tasks;
#[cfg(all(test, target_os = "linux"))]
mod turn_tests;

pub use self::connection::{Reply, LOOP_CLOSED};
pub use self::connections::Endpoint;
pub use self::socket::Address;
pub use self::tasks::{here, Abort, LoopPlace, LoopTasks};

/// The environment variable that turns the loop-thread path on (`1`), read when a manager is
/// built.
pub const SWITCH: &str = "STREAM_LEASE_IO_ON_LOOP_THREAD";

/// A new key for what an owner keeps per loop (`LoopTasks::local`, `LoopConnections::open`).
pub fn owner_id() -> u64 {
    static OWNERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    OWNERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Whether the switch is on now.
pub fn switched_on() -> bool {
    std::env::var(SWITCH).is_ok_and(|value| value.trim() == "1")
}
