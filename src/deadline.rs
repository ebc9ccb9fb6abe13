//! Deadlines for Redis calls without a tokio timer per call.
//!
//! `tokio::time::timeout` registers a timer per call, and registering one that falls before the
//! timer driver's next planned wake-up writes to the runtime's eventfd, even from the runtime's
//! own thread: with nothing else pending, every call did (twice, with redis-rs's own response
//! timeout), two system calls and an extra turn of the worker's poll per call, which on a
//! sandboxed machine cost more than the call's own work. Here the calls of one link share one
//! watchdog task: a call notes its deadline in a list ordered by deadline (every call of a link
//! has the same limit, so by arrival), and the watchdog sleeps until the earliest one. A new
//! call's deadline comes after every earlier one, so it only re-arms the watchdog when the list
//! was empty at its last look: a timer per `limit` under steady load, none when idle.

use std::collections::BTreeMap;
use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio::task::AbortHandle;

use crate::runtime;
use crate::sync::lock;

pub struct Deadlines {
    limit: Duration,
    shared: Arc<Shared>,
    /// Started on the first call; stopped when the link goes.
    watchdog: OnceLock<AbortHandle>,
}

struct Shared {
    calls: Mutex<Calls>,
    /// Wakes the watchdog when a call comes while it waits for one.
    call_came: Notify,
}

struct Calls {
    /// The calls in flight by arrival, which is also by deadline.
    waiting: BTreeMap<u64, Waiting>,
    next_id: u64,
    /// The watchdog sleeps until a deadline (false: it waits for a call).
    armed: bool,
}

struct Waiting {
    deadline: Instant,
    /// Taken when the deadline passes, so a late call is woken once.
    waker: Option<Waker>,
}

impl Deadlines {
    pub fn new(limit: Duration) -> Self {
        Deadlines {
            limit,
            shared: Arc::new(Shared {
                calls: Mutex::new(Calls {
                    waiting: BTreeMap::new(),
                    next_id: 0,
                    armed: false,
                }),
                call_came: Notify::new(),
            }),
            watchdog: OnceLock::new(),
        }
    }

    /// How long a call may take.
    pub fn limit(&self) -> Duration {
        self.limit
    }

    /// `call`'s output, or None if it did not finish within the limit (it is then dropped).
    pub async fn within<F: Future>(&self, call: F) -> Option<F::Output> {
        self.watchdog.get_or_init(|| {
            runtime::handle()
                .spawn(watch(Arc::clone(&self.shared)))
                .abort_handle()
        });
        let ticket = self.enter();
        let mut call = pin!(call);
        poll_fn(|cx| {
            if let Poll::Ready(output) = call.as_mut().poll(cx) {
                return Poll::Ready(Some(output));
            }
            if Instant::now() >= ticket.deadline {
                return Poll::Ready(None);
            }
            ticket.wake_on_deadline(cx.waker());
            Poll::Pending
        })
        .await
    }

    fn enter(&self) -> Ticket<'_> {
        let (id, deadline, rearm) = {
            let mut calls = lock(&self.shared.calls);
            // Taken under the lock, so deadlines grow with ids.
            let deadline = Instant::now() + self.limit;
            let id = calls.next_id;
            calls.next_id += 1;
            calls.waiting.insert(
                id,
                Waiting {
                    deadline,
                    waker: None,
                },
            );
            (id, deadline, !std::mem::replace(&mut calls.armed, true))
        };
        if rearm {
            self.shared.call_came.notify_one();
        }
        Ticket {
            shared: &self.shared,
            id,
            deadline,
        }
    }
}

impl Drop for Deadlines {
    fn drop(&mut self) {
        if let Some(watchdog) = self.watchdog.get() {
            watchdog.abort();
        }
    }
}

/// A call's place in the list, left when the call ends however it ends.
struct Ticket<'a> {
    shared: &'a Shared,
    id: u64,
    deadline: Instant,
}

impl Ticket<'_> {
    fn wake_on_deadline(&self, waker: &Waker) {
        let mut calls = lock(&self.shared.calls);
        if let Some(waiting) = calls.waiting.get_mut(&self.id) {
            match &waiting.waker {
                Some(known) if known.will_wake(waker) => {}
                _ => waiting.waker = Some(waker.clone()),
            }
        }
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        lock(&self.shared.calls).waiting.remove(&self.id);
    }
}

impl Shared {
    /// Wakes the calls whose deadline passed; the next deadline to watch for, if any call is
    /// still within its limit.
    fn expire(&self, now: Instant) -> Option<Instant> {
        let mut late = Vec::new();
        let next = {
            let mut calls = lock(&self.calls);
            let mut next = None;
            for waiting in calls.waiting.values_mut() {
                if waiting.deadline > now {
                    next = Some(waiting.deadline);
                    break;
                }
                late.extend(waiting.waker.take());
            }
            calls.armed = next.is_some();
            next
        };
        late.into_iter().for_each(Waker::wake); // outside the lock: a waker may run code
        next
    }
}

async fn watch(shared: Arc<Shared>) {
    loop {
        let call_came = shared.call_came.notified();
        match shared.expire(Instant::now()) {
            Some(next) => tokio::time::sleep_until(next.into()).await,
            None => call_came.await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run<F: Future>(future: F) -> F::Output {
        runtime::handle().block_on(future)
    }

    #[test]
    fn a_call_within_its_limit_gives_its_output() {
        let deadlines = Deadlines::new(Duration::from_secs(5));
        assert_eq!(run(deadlines.within(async { 7 })), Some(7));
        assert!(lock(&deadlines.shared.calls).waiting.is_empty());
    }

    #[test]
    fn a_call_past_its_limit_is_dropped_and_the_next_is_watched_again() {
        let deadlines = Deadlines::new(Duration::from_millis(50));
        let started = Instant::now();
        assert_eq!(run(deadlines.within(std::future::pending::<()>())), None);
        assert!(started.elapsed() >= Duration::from_millis(50));
        // The watchdog found nothing left and waits for a call: the next one re-arms it.
        assert_eq!(run(deadlines.within(std::future::pending::<()>())), None);
        assert_eq!(
            run(deadlines.within(async { tokio::time::sleep(Duration::from_millis(1)).await })),
            Some(())
        );
        assert!(lock(&deadlines.shared.calls).waiting.is_empty());
    }

    #[test]
    fn calls_in_flight_together_each_end_at_their_own_deadline() {
        let deadlines = Arc::new(Deadlines::new(Duration::from_millis(80)));
        let outcomes = run(async {
            let slow = deadlines.within(std::future::pending::<()>());
            let quick = deadlines.within(tokio::time::sleep(Duration::from_millis(5)));
            tokio::join!(slow, quick)
        });
        assert_eq!(outcomes, (None, Some(())));
    }

    /// Calls that come and go at random, some that never answer: every one ends (the watchdog
    /// is re-armed whatever the order), and none that answers well within the limit is cut.
    #[test]
    fn no_call_is_left_hanging_whatever_the_interleaving() {
        let deadlines = Arc::new(Deadlines::new(Duration::from_millis(40)));
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let calls: Vec<_> = (0..300)
            .map(|_| {
                let start_after = Duration::from_millis(next() % 120);
                // None: never answers; else answers after that long (quick ones well within).
                let answers_after = match next() % 3 {
                    0 => None,
                    1 => Some(Duration::from_millis(next() % 5)),
                    _ => Some(Duration::from_millis(next() % 80)),
                };
                let deadlines = Arc::clone(&deadlines);
                runtime::handle().spawn(async move {
                    tokio::time::sleep(start_after).await;
                    let outcome = deadlines
                        .within(async move {
                            match answers_after {
                                Some(after) => tokio::time::sleep(after).await,
                                None => std::future::pending().await,
                            }
                        })
                        .await;
                    (answers_after, outcome)
                })
            })
            .collect();
        let ended = run(async {
            tokio::time::timeout(Duration::from_secs(30), futures_util::future::join_all(calls)).await
        })
        .expect("every call ends, answered or cut at its deadline");
        for (answers_after, outcome) in ended.into_iter().map(Result::unwrap) {
            match answers_after {
                None => assert_eq!(outcome, None),
                Some(after) if after < Duration::from_millis(5) => assert_eq!(outcome, Some(())),
                Some(_) => {}
            }
        }
        assert!(lock(&deadlines.shared.calls).waiting.is_empty());
    }
}
