//! The protocol as stateright checks it: its initial state, the actions enabled in a state,
//! their steps (`protocol.rs`) and the properties (`properties.rs`) that must hold.

use stateright::{Model, Property};

use crate::process::{Call, Phase, Round};
use crate::properties;
use crate::protocol::{Action, Failure, ProtocolModel, State, Target};
use crate::redis::AcquireReply;

impl Model for ProtocolModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State::new(&self.cfg)]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        let cfg = &self.cfg;
        // Ways a call under way may fail: `sent` if its script has not run yet.
        let fail = |actions: &mut Vec<Action>, call: Target, sent: bool| {
            if s.failures == 0 {
                return;
            }
            actions.push(Action::Fail {
                call,
                how: Failure::Ran,
            });
            if sent {
                actions.push(Action::Fail {
                    call,
                    how: Failure::Unrun,
                });
                if s.late.is_none() {
                    actions.push(Action::Fail {
                        call,
                        how: Failure::Late,
                    });
                }
            }
        };
        for (lease, spec) in cfg.leases.iter().enumerate() {
            let l = &s.leases[lease];
            let awake = !s.holders[spec.holder].stalled;
            match (l.phase, l.acquire) {
                (Phase::Idle, _) if awake => actions.push(Action::Acquire(lease)),
                (Phase::Acquiring, Call::Sent) => {
                    actions.push(Action::RunAcquire(lease));
                    if awake {
                        fail(actions, Target::Acquire(lease), true);
                    }
                }
                (Phase::Acquiring, Call::Ran(reply)) if awake => {
                    match reply {
                        AcquireReply::Granted { .. } => {
                            actions.push(Action::Hold(lease));
                            actions.push(Action::DropGrant(lease));
                        }
                        AcquireReply::Refused => actions.push(Action::Refused(lease)),
                    }
                    fail(actions, Target::Acquire(lease), false);
                }
                (Phase::Held, _) if awake && !spec.kept => actions.push(Action::End(lease)),
                _ => {}
            }
            if l.release && awake {
                actions.push(Action::Release(lease));
                fail(actions, Target::Release(lease), true);
            }
        }
        for holder in 0..cfg.holders {
            let h = &s.holders[holder];
            match h.round {
                Round::Idle if !h.stalled => actions.push(Action::StartRound(holder)),
                Round::Idle => {}
                Round::Keepalive { call: Call::Sent, .. } => {
                    actions.push(Action::RunKeepalive(holder));
                    if !h.stalled {
                        fail(actions, Target::Round(holder), true);
                    }
                }
                Round::Keepalive { .. } if !h.stalled => {
                    actions.push(Action::Answer(holder));
                    fail(actions, Target::Round(holder), false);
                }
                Round::Keepalive { .. } => {}
                // The process sends the round's next call at once; the script runs and answers
                // in one step, which waits while the process is frozen.
                _ if !h.stalled => {
                    actions.push(Action::Answer(holder));
                    fail(actions, Target::Round(holder), true);
                }
                _ => {}
            }
            if h.stalled {
                actions.push(Action::Resume(holder));
            } else if s.stalls > 0 {
                actions.push(Action::Stall(holder));
            }
        }
        if s.late.is_some() {
            actions.push(Action::RunLate);
        }
        if cfg.time {
            actions.push(Action::Tick);
        }
        if s.snapshot.is_none() && s.restores > 0 {
            actions.push(Action::Snapshot);
        }
        if s.snapshot.is_some() {
            actions.push(Action::Restore);
        }
        if s.restarts > 0 {
            actions.push(Action::Restart);
        }
        if cfg.observer {
            actions.push(Action::Observe);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let s = last.after(&self.cfg, action);
        (s != *last).then_some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        properties::all(&self.cfg)
    }
}
