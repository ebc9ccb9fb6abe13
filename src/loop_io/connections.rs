//! `LoopConnections`: the Redis connections one event loop holds, one per owner (a store), that
//! its tasks call on (`LoopTasks::connection`) and the binding watches. `LoopTasks` keeps one and
//! closes it with the loop.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::Cmd;

use super::connection::LoopConnection;
use crate::sync::lock;

#[derive(Default)]
pub struct LoopConnections(Mutex<Vec<Arc<LoopConnection>>>);

impl LoopConnections {
    /// `owner`'s connection on this loop to `address`, opened now (sending `handshake` first)
    /// if it has none, or a broken one; new connections are listed for the binding to watch
    /// (`all`).
    pub(super) fn open(
        &self,
        owner: u64,
        address: &str,
        timeout: Duration,
        handshake: &[Cmd],
    ) -> std::io::Result<Arc<LoopConnection>> {
        let mut connections = lock(&self.0);
        if let Some(open) = connections.iter().find(|c| c.owner == owner && !c.is_broken()) {
            return Ok(Arc::clone(open));
        }
        let opened = Arc::new(LoopConnection::open(owner, address, timeout, handshake)?);
        connections.push(Arc::clone(&opened));
        Ok(opened)
    }

    /// The loop's connections, for the binding to watch (broken ones too: it stops watching
    /// them, then `retire`s them).
    pub fn all(&self) -> Vec<Arc<LoopConnection>> {
        lock(&self.0).clone()
    }

    /// Forgets the broken connections once the loop stops watching them (their sockets close
    /// with the last reference).
    pub fn retire(&self) {
        lock(&self.0).retain(|c| !c.is_broken());
    }

    /// The loop closed: every connection is forgotten and fails or drains its calls in flight
    /// (`LoopConnection::close_for_loop`).
    pub(super) fn close_all(&self) {
        let connections = std::mem::take(&mut *lock(&self.0));
        for connection in &connections {
            connection.close_for_loop();
        }
    }
}
