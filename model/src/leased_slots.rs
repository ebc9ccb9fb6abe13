//! A model of a global pool's slots leased to processes in slabs, checked exhaustively:
//! processes serve streams from slabs, each slab a lease of the global pool of a few slots
//! (one acquire of that pool, held by the process's holder entry), so a stream's start costs
//! the global pool no call while its process holds a free slot. A process takes a slab (a call
//! the store grants if the pool has room for all of it), serves streams from its free slots,
//! gives back a slab none of its streams uses (a release), and at each keep-alive checks that
//! the store still counts its slabs: a slab a failover lost is taken back where the pool has
//! room, else lost with every stream it serves. A process may crash (its streams end; its slabs
//! stay counted until the store reaps its expired holder), and the store may lose its last
//! write once (a failover to a replica that had not seen it).
//!
//! Properties: the store never counts more than the cap; every stream is served from a slab
//! the store counts, but for a slab a failover lost, until its process's next keep-alive; no
//! slab serves more streams than its slots. Each safeguard has a switch (`LeasedSlotsConfig`),
//! and the tests check that turning it off breaks the property it guards.

use stateright::{Model, Property};

/// What a model run covers.
#[derive(Clone, Debug)]
pub struct LeasedSlotsConfig {
    pub processes: usize,
    /// Streams per process in a run.
    pub streams: u8,
    /// The global pool's capacity, and the most slots a slab takes.
    pub cap: u8,
    pub most_per_slab: u8,
    /// Safeguards: a slab given back stops serving in the step that decides to give it back
    /// (not when the release is answered); a slab found lost ends the streams it serves.
    pub withdrawn_when_given_back: bool,
    pub loss_ends_streams: bool,
    pub failover: bool,
}

impl LeasedSlotsConfig {
    /// Two processes of two streams each, a cap of 3, slabs of 1 or 2 slots, every safeguard
    /// on.
    pub fn small() -> Self {
        LeasedSlotsConfig {
            processes: 2,
            streams: 2,
            cap: 3,
            most_per_slab: 2,
            withdrawn_when_given_back: true,
            loss_ends_streams: true,
            failover: true,
        }
    }
}

/// A slab in its process: taken (its call sent, not answered), held, given back (its release
/// sent, not run), lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SlabState {
    Taking,
    Held,
    GivingBack,
    Lost,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Slab {
    /// The slab's id, which the store's members carry.
    id: u8,
    slots: u8,
    /// Streams served from it now.
    serving: u8,
    state: SlabState,
    /// A failover lost it since its process's last keep-alive.
    lost_since_keepalive: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Process {
    streams_left: u8,
    slabs: Vec<Slab>,
    crashed: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SlotsState {
    processes: Vec<Process>,
    /// The store's global pool: (process, slab id, slots) of each slab it counts.
    counted: Vec<(usize, u8, u8)>,
    /// The store's last write, which a failover may lose, once: a slab added, or removed.
    last_write: Option<Write>,
    failed_over: bool,
    next_id: u8,
    /// A stream started on a slot its process held free (a start with no call).
    served_ahead: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Write {
    Added(usize, u8, u8),
    Removed(usize, u8, u8),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SlotsAction {
    /// A stream of process p that found no free slot sends a take of a slab of this many
    /// slots, its own among them.
    Take(usize, u8),
    /// The store runs process p's take of slab `id`; the take's answer reaches p.
    RunTake(usize, u8),
    /// A stream of process p starts on slab `id`, or one on it ends.
    Serve(usize, u8),
    End(usize, u8),
    /// Process p gives back slab `id` (none of its streams uses it); the store runs the release.
    GiveBack(usize, u8),
    RunRelease(usize, u8),
    KeepAlive(usize),
    Crash(usize),
    /// The store reaps a crashed process's holder: its slabs go.
    Reap(usize),
    Failover,
}

pub struct LeasedSlotsModel {
    pub cfg: LeasedSlotsConfig,
}

fn counts(s: &SlotsState, p: usize, id: u8) -> bool {
    s.counted.iter().any(|&(q, i, _)| q == p && i == id)
}

fn counted_slots(s: &SlotsState) -> u8 {
    s.counted.iter().map(|&(_, _, slots)| slots).sum()
}

impl Model for LeasedSlotsModel {
    type State = SlotsState;
    type Action = SlotsAction;

    fn init_states(&self) -> Vec<SlotsState> {
        let idle = Process {
            streams_left: self.cfg.streams,
            slabs: Vec::new(),
            crashed: false,
        };
        vec![SlotsState {
            processes: vec![idle; self.cfg.processes],
            counted: Vec::new(),
            last_write: None,
            failed_over: false,
            next_id: 0,
            served_ahead: false,
        }]
    }

    fn actions(&self, s: &SlotsState, actions: &mut Vec<SlotsAction>) {
        for (i, p) in s.processes.iter().enumerate() {
            if p.crashed {
                if s.counted.iter().any(|&(q, _, _)| q == i) {
                    actions.push(SlotsAction::Reap(i));
                }
                continue;
            }
            let taking = p.slabs.iter().any(|slab| slab.state == SlabState::Taking);
            if p.streams_left > 0 && !taking {
                for slots in 1..=self.cfg.most_per_slab {
                    actions.push(SlotsAction::Take(i, slots));
                }
            }
            for slab in &p.slabs {
                match slab.state {
                    SlabState::Taking => actions.push(SlotsAction::RunTake(i, slab.id)),
                    SlabState::Held if slab.serving == 0 => {
                        actions.push(SlotsAction::GiveBack(i, slab.id));
                    }
                    SlabState::GivingBack => actions.push(SlotsAction::RunRelease(i, slab.id)),
                    _ => {}
                }
                let servable = slab.state == SlabState::Held
                    || (!self.cfg.withdrawn_when_given_back && slab.state == SlabState::GivingBack);
                if servable && p.streams_left > 0 && slab.serving < slab.slots {
                    actions.push(SlotsAction::Serve(i, slab.id));
                }
                if slab.serving > 0 {
                    actions.push(SlotsAction::End(i, slab.id));
                }
            }
            let left_behind = s
                .counted
                .iter()
                .any(|&(q, id, _)| q == i && !p.slabs.iter().any(|slab| slab.id == id));
            if left_behind || p.slabs.iter().any(|slab| slab.lost_since_keepalive) {
                actions.push(SlotsAction::KeepAlive(i));
            }
            if !p.slabs.is_empty() {
                actions.push(SlotsAction::Crash(i));
            }
        }
        if self.cfg.failover && !s.failed_over && s.last_write.is_some() {
            actions.push(SlotsAction::Failover);
        }
    }

    fn next_state(&self, last: &SlotsState, action: SlotsAction) -> Option<SlotsState> {
        let mut s = last.clone();
        match action {
            SlotsAction::Take(p, slots) => {
                // A stream that found no free slot takes a slab, and its first slot.
                let id = s.next_id;
                s.next_id += 1;
                s.processes[p].streams_left -= 1;
                s.processes[p].slabs.push(Slab {
                    id,
                    slots,
                    serving: 0,
                    state: SlabState::Taking,
                    lost_since_keepalive: false,
                });
            }
            SlotsAction::RunTake(p, id) => {
                let (at, slots) = slab_at(&s, p, id)?;
                if counted_slots(&s) + slots <= self.cfg.cap {
                    s.counted.push((p, id, slots));
                    s.last_write = Some(Write::Added(p, id, slots));
                    let slab = &mut s.processes[p].slabs[at];
                    slab.state = SlabState::Held;
                    slab.serving = 1;
                } else {
                    s.processes[p].slabs.remove(at); // the stream that asked is refused
                }
            }
            SlotsAction::Serve(p, id) => {
                let (at, _) = slab_at(&s, p, id)?;
                let process = &mut s.processes[p];
                s.served_ahead = true;
                process.slabs[at].serving += 1;
                process.streams_left -= 1;
            }
            SlotsAction::End(p, id) => {
                let (at, _) = slab_at(&s, p, id)?;
                let process = &mut s.processes[p];
                process.slabs[at].serving -= 1;
                if process.slabs[at].state == SlabState::Lost && process.slabs[at].serving == 0 {
                    process.slabs.remove(at);
                }
            }
            SlotsAction::GiveBack(p, id) => {
                let (at, _) = slab_at(&s, p, id)?;
                s.processes[p].slabs[at].state = SlabState::GivingBack;
            }
            SlotsAction::RunRelease(p, id) => {
                let (at, slots) = slab_at(&s, p, id)?;
                if counts(&s, p, id) {
                    s.counted.retain(|&(q, i, _)| (q, i) != (p, id));
                    s.last_write = Some(Write::Removed(p, id, slots));
                }
                let process = &mut s.processes[p];
                if process.slabs[at].serving == 0 {
                    process.slabs.remove(at);
                } else {
                    process.slabs[at].state = SlabState::Lost; // released under its streams
                }
            }
            SlotsAction::KeepAlive(p) => {
                // Members of slabs it does not hold (a release a failover undid) are pruned.
                let held: Vec<u8> = s.processes[p].slabs.iter().map(|slab| slab.id).collect();
                s.counted.retain(|&(q, id, _)| q != p || held.contains(&id));
                for at in 0..s.processes[p].slabs.len() {
                    let slab = s.processes[p].slabs[at];
                    if !slab.lost_since_keepalive {
                        continue;
                    }
                    s.processes[p].slabs[at].lost_since_keepalive = false;
                    if slab.state == SlabState::GivingBack {
                        continue; // its release is on its way: nothing to take back
                    }
                    if counted_slots(&s) + slab.slots <= self.cfg.cap {
                        // Taken back: counted again.
                        s.counted.push((p, slab.id, slab.slots));
                        s.last_write = Some(Write::Added(p, slab.id, slab.slots));
                    } else {
                        let slab = &mut s.processes[p].slabs[at];
                        slab.state = SlabState::Lost;
                        if self.cfg.loss_ends_streams {
                            slab.serving = 0;
                        }
                    }
                }
                s.processes[p]
                    .slabs
                    .retain(|slab| slab.state != SlabState::Lost || slab.serving > 0);
            }
            SlotsAction::Crash(p) => {
                let process = &mut s.processes[p];
                process.crashed = true;
                process.slabs.clear();
                process.streams_left = 0;
            }
            SlotsAction::Reap(p) => s.counted.retain(|&(q, _, _)| q != p),
            SlotsAction::Failover => {
                match s.last_write? {
                    Write::Added(p, id, _) => {
                        s.counted.retain(|&(q, i, _)| (q, i) != (p, id));
                        mark_lost(&mut s, p, id);
                    }
                    Write::Removed(p, id, slots) => s.counted.push((p, id, slots)),
                }
                s.failed_over = true;
                s.last_write = None;
            }
        }
        (s != *last).then_some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(COUNTED_WITHIN_CAP, |m: &LeasedSlotsModel, s: &SlotsState| {
                counted_slots(s) <= m.cfg.cap
            }),
            Property::always(SERVED_FROM_COUNTED, |_, s: &SlotsState| {
                s.processes.iter().enumerate().all(|(p, process)| {
                    process.slabs.iter().all(|slab| {
                        slab.serving == 0
                            || slab.state == SlabState::Taking
                            || counts(s, p, slab.id)
                            || slab.lost_since_keepalive
                    })
                })
            }),
            Property::always(SLOTS_SERVE_ONE_STREAM, |_, s: &SlotsState| {
                s.processes
                    .iter()
                    .all(|process| process.slabs.iter().all(|slab| slab.serving <= slab.slots))
            }),
            Property::sometimes(SERVED_AHEAD, |_, s: &SlotsState| s.served_ahead),
        ]
    }
}

/// Where slab `id` of process `p` is in its list, and its slots.
fn slab_at(s: &SlotsState, p: usize, id: u8) -> Option<(usize, u8)> {
    let slabs = &s.processes[p].slabs;
    let at = slabs.iter().position(|slab| slab.id == id)?;
    Some((at, slabs[at].slots))
}

/// A failover lost slab `id`'s grant: its process's next keep-alive finds it missing.
fn mark_lost(s: &mut SlotsState, p: usize, id: u8) {
    let process = &mut s.processes[p];
    if let Some(slab) = process.slabs.iter_mut().find(|slab| slab.id == id) {
        slab.lost_since_keepalive = true;
    }
}

pub const COUNTED_WITHIN_CAP: &str = "the store never counts more than the cap";
pub const SERVED_FROM_COUNTED: &str =
    "every stream is served from a slab the store counts, but a failover's until the next keep-alive";
pub const SLOTS_SERVE_ONE_STREAM: &str = "no slab serves more streams than its slots";
pub const SERVED_AHEAD: &str = "a stream starts on a slot taken ahead, with no call";
