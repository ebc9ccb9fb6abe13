//! Group commit of script calls: while a call is in flight, the requests that follow wait, then
//! go out together in one call (release.lua takes many leases, acquire.lua decides many
//! acquires in their order), so the per-call and per-holder work of a script is paid once per
//! batch. A request with nothing in flight goes at once (one task hop away): nothing waits
//! when idle.

use std::future::Future;
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
    fn send(&self, requests: &[Self::Request]) -> impl Future<Output = Vec<CoreResult<Self::Answer>>> + Send;

    /// Undoes what a request did whose caller went away while its call was in flight (a
    /// cancelled waiter): nobody else will.
    fn unanswered(&self, request: Self::Request, answer: Self::Answer) -> impl Future<Output = ()> + Send;
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

/// A request's answer, and the request back, so that whoever finds its caller gone can undo it.
type Answered<B> = (<B as Batches>::Request, CoreResult<<B as Batches>::Answer>);

struct Waiting<B: Batches> {
    request: B::Request,
    answer: oneshot::Sender<Answered<B>>,
}

/// A caller's wait for its answer. Dropped unanswered (the caller was cancelled), it closes the
/// channel, so the sender undoes the request; dropped with an answer it did not take (cancelled
/// between the answer and its next turn), it undoes the request itself.
struct Awaiting<B: Batches> {
    commit: Arc<GroupCommit<B>>,
    answered: oneshot::Receiver<Answered<B>>,
}

impl<B: Batches> Drop for Awaiting<B> {
    fn drop(&mut self) {
        self.answered.close();
        if let Ok((request, Ok(answer))) = self.answered.try_recv() {
            let commit = Arc::clone(&self.commit);
            runtime::handle().spawn(async move { commit.batches.unanswered(request, answer).await });
        }
    }
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
        let mut awaiting = Awaiting {
            commit: Arc::clone(self),
            answered,
        };
        let first = {
            let mut queue = lock(&self.queue);
            queue.waiting.push(Waiting { request, answer });
            !std::mem::replace(&mut queue.sending, true)
        };
        if first {
            // The calls go from a task of their own: a caller cancelled mid-call (a waiter whose
            // client left) must neither strand the queue nor drop the answers of the others.
            runtime::handle().spawn(Arc::clone(self).send_all());
        }
        match (&mut awaiting.answered).await {
            Ok((_, answer)) => answer,
            Err(_) => Err(CoreError::Panic("a batched call was dropped unanswered".into())),
        }
    }

    /// Sends what waits, a batch per call (those that may share a call with the first), until
    /// nothing does; each batch's callers get their answers as soon as its call returns.
    async fn send_all(self: Arc<Self>) {
        loop {
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
            let (requests, answers): (Vec<_>, Vec<_>) =
                batch.into_iter().map(|w| (w.request, w.answer)).unzip();
            let outcomes = self.batches.send(&requests).await;
            for ((request, answer), outcome) in requests.into_iter().zip(answers).zip(outcomes) {
                if let Err((request, Ok(answer))) = answer.send((request, outcome)) {
                    self.batches.unanswered(request, answer).await;
                }
            }
        }
    }
}
