//! `LeaseConfig`: every knob, checked once at construction with errors that say how to fix them
//! (`fields.rs`, the identity secret in `secret.rs`); the options only the Python layer reads
//! are its `PythonSide` (`python_side.rs`).
//!
//! Over 400 lines: PyO3 takes one `#[pymethods]` block per class, and this is `LeaseConfig`'s
//! (its constructor and one getter per setting, which read best side by side).

mod fields;
mod python_side;
mod secret;

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyString;

use self::fields::{choice_field, failure_mode_field, one_of_two_names, prefix_field, Timings};
pub use self::python_side::PythonSide;
use self::secret::secret_field;
pub use self::secret::SECRET_VARIABLE;
use super::args;
use super::client_address::proxy_rule;
use crate::config::{Config, FailureMode, LineOrder, OnLost};

/// Limits and timings of a `StreamLeaseManager`. Immutable; validated when built.
#[pyclass(frozen, eq, module = "fastapi_stream_lease")]
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseConfig {
    pub config: Config,
    /// What only the Python layer reads (the 0.6 API's options); shared, never changed.
    pub python_side: Arc<PythonSide>,
}

#[pymethods]
impl LeaseConfig {
    #[new]
    #[pyo3(signature = (
        lease_seconds = None,
        max_per_user = None,
        max_global = None,
        key_prefix = None,
        *,
        global_pool = None,
        lease_global_slots = None,
        renew_every = None,
        redis_timeout = None,
        wait_timeout = None,
        line_order = None,
        max_waiting = None,
        wait_for_own_quota = None,
        retry_after = None,
        on_lost = None,
        failure_mode = None,
        fallback_workers = None,
        identity_secret = None,
        disclose_usage = None,
        enforce_rate_limits = None,
        fencing_tokens = None,
        trusted_proxies = None,
        proxy_header = None,
        fail_open = None,
        retry_after_seconds = None,
        acquire_timeout = None,
        failure_policy = None,
        include_lease_headers = None,
        on_acquired = None,
        on_rejected = None,
        on_released = None,
        on_backend_error = None,
        hook_queue_size = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn py_new(
        lease_seconds: Option<&Bound<'_, PyAny>>,
        max_per_user: Option<&Bound<'_, PyAny>>,
        max_global: Option<&Bound<'_, PyAny>>,
        key_prefix: Option<&Bound<'_, PyAny>>,
        global_pool: Option<&Bound<'_, PyAny>>,
        lease_global_slots: Option<&Bound<'_, PyAny>>,
        renew_every: Option<&Bound<'_, PyAny>>,
        redis_timeout: Option<&Bound<'_, PyAny>>,
        wait_timeout: Option<&Bound<'_, PyAny>>,
        line_order: Option<&Bound<'_, PyAny>>,
        max_waiting: Option<&Bound<'_, PyAny>>,
        wait_for_own_quota: Option<&Bound<'_, PyAny>>,
        retry_after: Option<&Bound<'_, PyAny>>,
        on_lost: Option<&Bound<'_, PyAny>>,
        failure_mode: Option<&Bound<'_, PyAny>>,
        fallback_workers: Option<&Bound<'_, PyAny>>,
        identity_secret: Option<&Bound<'_, PyAny>>,
        disclose_usage: Option<&Bound<'_, PyAny>>,
        enforce_rate_limits: Option<&Bound<'_, PyAny>>,
        fencing_tokens: Option<&Bound<'_, PyAny>>,
        trusted_proxies: Option<&Bound<'_, PyAny>>,
        proxy_header: Option<&Bound<'_, PyAny>>,
        fail_open: Option<&Bound<'_, PyAny>>,
        retry_after_seconds: Option<&Bound<'_, PyAny>>,
        acquire_timeout: Option<&Bound<'_, PyAny>>,
        failure_policy: Option<&Bound<'_, PyAny>>,
        include_lease_headers: Option<&Bound<'_, PyAny>>,
        on_acquired: Option<&Bound<'_, PyAny>>,
        on_rejected: Option<&Bound<'_, PyAny>>,
        on_released: Option<&Bound<'_, PyAny>>,
        on_backend_error: Option<&Bound<'_, PyAny>>,
        hook_queue_size: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let global_pool = args::flag("global_pool", global_pool, true)?;
        let lease_global_slots = args::flag("lease_global_slots", lease_global_slots, false)?;
        if lease_global_slots && !global_pool {
            return Err(PyValueError::new_err(
                "lease_global_slots leases the global pool's slots: drop global_pool=False, or lease_global_slots",
            ));
        }
        let wait_for_own_quota = args::flag("wait_for_own_quota", wait_for_own_quota, false)?;
        let disclose_usage = args::flag("disclose_usage", disclose_usage, true)?;
        let enforce_rate_limits = args::flag("enforce_rate_limits", enforce_rate_limits, true)?;
        let fencing_tokens = args::flag("fencing_tokens", fencing_tokens, false)?;
        let include_lease_headers = args::flag("include_lease_headers", include_lease_headers, false)?;
        let timings = Timings::of(
            lease_seconds,
            renew_every,
            redis_timeout,
            retry_after,
            retry_after_seconds,
        )?;
        // 0.6's acquire_timeout waits for a slot whichever cap is full, the user's own included.
        let (wait_name, wait) = one_of_two_names(
            ("wait_timeout", wait_timeout),
            ("acquire_timeout", acquire_timeout),
        )?;
        let wait_timeout = args::wait_seconds(wait_name, wait, 0.0)?;
        let users_share_the_tag = global_pool && !lease_global_slots;
        let wait_for_own_quota = wait_for_own_quota
            || (wait_name == "acquire_timeout" && wait_timeout > 0.0 && users_share_the_tag);
        if wait_for_own_quota && !global_pool {
            return Err(PyValueError::new_err(
                "wait_for_own_quota needs the global pool (the lines live in its hash tag): drop global_pool=False, or wait_for_own_quota",
            ));
        }
        if wait_for_own_quota && lease_global_slots {
            return Err(PyValueError::new_err(
                "wait_for_own_quota needs the users' own pools in the global pool's hash tag, where the lines live; lease_global_slots=True gives each user a tag of its own: drop one of the two",
            ));
        }
        let python_side = PythonSide::of(
            include_lease_headers,
            hook_queue_size,
            [on_acquired, on_rejected, on_lost, on_released, on_backend_error],
            failure_policy,
        )?;
        let lost_hook_given = python_side.has_lost_hook();
        let config = Config {
            lease_seconds: timings.lease_seconds,
            max_per_user: args::capacity("max_per_user", max_per_user, 3)?,
            max_global: match (global_pool, args::capacity("max_global", max_global, 1000)?) {
                (true, 0) if lease_global_slots => {
                    return Err(PyValueError::new_err(
                        "lease_global_slots=True leases the slots of a capped global pool, and max_global=0 caps nothing: give max_global a capacity, or drop lease_global_slots",
                    ))
                }
                (true, limit) => limit,
                (false, _) if args::given(max_global).is_none() => 0,
                (false, 0) => 0,
                (false, _) => {
                    return Err(PyValueError::new_err(
                        "max_global needs the global pool: drop global_pool=False, or max_global",
                    ))
                }
            },
            global_pool,
            lease_global_slots,
            key_prefix: prefix_field(key_prefix)?,
            renew_every: timings.renew_every,
            redis_timeout: timings.redis_timeout,
            wait_timeout,
            line_order: choice_field(
                "line_order",
                line_order,
                &[("fair", LineOrder::Fair), ("arrival", LineOrder::Arrival)],
            )?,
            max_waiting: args::capacity("max_waiting", max_waiting, 0)?,
            wait_for_own_quota,
            retry_after: timings.retry_after,
            // A 0.6 on_lost hook goes with 0.6's behaviour: a lost lease ends its stream.
            on_lost: match lost_hook_given {
                true => OnLost::Cancel,
                false => choice_field(
                    "on_lost",
                    on_lost,
                    &[("cancel", OnLost::Cancel), ("continue", OnLost::Continue)],
                )?,
            },
            failure_mode: failure_mode_field(failure_mode, fail_open, failure_policy)?,
            fallback_workers: match args::capacity("fallback_workers", fallback_workers, 1)? {
                0 => return Err(PyValueError::new_err("fallback_workers must be at least 1")),
                n => n,
            },
            identity_secret: secret_field(identity_secret)?,
            disclose_usage,
            enforce_rate_limits,
            fencing_tokens,
            proxy_rule: proxy_rule(trusted_proxies, proxy_header)?,
        };
        Ok(LeaseConfig {
            config,
            python_side: Arc::new(python_side),
        })
    }

    #[getter]
    fn lease_seconds(&self) -> f64 {
        self.config.lease_seconds
    }

    #[getter]
    fn max_per_user(&self) -> u64 {
        self.config.max_per_user
    }

    #[getter]
    fn max_global(&self) -> u64 {
        self.config.max_global
    }

    /// Keep a pool across every user (`max_global`, `get_active_count()`). Without it, each
    /// user's keys get a hash tag of their own and spread across Redis Cluster shards.
    #[getter]
    fn global_pool(&self) -> bool {
        self.config.global_pool
    }

    /// Whether each process takes the global pool's slots in slabs and starts its streams from
    /// them, without a call to the global pool's shard; each user's keys then have a hash tag
    /// of their own.
    #[getter]
    fn lease_global_slots(&self) -> bool {
        self.config.lease_global_slots
    }

    #[getter]
    fn key_prefix(&self) -> &str {
        &self.config.key_prefix
    }

    #[getter]
    fn renew_every(&self) -> f64 {
        self.config.renew_every
    }

    #[getter]
    fn redis_timeout(&self) -> f64 {
        self.config.redis_timeout
    }

    /// How long an acquire waits in line for shared capacity (global) before it is refused.
    #[getter]
    fn wait_timeout(&self) -> f64 {
        self.config.wait_timeout
    }

    /// Upper bound of the `Retry-After` given with a rejection (sooner if a slot frees sooner).
    #[getter]
    fn retry_after(&self) -> f64 {
        self.config.retry_after
    }

    /// What a lost lease does to its stream: `"cancel"` ends it with `LeaseLost`, `"continue"`
    /// only records it (`lease.lost`).
    #[getter]
    fn on_lost(&self, py: Python<'_>) -> Py<PyAny> {
        match &self.python_side.on_lost {
            Some(hook) => hook.clone_ref(py),
            None => PyString::new(py, self.on_lost_mode()).into_any().unbind(),
        }
    }

    /// 0.6's name: `failure_mode == "open"`.
    #[getter]
    fn fail_open(&self) -> bool {
        self.config.failure_mode == FailureMode::Open
    }

    /// 0.6's name of `retry_after`.
    #[getter]
    fn retry_after_seconds(&self) -> f64 {
        self.config.retry_after
    }

    /// 0.6's name of `wait_timeout` (given, it also sets `wait_for_own_quota`).
    #[getter]
    fn acquire_timeout(&self) -> f64 {
        self.config.wait_timeout
    }

    /// The 0.6 `BackendFailurePolicy` given, if any: its `fallback_mode` is `failure_mode`.
    #[getter]
    fn failure_policy(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.python_side.failure_policy.as_ref().map(|p| p.clone_ref(py))
    }

    /// Whether `as_streaming_response()` and `manager.stream()` send the `X-Stream-Lease-*`
    /// headers (the lease id and the caps).
    #[getter]
    fn include_lease_headers(&self) -> bool {
        self.python_side.include_lease_headers
    }

    /// Hook events queued at most; more are dropped rather than slow anything, with a warning
    /// in the log that counts them (at the first and every 1,000th).
    #[getter]
    fn hook_queue_size(&self) -> u64 {
        self.python_side.hook_queue_size
    }

    /// `on_acquired(lease)`, after a grant.
    #[getter]
    fn on_acquired(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.python_side.on_acquired.as_ref().map(|h| h.clone_ref(py))
    }

    /// `on_rejected(user_id, reason)`, after a refusal (`StreamLeaseRejected.reason`).
    #[getter]
    fn on_rejected(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.python_side.on_rejected.as_ref().map(|h| h.clone_ref(py))
    }

    /// `on_released(lease, reason)`: `"completed"`, `"cancelled"`, `"error"`, `"lost"` or
    /// `"manual"`.
    #[getter]
    fn on_released(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.python_side.on_released.as_ref().map(|h| h.clone_ref(py))
    }

    /// `on_backend_error(exc)`, when the store fails an acquire.
    #[getter]
    fn on_backend_error(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.python_side
            .on_backend_error
            .as_ref()
            .map(|h| h.clone_ref(py))
    }

    /// The order of a pool's line within one priority: `"fair"` (users take turns, first come
    /// first served within a user) or `"arrival"` (first come, first served).
    #[getter]
    fn line_order(&self) -> &'static str {
        self.config.line_order.code()
    }

    /// Waiters each pool's line holds at most (0: no limit); one more is refused at once with
    /// `LineFull` and a `Retry-After` from the line's recent service rate, unless it is its
    /// user's first there and another user has two places or more (docs/guide/waiting.md).
    #[getter]
    fn max_waiting(&self) -> u64 {
        self.config.max_waiting
    }

    /// Whether a user over its own `max_per_user` waits (up to `wait_timeout`) in its own line
    /// instead of being refused at once with 429.
    #[getter]
    fn wait_for_own_quota(&self) -> bool {
        self.config.wait_for_own_quota
    }

    /// When Redis is unreachable: `"closed"` refuses new streams (503), `"open"` admits them
    /// against this process's share of the caps (`fallback_workers`).
    #[getter]
    fn failure_mode(&self) -> &'static str {
        match self.config.failure_mode {
            FailureMode::Closed => "closed",
            FailureMode::Open => "open",
        }
    }

    /// Worker processes sharing the caps; under `failure_mode="open"` each enforces its share.
    #[getter]
    fn fallback_workers(&self) -> u64 {
        self.config.fallback_workers
    }

    /// Whether a refusal by a shared pool (global, a resource) tells the client the pool's
    /// capacity and usage (body, RateLimit headers). The user's own quota is always told.
    #[getter]
    fn disclose_usage(&self) -> bool {
        self.config.disclose_usage
    }

    /// False: every request-rate policy is a dry run (``RateLimit(enforce=False)``), counted and
    /// reported but never refusing: to roll out new limits, or watch them in a staging
    /// deployment. Token budgets still refuse.
    #[getter]
    fn enforce_rate_limits(&self) -> bool {
        self.config.enforce_rate_limits
    }

    /// True: each grant takes a fencing token (``lease.fencing_token``), above every token given
    /// before to a lease that shares a pool with it; on Redis one ``INCR`` per grant. Off by
    /// default, and then ``lease.fencing_token`` raises RuntimeError.
    #[getter]
    fn fencing_tokens(&self) -> bool {
        self.config.fencing_tokens
    }

    /// The reverse proxies (addresses or CIDR networks) whose `proxy_header` is believed.
    #[getter]
    fn trusted_proxies(&self) -> Vec<String> {
        self.config.proxy_rule.proxies().to_vec()
    }

    /// The header the trusted proxies write the client's address into: `X-Forwarded-For`,
    /// `Forwarded` (RFC 7239) or a header of one address (`X-Real-IP`, `CF-Connecting-IP`).
    #[getter]
    fn proxy_header(&self) -> &str {
        self.config.proxy_rule.header_name()
    }

    fn __repr__(&self) -> String {
        let c = &self.config;
        format!(
            "LeaseConfig(lease_seconds={:?}, max_per_user={}, max_global={}, global_pool={}, lease_global_slots={}, key_prefix={:?}, renew_every={:?}, redis_timeout={:?}, wait_timeout={:?}, line_order={:?}, max_waiting={}, wait_for_own_quota={}, retry_after={:?}, on_lost={:?}, failure_mode={:?}, fallback_workers={}, identity_secret={}, disclose_usage={}, enforce_rate_limits={}, fencing_tokens={}, trusted_proxies={:?}, proxy_header={:?})",
            c.lease_seconds,
            c.max_per_user,
            c.max_global,
            if c.global_pool { "True" } else { "False" },
            if c.lease_global_slots { "True" } else { "False" },
            c.key_prefix,
            c.renew_every,
            c.redis_timeout,
            c.wait_timeout,
            self.line_order(),
            c.max_waiting,
            if c.wait_for_own_quota { "True" } else { "False" },
            c.retry_after,
            self.on_lost_mode(),
            self.failure_mode(),
            c.fallback_workers,
            if c.identity_secret.is_empty() { "None" } else { "'***'" },
            if c.disclose_usage { "True" } else { "False" },
            if c.enforce_rate_limits { "True" } else { "False" },
            if c.fencing_tokens { "True" } else { "False" },
            c.proxy_rule.proxies(),
            c.proxy_rule.header_name(),
        )
    }
}

impl LeaseConfig {
    fn on_lost_mode(&self) -> &'static str {
        match self.config.on_lost {
            OnLost::Cancel => "cancel",
            OnLost::Continue => "continue",
        }
    }
}
