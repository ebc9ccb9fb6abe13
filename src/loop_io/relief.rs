//! The relief of a blocked event loop. A loop's replies are read, and its tasks run, when the
//! loop turns; a loop blocked by its application (a long computation, a blocking call) would
//! leave a grant unread in its socket past the lease's deadline, and the grant would be found
//! lost though Redis keeps it. So once a loop with calls in flight has not turned for
//! `BLOCKED_AFTER`, a task of the core's runtime does the loop's part: it reads the replies that
//! came, runs the tasks they wake (a grant is then held, and renewed, on the core's runtime),
//! writes what those queued, and wakes the loop so that it resolves their futures when it runs
//! again. One runner at a time: the loop waits for a relief in progress, and a relief gives way
//! to a loop that turns. It starts when the loop's tasks first ask for a connection
//! (`LoopTasks::connection`).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::connection::LoopConnection;
use super::connections::Endpoint;
use super::tasks::{LoopTasks, Shared};
use crate::runtime;

/// How long a loop with calls in flight may go without turning before the relief reads its
/// connections and runs its tasks.
pub const BLOCKED_AFTER: Duration = Duration::from_millis(100);

impl LoopTasks {
    /// The connection on this loop to `endpoint`, opened now if needed (`LoopConnections::open`);
    /// the loop's relief starts with its first call for one.
    pub async fn connection(
        &self,
        endpoint: &Endpoint,
        timeout: Duration,
    ) -> std::io::Result<Arc<LoopConnection>> {
        self.start_relief();
        self.connections().open(endpoint, timeout).await
    }

    /// Starts the loop's relief, once; it ends with the loop.
    fn start_relief(&self) {
        let started = &self.shared().relief_started;
        if !started.load(Ordering::Acquire) && !started.swap(true, Ordering::AcqRel) {
            runtime::handle().spawn(relieve_while_open(Arc::downgrade(self.shared())));
        }
    }

    /// Whether a call waits for its reply or its write, or a task to run.
    fn is_waiting(&self) -> bool {
        self.has_ready()
            || self
                .connections()
                .all()
                .iter()
                .any(|c| !c.is_broken() && c.is_waiting())
    }

    /// Does the loop's part once, unless the loop is running its tasks.
    fn relieve(&self) {
        let Ok(runner) = self.shared().runner.try_lock() else {
            return;
        };
        for connection in self.connections().all() {
            if !connection.is_broken() {
                connection.readable();
            }
        }
        self.run_queue(&runner);
        for connection in self.connections().all() {
            if !connection.is_broken() {
                connection.flush();
            }
        }
        drop(runner);
        (self.shared().wake_loop)();
    }
}

/// Checks every `BLOCKED_AFTER` whether the loop turned since the last check, and relieves it
/// when it did not while calls wait.
async fn relieve_while_open(shared: Weak<Shared>) {
    let mut turns_seen = None;
    loop {
        tokio::time::sleep(BLOCKED_AFTER).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        if shared.closed.load(Ordering::Acquire) {
            return;
        }
        let turns = shared.turns.load(Ordering::Relaxed);
        let tasks = LoopTasks::from_shared(shared);
        if turns_seen == Some(turns) && tasks.is_waiting() {
            tasks.relieve();
        }
        turns_seen = Some(turns);
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::sync::atomic::AtomicUsize;

    use super::*;
    use crate::loop_io::{here, Address};

    #[test]
    fn a_reply_that_comes_while_the_loop_is_blocked_reaches_its_task_and_the_loop_is_woken() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = Endpoint {
            owner: 1,
            address: Address::Tcp(listener.local_addr().unwrap().to_string()),
            handshake: Vec::new(),
        };
        let server = std::thread::spawn(move || {
            let (mut peer, _) = listener.accept().unwrap();
            let mut got = Vec::new();
            let mut buffer = [0u8; 64];
            while !got.windows(4).any(|w| w == b"PING") {
                let n = peer.read(&mut buffer).unwrap();
                got.extend_from_slice(&buffer[..n]);
            }
            peer.write_all(b"+PONG\r\n").unwrap();
            let _ = peer.read(&mut buffer); // until the client closes
        });
        let wakes = Arc::new(AtomicUsize::new(0));
        let tasks = LoopTasks::new({
            let wakes = Arc::clone(&wakes);
            move || {
                wakes.fetch_add(1, Ordering::SeqCst);
            }
        });
        let (finished, finished_on) = std::sync::mpsc::channel();
        tasks.spawn(async move {
            let connection = here()
                .expect("run by its loop")
                .connection(&endpoint, Duration::from_secs(5))
                .await
                .unwrap();
            let reply = connection.call(&redis::cmd("PING")).await.unwrap().unwrap();
            finished.send((reply, std::thread::current().id())).unwrap();
        });
        // The loop turns once (its task asks for the connection), then never again: its
        // thread is this test's, which only waits.
        tasks.run_ready();
        let (reply, thread) = finished_on
            .recv_timeout(Duration::from_secs(10))
            .expect("the relief ran the task and read its reply");
        assert_eq!(reply, redis::Value::SimpleString("PONG".into()));
        assert_ne!(thread, std::thread::current().id());
        assert!(
            wakes.load(Ordering::SeqCst) >= 1,
            "the loop is woken to resolve what its tasks finished"
        );
        tasks.close();
        server.join().unwrap();
    }
}
