//! The embedded store's waiting lines, making the decisions of `lua/acquire.lua`: every waiter
//! by ticket, what each one needs, and each capped shared pool's own line (waiters by place,
//! then id) with its turns.

use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use crate::backend::{InLine, Placed, Waiter, MAX_PRIORITY};
use crate::config::LineOrder;
use crate::keys::Pool;

/// A place in a pool's line: (MAX_PRIORITY - priority) * TURNS + turn, as in the script.
const TURNS: u64 = 1 << 48;

#[derive(Default)]
struct PoolLine {
    order: BTreeSet<(u64, String)>,
    places: HashMap<String, u64>,
    /// User -> the turn of its last waiter here.
    turns: HashMap<String, u64>,
    /// How many users `turns` kept after it last forgot those served (see `note_turn`).
    turns_kept: usize,
    /// The last turn served here.
    served: u64,
    /// Waiter -> slots that later requests took past it while it did not fit.
    passed: HashMap<String, u64>,
    /// User -> its places here.
    users: HashMap<String, u64>,
    /// When a waiter was last served here, and the mean time between two (for `Retry-After`).
    served_at: Option<Instant>,
    gap_ms: Option<f64>,
}

/// How much each new gap between two waiters served moves the mean (as in the script).
const GAP_WEIGHT: f64 = 0.2;

impl PoolLine {
    /// How long until a newcomer at the end of this line would be served, at the recent rate
    /// (None before two waiters were served).
    fn wait_estimate_ms(&self) -> Option<u64> {
        self.gap_ms
            .map(|gap| (gap * (self.order.len() + 1) as f64) as u64)
    }

    /// The place a request of `user` takes (fair order: the turn after the last one served or
    /// after the user's last waiter, whichever is later; arrival order: its ticket, or after
    /// every waiter of its priority for a request without one).
    fn place_for(&self, user: &str, ticket: Option<u64>, in_line: &InLine<'_>) -> u64 {
        let turn = match in_line.order {
            LineOrder::Arrival => ticket.unwrap_or(TURNS - 1),
            LineOrder::Fair => self.served.max(self.turns.get(user).copied().unwrap_or(0)) + 1,
        };
        u64::from(MAX_PRIORITY - in_line.priority) * TURNS + turn
    }

    /// Records the turn of `user`'s last waiter. Whenever the users known doubled, forgets
    /// those whose last turn was served (their next waiter's turn is the same without them), so
    /// that a line that never empties does not remember every user it ever served, as the
    /// script's `sweep_turns`.
    fn note_turn(&mut self, user: &str, turn: u64) {
        self.turns.insert(user.to_owned(), turn);
        if self.turns.len() > 2 * self.turns_kept + 64 {
            let served = self.served;
            self.turns.retain(|_, last| *last > served);
            self.turns_kept = self.turns.len();
        }
    }
}

/// What a waiter in line needs, and whose it is.
struct Needs {
    weight: u64,
    user: String,
    /// The keys of the pools it waits for.
    pools: Vec<String>,
}

#[derive(Default)]
pub struct MemoryLines {
    tickets: HashMap<String, u64>,
    needs: HashMap<String, Needs>,
    lines: HashMap<String, PoolLine>,
    /// User -> the weight of its waiters in line.
    users: HashMap<String, u64>,
    /// Waiters whose places went to other users' waiters -> the pool whose line they left
    /// (until their next call is answered).
    displaced: HashMap<String, String>,
    last_ticket: u64,
}

impl MemoryLines {
    /// Whether a waiter is in line.
    pub fn has(&self, waiter: &Waiter) -> bool {
        self.tickets.contains_key(&waiter.id)
    }

    /// The weight of `user`'s waiters in line.
    pub fn users_waiting(&self, user: &str) -> u64 {
        self.users.get(user).copied().unwrap_or(0)
    }

    /// Makes room for a new waiter of `user` in each line of its `pools` that is full
    /// (`max_waiting`), as the script's `make_room`: a user with no place there yet takes the
    /// place of the last waiter of the user with the most places there, when that user has two
    /// or more (that waiter is displaced). Else returns the first such line (in pool order),
    /// with its index, its waiters and an estimate of the wait, and displaces no one.
    pub fn make_room(
        &mut self,
        user: &str,
        pools: &[Pool],
        in_line: &InLine<'_>,
    ) -> Option<(usize, u64, Option<u64>)> {
        let mut displaced = Vec::new();
        for (i, pool) in pools.iter().enumerate() {
            let limit = in_line.max_waiting.get(i).copied().unwrap_or(0);
            let Some(line) = self.lines.get(&*pool.key).filter(|_| limit > 0) else {
                continue;
            };
            let waiting = line.order.len() as u64;
            if waiting < limit {
                continue;
            }
            // Ties go to the greatest user, as ZREVRANGE orders equal scores.
            let most = line.users.iter().max_by_key(|(who, places)| (**places, *who));
            let victim = most
                .filter(|(_, places)| **places >= 2 && !line.users.contains_key(user))
                .and_then(|(who, _)| {
                    line.order
                        .iter()
                        .rev()
                        .find(|(_, id)| self.needs.get(id).is_some_and(|needs| needs.user == *who))
                });
            match victim {
                Some((_, id)) => displaced.push((id.clone(), pool.key.to_string())),
                None => return Some((i, waiting, line.wait_estimate_ms())),
            }
        }
        for (id, pool) in displaced {
            self.leave(&id);
            self.displaced.insert(id, pool);
        }
        None
    }

    /// A waiter whose place went to another user's waiter (`make_room`), once: the index of
    /// the pool whose line it left, with that line's waiters and estimate.
    pub fn given_up(&mut self, waiter: &Waiter, pools: &[Pool]) -> Option<(usize, u64, Option<u64>)> {
        let key = self.displaced.remove(&waiter.id)?;
        let i = pools.iter().position(|pool| *pool.key == *key).unwrap_or(0);
        let line = self.lines.get(&key);
        Some((
            i,
            line.map_or(0, |line| line.order.len() as u64),
            line.and_then(PoolLine::wait_estimate_ms),
        ))
    }

    /// The waiters whose places went to other users' waiters, not told yet.
    pub fn displaced(&self) -> Vec<String> {
        self.displaced.keys().cloned().collect()
    }

    /// Enters a waiter of `user` (or finds it) in the line of each of its `lined` pools.
    pub fn enter(&mut self, waiter: &Waiter, user: &str, weight: u64, lined: &[&Pool], in_line: &InLine<'_>) {
        if self.tickets.contains_key(&waiter.id) {
            return;
        }
        self.last_ticket += 1;
        self.tickets.insert(waiter.id.clone(), self.last_ticket);
        for pool in lined {
            let line = self.lines.entry(pool.key.to_string()).or_default();
            let place = line.place_for(user, Some(self.last_ticket), in_line);
            line.order.insert((place, waiter.id.clone()));
            line.places.insert(waiter.id.clone(), place);
            *line.users.entry(user.to_owned()).or_default() += 1;
            if in_line.order == LineOrder::Fair {
                line.note_turn(user, place % TURNS);
            }
        }
        *self.users.entry(user.to_owned()).or_default() += weight;
        let needs = Needs {
            weight,
            user: user.to_owned(),
            pools: lined.iter().map(|pool| pool.key.to_string()).collect(),
        };
        self.needs.insert(waiter.id.clone(), needs);
    }

    /// The slots the waiters before this request (for one that will not wait: before the place
    /// it would take) keep in `pool` with `used` slots taken, as `promised_in` in the script: a
    /// waiter keeps its room when it fits beside those counted so far or was passed by a pool's
    /// worth of slots already; one that does not fit may be passed (listed in `passing`).
    pub fn promised(
        &self,
        pool: &Pool,
        used: u64,
        waiter: Option<&Waiter>,
        user: &str,
        in_line: &InLine<'_>,
        passing: &mut Vec<(String, String)>,
    ) -> u64 {
        let Some(line) = self.lines.get(&*pool.key) else {
            return 0;
        };
        let mine = waiter.and_then(|w| line.places.get(&w.id).map(|place| (*place, w.id.clone())));
        let upto = mine.unwrap_or_else(|| (line.place_for(user, None, in_line) + 1, String::new()));
        let mut promised = 0;
        for (_, id) in line.order.range(..upto) {
            let need = self.needs.get(id).map_or(0, |needs| needs.weight);
            let passed = line.passed.get(id).copied().unwrap_or(0);
            if used + promised + need <= pool.capacity || passed >= pool.capacity {
                promised += need;
            } else {
                passing.push((pool.key.to_string(), id.clone()));
            }
        }
        promised
    }

    /// A request of `weight` granted past the waiters in `passing`.
    pub fn passed(&mut self, passing: &[(String, String)], weight: u64) {
        for (key, id) in passing {
            if let Some(line) = self.lines.get_mut(key) {
                *line.passed.entry(id.clone()).or_default() += weight;
            }
        }
    }

    /// Where a waiter stands, for its process; `full`: the pool without room for it.
    pub fn placed(&self, waiter: &Waiter, pools: &[Pool], full: (usize, u64)) -> Placed {
        Placed {
            full,
            ticket: self.tickets.get(&waiter.id).copied().unwrap_or(0),
            places: pools
                .iter()
                .map(|pool| {
                    self.lines
                        .get(&*pool.key)
                        .and_then(|line| line.places.get(&waiter.id))
                        .copied()
                        .unwrap_or(0)
                })
                .collect(),
        }
    }

    /// A waiter granted: the turns it had are served, and the lines' service rates move.
    pub fn served(&mut self, waiter: &Waiter) {
        let now = Instant::now();
        for line in self.lines.values_mut() {
            if let Some(place) = line.places.get(&waiter.id) {
                line.served = line.served.max(place % TURNS);
                if let Some(at) = line.served_at {
                    let gap = now.duration_since(at).as_secs_f64() * 1000.0;
                    line.gap_ms = Some(line.gap_ms.map_or(gap, |mean| mean + GAP_WEIGHT * (gap - mean)));
                }
                line.served_at = Some(now);
            }
        }
    }

    pub fn leave(&mut self, id: &str) {
        self.tickets.remove(id);
        self.displaced.remove(id);
        let Some(needs) = self.needs.remove(id) else {
            return;
        };
        count_down(&mut self.users, &needs.user, needs.weight);
        for key in needs.pools {
            if let Some(line) = self.lines.get_mut(&key) {
                if let Some(place) = line.places.remove(id) {
                    line.order.remove(&(place, id.to_owned()));
                    count_down(&mut line.users, &needs.user, 1);
                }
                line.passed.remove(id);
                if line.order.is_empty() {
                    self.lines.remove(&key); // its turns are forgotten, as in the script
                }
            }
        }
    }
}

/// Moves a user's count down by `by`, forgetting the user at 0 (as the script's `count_user`).
fn count_down(counts: &mut HashMap<String, u64>, user: &str, by: u64) {
    if let Some(count) = counts.get_mut(user) {
        *count = count.saturating_sub(by);
        if *count == 0 {
            counts.remove(user);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_that_never_empties_forgets_the_users_it_served() {
        let mut line = PoolLine::default();
        for turn in 1..=1000 {
            line.note_turn(&format!("user{turn}"), turn);
            line.served = turn - 1; // the one before was just served: one waiter left each time
        }
        assert!(line.turns.len() <= 2 * 64 + 1, "{} users kept", line.turns.len());
        assert_eq!(
            line.turns.get("user1000"),
            Some(&1000),
            "a user still waiting is kept"
        );
    }
}
