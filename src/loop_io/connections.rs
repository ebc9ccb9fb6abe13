//! `LoopConnections`: the Redis connections one event loop holds, one per owner (a store), that
//! its tasks call on (`LoopTasks::connection`) and the binding watches. `LoopTasks` keeps one and
//! closes it with the loop.
//!
//! A connection is opened on the core's runtime (`socket.rs`, bounded by the call's limit) and
//! handed to the loop: the loop's thread never waits for a server that does not answer. The
//! loop's tasks that want the connection meanwhile await the same opening.

use std::io::ErrorKind;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::{BoxFuture, FutureExt, Shared};
use redis::Cmd;

use super::connection::LoopConnection;
use super::socket::{Address, Socket};
use crate::runtime;
use crate::sync::lock;

/// A connection opened, or why none could be (`std::io::Error` is not `Clone`, and the tasks
/// awaiting one opening each get its outcome).
type Opened = Result<Arc<LoopConnection>, (ErrorKind, String)>;

type Opening = Shared<BoxFuture<'static, Opened>>;

/// What a loop's connection goes to: its server, what it sends first, and whose it is (one per
/// owner, a store, and loop).
#[derive(Clone)]
pub struct Endpoint {
    pub owner: u64,
    pub address: Address,
    /// Sent before any call (`HELLO`, `AUTH`, `SELECT`).
    pub handshake: Vec<Cmd>,
}

#[derive(Default)]
pub struct LoopConnections(Mutex<Held>);

#[derive(Default)]
struct Held {
    open: Vec<Arc<LoopConnection>>,
    /// Connections being opened on the core's runtime, by owner and server.
    opening: Vec<(u64, Address, Opening)>,
}

impl LoopConnections {
    /// The connection on this loop to `endpoint`, opened now (within `timeout`) if it has none,
    /// or a broken one; new connections are listed for the binding to watch (`all`).
    pub(super) async fn open(
        &self,
        endpoint: &Endpoint,
        timeout: Duration,
    ) -> std::io::Result<Arc<LoopConnection>> {
        let Endpoint { owner, address, .. } = endpoint;
        let opening = {
            let mut held = lock(&self.0);
            if let Some(open) = held.open.iter().find(|c| c.owner == *owner && !c.is_broken()) {
                if open.address == *address {
                    return Ok(Arc::clone(open));
                }
                // Its server is no longer the owner's (behind Sentinel, another master).
                open.abandon(&format!("{} is no longer the server to call", open.address));
            }
            // An opening that failed, or to another server, is not waited for again.
            held.opening.retain(|(of, to, opening)| {
                *of != *owner || (to == address && !matches!(opening.peek(), Some(Err(_))))
            });
            match held.opening.iter().find(|(of, _, _)| of == owner) {
                Some((_, _, opening)) => opening.clone(),
                None => {
                    let opening = connect(endpoint.clone(), timeout);
                    held.opening.push((*owner, address.clone(), opening.clone()));
                    opening
                }
            }
        };
        let opened = opening
            .clone()
            .await
            .map_err(|(kind, why)| std::io::Error::new(kind, why))?;
        let mut held = lock(&self.0);
        // The first task to see the opening finish lists the connection; a loop closed
        // meanwhile took its openings away, and the connection goes with its last task.
        if let Some(at) = held.opening.iter().position(|(_, _, o)| o.ptr_eq(&opening)) {
            drop(held.opening.swap_remove(at));
            held.open.push(Arc::clone(&opened));
        }
        Ok(opened)
    }

    /// The loop's connections, for the binding to watch (broken ones too: it stops watching
    /// them, then `retire`s them).
    pub fn all(&self) -> Vec<Arc<LoopConnection>> {
        lock(&self.0).open.clone()
    }

    /// Forgets the broken connections once the loop stops watching them (their sockets close
    /// with the last reference).
    pub fn retire(&self) {
        lock(&self.0).open.retain(|c| !c.is_broken());
    }

    /// The loop closed: every connection is forgotten and fails or drains its calls in flight
    /// (`LoopConnection::close_for_loop`); openings under way are dropped with their tasks.
    pub(super) fn close_all(&self) {
        let Held { open, .. } = std::mem::take(&mut *lock(&self.0));
        for connection in &open {
            connection.close_for_loop();
        }
    }
}

/// Opens a connection to `endpoint` on the core's runtime, within `timeout`.
fn connect(endpoint: Endpoint, timeout: Duration) -> Opening {
    let opened = runtime::handle().spawn(async move {
        let Endpoint {
            owner,
            address,
            handshake,
        } = endpoint;
        let connected = tokio::time::timeout(timeout, Socket::connect(&address))
            .await
            .unwrap_or_else(|_| {
                Err(std::io::Error::new(
                    ErrorKind::TimedOut,
                    format!("connecting to {address} took longer than {timeout:?}"),
                ))
            });
        connected
            .and_then(|socket| LoopConnection::new(owner, address, socket, timeout, &handshake))
            .map(Arc::new)
            .map_err(|e| (e.kind(), e.to_string()))
    });
    opened
        .map(|joined| {
            joined.unwrap_or_else(|e| Err((ErrorKind::Other, format!("opening a connection failed: {e}"))))
        })
        .boxed()
        .shared()
}
