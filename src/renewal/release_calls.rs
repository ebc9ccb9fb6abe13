//! Releases from Redis in batches: those that come while a release call is in flight go out
//! together, as one call of release.lua (see `group_commit.rs`), which does a holder's
//! bookkeeping once per call, not once per lease.

use std::sync::Arc;

use crate::backend::{batches, Stores};
use crate::errors::CoreResult;
use crate::group_commit::Batches;
use crate::keys::LineKeys;
use crate::lease::{LeaseRecord, Store};

pub struct ReleaseCalls {
    pub stores: Arc<Stores>,
    /// The line whose waiters a release wakes.
    pub line: Option<LineKeys>,
}

impl Batches for ReleaseCalls {
    type Request = Arc<LeaseRecord>;
    /// Whether Redis still had the lease, or the error it met removing this one (the call
    /// itself answered: the others of the batch are released).
    type Answer = CoreResult<bool>;
    /// `send` splits what it gets into calls by members (`backend::batches`).
    const MOST_PER_CALL: usize = usize::MAX;

    fn together(&self, first: &Arc<LeaseRecord>, other: &Arc<LeaseRecord>) -> bool {
        !self.stores.get(Store::Main).is_cluster() || first.hash_tag() == other.hash_tag()
    }

    async fn send(&self, leases: &[Arc<LeaseRecord>]) -> Vec<CoreResult<CoreResult<bool>>> {
        let mut answers = Vec::with_capacity(leases.len());
        for batch in batches(leases, false) {
            let line = self.line.as_ref();
            match self
                .stores
                .call(Store::Main, |main| main.release(batch, line))
                .await
            {
                Ok(present) => answers.extend(present.into_iter().map(Ok)),
                Err(error) => answers.extend(batch.iter().map(|_| Err(error.clone()))),
            }
        }
        answers
    }

    /// A release runs from a task that is never cancelled: always answered.
    async fn unanswered(&self, _lease: Arc<LeaseRecord>, _present: CoreResult<bool>) {}
}
