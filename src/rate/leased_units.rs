//! Units of a request rate leased to this process (`RatePolicy::lease_units`): a hit that goes to
//! the store also takes units ahead for this process, and the hits that follow are served from
//! them here, without a round trip, until they run out or their bucket stops being current.
//!
//! A unit is served only after the store counted it, so a limit holds across every process; the
//! price is early refusal: units one process holds unused are refused to the others. That is
//! bounded: a slab is sized to what its process served in the last `SERVE_FOR` (none for an
//! identity seen once: the common case stays exact), at most a tenth of the limit, and the store
//! gives at most half the room the hit leaves (`lua/prelude/rates.lua`); what is unused goes back
//! after `IDLE` without a hit, when its bucket stops being current (a sliding window's slice: it
//! still counts in the window), and when the manager closes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::{Adjustment, Algorithm, Bucket, Decision, HitOutcome, RatePolicy};
use crate::sync::lock;

/// How long a slab should last at its identity's rate in this process.
const SERVE_FOR: Duration = Duration::from_millis(100);
/// A rate is counted over this long at least: a few hits in a few µs say little of the next
/// 100 ms.
const SHORTEST_COUNT: Duration = Duration::from_millis(10);
/// Unused units go back after this long without a hit.
pub const IDLE: Duration = Duration::from_secs(1);
/// A slab holds at most this fraction of its policy's limit.
const MOST_OF_LIMIT: u64 = 10;

/// The units this process holds ahead, per counter (a policy of an identity).
#[derive(Default)]
pub struct LeasedUnits {
    slabs: Mutex<HashMap<String, Slab>>,
    /// A sweeper looks at them (`give_back_idle`) while there are any.
    sweeping: AtomicBool,
}

/// What `LeasedUnits::serve` did with a hit.
pub enum Serving {
    Served(HitOutcome),
    /// Not served: a call in flight asked for units that may serve it; it answers when this
    /// changes.
    Refilling(watch::Receiver<()>),
    /// To the store, asking each policy for these units ahead (none: empty).
    Send(Vec<u64>),
}

/// One counter's units held ahead, and what the next slab's size is learned from.
struct Slab {
    policy: RatePolicy,
    /// Units taken ahead and not served yet.
    units: u64,
    /// Where they went (a refund finds them there).
    bucket: Option<Bucket>,
    /// They may be served until then: their bucket stays the current one.
    fresh_until: Instant,
    /// Units in use in the window as the last reply said (this slab's included), and when its
    /// next units free up.
    used: u64,
    reset_at: Instant,
    /// The identity's rate here: its hits (served here or sent) since `counted_from`, which
    /// starts again with each call that asks for units ahead; and its last hit.
    counted_from: Instant,
    hits: u64,
    last_hit: Instant,
    /// Units asked for ahead by calls not answered yet; told when one answers.
    asked: u64,
    refilled: watch::Sender<()>,
}

impl Slab {
    fn fresh(&self, now: Instant) -> bool {
        now < self.fresh_until
    }

    /// The decision of a hit it served: in use, the store's count as of its last answer.
    fn decision(&self, now: Instant) -> Decision {
        let reset_ms = self.reset_at.saturating_duration_since(now).as_millis() as u64;
        let mut decision = Decision::new(self.policy.clone(), self.used, reset_ms, self.bucket);
        self.leave_available(&mut decision);
        decision
    }

    /// `remaining` counts the units this process holds as the identity's to use; `used` stays
    /// what the store counts (they are taken), as `peek()` and the threshold alerts see it.
    fn leave_available(&self, decision: &mut Decision) {
        let unavailable = decision.used.saturating_sub(self.units);
        decision.remaining = self.policy.limit.saturating_sub(unavailable);
    }

    /// Its units, given back to their bucket (none when there are none, or when the bucket, a
    /// fixed window, has ended: nothing counts there any more).
    fn give_back(&mut self, key: &str, now: Instant) -> Option<Adjustment> {
        let units = std::mem::take(&mut self.units);
        let counts = self.policy.algorithm == Algorithm::SlidingWindow || self.fresh(now);
        (units > 0 && counts).then(|| Adjustment {
            key: key.to_owned(),
            policy: self.policy.clone(),
            tokens: units,
            refund_from: self.bucket,
        })
    }
}

impl LeasedUnits {
    /// The hit served here when every policy leases units and holds `cost` of them, fresh, for
    /// its counter (`keys[i]` counts `policies[i]`); else, when a call in flight asked units
    /// ahead for a counter that lacks them, a watch that changes when it answers (serve again
    /// then: a busy identity's hits wait for one round trip rather than each making one);
    /// else `Send`, with the units to ask for ahead (`aheads`), asked in the same step, so the
    /// hits that follow wait for them. Nothing is taken unless served.
    pub fn serve(&self, keys: &[String], policies: &[RatePolicy], cost: u64, now: Instant) -> Serving {
        if !policies.iter().all(|policy| policy.lease_units) {
            // Units ahead of such a hit would never serve one: it asks for none.
            return Serving::Send(Vec::new());
        }
        let mut slabs = lock(&self.slabs);
        let mut refilling = None;
        for key in keys {
            match slabs.get(key) {
                Some(slab) if slab.units >= cost && slab.fresh(now) => {}
                Some(slab) if slab.asked > 0 => refilling = Some(slab.refilled.subscribe()),
                _ => return Serving::Send(aheads(&mut slabs, keys, policies, now)),
            }
        }
        match refilling {
            Some(refilled) => Serving::Refilling(refilled),
            None => Serving::Served(served(&mut slabs, keys, cost, now)),
        }
    }

    /// Forgets the units `aheads` asked for (their call failed: nothing was taken).
    pub fn unasked(&self, keys: &[String], aheads: &[u64]) {
        let mut slabs = lock(&self.slabs);
        for (key, ahead) in keys.iter().zip(aheads) {
            if let Some(slab) = slabs.get_mut(key) {
                slab.asked = slab.asked.saturating_sub(*ahead);
                slab.refilled.send_replace(());
            }
        }
    }

    /// Keeps what a hit sent at `sent_at`, asking for `aheads` (`Serving::Send`), took ahead
    /// (`outcome.ahead`) for the policies that lease units (a counter seen for the first time
    /// starts its rate there). Units still held in another bucket are given back (returned); the
    /// outcome's decisions count this process's units as available in `remaining`, as a hit
    /// served here does.
    pub fn keep(
        &self,
        keys: &[String],
        policies: &[RatePolicy],
        aheads: &[u64],
        outcome: &mut HitOutcome,
        sent_at: Instant,
    ) -> Vec<Adjustment> {
        let mut given_back = Vec::new();
        let mut slabs = lock(&self.slabs);
        for (i, (key, policy)) in keys.iter().zip(policies).enumerate() {
            if !policy.lease_units {
                continue;
            }
            let ahead = outcome.ahead.get(i).copied().unwrap_or_default();
            let decision = &mut outcome.decisions[i];
            let fresh_until = sent_at + Duration::from_millis(ahead.fresh_ms);
            let slab = slabs.entry(key.clone()).or_insert_with(|| Slab {
                policy: policy.clone(),
                units: 0,
                bucket: None,
                fresh_until,
                used: 0,
                reset_at: sent_at,
                counted_from: sent_at,
                hits: 1,
                last_hit: sent_at,
                asked: 0,
                refilled: watch::Sender::new(()),
            });
            slab.asked = slab.asked.saturating_sub(aheads.get(i).copied().unwrap_or(0));
            if ahead.units > 0 {
                if slab.bucket != decision.bucket || !slab.fresh(sent_at) {
                    given_back.extend(slab.give_back(key, sent_at));
                    slab.bucket = decision.bucket;
                }
                slab.units += ahead.units;
                slab.fresh_until = fresh_until;
            }
            slab.policy = policy.clone();
            slab.used = decision.used;
            slab.reset_at = sent_at + Duration::from_millis(decision.reset_ms);
            slab.last_hit = slab.last_hit.max(sent_at);
            slab.refilled.send_replace(());
            slab.leave_available(decision);
        }
        given_back
    }

    /// Gives back the units of every slab without a hit for `IDLE` or whose bucket is no longer
    /// current, and forgets the counters idle that long with nothing held; with the number of
    /// slabs left.
    pub fn give_back_idle(&self, now: Instant) -> (Vec<Adjustment>, usize) {
        let mut slabs = lock(&self.slabs);
        let mut given_back = Vec::new();
        slabs.retain(|key, slab| {
            let idle = now.duration_since(slab.last_hit) >= IDLE;
            if idle || !slab.fresh(now) {
                given_back.extend(slab.give_back(key, now));
            }
            !idle
        });
        (given_back, slabs.len())
    }

    /// Gives back every unit held, and forgets them all (the manager closes).
    pub fn give_back_all(&self, now: Instant) -> Vec<Adjustment> {
        lock(&self.slabs)
            .drain()
            .filter_map(|(key, mut slab)| slab.give_back(&key, now))
            .collect()
    }

    /// Whether the caller is to start the sweeper: none runs.
    pub fn start_sweeping(&self) -> bool {
        !self.sweeping.swap(true, Ordering::AcqRel)
    }

    /// Whether the sweeper, which found nothing held, stops: not when a slab came meanwhile and
    /// no other sweeper was started for it.
    pub fn stop_sweeping(&self) -> bool {
        self.sweeping.store(false, Ordering::Release);
        lock(&self.slabs).is_empty() || !self.start_sweeping()
    }

    /// Forgets what is held of these counters (they were reset: their units are gone).
    pub fn forget(&self, keys: &[String]) {
        let mut slabs = lock(&self.slabs);
        for key in keys {
            slabs.remove(key);
        }
    }
}

/// Takes `cost` from each counter's slab (each holds it, fresh) and answers the hit.
fn served(slabs: &mut HashMap<String, Slab>, keys: &[String], cost: u64, now: Instant) -> HitOutcome {
    let decisions = keys
        .iter()
        .map(|key| {
            let slab = slabs.get_mut(key).expect("checked by serve");
            slab.units -= cost;
            slab.hits += 1;
            slab.last_hit = now;
            slab.decision(now)
        })
        .collect();
    HitOutcome {
        decisions,
        refused: None,
        ahead: Vec::new(),
    }
}

/// The units to ask each policy (every one leases units) for ahead of a hit sent to the store
/// now, noted as asked: none for a counter without a hit within `IDLE`; else its
/// hits here per `SERVE_FOR` (counted since the last call that asked, over `SHORTEST_COUNT` at
/// least), less what it holds fresh and has asked for already, so that never exceeds a tenth
/// of the limit. Empty when there are none to ask; else `keep` or `unasked` must follow.
fn aheads(
    slabs: &mut HashMap<String, Slab>,
    keys: &[String],
    policies: &[RatePolicy],
    now: Instant,
) -> Vec<u64> {
    let aheads: Vec<u64> = keys
        .iter()
        .zip(policies)
        .map(|(key, policy)| match slabs.get_mut(key) {
            Some(slab) if now.duration_since(slab.last_hit) < IDLE => {
                slab.hits += 1;
                slab.last_hit = now;
                let counted_for = now.duration_since(slab.counted_from);
                let elapsed = counted_for.max(SHORTEST_COUNT).as_micros();
                let want = (u128::from(slab.hits) * SERVE_FOR.as_micros() / elapsed) as u64;
                let held = if slab.fresh(now) { slab.units } else { 0 };
                let ask = want
                    .min(policy.limit / MOST_OF_LIMIT)
                    .saturating_sub(held + slab.asked);
                slab.asked += ask;
                if ask > 0 && counted_for >= SHORTEST_COUNT {
                    (slab.counted_from, slab.hits) = (now, 0);
                }
                ask
            }
            _ => 0,
        })
        .collect();
    if aheads.iter().all(|&ahead| ahead == 0) {
        return Vec::new();
    }
    aheads
}

#[cfg(test)]
#[path = "leased_units_tests.rs"]
mod tests;
