//! The manager: admits leases (the request, `request.rs`; admitting it, `admit.rs`, on the
//! local floor while Redis is down, `local_floor.rs`; its end, `grant.rs`; undone if cancelled,
//! `cancel_guard.rs`), sizes reservations from the answer sizes learned per model
//! (`answer_estimates.rs`), decides request rates (`rate.rs`), counts pools, revokes, reports its
//! counters and closes. It owns the backend (shared with renewal), the circuit breaker, this
//! process's side of the waiting line (`waiting.rs`) and the leases it holds (`renewal`). Plain
//! Rust: the binding (`py/manager.rs`) calls it and turns what it returns into Python objects.

mod admit;
mod answer_estimates;
mod cancel_guard;
mod grant;
mod local_floor;
mod rate;
mod request;
mod slab_admission;
mod slabs;
mod waiting;

#[cfg(test)]
mod task_sizes;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use self::answer_estimates::AnswerEstimates;
pub use self::grant::{Granted, PoolUsage};
pub use self::rate::HitCall;
pub use self::request::{AcquireRequest, MAX_WEIGHT};
use self::slabs::Slabs;
use self::waiting::LocalLine;
use crate::backend::{Backend, CallStats, Stores};
use crate::budget::Budgets;
use crate::config::Config;
use crate::errors::{CoreError, CoreResult};
use crate::keys::{check_identity, holders_key, KeySpace, LineKeys, Pool};
use crate::lease::Store;
use crate::rate::{LeasedUnits, Thresholds};
use crate::renewal::{Collected, Counters, Leases};
use crate::runtime;
use crate::sync::lock;

/// How long Redis remembers which leases were revoked, at least (4 lease durations if longer),
/// so a holder coming back from a stall never takes one back. One away longer (a process frozen
/// for 10 minutes) could, with room; its stream had been stalled all that time.
const REMEMBER_REVOKED_MS: u64 = 10 * 60 * 1000;

/// Resources remembered for the cluster-wide gauges, at most (names come from the app's code).
const MAX_SEEN_POOLS: usize = 256;

/// The resource pools this process has acquired, by name (the last capacity asked).
#[derive(Default)]
struct SeenPools(Mutex<BTreeMap<Arc<str>, Pool>>);

impl SeenPools {
    fn note(&self, resources: &[Pool]) {
        let mut seen = None;
        for pool in resources {
            let seen = seen.get_or_insert_with(|| lock(&self.0));
            if seen.len() < MAX_SEEN_POOLS || seen.contains_key(&pool.name) {
                seen.insert(pool.name.clone(), pool.clone());
            }
        }
    }

    fn seen(&self) -> Vec<Pool> {
        lock(&self.0).values().cloned().collect()
    }
}

/// Counters for monitoring.
#[derive(Debug, Clone, Copy)]
pub struct Stats {
    pub leases: Counters,
    pub breaker_open: bool,
    /// Calls to Redis.
    pub calls: CallStats,
    /// This process's waiters in line.
    pub waiting: usize,
    /// Streams with token budgets open now, and settlements waiting for another try.
    pub budget_streams: usize,
    pub unsettled: usize,
    pub settlements_dropped: u64,
}

pub struct Manager {
    config: Config,
    keys: KeySpace,
    stores: Arc<Stores>,
    /// The line of the shared pools (None without a global pool: nothing to wait for).
    line: Option<LineKeys>,
    local_line: LocalLine,
    /// The resources acquired here (for `shared_usage`).
    shared_pools: SeenPools,
    /// Stops the wake-up listener when the manager goes away (leases may outlive it).
    listener_stop: CancellationToken,
    leases: Arc<Leases>,
    budgets: Arc<Budgets>,
    /// The answer sizes learned per model, as `reserve="auto"` uses them.
    answer_estimates: Arc<AnswerEstimates>,
    /// Units of request rates this process holds ahead of its hits.
    leased_units: LeasedUnits,
    /// The global pool's slots this process holds in slabs (`lease_global_slots`, on Redis).
    slabs: Option<Arc<Slabs>>,
    /// The thresholds of every rate policy's limit at which hits and starts report their use
    /// (`alert_thresholds`); unset while nobody listens, so no call carries them.
    alert_at: OnceLock<Thresholds>,
    /// The process that first used this manager (0 = unused). Its connection and renewal loop
    /// live in that process's runtime; a forked child must build its own manager.
    used_in_pid: AtomicU32,
}

impl Drop for Manager {
    fn drop(&mut self) {
        self.listener_stop.cancel();
    }
}

impl Manager {
    /// A manager on `backend`; nothing is connected or started until first use.
    pub fn new(backend: Box<dyn Backend>, config: Config) -> Self {
        let leases_slots = config.lease_global_slots && !backend.is_embedded();
        let keys = match leases_slots {
            true => KeySpace::new(&config).with_global_slots_leased(),
            false => KeySpace::new(&config),
        };
        let line = keys.line();
        let stores = Arc::new(Stores::new(backend));
        let budgets = Arc::new(Budgets::new(Arc::clone(&stores), config.failure_mode));
        let leases = Arc::new(Leases::new(
            Arc::clone(&stores),
            Arc::clone(&budgets),
            line.clone(),
            config.lease_ms(),
            config.renew_period(),
            config.redis_timeout(),
            keys.revocations_channel(),
        ));
        let slabs = keys
            .global_pool()
            .filter(|_| leases_slots)
            .map(|global| Slabs::new(global, Arc::clone(&leases)));
        Manager {
            config,
            keys,
            stores,
            line,
            local_line: LocalLine::default(),
            shared_pools: SeenPools::default(),
            listener_stop: CancellationToken::new(),
            leases,
            budgets,
            answer_estimates: Arc::default(),
            leased_units: LeasedUnits::default(),
            slabs,
            alert_at: OnceLock::new(),
            used_in_pid: AtomicU32::new(0),
        }
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Where the leases live, without any password.
    pub fn describe(&self) -> String {
        self.stores.main().describe()
    }

    /// Whether every call finishes without waiting (the embedded store).
    pub fn is_embedded(&self) -> bool {
        self.stores.main().is_embedded()
    }

    /// Starts the renewal loop on first use, and refuses use in a process forked after it.
    fn start_here(&self) -> CoreResult<()> {
        let pid = runtime::process_id();
        match self.used_in_pid.compare_exchange(0, pid, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                self.leases.start_keeper();
                Ok(())
            }
            Err(owner) if owner == pid => Ok(()),
            Err(owner) => Err(CoreError::Misuse(format!(
                "this StreamLeaseManager was used in process {owner} before it forked into process {pid}; \
                 build the manager in each worker (for example in the app's lifespan), or do not use it before forking"
            ))),
        }
    }

    /// Slots in use in one user's pool, or (None) in the global pool across every process.
    pub fn count(
        self: &Arc<Self>,
        identity: Option<&str>,
    ) -> CoreResult<impl Future<Output = CoreResult<u64>> + Send + 'static> {
        let pool = match identity {
            Some(identity) => {
                check_identity(identity).map_err(CoreError::InvalidInput)?;
                self.keys.user_pool(identity)
            }
            None => self.keys.global_pool().ok_or_else(|| {
                CoreError::InvalidInput(
                    "this manager keeps no global pool (global_pool=False): count one user's streams with get_active_count(user_id)".into(),
                )
            })?,
        };
        self.start_here()?;
        let manager = Arc::clone(self);
        let ttl_ms = self.config.lease_ms();
        let keys = [pool.key.to_string()];
        Ok(async move {
            let counts = manager
                .stores
                .call(Store::Main, |main| main.count(&keys, ttl_ms))
                .await?;
            Ok(counts[0])
        })
    }

    /// Slots in use across every process in each shared pool (the global one, and the
    /// resources this process has seen), with its capacity: one call (all are in one tag), for
    /// cluster-wide gauges.
    pub fn shared_usage(
        self: &Arc<Self>,
    ) -> CoreResult<impl Future<Output = CoreResult<Vec<(String, u64, u64)>>> + Send + 'static> {
        let pools: Vec<Pool> = self
            .keys
            .global_pool()
            .into_iter()
            .chain(self.shared_pools.seen())
            .collect();
        self.start_here()?;
        let manager = Arc::clone(self);
        let ttl_ms = self.config.lease_ms();
        Ok(async move {
            if pools.is_empty() {
                return Ok(Vec::new());
            }
            let keys: Vec<String> = pools.iter().map(|pool| pool.key.to_string()).collect();
            let counts = manager
                .stores
                .call(Store::Main, |main| main.count(&keys, ttl_ms))
                .await?;
            Ok(pools
                .into_iter()
                .zip(counts)
                .map(|(pool, used)| (pool.name.to_string(), used, pool.capacity))
                .collect())
        })
    }

    /// Stops renewal and releases every lease this process holds (one script call per 1,000,
    /// a few in flight); the returned future finishes the work.
    pub fn close(&self) -> impl Future<Output = CoreResult<()>> + Send + 'static {
        let owner = self.used_in_pid.load(Ordering::Acquire);
        let forked_copy = owner != 0 && owner != runtime::process_id();
        // A forked copy only refuses new leases: those it lists belong to the parent, which
        // still renews them.
        let closed = if forked_copy {
            self.leases.refuse_new();
            None
        } else {
            // Boxed: a future that an async block captures and then awaits is stored twice.
            Some(Box::pin(self.leases.close()))
        };
        let (budgets, wait) = (Arc::clone(&self.budgets), self.config.redis_timeout());
        let units_given_back = if forked_copy {
            Vec::new()
        } else {
            self.give_back_all_units()
        };
        async move {
            futures_util::future::join_all(units_given_back).await;
            let released = match closed {
                Some(closed) => closed.await,
                None => Ok(()),
            };
            // After the leases: their release settles their budgets.
            if !forked_copy {
                budgets.close(wait).await;
            }
            released
        }
    }

    /// The keyed hash of an identity, as the keys carry it (for traces and operators, who must
    /// never see the identity itself).
    pub fn identity_digest(&self, identity: &str) -> CoreResult<String> {
        check_identity(identity).map_err(CoreError::InvalidInput)?;
        Ok(self.keys.identity_digest(identity))
    }

    /// Slots this process holds per pool name.
    pub fn slots_by_pool(&self) -> Vec<(String, u64)> {
        self.leases.slots_by_name()
    }

    /// From now on, leases taken are counted and their held times kept for a metrics reader.
    pub fn time_leases(&self) {
        self.leases.time_held();
    }

    /// Leases taken since `time_leases`, and the held times of those released since the last
    /// call.
    pub fn collect_lease_times(&self) -> Collected {
        self.leases.collect_held_times()
    }

    /// Drain, first step: refuses new leases here (503), leaving the held ones to end.
    pub fn refuse_new(&self) {
        self.leases.refuse_new();
    }

    /// Ends every live stream of `identity` in every process (here at once, elsewhere within
    /// one renewal period) and bans its new ones for `ban`; resolves to how many leases it had.
    pub fn revoke(
        self: &Arc<Self>,
        identity: &str,
        ban: Duration,
    ) -> CoreResult<impl Future<Output = CoreResult<u64>> + Send + 'static> {
        check_identity(identity).map_err(CoreError::InvalidInput)?;
        let pool = self.keys.user_pool(identity);
        self.start_here()?;
        let manager = Arc::clone(self);
        let holders = holders_key(&pool.key);
        let ban_ms = ban.as_millis() as u64;
        let remember_ms = (4 * self.config.lease_ms()).max(REMEMBER_REVOKED_MS);
        let channel = self.keys.revocations_channel();
        Ok(async move {
            // This process's own at once, those of the local floor too.
            let here = manager.leases.revoke_user(&pool.key, ban_ms) as u64;
            let everywhere = manager
                .stores
                .call(Store::Main, |main| {
                    main.revoke(&pool.key, &holders, ban_ms, remember_ms, &channel)
                })
                .await?;
            Ok(everywhere.max(here))
        })
    }

    /// Drain, last step: ends the streams still held here, as revoked.
    pub fn revoke_held(&self) -> usize {
        self.leases.revoke_held()
    }

    pub fn stats(&self) -> Stats {
        let (budget_streams, unsettled, settlements_dropped) = self.budgets.counts();
        Stats {
            budget_streams,
            unsettled,
            settlements_dropped,
            leases: self.leases.counters(),
            breaker_open: self.stores.breaker().is_open(),
            calls: self.stores.main().call_stats(),
            waiting: self.local_line.len(),
        }
    }
}
