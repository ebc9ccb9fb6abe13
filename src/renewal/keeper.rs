//! One renewal loop per manager. Every `renew_every` it runs a round (`round.rs`); between
//! rounds it wakes at the earliest deadline of a group of leases kept alive together, so a lease
//! whose keep-alive has not succeeded by the time the store expires it is reported lost at that
//! moment (`sweep.rs`), even while a call is still hanging on a dead connection. It holds the
//! leases weakly and stops on `close()` or when they are dropped.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::{interval, sleep_until, Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use super::Leases;
use crate::lease::monotonic_ms;
use crate::runtime;
use crate::sync::lock;

/// The renewal loop of one manager, and the process it runs in.
#[derive(Default)]
pub(super) struct Keeper {
    /// Stops the loop (`close()`, or the leases dropped).
    pub stop: CancellationToken,
    pub task: Mutex<Option<JoinHandle<()>>>,
    /// The process that runs the renewal loop (0: not started). A forked child's copies of the
    /// leases belong to it: the child never releases them.
    owner_pid: AtomicU32,
}

impl Leases {
    /// Starts the renewal loop (once, by the process that uses the manager).
    pub fn start_keeper(self: &Arc<Self>) {
        self.keeper
            .owner_pid
            .store(runtime::process_id(), Ordering::Release);
        *lock(&self.keeper.task) = Some(start(self));
    }

    /// True in a process forked from the one that holds these leases.
    pub(super) fn in_forked_child(&self) -> bool {
        let owner = self.keeper.owner_pid.load(Ordering::Acquire);
        owner != 0 && owner != runtime::process_id()
    }
}

fn start(leases: &Arc<Leases>) -> JoinHandle<()> {
    let weak = Arc::downgrade(leases);
    let stop = leases.keeper.stop.clone();
    let period = leases.period;
    runtime::handle().spawn(async move {
        let mut ticker = interval(period);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        ticker.tick().await;
        // A round runs on its own, so a slow Redis delays neither deadlines nor shutdown.
        let mut round: Option<JoinHandle<()>> = None;
        // Held strongly only while working, so dropping the leases ends the loop.
        while let Some(next_deadline) = weak.upgrade().map(|leases| leases.expire_overdue()) {
            let next_deadline = next_deadline.map(|deadline| {
                Instant::now() + Duration::from_millis(deadline.saturating_sub(monotonic_ms()))
            });
            let deadline_passes = async {
                match next_deadline {
                    Some(at) => sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = deadline_passes => {}
                _ = ticker.tick() => {
                    let Some(leases) = weak.upgrade() else { break };
                    if round.as_ref().is_none_or(JoinHandle::is_finished) {
                        round = Some(tokio::spawn(async move { leases.renew_held().await }));
                    }
                }
            }
        }
        if let Some(round) = round {
            round.abort();
        }
    })
}
