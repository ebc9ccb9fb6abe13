//! Group commit of script calls: while a call is in flight, the requests that follow wait, then
//! go out together in one call (release.lua takes many leases, acquire.lua decides many
//! acquires in their order), so the per-call and per-holder work of a script is paid once per
//! batch. A request with nothing in flight goes at once: no added latency when idle.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::errors::{CoreError, CoreResult};
use crate::runtime;
use crate::sync::lock;

/// How one kind of request goes out in batches.
pub trait Batches: Send + Sync + 'static {
    type Request: Send + 'static;
    type Answer: Send + 'static;

    /// Whether two requests may share a call (Redis Cluster runs a script on one slot).
    fn together(&self, first: &Self::Request, other: &Self::Request) -> bool;

    /// Sends the requests, in as few calls as the sender's limits allow; one answer per request,
    /// in order.
    fn send(
        &self,
        requests: Vec<Self::Request>,
    ) -> impl Future<Output = Vec<CoreResult<Self::Answer>>> + Send;
}

pub struct GroupCommit<B: Batches> {
    batches: B,
    queue: Mutex<Queue<B>>,
}

struct Queue<B: Batches> {
    /// A call is in flight, or about to be: requests that come meanwhile wait for the next.
    sending: bool,
    waiting: Vec<Waiting<B>>,
}

struct Waiting<B: Batches> {
    request: B::Request,
    answer: oneshot::Sender<CoreResult<B::Answer>>,
}

impl<B: Batches> GroupCommit<B> {
    pub fn new(batches: B) -> Self {
        GroupCommit {
            batches,
            queue: Mutex::new(Queue {
                sending: false,
                waiting: Vec::new(),
            }),
        }
    }

    /// Sends `request` with those that come while a call is in flight; resolves to its answer.
    /// A request whose caller went away before its batch left is not sent.
    pub async fn submit(self: &Arc<Self>, request: B::Request) -> CoreResult<B::Answer> {
        let (answer, answered) = oneshot::channel();
        let first = {
            let mut queue = lock(&self.queue);
            queue.waiting.push(Waiting { request, answer });
            !std::mem::replace(&mut queue.sending, true)
        };
        if first {
            // Boxed: the acquire future that awaits this would otherwise nest the whole call's
            // state, deeper than the compiler lays out in a release build.
            Box::pin(self.send_next()).await;
        }
        answered
            .await
            .unwrap_or_else(|_| Err(CoreError::Panic("a batched call was dropped unanswered".into())))
    }

    /// Sends what waits (those that may share a call with the first), then hands what is left
    /// or came meanwhile to a task of its own, so the caller who sent this batch has its answer
    /// now however busy the queue stays.
    async fn send_next(self: &Arc<Self>) {
        let batch: Vec<Waiting<B>> = {
            let mut queue = lock(&self.queue);
            let mut waiting = std::mem::take(&mut queue.waiting)
                .into_iter()
                .filter(|w| !w.answer.is_closed());
            let Some(first) = waiting.next() else {
                queue.sending = false;
                return;
            };
            let (together, later): (Vec<_>, Vec<_>) =
                waiting.partition(|w| self.batches.together(&first.request, &w.request));
            queue.waiting = later;
            std::iter::once(first).chain(together).collect()
        };
        let (requests, answers): (Vec<_>, Vec<_>) = batch.into_iter().map(|w| (w.request, w.answer)).unzip();
        let outcomes = self.batches.send(requests).await;
        for (answer, outcome) in answers.into_iter().zip(outcomes) {
            let _ = answer.send(outcome);
        }
        let mut queue = lock(&self.queue);
        if queue.waiting.is_empty() {
            queue.sending = false;
        } else {
            drop(queue);
            self.send_rest();
        }
    }

    fn send_rest(self: &Arc<Self>) {
        let rest = Arc::clone(self);
        let rest: Pin<Box<dyn Future<Output = ()> + Send>> = Box::pin(async move { rest.send_next().await });
        runtime::handle().spawn(rest);
    }
}
