//! What Redis should count for this holder in each tag of the main store: the members of the
//! leases it holds, give or take those in flight (acquires sent and not answered, releases not
//! confirmed), and the sum of their ids (`LeaseRecord::id_value` per member). A keep-alive's
//! count below the lowest figure seen during its call means members are missing (the leases are
//! checked one by one, that round); above the highest, members it does not hold (they are
//! pruned at the next round, once the acquires in flight during the call are answered: a
//! refused one never counted), and the leases are checked one by one too, that round, since the
//! excess may hide members missing. A count within those figures whose sum of ids no choice of
//! the leases that changed during the call explains means as many members are missing as came
//! back (a failover that lost a grant and brought back a release): checked one by one as well.
//! So a shortfall is found within one renewal period (one whose call saw at most
//! `MOST_CHANGES_JUDGED` leases change; a later one otherwise), an excess within two.

use std::collections::HashMap;

use crate::backend::Counted;
use crate::lease::{LeaseId, LeaseRecord};

/// Leases that changed during one keep-alive call beyond which its sum of ids is not judged
/// (each choice of them is tried: 2^12 at most); the count still is, and the next call with
/// fewer changes judges the sum.
const MOST_CHANGES_JUDGED: usize = 12;

/// A lease as a tally sees it: what it adds to the count and to the sum of ids, and whether it
/// is held now.
#[derive(Clone, Copy)]
struct Share {
    units: u64,
    ids: u64,
    held: bool,
}

impl Share {
    fn of(record: &LeaseRecord, held: bool) -> Self {
        let units = record.units();
        Share {
            units,
            ids: units * record.id_value(),
            held,
        }
    }
}

#[derive(Default)]
struct Tally {
    /// Members of the leases held, and the sum of their ids.
    held: u64,
    held_ids: u64,
    /// Lease id -> its share, of the leases in flight (few: only calls under way).
    in_flight: HashMap<LeaseId, Share>,
    /// Since the window opened: the lowest and highest `held`, and the leases in flight at any
    /// moment, less those found to have added nothing (refused, never sent).
    lo: u64,
    held_hi: u64,
    seen_in_flight: HashMap<LeaseId, u64>,
    /// The leases in flight when the window opened or changed since, each with its share now:
    /// Redis may or may not count them. Every other lease held now was held all along.
    changed: HashMap<LeaseId, Share>,
    /// The window is open until the keep-alive's answer arrives.
    window_open: bool,
    /// What that answer said: the holder's count in Redis, and whether its sum of ids was
    /// explained.
    reported: Option<u64>,
    ids_unexplained: bool,
}

impl Tally {
    fn seen(&mut self) {
        if self.window_open {
            self.lo = self.lo.min(self.held);
            self.held_hi = self.held_hi.max(self.held);
        }
    }

    fn changed(&mut self, record: &LeaseRecord, share: Share) {
        if self.window_open {
            self.changed.insert(record.id, share);
        }
    }

    /// Nothing to keep: nothing held or in flight, no count to judge, and no window open (a
    /// tally dropped while its keep-alive is under way would come back without the window's
    /// figures, and its answer would look like an excess).
    fn is_empty(&self) -> bool {
        self.held == 0
            && self.in_flight.is_empty()
            && self.reported.is_none()
            && !self.ids_unexplained
            && !self.window_open
    }

    /// The most Redis may have counted while the window was open.
    fn hi(&self) -> u64 {
        self.held_hi + self.seen_in_flight.values().sum::<u64>()
    }

    /// Whether Redis's sum of ids is what the leases held all along add, plus those of some of
    /// the leases that changed, with as many members as it counted (not judged, so true, when
    /// too many changed).
    fn ids_explained(&self, counted: Counted) -> bool {
        let changed: Vec<Share> = self.changed.values().copied().collect();
        if changed.len() > MOST_CHANGES_JUDGED {
            return true;
        }
        let (mut members, mut ids) = (self.held, self.held_ids);
        for share in changed.iter().filter(|share| share.held) {
            members = members.saturating_sub(share.units);
            ids = ids.saturating_sub(share.ids);
        }
        let (Some(members), Some(ids)) = (counted.members.checked_sub(members), counted.ids.checked_sub(ids))
        else {
            return false;
        };
        (0u32..1 << changed.len()).any(|choice| {
            let chosen = changed
                .iter()
                .enumerate()
                .filter(|(i, _)| choice & (1 << i) != 0)
                .map(|(_, share)| share);
            chosen.fold((0, 0), |(m, s), share| (m + share.units, s + share.ids)) == (members, ids)
        })
    }
}

#[derive(Default)]
pub struct Tallies {
    by_tag: HashMap<String, Tally>,
}

impl Tallies {
    fn change(&mut self, holders: &str, change: impl FnOnce(&mut Tally)) {
        // Looked up by reference first: the key is copied only for a tag seen the first time.
        let tally = match self.by_tag.get_mut(holders) {
            Some(tally) => tally,
            None => self.by_tag.entry(holders.to_owned()).or_default(),
        };
        change(tally);
        tally.seen();
        if tally.is_empty() {
            self.by_tag.remove(holders);
        }
    }

    /// Whether anything is held or in flight in a tag, or its keep-alive's count is still to be
    /// judged.
    pub fn tracks(&self, holders: &str) -> bool {
        self.by_tag.contains_key(holders)
    }

    /// A lease became held (`held`), or stopped being held.
    pub fn hold(&mut self, record: &LeaseRecord, held: bool) {
        let share = Share::of(record, held);
        self.change(&record.holders, |tally| {
            if held {
                tally.held += share.units;
                tally.held_ids += share.ids;
            } else {
                tally.held = tally.held.saturating_sub(share.units);
                tally.held_ids = tally.held_ids.saturating_sub(share.ids);
            }
            if let Some(flight) = tally.in_flight.get_mut(&record.id) {
                flight.held = held;
            }
            tally.changed(record, share);
        });
    }

    /// A call about to change the lease in Redis (an acquire, a release); idempotent. A lease
    /// `held` until now is counted by the window's highest `held` already.
    pub fn flight_start(&mut self, record: &LeaseRecord, held: bool) {
        // Not in `held` (a release has taken it out already).
        let share = Share::of(record, false);
        self.change(&record.holders, |tally| {
            tally.in_flight.insert(record.id, share);
            if !held && tally.window_open {
                tally.seen_in_flight.insert(record.id, share.units);
            }
            tally.changed(record, share);
        });
    }

    /// The lease's calls are over: `counted` if Redis may have had its members meanwhile (a
    /// grant, a release), not if it certainly never had them (refused, never sent); idempotent.
    pub fn flight_end(&mut self, record: &LeaseRecord, counted: bool) {
        self.change(&record.holders, |tally| {
            if let Some(share) = tally.in_flight.remove(&record.id) {
                tally.changed(record, share);
            }
            if !counted {
                tally.seen_in_flight.remove(&record.id);
            }
        });
    }

    /// Opens a window per tag (at a keep-alive's send): from now, every figure is seen.
    pub fn open_windows(&mut self) {
        // A tag with nothing held or in flight gets no keep-alive, so no window (a window left
        // open by a keep-alive that failed closes here).
        self.by_tag
            .retain(|_, tally| tally.held > 0 || !tally.in_flight.is_empty());
        for tally in self.by_tag.values_mut() {
            tally.lo = tally.held;
            tally.held_hi = tally.held;
            tally.seen_in_flight = tally
                .in_flight
                .iter()
                .map(|(id, share)| (*id, share.units))
                .collect();
            tally.changed.clone_from(&tally.in_flight);
            tally.window_open = true;
            tally.reported = None;
        }
    }

    /// Closes a tag's window with the keep-alive's count; true if its leases must be checked one
    /// by one: the count is short of what was held all along (grants are missing), above the
    /// most the window saw (members it does not hold, which may hide missing ones: a failover
    /// that brings back more released members than it loses held ones), or its sum of ids says
    /// that as many are missing as came back. An excess is also pruned at the next round.
    pub fn close_window(&mut self, holders: &str, counted: Counted) -> bool {
        let Some(tally) = self.by_tag.get_mut(holders) else {
            return false;
        };
        tally.window_open = false;
        tally.reported = Some(counted.members);
        tally.ids_unexplained = !tally.ids_explained(counted);
        tally.changed.clear();
        counted.members < tally.lo || counted.members > tally.hi() || tally.ids_unexplained
    }

    /// The tags whose last count exceeded the most they could have had, now that the calls in
    /// flight during its window are answered, or whose sum of ids was not explained: members
    /// this holder does not hold may be there (a released lease a failover brought back, in
    /// place of a grant it lost, which the check one by one took back meanwhile).
    pub fn take_excess(&mut self) -> Vec<String> {
        let excess = self
            .by_tag
            .iter()
            .filter(|(_, tally)| {
                tally.ids_unexplained || tally.reported.is_some_and(|members| members > tally.hi())
            })
            .map(|(holders, _)| holders.clone())
            .collect();
        for tally in self.by_tag.values_mut() {
            tally.reported = None;
            tally.ids_unexplained = false;
        }
        excess
    }

    /// The ids of the leases in flight in the tag.
    pub fn in_flight(&self, holders: &str) -> Vec<String> {
        self.by_tag.get(holders).map_or_else(Vec::new, |tally| {
            tally.in_flight.keys().map(|id| id.to_string()).collect()
        })
    }

    /// Whether a lease is in flight in the tag.
    pub fn is_in_flight(&self, holders: &str, id: &str) -> bool {
        self.by_tag
            .get(holders)
            .is_some_and(|tally| tally.in_flight.contains_key(id))
    }
}

#[cfg(test)]
#[path = "tally_tests.rs"]
mod tests;
