//! The global pool's slots this process leases in slabs (`LeaseConfig(lease_global_slots=True)`).
//! A slab is a lease of the global pool of a few slots, held and renewed as every lease of this
//! process is; a user's stream takes a free slot of one here, with no call to the global pool's
//! shard, and then its own pool in its own tag (`slab_admission.rs`). A stream that finds no free slot takes
//! a slab, its own slot among them, sized by the slots this process uses. A slab that serves no
//! stream goes back: at once while another such slab is kept here or the pool was found full,
//! else after `IDLE`. A slab found lost loses the streams it serves.
//!
//! The protocol model (`model/src/leased_slots.rs`) checks the two steps that keep every stream
//! on a slot the store counts: a slab stops serving in the step that decides to give it back,
//! and its loss ends its streams.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::watch;

use crate::keys::Pool;
use crate::lease::{monotonic_ms, LeaseRecord, Store};
use crate::renewal::{HeldLease, Leases};
use crate::runtime;
use crate::sync::lock;

/// A slab that serves no stream goes back after this long without one; idle slabs are looked
/// for this often.
const IDLE: Duration = Duration::from_secs(1);
const SWEEP_EVERY: Duration = Duration::from_millis(250);
/// The most slots one slab takes, and the share of the cap it takes at most (a tenth).
const MOST_PER_SLAB: u32 = 16;
const MOST_OF_CAP: u64 = 10;
/// A slab takes a quarter of the slots this process uses (more streams, bigger slabs).
const SHARE_OF_USED: u32 = 4;

/// The slabs of one manager, and the state of its takes.
pub struct Slabs {
    /// The global pool, whose slots the slabs take.
    pub global: Pool,
    most: u32,
    state: Mutex<SlabsState>,
    /// Moved on when a take that others wait for ends.
    takes: watch::Sender<u64>,
    leases: Arc<Leases>,
}

#[derive(Default)]
struct SlabsState {
    slabs: Vec<Slab>,
    /// The next slab's or seat's id.
    next_id: u64,
    /// A take of more slots than its stream's is in flight: the streams that find no free
    /// slot wait for it instead of each sending one.
    taking: bool,
    /// When the global pool last refused a take (`monotonic_ms`): for `IDLE` after it, takes
    /// ask for their stream's slots only, and empty slabs go back at once.
    refused_at_ms: Option<u64>,
    /// The sweeper of idle slabs runs: one task, while a slab is idle.
    sweeping: bool,
}

struct Slab {
    id: u64,
    /// Its lease (taken out to give it back).
    lease: Option<HeldLease>,
    slots: u32,
    used: u32,
    /// The streams it serves, by seat: their leases are lost with it.
    serving: Vec<(u64, Weak<LeaseRecord>, u32)>,
    /// Since when it serves none (`monotonic_ms`).
    idle_since_ms: Option<u64>,
    /// Granted by the local floor while Redis was down: it serves its first stream only.
    servable: bool,
}

impl SlabsState {
    /// Whether the global pool refused this process a take within `IDLE` of `now_ms`.
    fn pool_was_full(&self, now_ms: u64) -> bool {
        self.refused_at_ms
            .is_some_and(|at| now_ms < at + IDLE.as_millis() as u64)
    }
}

impl Slab {
    /// Whether a new stream may start on it: a slab of the main store, not found lost (its
    /// streams are lost from a task of their own, a moment later).
    fn serves(&self) -> bool {
        self.servable && self.lease.as_ref().is_some_and(|lease| !lease.record().is_lost())
    }
}

/// What a stream of `weight` slots finds.
pub enum Serving {
    Served(Slot),
    /// A take is in flight: look again when it ends.
    Wait(watch::Receiver<u64>),
    /// Take a slab of this many slots (others wait for a take of more than the stream's).
    Take(u32),
}

/// A stream's slots in a slab (its seat there), given back when dropped.
pub struct Slot {
    slabs: Weak<Slabs>,
    slab: u64,
    seat: u64,
    weight: u32,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(slabs) = self.slabs.upgrade() {
            slabs.returned(self.slab, self.seat, self.weight);
        }
    }
}

/// Ends a shared take however its acquire ends (cancelled included), so the others look again.
pub(super) struct TakeTurn<'a>(pub &'a Slabs, pub bool);

impl Drop for TakeTurn<'_> {
    fn drop(&mut self) {
        if self.1 {
            lock(&self.0.state).taking = false;
            self.0.takes.send_modify(|n| *n += 1);
        }
    }
}

impl Slabs {
    pub fn new(global: Pool, leases: Arc<Leases>) -> Arc<Self> {
        let most = (global.capacity / MOST_OF_CAP).clamp(1, u64::from(MOST_PER_SLAB)) as u32;
        Arc::new(Slabs {
            global,
            most,
            state: Mutex::default(),
            takes: watch::Sender::new(0),
            leases,
        })
    }

    /// In one locked step: a free slot for `record` (in the fullest slab that has room, so the
    /// emptiest drain and go back), or a take in flight to wait for, or the size of the slab
    /// to take. `waits`: the stream may wait in line, so its take asks for its own slots only.
    pub fn serve(self: &Arc<Self>, record: &Arc<LeaseRecord>, waits: bool) -> Serving {
        let weight = record.weight;
        let mut state = lock(&self.state);
        let fullest = (state.slabs.iter().enumerate())
            .filter(|(_, slab)| slab.serves() && slab.slots - slab.used >= weight)
            .max_by_key(|(_, slab)| slab.used)
            .map(|(at, _)| at);
        if let Some(at) = fullest {
            return Serving::Served(self.seat(&mut state, at, record));
        }
        if state.taking {
            return Serving::Wait(self.takes.subscribe());
        }
        if waits || state.pool_was_full(monotonic_ms()) {
            return Serving::Take(weight);
        }
        let used: u32 = state.slabs.iter().map(|slab| slab.used).sum();
        let slots = (used / SHARE_OF_USED).min(self.most).max(weight);
        state.taking = slots > weight;
        Serving::Take(slots)
    }

    /// A slab taken for `record`, whose slots it serves first.
    pub(super) fn add(self: &Arc<Self>, lease: HeldLease, record: &Arc<LeaseRecord>) -> Slot {
        let servable = lease.record().store == Store::Main;
        let slots = lease.record().weight;
        let mut state = lock(&self.state);
        let id = state.next_id;
        state.next_id += 1;
        let weak = Arc::downgrade(self);
        lease.when_lost(Box::new(move || {
            // Told from wherever the loss was found: its streams are lost from a task of
            // their own, outside that place's locks.
            runtime::handle().spawn(async move {
                if let Some(slabs) = weak.upgrade() {
                    slabs.lost(id);
                }
            });
        }));
        state.slabs.push(Slab {
            id,
            lease: Some(lease),
            slots,
            used: 0,
            serving: Vec::new(),
            idle_since_ms: None,
            servable,
        });
        let at = state.slabs.len() - 1;
        self.seat(&mut state, at, record)
    }

    /// `record`'s slots in slab `at`: a seat there.
    fn seat(self: &Arc<Self>, state: &mut SlabsState, at: usize, record: &Arc<LeaseRecord>) -> Slot {
        let seat = state.next_id;
        state.next_id += 1;
        let slab = &mut state.slabs[at];
        slab.used += record.weight;
        slab.idle_since_ms = None;
        slab.serving.push((seat, Arc::downgrade(record), record.weight));
        Slot {
            slabs: Arc::downgrade(self),
            slab: slab.id,
            seat,
            weight: record.weight,
        }
    }

    /// `slot` serves `record` (the lease granted on it) from now on: lost with its slab.
    pub(super) fn serve_as(&self, slot: &Slot, record: &Arc<LeaseRecord>) {
        let mut state = lock(&self.state);
        let Some(slab) = state.slabs.iter_mut().find(|slab| slab.id == slot.slab) else {
            drop(state);
            // Lost meanwhile (its loss looked for the first record): so is this lease.
            self.leases.lose(record, true);
            return;
        };
        if let Some(served) = slab.serving.iter_mut().find(|(seat, _, _)| *seat == slot.seat) {
            served.1 = Arc::downgrade(record);
        }
    }

    /// The global pool refused a take: for `IDLE`, takes ask for their stream's slots only, and
    /// empty slabs go back at once (the room is what others wait for).
    pub(super) fn refused(&self) {
        lock(&self.state).refused_at_ms = Some(monotonic_ms());
    }

    /// A stream's slots come back; its slab, left serving none, goes back at once when another
    /// empty one is kept or the pool was found full, else once idle for `IDLE`.
    fn returned(self: &Arc<Self>, id: u64, seat: u64, weight: u32) {
        let mut state = lock(&self.state);
        let now = monotonic_ms();
        let pool_was_full = state.pool_was_full(now);
        let others_empty = state
            .slabs
            .iter()
            .filter(|slab| slab.id != id && slab.used == 0)
            .count();
        let Some(at) = state.slabs.iter().position(|slab| slab.id == id) else {
            return; // lost, or given back
        };
        let slab = &mut state.slabs[at];
        slab.used -= weight;
        slab.serving.retain(|(served, _, _)| *served != seat);
        if slab.used > 0 {
            return;
        }
        if !slab.servable || pool_was_full || others_empty > 0 {
            let slab = state.slabs.swap_remove(at);
            drop(state);
            give_back(slab);
            return;
        }
        slab.idle_since_ms = Some(now);
        if !std::mem::replace(&mut state.sweeping, true) {
            let weak = Arc::downgrade(self);
            runtime::handle().spawn(async move {
                loop {
                    tokio::time::sleep(SWEEP_EVERY).await;
                    match weak.upgrade() {
                        Some(slabs) if slabs.give_back_idle() => {}
                        _ => break,
                    }
                }
            });
        }
    }

    /// Gives back the slabs that served no stream for `IDLE`; false once none is idle (the
    /// sweeper stops).
    fn give_back_idle(&self) -> bool {
        let due = monotonic_ms().saturating_sub(IDLE.as_millis() as u64);
        let mut state = lock(&self.state);
        let (idle, kept): (Vec<Slab>, Vec<Slab>) = std::mem::take(&mut state.slabs)
            .into_iter()
            .partition(|slab| slab.idle_since_ms.is_some_and(|since| since <= due));
        state.slabs = kept;
        state.sweeping = state.slabs.iter().any(|slab| slab.idle_since_ms.is_some());
        let sweeping = state.sweeping;
        drop(state);
        idle.into_iter().for_each(give_back);
        sweeping
    }

    /// Slab `id` was lost (its keep-alive found it gone with no room, its deadline passed, a
    /// drain revoked it): so are the streams it serves.
    fn lost(&self, id: u64) {
        let mut state = lock(&self.state);
        let Some(at) = state.slabs.iter().position(|slab| slab.id == id) else {
            return;
        };
        let slab = state.slabs.swap_remove(at);
        drop(state);
        for (_, record, _) in &slab.serving {
            if let Some(record) = record.upgrade() {
                self.leases.lose(&record, true);
            }
        }
        give_back(slab);
    }
}

/// Releases a slab's lease, from a task of its own: a stream's slots come back from whatever
/// ends it, some of which hold the renewal's locks.
fn give_back(mut slab: Slab) {
    if let Some(lease) = slab.lease.take() {
        runtime::handle().spawn(async move { drop(lease) });
    }
}
