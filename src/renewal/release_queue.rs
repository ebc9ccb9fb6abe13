//! Group commit of releases: while a release call to Redis is in flight, the releases that
//! follow wait here and then go out together, as one call of release.lua (which takes many
//! leases and does a holder's bookkeeping once per call, not once per lease). Under load a
//! release costs a fraction of a script call; a release with nothing in flight goes at once.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::backend::{batches, Stores};
use crate::errors::{CoreError, CoreResult};
use crate::keys::LineKeys;
use crate::lease::{LeaseRecord, Store};
use crate::runtime;
use crate::sync::lock;

#[derive(Default)]
pub struct ReleaseQueue {
    queue: Mutex<Queue>,
}

#[derive(Default)]
struct Queue {
    /// A call is in flight, or about to be: the releases that come meanwhile wait for it.
    sending: bool,
    waiting: Vec<Waiting>,
}

struct Waiting {
    record: Arc<LeaseRecord>,
    /// Whether the store still had the lease, or why the call failed.
    done: oneshot::Sender<CoreResult<bool>>,
}

impl ReleaseQueue {
    /// Removes `record` from Redis along with the releases queued meanwhile; resolves to whether
    /// Redis still had it.
    pub async fn release(
        self: &Arc<Self>,
        stores: &Arc<Stores>,
        line: Option<&LineKeys>,
        record: Arc<LeaseRecord>,
    ) -> CoreResult<bool> {
        let (done, outcome) = oneshot::channel();
        let first = {
            let mut queue = lock(&self.queue);
            queue.waiting.push(Waiting { record, done });
            !std::mem::replace(&mut queue.sending, true)
        };
        if first {
            self.send_next(stores, line).await;
        }
        outcome
            .await
            .unwrap_or_else(|_| Err(CoreError::Panic("a release was dropped unanswered".into())))
    }

    /// Sends what waits (one call; more only past `BATCH_UNITS` members), then hands what came
    /// meanwhile to a task of its own, so that the caller who sent this one gets its answer now,
    /// however busy the queue stays.
    async fn send_next(self: &Arc<Self>, stores: &Arc<Stores>, line: Option<&LineKeys>) {
        let one_slot = stores.get(Store::Main).is_cluster();
        let batch: Vec<Waiting> = {
            let mut queue = lock(&self.queue);
            if queue.waiting.is_empty() {
                queue.sending = false;
                return;
            }
            let tag = queue.waiting[0].record.hash_tag().to_owned();
            // A cluster runs a script on one slot: the first one's tag goes now, others next.
            let (now, later): (Vec<_>, Vec<_>) = std::mem::take(&mut queue.waiting)
                .into_iter()
                .partition(|w| !one_slot || w.record.hash_tag() == tag);
            queue.waiting = later;
            now
        };
        let leases: Vec<_> = batch.iter().map(|w| Arc::clone(&w.record)).collect();
        let mut answers = batch.into_iter().map(|w| w.done);
        for leases in batches(&leases, false) {
            let outcome = stores.call(Store::Main, |main| main.release(leases, line)).await;
            for (i, done) in answers.by_ref().take(leases.len()).enumerate() {
                let _ = done.send(outcome.as_ref().map(|present| present[i]).map_err(Clone::clone));
            }
        }
        let mut queue = lock(&self.queue);
        if queue.waiting.is_empty() {
            queue.sending = false;
        } else {
            drop(queue);
            self.send_rest(stores, line);
        }
    }

    fn send_rest(self: &Arc<Self>, stores: &Arc<Stores>, line: Option<&LineKeys>) {
        let (queue, stores, line) = (Arc::clone(self), Arc::clone(stores), line.cloned());
        let rest: Pin<Box<dyn Future<Output = ()> + Send>> =
            Box::pin(async move { queue.send_next(&stores, line.as_ref()).await });
        runtime::handle().spawn(rest);
    }
}
