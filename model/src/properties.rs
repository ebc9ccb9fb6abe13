//! What the checker asserts (`always`), proves reachable (`sometimes`), and, where runs end,
//! requires of their end (`eventually`).
//!
//! Windows. A fault of Redis (a restore of an earlier snapshot, a restart empty) may take members
//! away from live streams; the protocol repairs that at the holder's next keep-alive that sees the
//! shortfall. A holder is *exposed* from a fault until it completes a *calm* round: a renewal
//! round that began after the fault, that sent a keep-alive (it held leases), whose keep-alive
//! window was quiet (nothing of the holder in flight when it opened, none of its leases changed
//! until the answer: only then does the count compare like with like), and all of whose calls
//! were answered. A stalled holder (a frozen process) is outside the properties while it stalls:
//! its streams do not run, and it sweeps its overdue leases first when it wakes.

use stateright::Property;

use crate::config::{bits, ModelConfig};
use crate::process::{Phase, Round};
use crate::protocol::{ProtocolModel, State};

type P = Property<ProtocolModel>;

/// Units of a holder's live streams in a pool.
pub fn live_units(cfg: &ModelConfig, s: &State, holder: usize, pool: usize) -> u8 {
    bits(s.held(cfg, holder))
        .filter(|&l| cfg.pool_mask(l) & (1 << pool) != 0)
        .map(|l| cfg.leases[l].weight)
        .sum()
}

/// A member in Redis of a lease its live holder neither holds nor has in flight.
pub fn stray(cfg: &ModelConfig, s: &State, lease: usize) -> bool {
    let l = &s.leases[lease];
    s.redis.members[lease] != 0
        && s.redis.is_alive(cfg.leases[lease].holder)
        && l.phase != Phase::Held
        && !s.in_flight(cfg, lease)
}

/// A held lease without all its members in Redis.
pub fn missing(cfg: &ModelConfig, s: &State, lease: usize) -> bool {
    s.leases[lease].phase == Phase::Held && s.redis.members[lease] != cfg.pool_mask(lease)
}

fn in_window(s: &State, holder: usize) -> bool {
    let h = &s.holders[holder];
    h.exposed || h.stalled
}

fn faults_used(cfg: &ModelConfig, s: &State) -> bool {
    s.restores < cfg.restores || s.restarts < cfg.restarts
}

/// I2: a pool never holds more members than its capacity.
fn pools_within_capacity(m: &ProtocolModel, s: &State) -> bool {
    let cfg = &m.cfg;
    (0..cfg.capacities.len()).all(|p| cfg.capacities[p] == 0 || s.redis.zcard(cfg, p) <= cfg.capacities[p])
}

/// (a) Live streams never exceed a cap while no holder is in its window.
fn streams_within_caps(m: &ProtocolModel, s: &State) -> bool {
    let cfg = &m.cfg;
    if (0..cfg.holders).any(|h| in_window(s, h)) {
        return true;
    }
    (0..cfg.capacities.len()).all(|p| {
        let live: u8 = (0..cfg.holders).map(|h| live_units(cfg, s, h, p)).sum();
        cfg.capacities[p] == 0 || live <= cfg.capacities[p]
    })
}

/// (a) Outside its window, a holder's live streams are counted in every pool: it has at least
/// as many members there as its streams take (so, with I2, no cap is exceeded).
fn streams_counted(m: &ProtocolModel, s: &State) -> bool {
    let cfg = &m.cfg;
    (0..cfg.holders)
        .filter(|&h| !in_window(s, h))
        .all(|h| (0..cfg.capacities.len()).all(|p| live_units(cfg, s, h, p) <= s.redis.zcount(cfg, p, h)))
}

/// I4: outside its window, a holder that holds leases has a live entry (its leases are lost no
/// later than Redis can drop them).
fn entry_covers_streams(m: &ProtocolModel, s: &State) -> bool {
    let cfg = &m.cfg;
    (0..cfg.holders)
        .filter(|&h| !in_window(s, h) && s.held(cfg, h) != 0)
        .all(|h| s.redis.is_alive(h))
}

/// Units of a holder's leases that are held or in flight, in a pool.
fn held_or_in_flight_units(cfg: &ModelConfig, s: &State, holder: usize, pool: usize) -> u8 {
    bits(cfg.leases_of(holder))
        .filter(|&l| cfg.pool_mask(l) & (1 << pool) != 0)
        .filter(|&l| s.leases[l].phase == Phase::Held || s.in_flight(cfg, l))
        .map(|l| cfg.leases[l].weight)
        .sum()
}

fn calm_holders<'a>(s: &'a State, cfg: &ModelConfig) -> impl Iterator<Item = usize> + 'a {
    let holders = cfg.holders;
    (0..holders).filter(move |&h| s.holders[h].calm >= 2 && !s.holders[h].stalled)
}

/// (b) After two calm rounds in a row, a live holder has no more members in any pool than its
/// leases held or in flight take there: a slot left behind by a stream that ended is free.
fn no_slot_left_after_two_calm_rounds(m: &ProtocolModel, s: &State) -> bool {
    let cfg = &m.cfg;
    calm_holders(s, cfg).filter(|&h| s.redis.is_alive(h)).all(|h| {
        (0..cfg.capacities.len()).all(|p| s.redis.zcount(cfg, p, h) <= held_or_in_flight_units(cfg, s, h, p))
    })
}

/// (c) After two calm rounds in a row, a holder has at least as many members in every pool as
/// its live streams take there: with (b), Redis counts for it what it holds (give or take what is
/// in flight).
fn no_stream_uncounted_after_two_calm_rounds(m: &ProtocolModel, s: &State) -> bool {
    let cfg = &m.cfg;
    calm_holders(s, cfg)
        .all(|h| (0..cfg.capacities.len()).all(|p| live_units(cfg, s, h, p) <= s.redis.zcount(cfg, p, h)))
}

/// (c), strict: after two calm rounds in a row, the members of a live holder are exactly those
/// of the leases it holds or has in flight, lease by lease.
fn same_leases_after_two_calm_rounds(m: &ProtocolModel, s: &State) -> bool {
    let cfg = &m.cfg;
    calm_holders(s, cfg)
        .filter(|&h| s.redis.is_alive(h))
        .all(|h| bits(cfg.leases_of(h)).all(|l| !stray(cfg, s, l) && !missing(cfg, s, l)))
}

/// A run that ends (every stream over, no call in flight, every fault spent, the clocks run
/// out, the pools counted) leaves no member in Redis.
fn ends_empty(m: &ProtocolModel, s: &State) -> bool {
    let cfg = &m.cfg;
    (0..cfg.leases.len()).all(|l| s.leases[l].phase == Phase::Released && s.redis.members[l] == 0)
}

fn grant_lost_in_a_fault(m: &ProtocolModel, s: &State) -> bool {
    let cfg = &m.cfg;
    faults_used(cfg, s)
        && (0..cfg.leases.len()).any(|l| missing(cfg, s, l) && !s.holders[cfg.leases[l].holder].stalled)
}

fn recount(s: &State, what: impl Fn(u8, u8) -> bool) -> bool {
    s.holders
        .iter()
        .any(|h| matches!(h.round, Round::Recount { lost, reclaimed, .. } if what(lost, reclaimed)))
}

fn lost_grant_taken_back(m: &ProtocolModel, s: &State) -> bool {
    let cfg = &m.cfg;
    recount(s, |_, reclaimed| {
        bits(reclaimed).any(|l| s.leases[l].phase == Phase::Held)
    }) && faults_used(cfg, s)
}

fn lost_grant_without_room(_: &ProtocolModel, s: &State) -> bool {
    recount(s, |lost, _| lost != 0)
}

fn release_lost_in_a_fault(m: &ProtocolModel, s: &State) -> bool {
    let cfg = &m.cfg;
    faults_used(cfg, s) && (0..cfg.leases.len()).any(|l| stray(cfg, s, l))
}

fn stray_without_a_fault(m: &ProtocolModel, s: &State) -> bool {
    let cfg = &m.cfg;
    !faults_used(cfg, s) && (0..cfg.leases.len()).any(|l| stray(cfg, s, l))
}

fn excess_pruned(m: &ProtocolModel, s: &State) -> bool {
    let cfg = &m.cfg;
    (0..cfg.holders).any(|h| match s.holders[h].round {
        Round::Prune { keep, .. } => bits(cfg.leases_of(h) & !keep).any(|l| stray(cfg, s, l)),
        Round::PruneStrays { strays, .. } => bits(strays).any(|l| stray(cfg, s, l)),
        _ => false,
    })
}

fn swept_at_deadline(m: &ProtocolModel, s: &State) -> bool {
    let cfg = &m.cfg;
    // Released and on the retry list with its release call out: only a loss does both.
    (0..cfg.leases.len())
        .any(|l| s.leases[l].phase == Phase::Released && s.leases[l].unremoved && s.leases[l].release)
}

fn streams_fill_a_cap(m: &ProtocolModel, s: &State) -> bool {
    let cfg = &m.cfg;
    (0..cfg.capacities.len()).any(|p| {
        let live: u8 = (0..cfg.holders).map(|h| live_units(cfg, s, h, p)).sum();
        cfg.capacities[p] > 0 && live == cfg.capacities[p]
    })
}

fn calm_after_a_fault(m: &ProtocolModel, s: &State) -> bool {
    let cfg = &m.cfg;
    faults_used(cfg, s) && (0..cfg.holders).any(|h| s.holders[h].calm >= 2 && s.held(cfg, h) != 0)
}

fn stalled_holder_reaped(m: &ProtocolModel, s: &State) -> bool {
    let cfg = &m.cfg;
    (0..cfg.leases.len()).any(|l| {
        let h = cfg.leases[l].holder;
        s.holders[h].stalled && s.leases[l].phase == Phase::Held && s.redis.members[l] == 0
    })
}

/// The index of every holder lists each pool where it has members: how the reaper finds a dead
/// holder's members (the guard of I3 in docs/design.md) and a closing manager its own (I5).
fn index_covers_members(m: &ProtocolModel, s: &State) -> bool {
    s.redis.index_covers_members(&m.cfg)
}

/// No acquire is refused for a pool where a holder whose entry is not live has members.
fn refused_by_the_living(_: &ProtocolModel, s: &State) -> bool {
    !s.redis.refused_by_the_dead
}

/// The properties that apply to a configuration (the reachability ones only where its budgets
/// make them reachable).
pub fn all(cfg: &ModelConfig) -> Vec<P> {
    let mut properties = vec![
        P::always(
            "I2: a pool never holds more than its capacity",
            pools_within_capacity,
        ),
        P::always(
            "I3/I5 guard: a holder's index lists every pool where it has members",
            index_covers_members,
        ),
        P::always(
            "R: a refusal counts only live holders' members",
            refused_by_the_living,
        ),
        P::always(
            "(a) live streams within every cap, outside windows",
            streams_within_caps,
        ),
        P::always(
            "(a) every live stream counted, outside its holder's window",
            streams_counted,
        ),
        P::always(
            "I4: a holder's entry is live while it holds leases, outside its window",
            entry_covers_streams,
        ),
        P::always(
            "(b) no slot left behind after two calm rounds",
            no_slot_left_after_two_calm_rounds,
        ),
        P::always(
            "(c) no stream uncounted after two calm rounds",
            no_stream_uncounted_after_two_calm_rounds,
        ),
        P::always(
            "(c) strict: the same leases after two calm rounds",
            same_leases_after_two_calm_rounds,
        ),
    ];
    let capped = cfg.capacities.iter().any(|&c| c > 0);
    if capped {
        properties.push(P::sometimes("streams fill a cap", streams_fill_a_cap));
    }
    if cfg.time {
        properties.push(P::sometimes(
            "a lease is lost at its group's deadline",
            swept_at_deadline,
        ));
    }
    let faults = cfg.restores + cfg.restarts > 0;
    if faults {
        properties.extend([
            P::sometimes("a fault takes a live stream's member", grant_lost_in_a_fault),
            P::sometimes("a lost grant is taken back", lost_grant_taken_back),
            P::sometimes("two calm rounds after a fault", calm_after_a_fault),
        ]);
        if capped && cfg.holders >= 2 {
            properties.push(P::sometimes(
                "a lost grant finds no room: lost",
                lost_grant_without_room,
            ));
        }
    }
    if cfg.restores > 0 {
        properties.push(P::sometimes(
            "a release lost in a failover comes back under a live holder",
            release_lost_in_a_fault,
        ));
        let shared_holder = (0..cfg.holders).any(|h| cfg.leases_of(h).count_ones() >= 2);
        if cfg.prune != crate::config::Prune::Never && shared_holder {
            properties.push(P::sometimes("members in excess are pruned", excess_pruned));
        }
    }
    if cfg.failures > 0 {
        properties.push(P::sometimes(
            "a member outlives its lease's release without a fault",
            stray_without_a_fault,
        ));
    }
    if cfg.stalls > 0 {
        properties.push(P::sometimes(
            "a stalled holder's members are reaped",
            stalled_holder_reaped,
        ));
    }
    if cfg.observer {
        properties.push(P::eventually(
            "a run that ends leaves no member in Redis",
            ends_empty,
        ));
    }
    properties
}
