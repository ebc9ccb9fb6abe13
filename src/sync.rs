//! Locking that outlives a panic: a thread that panicked while holding a lock leaves data that
//! every writer here keeps consistent between statements, so the next user takes it as it is.

use std::sync::{Mutex, MutexGuard, PoisonError};

pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
