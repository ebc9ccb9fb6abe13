//! Symmetry reduction: leases of one class (same holder, weight and pools) are interchangeable,
//! so the checker visits one representative of each set of states that differ only by their
//! numbering.

use super::{Late, State, NO_CLASS};
use crate::config::{MAX_HOLDERS, MAX_LEASES};
use crate::process::{Call, Round};
use crate::redis::Ids;

/// Leases of one class are interchangeable: a state's representative sorts them by how they look
/// everywhere in the state (their process side, their members, every mask they are in).
impl stateright::Representative for State {
    fn representative(&self) -> Self {
        let key = |l: usize| {
            let bit = 1u8 << l;
            let mut masks = Vec::with_capacity(6 * MAX_HOLDERS + 1);
            let mut replied = 0;
            for h in &self.holders {
                let (a, b) = match h.round {
                    Round::Prune { keep, .. } => (keep, 0),
                    Round::PruneStrays { strays, .. } => (strays, 0),
                    Round::Reclaim { check, .. } => (check, 0),
                    Round::Recount { lost, reclaimed, .. } => (lost, reclaimed),
                    Round::Releasing { leases } => (leases, 0),
                    Round::Keepalive {
                        call: Call::Ran(reply),
                        ..
                    } => {
                        replied += reply.ids[l]; // 0 in other holders' replies
                        (0, 0)
                    }
                    _ => (0, 0),
                };
                let [c, d, e, f] = h
                    .tally
                    .map_or([0; 4], |t| [t.in_flight, t.seen_in_flight, t.held_ids, t.changed]);
                masks.extend([a, b, c, d, e, f].map(|m| m & bit != 0));
            }
            masks.push(self.late.is_some_and(|late| late.leases() & bit != 0));
            (
                self.leases[l],
                (self.redis.members[l], self.redis.summed[l], replied),
                self.snapshot.as_ref().map(|s| (s.members[l], s.summed[l])),
                masks,
            )
        };
        // perm[new] = old: leases move only among the positions of their class.
        let mut perm: [usize; MAX_LEASES] = std::array::from_fn(|i| i);
        let mut placed = [false; MAX_LEASES];
        for first in 0..MAX_LEASES {
            let class = self.leases[first].class;
            if placed[first] || class == NO_CLASS {
                continue;
            }
            let positions: Vec<usize> = (first..MAX_LEASES)
                .filter(|&l| self.leases[l].class == class)
                .collect();
            let mut sorted = positions.clone();
            sorted.sort_by_key(|&l| key(l));
            for (&position, &old) in positions.iter().zip(&sorted) {
                perm[position] = old;
                placed[position] = true;
            }
        }
        if perm.iter().enumerate().all(|(i, &old)| i == old) {
            return self.clone();
        }
        self.permuted(&perm)
    }
}

impl State {
    /// The same state with its leases renumbered: `perm[new] = old`.
    fn permuted(&self, perm: &[usize; MAX_LEASES]) -> Self {
        let remap = |mask: u8| -> u8 {
            (0..MAX_LEASES)
                .filter(|&new| mask & (1 << perm[new]) != 0)
                .fold(0, |m, new| m | 1 << new)
        };
        let renumber = |old: usize| perm.iter().position(|&o| o == old).expect("a permutation");
        let renumber_ids = |ids: Ids| -> Ids { std::array::from_fn(|new| ids[perm[new]]) };
        let mut s = self.clone();
        for (new, &old) in perm.iter().enumerate() {
            s.leases[new] = self.leases[old];
            s.redis.members[new] = self.redis.members[old];
            if let (Some(to), Some(from)) = (&mut s.snapshot, &self.snapshot) {
                to.members[new] = from.members[old];
            }
        }
        s.redis.summed = renumber_ids(self.redis.summed);
        if let (Some(to), Some(from)) = (&mut s.snapshot, &self.snapshot) {
            to.summed = renumber_ids(from.summed);
        }
        for h in s.holders.iter_mut() {
            match &mut h.round {
                Round::Prune { keep, .. } => *keep = remap(*keep),
                Round::PruneStrays { strays, .. } => *strays = remap(*strays),
                Round::Reclaim { check, .. } => *check = remap(*check),
                Round::Recount { lost, reclaimed, .. } => {
                    *lost = remap(*lost);
                    *reclaimed = remap(*reclaimed);
                }
                Round::Releasing { leases } => *leases = remap(*leases),
                Round::Keepalive {
                    call: Call::Ran(reply),
                    ..
                } => reply.ids = renumber_ids(reply.ids),
                Round::Idle | Round::Keepalive { .. } => {}
            }
            if let Some(t) = &mut h.tally {
                t.in_flight = remap(t.in_flight);
                t.seen_in_flight = remap(t.seen_in_flight);
                t.held_ids = remap(t.held_ids);
                t.changed = remap(t.changed);
            }
        }
        s.late = self.late.map(|late| match late {
            Late::Acquire(lease) => Late::Acquire(renumber(lease)),
            Late::Release { holder, leases } => Late::Release {
                holder,
                leases: remap(leases),
            },
            Late::Prune { holder, keep } => Late::Prune {
                holder,
                keep: remap(keep),
            },
            Late::PruneIds { holder, strays } => Late::PruneIds {
                holder,
                strays: remap(strays),
            },
            Late::Reclaim { holder, check } => Late::Reclaim {
                holder,
                check: remap(check),
            },
            late @ Late::Keepalive { .. } => late,
        });
        s
    }
}
