//! A model of leased units (`src/rate/leased_units.rs`, `answer_rates` in
//! `src/lua/prelude/rates.lua`), checked exhaustively: processes hit one identity's fixed-window
//! request rate; a hit is served from units its process holds ahead, fresh, or its process
//! sends it to the store, asking for units ahead; the store counts the hit and takes up to
//! half of the room it leaves, in the current window, answering until when that window
//! lasts; the answer comes back later, and the process dates the units' freshness from when it
//! sent the call. Time passes in ticks between any two steps; a process may crash (its units
//! are lost unserved) and the store may lose its last write once (a failover to a replica that
//! had not seen it).
//!
//! Properties: no window serves more hits than the limit, outside a window whose counts a
//! failover lost; no unit is served outside the window it was counted in; the store never
//! counts more than the limit. Each safeguard has a switch (`LeasedUnitsConfig`), and the
//! tests check that turning it off breaks the property it guards.

use stateright::{Model, Property};

/// What a model run covers.
#[derive(Clone, Debug)]
pub struct LeasedUnitsConfig {
    pub processes: usize,
    /// Hits per process in a run.
    pub hits: u8,
    pub limit: u8,
    /// Ticks per fixed window, and the ticks a run lasts.
    pub window: u8,
    pub ticks: u8,
    /// The most units a call asks for ahead (the process's size, any from 1 to it).
    pub most_ahead: u8,
    /// Safeguards: units are served only before their freshness ends (dated from when their
    /// call was sent); the store takes ahead at most half of the room the cost leaves.
    pub dated_from_send: bool,
    pub half_the_room: bool,
    pub failover: bool,
}

impl LeasedUnitsConfig {
    /// Two processes of two hits each, a limit of 3 per window of 2 ticks, 3 ticks (two
    /// windows), every safeguard on.
    pub fn small() -> Self {
        LeasedUnitsConfig {
            processes: 2,
            hits: 2,
            limit: 3,
            window: 2,
            ticks: 3,
            most_ahead: 2,
            dated_from_send: true,
            half_the_room: true,
            failover: true,
        }
    }

    fn windows(&self) -> usize {
        usize::from(self.ticks / self.window) + 1
    }
}

/// One process's call to the store: sent at `sent`, asking `ask` units ahead; once the store
/// ran it, what it took ahead, in which window, and when that window ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Call {
    Sent {
        sent: u8,
        ask: u8,
    },
    Ran {
        sent: u8,
        taken: u8,
        window: u8,
        ends: u8,
        ran: u8,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Process {
    hits_left: u8,
    units: u8,
    /// The window its units were counted in, and the tick they may be served until (excluded).
    window: u8,
    fresh_until: u8,
    call: Option<Call>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct UnitsState {
    now: u8,
    processes: Vec<Process>,
    /// The store's count per window, the hits served per window (here or by the store), and
    /// the windows whose counts a failover lost.
    counted: Vec<u8>,
    served: Vec<u8>,
    lost: Vec<bool>,
    /// The store's last write (window, units), which a failover may lose, once.
    last_write: Option<(u8, u8)>,
    failed_over: bool,
    served_outside: bool,
    served_here: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnitsAction {
    /// A hit at process p: served there, or sent asking this many units ahead.
    Serve(usize),
    Send(usize, u8),
    Run(usize),
    Answer(usize),
    Crash(usize),
    Tick,
    Failover,
}

pub struct LeasedUnitsModel {
    pub cfg: LeasedUnitsConfig,
}

impl LeasedUnitsModel {
    fn fresh(&self, p: &Process, now: u8) -> bool {
        p.units > 0 && now < p.fresh_until
    }
}

impl Model for LeasedUnitsModel {
    type State = UnitsState;
    type Action = UnitsAction;

    fn init_states(&self) -> Vec<UnitsState> {
        let cfg = &self.cfg;
        let idle = Process {
            hits_left: cfg.hits,
            units: 0,
            window: 0,
            fresh_until: 0,
            call: None,
        };
        vec![UnitsState {
            now: 0,
            processes: vec![idle; cfg.processes],
            counted: vec![0; cfg.windows()],
            served: vec![0; cfg.windows()],
            lost: vec![false; cfg.windows()],
            last_write: None,
            failed_over: false,
            served_outside: false,
            served_here: false,
        }]
    }

    fn actions(&self, s: &UnitsState, actions: &mut Vec<UnitsAction>) {
        for (i, p) in s.processes.iter().enumerate() {
            match p.call {
                None if p.hits_left > 0 && self.fresh(p, s.now) => actions.push(UnitsAction::Serve(i)),
                None if p.hits_left > 0 => {
                    for ask in 0..=self.cfg.most_ahead {
                        actions.push(UnitsAction::Send(i, ask));
                    }
                }
                Some(Call::Sent { .. }) => actions.push(UnitsAction::Run(i)),
                Some(Call::Ran { .. }) => actions.push(UnitsAction::Answer(i)),
                None => {}
            }
            if p.units > 0 || p.call.is_some() {
                actions.push(UnitsAction::Crash(i));
            }
        }
        if s.now < self.cfg.ticks {
            actions.push(UnitsAction::Tick);
        }
        if self.cfg.failover && !s.failed_over && s.last_write.is_some() {
            actions.push(UnitsAction::Failover);
        }
    }

    fn next_state(&self, last: &UnitsState, action: UnitsAction) -> Option<UnitsState> {
        let cfg = &self.cfg;
        let mut s = last.clone();
        let current = s.now / cfg.window;
        match action {
            UnitsAction::Serve(i) => {
                let p = &mut s.processes[i];
                p.units -= 1;
                p.hits_left -= 1;
                s.served[usize::from(current)] += 1;
                s.served_outside |= p.window != current;
                s.served_here = true;
            }
            UnitsAction::Send(i, ask) => {
                s.processes[i].call = Some(Call::Sent { sent: s.now, ask });
            }
            UnitsAction::Run(i) => {
                let Some(Call::Sent { sent, ask }) = s.processes[i].call else {
                    return None;
                };
                let w = usize::from(current);
                let room = cfg.limit.saturating_sub(s.counted[w]);
                let taken = if room == 0 {
                    s.processes[i].hits_left -= 1; // refused
                    0
                } else {
                    let ahead = if cfg.half_the_room {
                        ask.min((room - 1) / 2)
                    } else {
                        ask
                    };
                    s.counted[w] += 1 + ahead;
                    s.served[w] += 1;
                    s.processes[i].hits_left -= 1;
                    s.last_write = Some((current, 1 + ahead));
                    ahead
                };
                let ends = (current + 1) * cfg.window;
                s.processes[i].call = Some(Call::Ran {
                    sent,
                    taken,
                    window: current,
                    ends,
                    ran: s.now,
                });
            }
            UnitsAction::Answer(i) => {
                let Some(Call::Ran {
                    sent,
                    taken,
                    window,
                    ends,
                    ran,
                }) = s.processes[i].call
                else {
                    return None;
                };
                let p = &mut s.processes[i];
                p.call = None;
                if taken > 0 {
                    // Fresh for as long as the store said its window lasts, from when the call
                    // was sent (its script ran at that time or later).
                    let dated = if cfg.dated_from_send { sent } else { s.now };
                    let fresh_until = dated + (ends - ran);
                    if p.window != window || s.now >= p.fresh_until {
                        p.units = 0; // given back (or nothing to give: its window ended)
                    }
                    p.units += taken;
                    p.window = window;
                    p.fresh_until = fresh_until;
                }
            }
            UnitsAction::Crash(i) => {
                let p = &mut s.processes[i];
                p.units = 0;
                p.call = None;
            }
            UnitsAction::Tick => s.now += 1,
            UnitsAction::Failover => {
                let (w, units) = s.last_write?;
                s.counted[usize::from(w)] -= units;
                s.lost[usize::from(w)] = true;
                s.failed_over = true;
                s.last_write = None;
            }
        }
        (s != *last).then_some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(SERVED_WITHIN_LIMIT, |m: &LeasedUnitsModel, s: &UnitsState| {
                (0..s.served.len()).all(|w| s.lost[w] || s.served[w] <= m.cfg.limit)
            }),
            Property::always(SERVED_IN_ITS_WINDOW, |_, s: &UnitsState| !s.served_outside),
            Property::always(COUNTED_WITHIN_LIMIT, |m: &LeasedUnitsModel, s: &UnitsState| {
                s.counted.iter().all(|&c| c <= m.cfg.limit)
            }),
            Property::sometimes(SERVED_HERE, |_, s: &UnitsState| s.served_here),
        ]
    }
}

pub const SERVED_WITHIN_LIMIT: &str = "no window serves more hits than the limit, outside a failover's";
pub const SERVED_IN_ITS_WINDOW: &str = "no unit is served outside the window it was counted in";
pub const COUNTED_WITHIN_LIMIT: &str = "the store never counts more than the limit";
pub const SERVED_HERE: &str = "a hit is served from units held ahead";
