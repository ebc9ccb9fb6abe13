//! An acquire under `lease_global_slots`: a slot of a slab of this process first (`slabs.rs`),
//! taken now if none is free, then the user's own pool in its own tag (`admit.rs`).

use std::sync::Arc;
use std::time::Duration;

use super::grant::Granted;
use super::slabs::{Serving, Slabs, Slot, TakeTurn};
use super::Manager;
use crate::budget::BudgetRequest;
use crate::errors::{CoreError, CoreResult};
use crate::lease::{LeaseRecord, Store};
use crate::rate::RateCheck;
use crate::renewal::HeldLease;

impl Manager {
    /// Admits a user's stream on a slot of a slab (taken first: a stream refused by its own
    /// pool gives it back to the slab, for the next stream here), then in its own tag.
    pub(super) async fn admit_on_a_slot(
        self: Arc<Self>,
        slabs: Arc<Slabs>,
        record: Arc<LeaseRecord>,
        rates: RateCheck,
        budget: Option<BudgetRequest>,
        (wait, priority): (Duration, u8),
        line_limits: Vec<u64>,
    ) -> CoreResult<Granted> {
        let slot = self.global_slot(&slabs, &record, wait, priority).await?;
        // Held here until the grant: the lease granted may be another record (the local
        // floor's, while Redis does not answer), which keeps the slot from then on.
        let granted = self
            .admit(record, rates, budget, wait, priority, line_limits)
            .await?;
        slabs.serve_as(&slot, granted.lease());
        granted.lease().keep_until_ended(slot);
        Ok(granted)
    }

    /// A slot of the global pool for `record`, from a slab of this process: a free one, or one
    /// of a slab taken now (waiting in the global pool's line up to `wait`).
    pub(super) async fn global_slot(
        self: &Arc<Self>,
        slabs: &Arc<Slabs>,
        record: &Arc<LeaseRecord>,
        wait: Duration,
        priority: u8,
    ) -> CoreResult<Slot> {
        loop {
            let mut slots = match slabs.serve(record, !wait.is_zero()) {
                Serving::Served(slot) => return Ok(slot),
                Serving::Wait(mut taken) => {
                    let _ = taken.changed().await;
                    continue;
                }
                Serving::Take(slots) => slots,
            };
            let _turn = TakeTurn(slabs, slots > record.weight);
            loop {
                match self.take_slab(slabs, slots, wait, priority).await {
                    Ok(lease) => return Ok(slabs.add(lease, record)),
                    Err(CoreError::Rejected(refusal)) => {
                        slabs.refused();
                        if slots == record.weight {
                            return Err(CoreError::Rejected(refusal));
                        }
                        slots = record.weight; // room for its own slots, maybe
                    }
                    Err(other) => return Err(other),
                }
            }
        }
    }

    /// A slab of `slots` slots: an acquire of the global pool alone, held here.
    async fn take_slab(
        self: &Arc<Self>,
        slabs: &Slabs,
        slots: u32,
        wait: Duration,
        priority: u8,
    ) -> CoreResult<HeldLease> {
        let record = Arc::new(LeaseRecord::new(vec![slabs.global.clone()], slots, Store::Main));
        let admitted = Arc::clone(self).admit(
            record,
            RateCheck::default(),
            None,
            wait,
            priority,
            vec![self.config.max_waiting],
        );
        let mut granted: Granted = Box::pin(admitted).await?;
        let lease = granted.hold()?;
        granted.delivered();
        Ok(lease)
    }
}
