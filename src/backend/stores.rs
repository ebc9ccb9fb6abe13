//! The manager's store behind its circuit breaker, and the local floor that admits while it is
//! down.

use std::future::Future;

use super::{Backend, MemoryBackend};
use crate::breaker::{Breaker, Permit};
use crate::errors::{CoreError, CoreResult};
use crate::lease::Store;

pub struct Stores {
    main: Box<dyn Backend>,
    fallback: MemoryBackend,
    breaker: Breaker,
}

impl Stores {
    pub fn new(main: Box<dyn Backend>) -> Self {
        Stores {
            main,
            fallback: MemoryBackend::default(),
            breaker: Breaker::default(),
        }
    }

    pub fn get(&self, store: Store) -> &dyn Backend {
        match store {
            Store::Main => &*self.main,
            Store::Fallback => &self.fallback,
        }
    }

    pub fn main(&self) -> &dyn Backend {
        &*self.main
    }

    pub fn breaker(&self) -> &Breaker {
        &self.breaker
    }

    /// Runs one call on a store. Calls to the main store go through the breaker: refused without
    /// a call while it is open (a dead server would cost each one the full timeout), and their
    /// outcome feeds it.
    pub async fn call<'a, T, Call>(
        &'a self,
        store: Store,
        call: impl FnOnce(&'a dyn Backend) -> Call,
    ) -> CoreResult<T>
    where
        Call: Future<Output = CoreResult<T>> + 'a,
    {
        let backend = self.get(store);
        if store == Store::Fallback {
            return call(backend).await;
        }
        if let Permit::Wait(left) = self.breaker.admit() {
            return Err(CoreError::breaker_open(&backend.describe(), left));
        }
        let outcome = call(backend).await;
        self.breaker.observe(&outcome);
        outcome
    }
}
