//! Rate counters for one process: the decisions of `lua/hit.lua`, on this process's monotonic
//! clock (calendar windows end at the boundaries of the wall-clock time of each call). Counters of identities not seen for a while are swept, so memory follows the
//! identities of the last windows, not every identity ever seen.

use std::collections::{BTreeMap, HashMap};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::rate::price::{tokens_within, units_for};
use crate::rate::{Adjustment, Algorithm, Bucket, Decision, HitOutcome, RatePolicy, TopUp, ToppedUp, SLICES};

/// Hits between two sweeps of counters whose windows have passed.
const SWEEP_EVERY: u32 = 1024;

enum Counter {
    /// Slice start (ms / slice length) -> units, and the counter's epoch (see `Bucket`).
    Sliding(BTreeMap<u64, u64>, u64),
    /// Units, and when the window ends (ms).
    Fixed { used: u64, ends_at: u64 },
}

/// What one policy's counter holds now.
struct Look {
    used: u64,
    /// ms until `excess` units have left the window (argument: the excess).
    wait: Box<dyn Fn(u64) -> u64>,
    /// ms until the next units free up, with `used` units in use after the hit.
    reset: Box<dyn Fn(u64) -> u64>,
}

pub struct RateCounters {
    epoch: Instant,
    /// The wall-clock time (ms since 1970 UTC) of the call in progress: a calendar window that
    /// starts in it ends at the next boundary after it.
    unix_ms: u64,
    counters: HashMap<String, (Counter, u64)>,
    hits_since_sweep: u32,
    /// The last epoch given to a sliding counter (a counter made again gets a new one).
    epochs: u64,
    /// Alert thresholds told: (counter, mark in units) -> from when it is told again (`told_first`).
    told: HashMap<(String, u64), u64>,
}

impl Default for RateCounters {
    fn default() -> Self {
        RateCounters {
            epoch: Instant::now(),
            unix_ms: 0,
            counters: HashMap::new(),
            hits_since_sweep: 0,
            epochs: 0,
            told: HashMap::new(),
        }
    }
}

impl RateCounters {
    /// The monotonic time of a call (and its wall-clock time into `unix_ms`).
    fn now(&mut self) -> u64 {
        self.unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_millis() as u64);
        // Starts one year in, so `now - window` never goes below 0.
        self.epoch.elapsed().as_millis() as u64 + crate::rate::MAX_WINDOW_MS
    }

    /// ms until a fixed window of `policy` that starts in this call would end.
    fn fixed_span(&self, policy: &RatePolicy) -> u64 {
        policy.fixed_span_ms(self.unix_ms)
    }

    /// One hit against every policy (`keys[i]` counts `policies[i]`, which it takes `costs[i]`
    /// from), all or nothing.
    pub fn hit(
        &mut self,
        keys: &[String],
        policies: &[RatePolicy],
        costs: &[u64],
        consume: bool,
    ) -> HitOutcome {
        let now = self.now();
        self.hit_at(now, keys, policies, costs, consume)
    }

    fn hit_at(
        &mut self,
        now: u64,
        keys: &[String],
        policies: &[RatePolicy],
        costs: &[u64],
        consume: bool,
    ) -> HitOutcome {
        self.sweep(now);
        let looks: Vec<Look> = keys
            .iter()
            .zip(policies)
            .map(|(key, policy)| self.look(key, policy, now))
            .collect();
        let over: Vec<bool> = looks
            .iter()
            .zip(policies.iter().zip(costs))
            .map(|(look, (policy, cost))| look.used + cost > policy.limit)
            .collect();
        let refused = (0..policies.len())
            .find(|&i| over[i] && policies[i].enforce)
            .map(|i| (i, (looks[i].wait)(looks[i].used + costs[i] - policies[i].limit)));
        let taken = consume && refused.is_none();
        let decisions = keys
            .iter()
            .zip(policies.iter().zip(costs))
            .zip(looks.iter().zip(over))
            .map(|((key, (policy, cost)), (look, over))| {
                let (mut used, mut bucket) = (look.used, None);
                if taken && *cost > 0 {
                    bucket = Some(self.take(key, policy, *cost, now));
                    used += cost;
                }
                let told = if taken {
                    self.told_first(key, policy, used, now)
                } else {
                    0
                };
                Decision::new(policy.clone(), used, (look.reset)(used), bucket)
                    .refusing(over)
                    .telling(told)
            })
            .collect();
        HitOutcome {
            decisions,
            refused,
            ahead: Vec::new(),
        }
    }

    /// A budget top-up (`lua/topup.lua`): gives back what it lists, takes the moved units
    /// whatever the room, then as many of the answer tokens wanted as every budget has room for
    /// at its price (all of them, forced); the answer tokens left room for after it, and each
    /// budget's bucket and how long it counts.
    pub fn top_up(&mut self, top_up: &TopUp) -> ToppedUp {
        let now = self.now();
        for (key, give_back) in top_up.keys.iter().zip(&top_up.give_back) {
            for (bucket, tokens) in give_back {
                self.give_back(key, *bucket, *tokens, now);
            }
        }
        let left: Vec<u64> = top_up
            .keys
            .iter()
            .zip(&top_up.policies)
            .zip(&top_up.moved)
            .map(|((key, policy), moved)| {
                policy
                    .limit
                    .saturating_sub(self.look(key, policy, now).used + moved)
            })
            .collect();
        let granted = match top_up.forced {
            true => top_up.want,
            false => left
                .iter()
                .zip(&top_up.prices)
                .map(|(left, price)| tokens_within(*left, *price))
                .fold(top_up.want, u64::min),
        };
        let mut room = u64::MAX;
        let mut buckets = Vec::with_capacity(left.len());
        for (i, (key, policy)) in top_up.keys.iter().zip(&top_up.policies).enumerate() {
            let units = units_for(granted, top_up.prices[i]);
            room = room.min(tokens_within(left[i].saturating_sub(units), top_up.prices[i]));
            let taken = top_up.moved[i] + units;
            buckets.push((taken > 0).then(|| {
                let bucket = self.take(key, policy, taken, now);
                (bucket, Self::counts_for(bucket, policy, now))
            }));
        }
        ToppedUp {
            granted,
            room: if buckets.is_empty() { 0 } else { room },
            buckets,
        }
    }

    /// For how many more ms units taken into `bucket` now count in the window (`counts` of
    /// `lua/prelude/rates.lua`'s look_rate).
    fn counts_for(bucket: Bucket, policy: &RatePolicy, now: u64) -> u64 {
        match policy.algorithm {
            Algorithm::SlidingWindow => {
                let slice = policy.window_ms / SLICES;
                (bucket.slot + 1) * slice + policy.window_ms - now
            }
            Algorithm::FixedWindow | Algorithm::Calendar(_) => bucket.slot - now,
        }
    }

    /// One settlement step (`lua/settle.lua`): a charge now, or a refund to the bucket it was
    /// taken from while that still counts.
    pub fn settle(&mut self, adjustment: &Adjustment) {
        let now = self.now();
        match adjustment.refund_from {
            None => {
                self.take(&adjustment.key, &adjustment.policy, adjustment.tokens, now);
            }
            Some(bucket) => self.give_back(&adjustment.key, bucket, adjustment.tokens, now),
        }
    }

    /// Gives back up to `tokens` taken into `bucket`, while it still counts (`give_back` of
    /// `lua/prelude/rates.lua`).
    fn give_back(&mut self, key: &str, bucket: Bucket, tokens: u64, now: u64) {
        let held = match self.counters.get_mut(key) {
            Some((Counter::Sliding(slices, epoch), _)) if *epoch == bucket.epoch => {
                slices.get_mut(&bucket.slot)
            }
            Some((Counter::Fixed { used, ends_at }, _)) if *ends_at == bucket.slot && *ends_at > now => {
                Some(used)
            }
            _ => None,
        };
        if let Some(held) = held {
            *held -= tokens.min(*held);
        }
    }

    pub fn reset(&mut self, keys: &[String]) {
        for key in keys {
            self.counters.remove(key);
        }
        self.told.retain(|(key, _), _| !keys.contains(key));
    }

    /// Which of `policy`'s alert marks `used` units reach that were not told within the window
    /// yet, as bits, each remembered until the units taken now leave the window (`told_first`
    /// of `lua/prelude/rates.lua`).
    fn told_first(&mut self, key: &str, policy: &RatePolicy, used: u64, now: u64) -> u64 {
        let until = match (policy.algorithm, self.counters.get(key)) {
            (Algorithm::SlidingWindow, _) => {
                let slot = now / (policy.window_ms / SLICES);
                now + Self::counts_for(Bucket { slot, epoch: 0 }, policy, now)
            }
            (_, Some((Counter::Fixed { ends_at, .. }, _))) => *ends_at,
            _ => now + self.fixed_span(policy),
        };
        let reached: Vec<u64> = policy
            .alert_at
            .marks(policy.limit)
            .take_while(|mark| used >= *mark)
            .collect();
        let bits = reached.iter().enumerate().fold(0, |bits, (i, mark)| {
            match self.told.get(&(key.to_owned(), *mark)) {
                Some(told) if *told > now => bits,
                _ => bits | 1 << i,
            }
        });
        for (i, mark) in reached.into_iter().enumerate() {
            if bits >> i & 1 == 1 {
                self.told.insert((key.to_owned(), mark), until);
            }
        }
        bits
    }

    fn look(&mut self, key: &str, policy: &RatePolicy, now: u64) -> Look {
        let window = policy.window_ms;
        let span = self.fixed_span(policy);
        match (policy.algorithm, self.counters.get_mut(key)) {
            (Algorithm::SlidingWindow, entry) => {
                let slice = window / SLICES;
                let oldest = (now - window) / slice;
                let live: Vec<(u64, u64)> = match entry {
                    Some((Counter::Sliding(slices, _), _)) => {
                        slices.retain(|at, _| *at >= oldest);
                        slices.iter().map(|(at, units)| (*at, *units)).collect()
                    }
                    _ => Vec::new(),
                };
                let freed_after = {
                    let live = live.clone();
                    move |units: u64| {
                        let mut freed = 0;
                        for (at, n) in &live {
                            freed += n;
                            if freed >= units {
                                return (at + 1) * slice + window - now;
                            }
                        }
                        0
                    }
                };
                let first_free = freed_after.clone();
                let empty = live.is_empty();
                Look {
                    used: live.iter().map(|(_, n)| n).sum(),
                    wait: Box::new(freed_after),
                    reset: Box::new(move |used| match (used, empty) {
                        (0, _) => 0,
                        (_, true) => slice + window - now % slice,
                        (_, false) => first_free(1),
                    }),
                }
            }
            (Algorithm::FixedWindow | Algorithm::Calendar(_), entry) => {
                let (used, left) = match entry {
                    Some((Counter::Fixed { used, ends_at }, _)) if *ends_at > now => (*used, *ends_at - now),
                    _ => (0, span),
                };
                Look {
                    used,
                    wait: Box::new(move |_| left),
                    reset: Box::new(move |used| if used == 0 { 0 } else { left }),
                }
            }
        }
    }

    /// Takes `cost` units; returns where they went (as `lua/prelude/rates.lua`'s look_rate).
    fn take(&mut self, key: &str, policy: &RatePolicy, cost: u64, now: u64) -> Bucket {
        let window = policy.window_ms;
        let span = self.fixed_span(policy);
        self.epochs += 1;
        let new_epoch = self.epochs;
        let entry = self
            .counters
            .entry(key.to_owned())
            .or_insert_with(|| (Counter::Sliding(BTreeMap::new(), new_epoch), 0));
        match policy.algorithm {
            Algorithm::SlidingWindow => {
                if !matches!(entry.0, Counter::Sliding(..)) {
                    entry.0 = Counter::Sliding(BTreeMap::new(), new_epoch);
                }
                let slot = now / (window / SLICES);
                let Counter::Sliding(slices, epoch) = &mut entry.0 else {
                    unreachable!("a sliding window was just set")
                };
                *slices.entry(slot).or_default() += cost;
                entry.1 = now + window + window / SLICES;
                Bucket { slot, epoch: *epoch }
            }
            Algorithm::FixedWindow | Algorithm::Calendar(_) => {
                match &mut entry.0 {
                    Counter::Fixed { used, ends_at } if *ends_at > now => *used += cost,
                    counter => {
                        *counter = Counter::Fixed {
                            used: cost,
                            ends_at: now + span,
                        }
                    }
                }
                let Counter::Fixed { ends_at, .. } = entry.0 else {
                    unreachable!("a fixed window was just set")
                };
                entry.1 = ends_at;
                Bucket {
                    slot: ends_at,
                    epoch: 0,
                }
            }
        }
    }

    /// Drops counters whose last window has passed (the second field: when it stops counting).
    fn sweep(&mut self, now: u64) {
        self.hits_since_sweep += 1;
        if self.hits_since_sweep >= SWEEP_EVERY {
            self.hits_since_sweep = 0;
            self.counters.retain(|_, (_, stale_at)| *stale_at > now);
            self.told.retain(|_, until| *until > now);
        }
    }
}

#[cfg(test)]
#[path = "rate_tests.rs"]
mod tests;
