//! A turn of the core's tasks on an event loop's thread (`crate::loop_io`): run what is ready,
//! resolve the futures whose results came, many per turn, then write what the tasks queued on
//! their connections, and have the loop watch those connections' sockets: for reading while
//! they live, for writing only while a write is partial.

use pyo3::intern;
use pyo3::prelude::*;

use super::loops::{running_loop, LoopBridge};
use crate::sync::lock;

impl LoopBridge {
    /// Runs the loop's ready tasks and resolves what they finished, until none is ready; then
    /// writes and watches the connections.
    pub(super) fn turn(me: &Bound<'_, LoopBridge>) {
        let (py, bridge) = (me.py(), me.get());
        loop {
            bridge.tasks.run_ready();
            bridge.resolve_finished(py);
            if !bridge.tasks.has_ready() {
                break;
            }
        }
        if let Err(error) = bridge.watch(me) {
            error.write_unraisable(py, None);
        }
    }

    /// Writes each connection's queued commands; the loop watches the live ones (for writing
    /// too while a write is partial) and stops watching the broken ones, which then close.
    fn watch(&self, me: &Bound<'_, LoopBridge>) -> PyResult<()> {
        let py = me.py();
        let connections = self.tasks.connections().all();
        if connections.is_empty() {
            return Ok(());
        }
        let mut event_loop = None;
        for connection in &connections {
            let fd = connection.fd();
            let wants_write = !connection.is_broken() && connection.flush();
            let watched = lock(&self.watched).get(&fd).copied();
            let wanted = (!connection.is_broken()).then_some(wants_write);
            if watched == wanted {
                continue;
            }
            let event_loop = match &event_loop {
                Some(event_loop) => event_loop,
                None => event_loop.insert(running_loop(py)?),
            };
            match (watched, wanted) {
                (None, Some(_)) => {
                    event_loop.call_method1(
                        intern!(py, "add_reader"),
                        (fd, me.getattr(intern!(py, "_readable"))?, fd),
                    )?;
                }
                (Some(_), None) => {
                    event_loop.call_method1(intern!(py, "remove_reader"), (fd,))?;
                }
                _ => {}
            }
            match (watched.unwrap_or(false), wanted.unwrap_or(false)) {
                (false, true) => {
                    event_loop.call_method1(
                        intern!(py, "add_writer"),
                        (fd, me.getattr(intern!(py, "_writable"))?),
                    )?;
                }
                (true, false) => {
                    event_loop.call_method1(intern!(py, "remove_writer"), (fd,))?;
                }
                _ => {}
            }
            match wanted {
                Some(writing) => lock(&self.watched).insert(fd, writing),
                None => lock(&self.watched).remove(&fd),
            };
        }
        if connections.iter().any(|c| c.is_broken()) {
            self.tasks.connections().retire();
        }
        Ok(())
    }
}
