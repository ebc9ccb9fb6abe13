//! One renewal loop per manager. Every `renew_every` it keeps all held leases alive (Redis: one
//! keep-alive per hash tag, many tags per call); between rounds it wakes at the earliest deadline
//! of a group of leases kept alive together, so a lease whose keep-alive has not succeeded by the
//! time the store expires it is reported lost at that moment, even while a call is still hanging
//! on a dead connection. It holds the manager weakly and stops on
//! `aclose()` or when the manager is dropped.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::{interval, sleep_until, Instant, MissedTickBehavior};

use crate::lease::monotonic_ms;
use crate::manager::ManagerShared;
use crate::runtime;

pub fn start(shared: &Arc<ManagerShared>) -> JoinHandle<()> {
    let manager = Arc::downgrade(shared);
    let stop = shared.stop_signal();
    let period = shared.config.renew_period();
    runtime::handle().spawn(async move {
        let mut ticker = interval(period);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        ticker.tick().await;
        // A round runs on its own, so a slow Redis delays neither deadlines nor shutdown.
        let mut round: Option<JoinHandle<()>> = None;
        // Held strongly only while working, so dropping the manager ends the loop.
        while let Some(next_deadline) = manager.upgrade().map(|shared| shared.expire_overdue()) {
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
                    let Some(shared) = manager.upgrade() else { break };
                    if round.as_ref().is_none_or(JoinHandle::is_finished) {
                        round = Some(tokio::spawn(async move { shared.renew_held().await }));
                    }
                }
            }
        }
        if let Some(round) = round {
            round.abort();
        }
    })
}
