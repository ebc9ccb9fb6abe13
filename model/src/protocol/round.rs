//! The steps of a holder's renewal round (`renewal/round.rs`): the excess judged and the
//! windows opened, the keep-alive, the prune, the check one by one and the recount, the
//! results applied and the releases sent again; and a round's call that times out.

use super::step::Step;
use super::{Failure, Late};
use crate::config::{bits, Count, Prune};
use crate::process::{self, Call, Phase, Round, RoundGhost};

impl Step<'_> {
    /// Round step 1 and 2: the excess judged, windows opened, the keep-alive sent.
    pub(super) fn start_round(&mut self, holder: usize) {
        let cfg = self.cfg;
        let exact = self.exact();
        let quiet = self.nothing_in_flight(holder);
        let kept = self.has_group(holder);
        let h = &mut self.s.holders[holder];
        let excess = exact && process::take_excess(cfg, &mut h.tally);
        if exact {
            process::open_windows(cfg, &mut h.tally);
        }
        h.round_sent = cfg.ttl;
        h.ghost = match (kept, quiet) {
            (false, _) => RoundGhost::Unkept,
            (true, true) => RoundGhost::Calm,
            (true, false) => RoundGhost::Spoiled,
        };
        let known = h.granted;
        if kept {
            h.round = Round::Keepalive {
                excess,
                known,
                call: Call::Sent,
            };
        } else {
            self.after_keepalive(holder, false, false, excess, known);
        }
    }

    /// After the keep-alive: the prune of members in excess, sent with what is held or in
    /// flight now.
    pub(super) fn after_keepalive(
        &mut self,
        holder: usize,
        renewed: bool,
        short: bool,
        excess: bool,
        known: u8,
    ) {
        if excess && self.cfg.prune != Prune::Never {
            let in_flight = self.s.holders[holder].tally.map_or(0, |t| t.in_flight);
            let keep = self.s.held(self.cfg, holder) | in_flight;
            self.s.holders[holder].round = Round::Prune {
                renewed,
                short,
                keep,
                known,
            };
        } else {
            self.after_prune(holder, renewed, short, known);
        }
    }

    /// Step 3: a short tag's held leases checked one by one (no call for none: straight to the
    /// recount).
    pub(super) fn after_prune(&mut self, holder: usize, renewed: bool, short: bool, known: u8) {
        if !short {
            return self.finish(holder, renewed, 0, 0);
        }
        let check = self.s.held(self.cfg, holder);
        self.s.holders[holder].round = if check != 0 {
            Round::Reclaim {
                renewed,
                check,
                known,
            }
        } else {
            Round::Recount {
                renewed,
                lost: 0,
                reclaimed: 0,
                known,
            }
        };
    }

    /// Steps 6 and 7: deadlines extended, results applied, releases sent again.
    pub(super) fn finish(&mut self, holder: usize, renewed: bool, lost: u8, reclaimed: u8) {
        if renewed {
            let h = &mut self.s.holders[holder];
            h.entry_known = h.entry_known.max(h.round_sent);
        }
        if renewed && self.has_group(holder) {
            let h = &mut self.s.holders[holder];
            h.deadline = h.deadline.max(h.round_sent);
        }
        let mut again = 0;
        for lease in bits(reclaimed) {
            match self.s.leases[lease].phase {
                Phase::Released => again |= 1 << lease,
                // A count that only grows: `Held::taken_back`, for a lease still in the group.
                Phase::Held if !self.exact() => self.s.holders[holder].granted += self.cfg.units(lease),
                _ => {}
            }
        }
        for lease in bits(lost) {
            self.lose(lease, false);
        }
        for lease in bits(self.cfg.leases_of(holder)) {
            if std::mem::take(&mut self.s.leases[lease].unremoved) {
                again |= 1 << lease;
            }
        }
        if again != 0 {
            self.s.holders[holder].round = Round::Releasing { leases: again };
        } else {
            self.end_round(holder);
        }
    }

    pub(super) fn end_round(&mut self, holder: usize) {
        let h = &mut self.s.holders[holder];
        match h.ghost {
            RoundGhost::Unkept => {}
            RoundGhost::Calm => {
                h.calm = (h.calm + 1).min(2);
                h.exposed = false;
            }
            RoundGhost::Spoiled => h.calm = 0,
        }
        h.round = Round::Idle;
        h.round_sent = 0;
        h.ghost = RoundGhost::Unkept;
    }

    /// The keep-alive's reply, or another call of the round run by Redis and answered.
    pub(super) fn answer(&mut self, holder: usize) {
        let cfg = self.cfg;
        match self.s.holders[holder].round {
            Round::Keepalive {
                excess,
                known,
                call: Call::Ran(reply),
            } => {
                let short = match cfg.count {
                    Count::Exact => process::close_window(cfg, &mut self.s.holders[holder].tally, reply),
                    Count::GrantedOnlyGrows => false,
                };
                if !reply.alive {
                    self.s.holders[holder].entry_known = 0;
                }
                self.after_keepalive(holder, reply.alive, !reply.alive || short, excess, known);
            }
            Round::Prune {
                renewed,
                short,
                keep,
                known,
            } => {
                if cfg.prune == Prune::TwoStep {
                    let listed = self.s.redis.list_strays(cfg, holder, keep);
                    let in_flight = self.s.holders[holder].tally.map_or(0, |t| t.in_flight);
                    let strays = listed & !(self.s.held(cfg, holder) | in_flight);
                    if strays != 0 {
                        self.s.holders[holder].round = Round::PruneStrays {
                            renewed,
                            short,
                            strays,
                            known,
                        };
                        return;
                    }
                } else {
                    self.s.redis.prune(cfg, holder, keep);
                }
                self.after_prune(holder, renewed, short, known);
            }
            Round::PruneStrays {
                renewed,
                short,
                strays,
                known,
            } => {
                self.s.redis.prune_ids(cfg, holder, strays);
                self.after_prune(holder, renewed, short, known);
            }
            Round::Reclaim {
                renewed,
                check,
                known,
            } => {
                let (lost, reclaimed) = self.s.redis.reclaim(cfg, holder, check);
                // A count that only grows: the recount raises the granted count to the group's, taken
                // back included.
                let taken_back: u8 = match cfg.count {
                    Count::Exact => 0,
                    Count::GrantedOnlyGrows => bits(reclaimed).map(|l| cfg.units(l)).sum(),
                };
                self.s.holders[holder].round = Round::Recount {
                    renewed,
                    lost,
                    reclaimed,
                    known: known + taken_back,
                };
            }
            Round::Recount {
                renewed,
                lost,
                reclaimed,
                known,
            } => {
                let reply = self.s.redis.keepalive(cfg, holder, true, known);
                self.finish(holder, renewed || reply.alive, lost, reclaimed);
            }
            Round::Releasing { leases } => {
                self.s.redis.release(cfg, holder, leases);
                for lease in bits(leases) {
                    self.flight_end(lease, true);
                }
                self.end_round(holder);
            }
            _ => unreachable!("no call to answer"),
        }
    }

    /// Runs the round's call in Redis, without its answer (a reply lost, or a request that runs
    /// late).
    pub(super) fn run_round_call(&mut self, holder: usize) {
        let cfg = self.cfg;
        let redis = &mut self.s.redis;
        match self.s.holders[holder].round {
            Round::Keepalive { known, call, .. } => {
                if call == Call::Sent {
                    redis.keepalive(cfg, holder, false, known);
                }
            }
            Round::Prune { keep, .. } => {
                if cfg.prune == Prune::KeepList {
                    redis.prune(cfg, holder, keep);
                }
            }
            Round::PruneStrays { strays, .. } => {
                redis.prune_ids(cfg, holder, strays);
            }
            Round::Reclaim { check, .. } => {
                redis.reclaim(cfg, holder, check);
            }
            Round::Recount { known, .. } => {
                redis.keepalive(cfg, holder, true, known);
            }
            Round::Releasing { leases } => {
                redis.release(cfg, holder, leases);
            }
            Round::Idle => unreachable!("no call under way"),
        }
    }

    /// The round's call as a request that may run late (None: one that changes nothing).
    pub(super) fn late_round_call(&self, holder: usize) -> Option<Late> {
        Some(match self.s.holders[holder].round {
            Round::Keepalive { known, .. } => Late::Keepalive {
                holder,
                resync: false,
                known,
            },
            Round::Prune { .. } if self.cfg.prune == Prune::TwoStep => return None,
            Round::Prune { keep, .. } => Late::Prune { holder, keep },
            Round::PruneStrays { strays, .. } => Late::PruneIds { holder, strays },
            Round::Reclaim { check, .. } => Late::Reclaim { holder, check },
            Round::Recount { known, .. } => Late::Keepalive {
                holder,
                resync: true,
                known,
            },
            Round::Releasing { leases } => Late::Release { holder, leases },
            Round::Idle => unreachable!("no call under way"),
        })
    }

    /// The round's call times out: the round goes on as the code does on an error.
    pub(super) fn fail_round(&mut self, holder: usize, how: Failure) {
        match how {
            Failure::Unrun => {}
            Failure::Ran => self.run_round_call(holder),
            Failure::Late => self.s.late = self.late_round_call(holder),
        }
        self.spoil(holder);
        match self.s.holders[holder].round {
            Round::Keepalive { excess, known, .. } => {
                self.after_keepalive(holder, false, false, excess, known)
            }
            Round::Prune {
                renewed,
                short,
                known,
                ..
            }
            | Round::PruneStrays {
                renewed,
                short,
                known,
                ..
            } => self.after_prune(holder, renewed, short, known),
            Round::Reclaim { renewed, .. } => self.finish(holder, renewed, 0, 0),
            Round::Recount {
                renewed,
                lost,
                reclaimed,
                ..
            } => self.finish(holder, renewed, lost, reclaimed),
            Round::Releasing { leases } => {
                for lease in bits(leases) {
                    self.retry_later(lease);
                }
                self.end_round(holder);
            }
            Round::Idle => unreachable!("no call under way"),
        }
    }
}
