//! The manager: one backend, the leases this process holds, and the renewal loop that keeps them.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures_util::{stream, FutureExt, StreamExt};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt, PyString};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backend::{self, AcquireOutcome, Backend, InLine, Line, MemoryBackend, RedisBackend, Waiter};
use crate::breaker::{Admission, Breaker};
use crate::bridge::{self, Completion, Delivery};
use crate::config::{capacity_field, wait_seconds, LeaseConfig};
use crate::errors::{CoreError, CoreResult, Rejection};
use crate::held::Held;
use crate::keys::{check_identity, check_resource, KeySpace};
use crate::lease::{monotonic_ms, Lease, LeaseRecord};
use crate::waiting::{LocalLine, LocalTurn, RECHECK_WAITING, WAITER_TTL};
use crate::{renewal, runtime};

/// A lease of weight w is w members per pool: keep scripts short.
const MAX_WEIGHT: u32 = 100;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Leaves the line and gives back what an acquire may have taken, unless disarmed.
struct Cleanup<'a> {
    shared: &'a Arc<ManagerShared>,
    record: &'a Arc<LeaseRecord>,
    waiter: Option<&'a Waiter>,
    armed: bool,
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // The script may have run before an error or a cancellation: release is idempotent.
        self.shared.release_in_background(self.record);
        if let (Some(waiter), Some(line)) = (self.waiter, &self.shared.line) {
            let (shared, line, id) = (Arc::clone(self.shared), line.clone(), waiter.id.clone());
            runtime::handle().spawn(async move { shared.backend.leave(&line, &id).await });
        }
    }
}

/// Release script calls in flight at once when releasing many leases (each up to 1,000).
const RELEASE_CALLS_IN_FLIGHT: usize = 4;

/// A release already under way: finished (embedded backend) or running on the runtime.
enum LaunchedRelease {
    Done(CoreResult<u64>),
    Running(JoinHandle<CoreResult<u64>>),
}

pub struct ManagerShared {
    pub backend: Backend,
    /// This process's own floor of protection while Redis is down (`failure_mode="open"`).
    fallback: Backend,
    breaker: Breaker,
    /// The line of the shared pools (None without a global pool: nothing to wait for).
    line: Option<Line>,
    /// Bumped whenever a slot may have freed (a release here, or one published by any process).
    wakeups: watch::Sender<u64>,
    listener: Mutex<Option<JoinHandle<()>>>,
    /// Stops the listener when the Python manager goes away (leases may outlive it).
    listener_stop: CancellationToken,
    /// This process's waiters, in arrival order.
    local_line: LocalLine,
    pub config: LeaseConfig,
    keys: KeySpace,
    /// Leases this process holds and renews.
    held: Mutex<Held>,
    /// Leases to take out of the store again: their release failed, or they were lost (a holder
    /// that comes back would otherwise keep their members alive). Retried every round.
    unremoved: Mutex<Vec<Arc<LeaseRecord>>>,
    /// Releases in flight, so `aclose()` can wait for them.
    releases: TaskTracker,
    stop: CancellationToken,
    renewal: Mutex<Option<JoinHandle<()>>>,
    /// The process that first used this manager (0 = unused). Its connection and renewal loop
    /// live in that process's runtime; a forked child must build its own manager.
    used_in_pid: AtomicU32,
    closed: AtomicBool,
    lost: AtomicU64,
    reclaimed: AtomicU64,
    renew_failures: AtomicU64,
}

impl Drop for ManagerShared {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl ManagerShared {
    /// Starts the renewal loop on first use, and refuses use in a process forked after it.
    fn start_here(self: &Arc<Self>) -> CoreResult<()> {
        let pid = std::process::id();
        match self.used_in_pid.compare_exchange(0, pid, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                *lock(&self.renewal) = Some(renewal::start(self));
                Ok(())
            }
            Err(owner) if owner == pid => Ok(()),
            Err(owner) => Err(CoreError::Misuse(format!(
                "this StreamLeaseManager was used in process {owner} before it forked into process {pid}; \
                 build the manager in each worker (for example in the app's lifespan), or do not use it before forking"
            ))),
        }
    }

    pub fn stop_signal(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Runs `op` and hands its result to Python as an awaitable. The embedded backend never
    /// waits, so its ops finish right here instead of taking a trip through the runtime.
    fn submit<'py, F>(&self, py: Python<'py>, op: F, abortable: bool) -> PyResult<Bound<'py, PyAny>>
    where
        F: Future<Output = Completion> + Send + 'static,
    {
        if self.backend.is_embedded() {
            let completion = op.now_or_never().expect("the memory backend never waits");
            bridge::ready(py, completion)
        } else {
            bridge::spawn(py, op, abortable)
        }
    }

    /// Marks the lease released, stops renewing it and starts removing it from the store, all
    /// before returning, so no cancellation can undo it. None if it was already released.
    fn launch_release(self: &Arc<Self>, record: &Arc<LeaseRecord>) -> Option<LaunchedRelease> {
        if !record.mark_released() {
            return None;
        }
        lock(&self.held).remove(record);
        let shared = Arc::clone(self);
        let record = Arc::clone(record);
        let embedded = self.backend_of(&record).is_embedded();
        let release = async move {
            let line = if record.local { None } else { shared.line.as_ref() };
            let released = shared
                .backend_of(&record)
                .release(std::slice::from_ref(&record), line)
                .await;
            if released.is_err() {
                lock(&shared.unremoved).push(Arc::clone(&record));
            }
            shared.wake_waiters();
            released
        };
        Some(if embedded {
            LaunchedRelease::Done(release.now_or_never().expect("the memory backend never waits"))
        } else {
            LaunchedRelease::Running(runtime::handle().spawn(self.releases.track_future(release)))
        })
    }

    /// Where a lease lives: Redis (or the embedded store), or the local fallback.
    fn backend_of(&self, record: &LeaseRecord) -> &Backend {
        if record.local {
            &self.fallback
        } else {
            &self.backend
        }
    }

    /// Feeds the breaker with the outcome of a call to the main backend: any answer, even an
    /// error reply, means the server is there.
    fn observe<T>(&self, outcome: &CoreResult<T>) {
        match outcome {
            Err(CoreError::Unavailable(_)) => self.breaker.failed(),
            _ => self.breaker.succeeded(),
        }
    }

    /// Takes a lease: from the main backend while it answers, waiting in line up to `wait`
    /// for shared capacity; when the backend does not answer (or the breaker is open), refuses
    /// under `failure_mode="closed"`, or admits against this process's local floor under `"open"`.
    async fn acquire(self: Arc<Self>, record: Arc<LeaseRecord>, wait: Duration) -> Completion {
        let ttl_ms = self.config.lease_ms();
        let deadline = Instant::now() + wait;
        let waiter = (!wait.is_zero() && self.line.is_some()).then(|| Waiter {
            id: uuid::Uuid::new_v4().simple().to_string(),
            ttl_ms: WAITER_TTL.as_millis() as u64,
        });
        if waiter.is_some() {
            self.listen_for_wakeups();
        }
        let _present = waiter.as_ref().map(|w| self.local_line.arrive(&w.id));
        let mut wakeups = self.wakeups.subscribe();
        // Until disarmed, leaves the line and gives back what a call may have taken, however
        // this future ends (an error, the wait running out, cancellation).
        let mut cleanup = Cleanup {
            shared: &self,
            record: &record,
            waiter: waiter.as_ref(),
            armed: true,
        };
        // Set once in line: this process's earliest waiter speaks for all of its waiters.
        let mut local_turn: Option<LocalTurn<'_>> = None;
        loop {
            if let Some(turn) = local_turn
                .as_ref()
                .filter(|t| !self.local_line.is_first(t.ticket))
            {
                tokio::select! {
                    _ = turn.turn.notified() => continue,
                    _ = tokio::time::sleep_until(deadline) => return Err(self.waited_too_long(&record, wait)),
                }
            }
            wakeups.borrow_and_update();
            let sent_at = monotonic_ms();
            let unavailable = match self.breaker.admit() {
                Admission::Go => {
                    let in_line = self.line.as_ref().map(|line| InLine {
                        line,
                        waiter: waiter.as_ref(),
                    });
                    let outcome = self.backend.acquire(&record, ttl_ms, in_line).await;
                    self.observe(&outcome);
                    match outcome {
                        Ok(AcquireOutcome::Wait(ticket)) => {
                            // A waiter taken out of the shared line (its process was late to
                            // keep it alive) came back with a later ticket: it takes that place
                            // here too, so this process's order stays the shared line's.
                            let placed = local_turn.as_ref().is_some_and(|t| t.ticket == ticket);
                            if !placed && waiter.is_some() {
                                drop(local_turn.take());
                                let turn = self.local_line.join(ticket);
                                local_turn = Some(LocalTurn {
                                    line: &self.local_line,
                                    ticket,
                                    turn,
                                });
                            }
                            None
                        }
                        Ok(outcome) => {
                            cleanup.armed = false;
                            if waiter.is_some() {
                                self.wake_waiters(); // a grant from the line: the next may fit too
                            }
                            return Arc::clone(&self).settle_acquire(Arc::clone(&record), outcome, sent_at);
                        }
                        Err(CoreError::Unavailable(message)) => Some(CoreError::Unavailable(message)),
                        Err(other) => return Err(other),
                    }
                }
                Admission::Wait(left) => Some(CoreError::breaker_open(&self.backend.describe(), left)),
            };
            if let Some(unavailable) = unavailable {
                drop(cleanup);
                if !self.config.fail_open() {
                    return Err(unavailable);
                }
                let local = Arc::new(LeaseRecord::local(
                    self.config.local_floor(&record.pools),
                    record.weight,
                ));
                let outcome = self.fallback.acquire(&local, ttl_ms, None).await?;
                return Arc::clone(&self).settle_acquire(local, outcome, sent_at);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(self.waited_too_long(&record, wait));
            }
            // A release anywhere wakes us; the periodic check bounds a lost wake-up and keeps this
            // process's waiters alive in the shared line.
            if let (Some(line), true) = (&self.line, self.local_line.heartbeat_due()) {
                let ids = self.local_line.ids();
                let _ = self
                    .backend
                    .heartbeat(line, &ids, WAITER_TTL.as_millis() as u64)
                    .await;
            }
            tokio::select! {
                _ = wakeups.changed() => {}
                _ = tokio::time::sleep(RECHECK_WAITING.min(deadline - now)) => {}
            }
        }
    }

    /// The refusal for a waiter whose time ran out: the shared pool it waited for is full.
    fn waited_too_long(&self, record: &LeaseRecord, waited: Duration) -> CoreError {
        let pool = record.pools.get(record.own_pools).unwrap_or(&record.pools[0]);
        CoreError::Rejected(Rejection {
            limit: pool.name.clone(),
            capacity: pool.capacity,
            current: pool.capacity,
            retry_after_ms: self.config.retry_after_ms().min(waited.as_millis() as u64).max(1),
        })
    }

    fn wake_waiters(&self) {
        self.wakeups.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Starts (once) the task that turns wake-ups published by any process into local ones.
    fn listen_for_wakeups(self: &Arc<Self>) {
        let (Backend::Redis(_), Some(line)) = (&self.backend, &self.line) else {
            return; // the embedded store wakes its waiters itself
        };
        let mut listener = lock(&self.listener);
        if listener.is_some() {
            return;
        }
        let shared = Arc::clone(self);
        let line = line.clone();
        *listener = Some(runtime::handle().spawn(async move {
            let Backend::Redis(redis) = &shared.backend else {
                return;
            };
            loop {
                tokio::select! {
                    _ = shared.stop.cancelled() => return,
                    _ = shared.listener_stop.cancelled() => return,
                    _ = redis.listen(&line, || shared.wake_waiters()) => {}
                }
                // The subscription broke (Redis restarted, a failover): subscribe again soon.
                tokio::time::sleep(RECHECK_WAITING).await;
            }
        }));
    }

    fn settle_acquire(
        self: Arc<Self>,
        record: Arc<LeaseRecord>,
        outcome: AcquireOutcome,
        sent_at: u64,
    ) -> Completion {
        match outcome {
            AcquireOutcome::Granted(_) => {
                let deadline_ms = sent_at + self.config.lease_ms();
                Ok(self.deliver_granted(record, deadline_ms))
            }
            AcquireOutcome::Rejected(mut rejection) => {
                record.mark_released();
                rejection.retry_after_ms = rejection.retry_after_ms.min(self.config.retry_after_ms());
                Err(CoreError::Rejected(rejection))
            }
            AcquireOutcome::Wait(_) => unreachable!("only a waiter is told to wait, and it loops"),
        }
    }

    pub fn release_in_background(self: &Arc<Self>, record: &Arc<LeaseRecord>) -> bool {
        self.launch_release(record).is_some()
    }

    pub fn release_awaitable<'py>(
        self: &Arc<Self>,
        py: Python<'py>,
        record: &Arc<LeaseRecord>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let launched = self.launch_release(record);
        self.submit(
            py,
            async move {
                let removed = match launched {
                    None => 0,
                    Some(LaunchedRelease::Done(result)) => result?,
                    Some(LaunchedRelease::Running(task)) => task
                        .await
                        .map_err(|e| CoreError::Panic(format!("release task failed: {e}")))??,
                };
                Ok(Box::new(move |py: Python<'_>| {
                    Ok(PyBool::new(py, removed > 0).to_owned().into_any().unbind())
                }) as bridge::Delivery)
            },
            false,
        )
    }

    /// One renewal round: leases whose removal failed are removed again, then every held lease
    /// is kept alive (Redis: one keep-alive per hash tag). Leases found gone are taken back
    /// where capacity allows, else become lost. A failed call leaves its leases to the next
    /// round, and to their deadlines.
    pub async fn renew_held(&self) {
        let unremoved = std::mem::take(&mut *lock(&self.unremoved));
        if !unremoved.is_empty() && self.release_all(&unremoved).await.is_err() {
            lock(&self.unremoved).extend(unremoved);
        }
        let (local_groups, shared_groups) = {
            let held = lock(&self.held);
            (held.groups(true), held.groups(false))
        };
        let local_leases = |holders: &str| lock(&self.held).leases_of(true, holders);
        let shared_leases = |holders: &str| lock(&self.held).leases_of(false, holders);
        let ttl_ms = self.config.lease_ms();
        let period_ms = self.config.renew_period().as_millis() as u64;
        let sent_at = monotonic_ms();
        let (local, shared) = tokio::join!(
            self.fallback
                .renew(&local_groups, &local_leases, ttl_ms, period_ms),
            self.backend
                .renew(&shared_groups, &shared_leases, ttl_ms, period_ms)
        );
        if let Some(failure) = shared.failures.first() {
            self.observe::<()>(&Err(failure.clone()));
        }
        if shared.answered {
            self.observe(&Ok(()));
        }
        // A lease released after this round's snapshot but before its check was found gone
        // and, with room, taken back: give it back again.
        let mut released_meanwhile = Vec::new();
        for (is_local, round) in [(true, local), (false, shared)] {
            {
                let mut held = lock(&self.held);
                for holders in &round.renewed {
                    held.extend(is_local, holders, sent_at + ttl_ms);
                }
            }
            let failures = round.failures.len() as u64;
            self.renew_failures.fetch_add(failures, Ordering::Relaxed);
            for record in &round.reclaimed {
                if record.is_released() {
                    released_meanwhile.push(Arc::clone(record));
                } else {
                    lock(&self.held).taken_back(record);
                    self.reclaimed.fetch_add(1, Ordering::Relaxed);
                }
            }
            for record in &round.lost {
                self.lose(record, false); // the check removed it everywhere
            }
        }
        if !released_meanwhile.is_empty() && self.release_all(&released_meanwhile).await.is_err() {
            lock(&self.unremoved).extend(released_meanwhile);
        }
    }

    /// Marks leases whose deadline passed without a successful renewal as lost: the store has
    /// expired them, whatever sockets and retries are still doing. Returns the next deadline.
    pub fn expire_overdue(&self) -> Option<u64> {
        let (overdue, next) = lock(&self.held).overdue(monotonic_ms());
        for record in &overdue {
            self.lose(record, true);
        }
        next
    }

    /// Marks a lease lost; `still_stored` when Redis may still have its members (a holder that
    /// comes back would keep them alive), so they are removed again.
    fn lose(&self, record: &Arc<LeaseRecord>, still_stored: bool) {
        if record.mark_lost() {
            lock(&self.held).remove(record);
            if still_stored {
                lock(&self.unremoved).push(Arc::clone(record));
            }
            self.lost.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Local leases apart from shared ones; on a cluster, shared ones sorted by hash tag so each
    /// batch stays within one slot.
    fn split_for_batches(
        &self,
        leases: Vec<Arc<LeaseRecord>>,
    ) -> (Vec<Arc<LeaseRecord>>, Vec<Arc<LeaseRecord>>) {
        let (local, mut shared): (Vec<_>, Vec<_>) = leases.into_iter().partition(|record| record.local);
        if self.backend.is_cluster() {
            shared.sort_unstable_by(|a, b| a.hash_tag().cmp(b.hash_tag()));
        }
        (local, shared)
    }

    /// Script-call batches and the backend each goes to.
    fn plan_batches<'a>(
        &'a self,
        local: &'a [Arc<LeaseRecord>],
        shared: &'a [Arc<LeaseRecord>],
    ) -> Vec<(&'a Backend, &'a [Arc<LeaseRecord>])> {
        let local = backend::batches(local, false)
            .into_iter()
            .map(|batch| (&self.fallback, batch));
        let shared = backend::batches(shared, self.backend.is_cluster())
            .into_iter()
            .map(|batch| (&self.backend, batch));
        local.chain(shared).collect()
    }

    /// Releases many leases, in batched script calls sent together.
    async fn release_all(&self, leases: &[Arc<LeaseRecord>]) -> CoreResult<u64> {
        let (local, shared) = self.split_for_batches(leases.to_vec());
        let releases: Vec<_> = self
            .plan_batches(&local, &shared)
            .into_iter()
            .map(|(backend, batch)| backend.release(batch, self.line.as_ref()))
            .collect();
        // A few calls at a time: each call's timeout then covers its own work, not a queue of
        // a hundred others (closing a manager that holds 100,000 leases).
        let released: Vec<_> = stream::iter(releases)
            .buffer_unordered(RELEASE_CALLS_IN_FLIGHT)
            .collect()
            .await;
        released.into_iter().sum()
    }

    /// Hands a granted lease to Python, on the loop thread: only then is it held and renewed,
    /// so a result nobody receives (loop gone, future cancelled) is released, not kept alive.
    fn deliver_granted(self: Arc<Self>, record: Arc<LeaseRecord>, deadline_ms: u64) -> Delivery {
        let lease = Lease::new(Arc::clone(&record), Arc::clone(&self));
        Box::new(move |py| {
            {
                let mut held = lock(&self.held);
                // Checked under the lock that aclose() drains, so no lease slips past a close.
                if !self.closed.load(Ordering::Acquire) {
                    held.insert(Arc::clone(&record), deadline_ms);
                    return Ok(Py::new(py, lease)?.into_any());
                }
            }
            drop(lease);
            Err(CoreError::Closed.into_pyerr(py))
        })
    }
}

/// The core behind `StreamLeaseManager`.
#[pyclass(frozen, module = "fastapi_stream_lease._core")]
pub struct Manager {
    shared: Arc<ManagerShared>,
}

impl Drop for Manager {
    /// Nobody can wait any more; leases still held keep their renewal.
    fn drop(&mut self) {
        self.shared.listener_stop.cancel();
    }
}

#[pymethods]
impl Manager {
    #[new]
    #[pyo3(signature = (url, config, tls_ca_file = None))]
    fn new(url: &str, config: PyRef<'_, LeaseConfig>, tls_ca_file: Option<&str>) -> PyResult<Self> {
        let config = config.clone();
        let backend = open_backend(url, &config, tls_ca_file)?;
        let keys = KeySpace::new(&config);
        let shared = Arc::new(ManagerShared {
            backend,
            fallback: Backend::Memory(MemoryBackend::default()),
            breaker: Breaker::default(),
            line: keys.line(),
            wakeups: watch::Sender::new(0),
            listener: Mutex::new(None),
            listener_stop: CancellationToken::new(),
            local_line: LocalLine::default(),
            keys,
            config,
            held: Mutex::new(Held::default()),
            unremoved: Mutex::new(Vec::new()),
            releases: TaskTracker::new(),
            stop: CancellationToken::new(),
            renewal: Mutex::new(None),
            used_in_pid: AtomicU32::new(0),
            closed: AtomicBool::new(false),
            lost: AtomicU64::new(0),
            reclaimed: AtomicU64::new(0),
            renew_failures: AtomicU64::new(0),
        });
        Ok(Manager { shared })
    }

    #[getter]
    fn config(&self) -> LeaseConfig {
        self.shared.config.clone()
    }

    /// Where the leases live, without any password.
    #[getter]
    fn backend(&self) -> String {
        self.shared.backend.describe()
    }

    #[pyo3(signature = (user_id, weight = None, max_per_user = None, wait_timeout = None, resources = None))]
    fn acquire<'py>(
        &self,
        py: Python<'py>,
        user_id: Option<&Bound<'py, PyAny>>,
        weight: Option<&Bound<'py, PyAny>>,
        max_per_user: Option<&Bound<'py, PyAny>>,
        wait_timeout: Option<&Bound<'py, PyAny>>,
        resources: Option<Vec<(String, u64)>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let wait = Duration::from_secs_f64(wait_seconds(wait_timeout, self.shared.config.wait_timeout)?);
        let identity = user_id.filter(|u| !u.is_none()).map(identity_arg).transpose()?;
        let resources = resources.unwrap_or_default();
        for (name, capacity) in &resources {
            check_resource(name, *capacity).map_err(PyValueError::new_err)?;
        }
        if identity.is_none() && resources.is_empty() {
            return Err(PyTypeError::new_err(
                "pass a user_id (a stream) or resources (shared capacity), or both",
            ));
        }
        if identity.is_some() && !resources.is_empty() && !self.shared.config.global_pool {
            return Err(PyValueError::new_err(
                "resources and a user_id in one acquire need the global pool's shared hash tag: drop global_pool=False",
            ));
        }
        let weight = weight_arg(weight)?;
        let max_per_user = max_per_user
            .filter(|cap| !cap.is_none())
            .map(|cap| capacity_field("max_per_user", Some(cap), 0))
            .transpose()?;
        if self.shared.closed.load(Ordering::Acquire) {
            return Err(CoreError::Closed.into_pyerr(py));
        }
        self.shared.start_here().map_err(|e| e.into_pyerr(py))?;
        let mut pools = self.shared.keys.pools_for(identity.as_deref(), &resources);
        if let (Some(cap), Some(_)) = (max_per_user, &identity) {
            // A per-call cap (a paid tier, say): the user's pool is the same, only its limit moves.
            pools[0].capacity = cap;
        }
        if let Some(pool) = pools
            .iter()
            .find(|p| p.capacity > 0 && u64::from(weight) > p.capacity)
        {
            return Err(PyValueError::new_err(format!(
                "weight={weight} is more than the {} capacity of {}: such a lease could never be granted",
                pool.name, pool.capacity
            )));
        }
        let record = Arc::new(LeaseRecord::new(pools, weight));
        let op = Arc::clone(&self.shared).acquire(record, wait);
        if wait.is_zero() {
            self.shared.submit(py, op, false)
        } else {
            // A waiter stops waiting when cancelled; its cleanup leaves the line.
            bridge::spawn(py, op, true)
        }
    }

    #[pyo3(signature = (user_id = None))]
    fn count<'py>(
        &self,
        py: Python<'py>,
        user_id: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let pool = match user_id.filter(|u| !u.is_none()) {
            Some(user_id) => self.shared.keys.user_pool(&identity_arg(user_id)?),
            None => self.shared.keys.global_pool().ok_or_else(|| {
                PyValueError::new_err(
                    "this manager keeps no global pool (global_pool=False): count one user's streams with get_active_count(user_id)",
                )
            })?,
        };
        self.shared.start_here().map_err(|e| e.into_pyerr(py))?;
        let shared = Arc::clone(&self.shared);
        let op = async move {
            if let Admission::Wait(left) = shared.breaker.admit() {
                return Err(CoreError::breaker_open(&shared.backend.describe(), left));
            }
            let count = shared.backend.count(&pool.key).await;
            shared.observe(&count);
            let count = count?;
            Ok(
                Box::new(move |py: Python<'_>| Ok(count.into_pyobject(py)?.into_any().unbind()))
                    as bridge::Delivery,
            )
        };
        self.shared.submit(py, op, true)
    }

    /// Stops renewal and releases every lease this process holds (one script call per 1,000,
    /// a few in flight).
    fn aclose<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let shared = Arc::clone(&self.shared);
        shared.closed.store(true, Ordering::Release);
        let owner = shared.used_in_pid.load(Ordering::Acquire);
        if owner != 0 && owner != std::process::id() {
            // A forked copy: the leases it lists belong to the parent, which still renews them.
            return bridge::ready(py, Ok(Box::new(|py: Python<'_>| Ok(py.None()))));
        }
        shared.stop.cancel();
        let renewal = lock(&shared.renewal).take();
        let held: Vec<Arc<LeaseRecord>> = lock(&shared.held)
            .drain()
            .into_iter()
            .filter(|record| record.mark_released())
            .collect();
        let op = async move {
            if let Some(renewal) = renewal {
                let _ = renewal.await;
            }
            let released = shared.release_all(&held).await;
            shared.releases.close();
            let _ = tokio::time::timeout(shared.config.redis_timeout(), shared.releases.wait()).await;
            released?;
            Ok(Box::new(|py: Python<'_>| Ok(py.None())) as bridge::Delivery)
        };
        // Waits for the renewal loop and in-flight releases, so never finishes inline.
        bridge::spawn(py, op, false)
    }

    /// Counters for monitoring: leases held by this process, lost and taken back so far, failed
    /// renewal rounds, whether the breaker is open, and this process's waiters in line.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let stats = PyDict::new(py);
        stats.set_item("held", lock(&self.shared.held).len())?;
        stats.set_item("lost", self.shared.lost.load(Ordering::Relaxed))?;
        stats.set_item("reclaimed", self.shared.reclaimed.load(Ordering::Relaxed))?;
        stats.set_item(
            "renew_failures",
            self.shared.renew_failures.load(Ordering::Relaxed),
        )?;
        stats.set_item("closed", self.shared.closed.load(Ordering::Relaxed))?;
        stats.set_item("breaker_open", self.shared.breaker.is_open())?;
        stats.set_item("waiting", self.shared.local_line.len())?;
        Ok(stats)
    }
}

fn open_backend(url: &str, config: &LeaseConfig, tls_ca_file: Option<&str>) -> PyResult<Backend> {
    let scheme = url.split_once("://").map(|(s, _)| s);
    match scheme {
        Some("memory") => Ok(Backend::Memory(MemoryBackend::default())),
        Some("redis" | "rediss" | "unix" | "redis+unix" | "redis+cluster" | "rediss+cluster" | "redis+sentinel") => {
            let ca_pem = tls_ca_file
                .map(|path| {
                    std::fs::read(path).map_err(|e| {
                        PyValueError::new_err(format!(
                            "cannot read tls_ca_file {path:?} ({e}): pass the path of the PEM file of the CA that signed Redis' certificate"
                        ))
                    })
                })
                .transpose()?;
            RedisBackend::new(url, config.redis_timeout(), ca_pem)
                .map(|redis| Backend::Redis(Box::new(redis)))
                .map_err(|e| PyValueError::new_err(e.to_string()))
        }
        _ => Err(PyValueError::new_err(format!(
            "unsupported URL {:?}: use memory://, redis://host:port/db, rediss://host:port/db (TLS), unix:///path/to/socket, redis+cluster://host:port,host:port or redis+sentinel://host:port,host:port/master_name",
            crate::backend::redis::redact(url)
        ))),
    }
}

fn identity_arg(user_id: &Bound<'_, PyAny>) -> PyResult<String> {
    let Ok(text) = user_id.cast::<PyString>() else {
        let kind = user_id.get_type().name()?;
        return Err(PyTypeError::new_err(format!(
            "user_id must be a str, got {kind} {}: pass str(...) if your ids are numbers",
            user_id.repr()?
        )));
    };
    let identity = text.to_str()?;
    check_identity(identity).map_err(PyValueError::new_err)?;
    Ok(identity.to_owned())
}

fn weight_arg(weight: Option<&Bound<'_, PyAny>>) -> PyResult<u32> {
    let Some(weight) = weight.filter(|w| !w.is_none()) else {
        return Ok(1);
    };
    if weight.is_instance_of::<PyBool>() || !weight.is_instance_of::<PyInt>() {
        return Err(PyTypeError::new_err(format!(
            "weight must be an int, got {}",
            weight.repr()?
        )));
    }
    match weight.extract::<i64>() {
        Ok(w) if (1..=i64::from(MAX_WEIGHT)).contains(&w) => Ok(w as u32),
        _ => Err(PyValueError::new_err(format!(
            "weight={} is out of range: use 1 to {MAX_WEIGHT} slots",
            weight.repr()?
        ))),
    }
}
