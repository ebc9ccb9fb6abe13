//! The embedded store for one process (`memory://`, and the local floor while Redis is down):
//! the same decisions as the scripts, under one mutex (admission in `acquire.rs`, the waiting
//! lines in `line.rs`, rate counters in `rate.rs`, answer sizes per model in `answers.rs`). Its leases live as long as their holder,
//! this process: a lease dropped without a release releases itself, so nothing here expires or
//! is renewed. Nothing in it ever waits.

mod acquire;
mod answers;
mod line;
mod rate;

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;

use self::answers::AnswerHistograms;
use self::line::MemoryLines;
use self::rate::RateCounters;
use super::{answered, AcquireOutcome, Backend, InLine};
use crate::config::GrantTerms;
use crate::errors::CoreResult;
use crate::keys::LineKeys;
use crate::lease::{LeaseId, LeaseRecord};
use crate::rate::{HitOutcome, RateCheck, RatePolicy, Settlement, TopUp, ToppedUp};

#[derive(Default)]
struct MemoryPool {
    /// lease id -> weight
    leases: HashMap<LeaseId, u64>,
    used: u64,
}

#[derive(Default)]
struct State {
    pools: HashMap<Arc<str>, MemoryPool>,
    line: MemoryLines,
    /// Users' own pools whose new streams are banned, until when.
    bans: HashMap<String, Instant>,
    /// The last grant's fencing token (see `next_fencing_token` in `acquire.rs`).
    fenced: u64,
}

/// What the store holds, shared by every manager that opened it by one name.
#[derive(Default)]
struct Tables {
    state: Mutex<State>,
    rates: Mutex<RateCounters>,
    answers: Mutex<AnswerHistograms>,
}

/// The stores opened by name (`memory://<name>`), each as long as a manager holds it.
static NAMED: LazyLock<Mutex<HashMap<String, Weak<Tables>>>> = LazyLock::new(Mutex::default);

/// An embedded store: `memory://` is a store of its own; `memory://<name>` the process's store
/// of that name, shared by every manager opened with it while one of them lives (two managers
/// handed one `fakeredis` client share its caps).
#[derive(Default)]
pub struct MemoryBackend {
    name: String,
    tables: Arc<Tables>,
}

impl MemoryBackend {
    /// The store `name` names (empty: a store of its own).
    pub fn named(name: &str) -> MemoryBackend {
        if name.is_empty() {
            return MemoryBackend::default();
        }
        let mut named = NAMED.lock().unwrap_or_else(PoisonError::into_inner);
        named.retain(|_, tables| tables.strong_count() > 0);
        let tables = match named.get(name).and_then(Weak::upgrade) {
            Some(tables) => tables,
            None => {
                let tables = Arc::default();
                named.insert(name.to_owned(), Arc::downgrade(&tables));
                tables
            }
        };
        MemoryBackend {
            name: name.to_owned(),
            tables,
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.tables.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The rate counters; where the state is locked too, it is locked first.
    fn rates(&self) -> MutexGuard<'_, RateCounters> {
        self.tables.rates.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The histograms of answer sizes; where the rate counters are locked too, they are locked
    /// first.
    fn answers(&self) -> MutexGuard<'_, AnswerHistograms> {
        self.tables.answers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Removes the leases; says whether each was still there.
    fn remove(&self, leases: &[Arc<LeaseRecord>]) -> Vec<bool> {
        let mut state = self.state();
        let mut released = Vec::with_capacity(leases.len());
        for lease in leases {
            let mut present = false;
            for pool in &lease.pools {
                if let Some(entry) = state.pools.get_mut(&*pool.key) {
                    if let Some(weight) = entry.leases.remove(&lease.id) {
                        entry.used -= weight;
                        present = true;
                    }
                    if entry.leases.is_empty() {
                        state.pools.remove(&*pool.key);
                    }
                }
            }
            released.push(present);
        }
        released
    }

    /// Bans a user's new streams (`pool_key`: their own pool) for `ban_ms`, unless a longer ban
    /// is on; returns how many leases the user holds (the caller ends them: all are this
    /// process's).
    fn ban(&self, pool_key: &str, ban_ms: u64) -> u64 {
        let mut state = self.state();
        let now = Instant::now();
        state.bans.retain(|_, until| *until > now);
        if ban_ms > 0 {
            let until = now + Duration::from_millis(ban_ms);
            let ban = state.bans.entry(pool_key.to_owned()).or_insert(until);
            *ban = (*ban).max(until);
        }
        state
            .pools
            .get(pool_key)
            .map_or(0, |pool| pool.leases.len() as u64)
    }

    /// Slots in use in a pool.
    fn used(&self, pool_key: &str) -> u64 {
        self.state().pools.get(pool_key).map_or(0, |pool| pool.used)
    }
}

/// Every answer is there at once; the waiters live and die with the process.
impl Backend for MemoryBackend {
    fn describe(&self) -> String {
        format!("memory://{}", self.name)
    }

    fn is_embedded(&self) -> bool {
        true
    }

    fn acquire<'a>(
        &'a self,
        lease: &'a Arc<LeaseRecord>,
        terms: GrantTerms,
        in_line: Option<InLine<'a>>,
        rates: &'a RateCheck,
    ) -> BoxFuture<'a, CoreResult<AcquireOutcome>> {
        answered(Ok(self.decide(lease, terms.fencing, in_line, rates)))
    }

    /// Says only which waiters were displaced.
    fn heartbeat<'a>(
        &'a self,
        _line: &'a LineKeys,
        _waiter_ids: &'a [String],
        _ttl_ms: u64,
    ) -> BoxFuture<'a, CoreResult<Vec<String>>> {
        answered(Ok(self.state().line.displaced()))
    }

    fn leave<'a>(&'a self, _line: &'a LineKeys, waiter_id: &'a str) -> BoxFuture<'a, CoreResult<()>> {
        self.state().line.leave(waiter_id);
        answered(Ok(()))
    }

    fn release<'a>(
        &'a self,
        leases: &'a [Arc<LeaseRecord>],
        _line: Option<&'a LineKeys>,
    ) -> BoxFuture<'a, CoreResult<Vec<CoreResult<bool>>>> {
        answered(Ok(self.remove(leases).into_iter().map(Ok).collect()))
    }

    /// The same decisions as `hit.lua`.
    fn hit<'a>(
        &'a self,
        keys: &'a [String],
        policies: &'a [RatePolicy],
        cost: u64,
        _aheads: &'a [u64],
        consume: bool,
    ) -> BoxFuture<'a, CoreResult<HitOutcome>> {
        let costs = vec![cost; policies.len()];
        answered(Ok(self.rates().hit(keys, policies, &costs, consume)))
    }

    fn top_up<'a>(&'a self, top_ups: &'a [&'a TopUp]) -> BoxFuture<'a, CoreResult<Vec<ToppedUp>>> {
        let mut rates = self.rates();
        answered(Ok(top_ups.iter().map(|top_up| rates.top_up(top_up)).collect()))
    }

    fn settle<'a>(&'a self, settlement: &'a Settlement) -> BoxFuture<'a, CoreResult<()>> {
        let mut rates = self.rates();
        for adjustment in &settlement.adjustments {
            rates.settle(adjustment);
        }
        if let Some(answer) = &settlement.answer {
            self.answers().count(answer);
        }
        answered(Ok(()))
    }

    fn answer_sizes<'a>(
        &'a self,
        model: &'a str,
        own: Option<&'a str>,
    ) -> BoxFuture<'a, CoreResult<Vec<u64>>> {
        let answers = self.answers();
        let mut counts = answers.counts(model);
        if let Some(own) = own {
            counts.extend(answers.counts(own));
        }
        answered(Ok(counts))
    }

    fn revoke<'a>(
        &'a self,
        pool_key: &'a str,
        _holders: &'a str,
        ban_ms: u64,
        _remember_ms: u64,
        _channel: &'a str,
    ) -> BoxFuture<'a, CoreResult<u64>> {
        answered(Ok(self.ban(pool_key, ban_ms)))
    }

    fn forget_rates<'a>(&'a self, keys: &'a [String]) -> BoxFuture<'a, CoreResult<()>> {
        self.rates().reset(keys);
        answered(Ok(()))
    }

    fn count<'a>(&'a self, pool_keys: &'a [String], _ttl_ms: u64) -> BoxFuture<'a, CoreResult<Vec<u64>>> {
        answered(Ok(pool_keys.iter().map(|key| self.used(key)).collect()))
    }
}
