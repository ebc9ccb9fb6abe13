//! One renewal loop per manager: every `renew_every` it renews all held leases in batched
//! script calls. It holds the manager weakly and stops on `aclose()` or when the manager is dropped.

use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio::time::{interval, MissedTickBehavior};

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
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = ticker.tick() => {}
            }
            let Some(shared) = manager.upgrade() else { return };
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = shared.renew_held() => {}
            }
        }
    })
}
