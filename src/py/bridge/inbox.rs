//! The half of a bridge that tokio tasks touch: plain Rust data only. A finished result is pushed
//! into the queue, and one byte written to the loop's wake-up socket unless a wake-up is pending.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use super::Completion;
use crate::sync::lock;

/// Futures forgotten (their lease released before it was lost) before the loop is woken just to
/// drop its hold on them.
const FORGOTTEN_BEFORE_A_WAKE_UP: usize = 64;

/// The id of a result that resolves no future: its delivery runs on the loop for what it does
/// (`spawn_told_of_failure`). Futures' ids count up from 0 and never reach it.
pub(super) const NOTICE: u64 = u64::MAX;

/// The half of a bridge that tokio tasks touch: plain Rust data only.
pub(super) struct Inbox {
    /// Results for the loop's futures by id; None forgets a future nothing will resolve.
    pub finished: Mutex<Vec<(u64, Option<Completion>)>>,
    pub wake_pending: AtomicBool,
    waker: UnixStream,
    /// The loop closed or went away: results are dropped on arrival (a grant releases itself).
    closed: AtomicBool,
}

impl Inbox {
    pub fn new(waker: UnixStream) -> Self {
        Inbox {
            finished: Mutex::new(Vec::new()),
            wake_pending: AtomicBool::new(false),
            waker,
            closed: AtomicBool::new(false),
        }
    }

    pub fn deliver(&self, id: u64, completion: Completion) {
        let mut finished = lock(&self.finished);
        if self.closed.load(Ordering::Acquire) {
            drop(finished);
            drop(completion);
            return;
        }
        finished.push((id, Some(completion)));
        self.wake(&finished);
    }

    /// Lets the loop drop its hold on a future nothing will resolve, at its next wake-up: no
    /// need to wake it for that, unless forgotten futures pile up (a loop that nothing else
    /// wakes, the embedded store's, would keep them all).
    pub fn forget(&self, id: u64) {
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
    pub fn close(&self) {
        let stranded = {
            let mut finished = lock(&self.finished);
            self.closed.store(true, Ordering::Release);
            std::mem::take(&mut *finished)
        };
        drop(stranded); // outside the lock: grants release themselves
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;
    use crate::errors::CoreError;

    fn inbox() -> (Inbox, UnixStream) {
        let (waker, wakeup) = UnixStream::pair().unwrap();
        waker.set_nonblocking(true).unwrap();
        wakeup.set_nonblocking(true).unwrap();
        (Inbox::new(waker), wakeup)
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
