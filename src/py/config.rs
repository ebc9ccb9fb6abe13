//! `LeaseConfig`: every knob, checked once at construction with errors that say how to fix them.

use std::sync::Arc;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyString};

use super::args::{self, type_name};
use super::client_address::proxy_rule;
use crate::config::{Config, FailureMode, LineOrder, OnLost};

const MIN_LEASE_SECONDS: f64 = 1.0;
const MAX_LEASE_SECONDS: f64 = 86_400.0;
const MAX_PREFIX_LEN: usize = 128;

/// Limits and timings of a `StreamLeaseManager`. Immutable; validated when built.
#[pyclass(frozen, eq, module = "fastapi_stream_lease")]
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseConfig {
    pub config: Config,
    /// What only the Python layer reads (the 0.6 API's options); shared, never changed.
    pub python_side: Arc<PythonSide>,
}

/// The options of the 0.6 API that the core never reads: its response headers and its
/// lifecycle hooks (run by the Python layer, off the hot path), and the failure policy object
/// given (its fallback mode became `failure_mode`).
#[derive(Debug)]
pub struct PythonSide {
    include_lease_headers: bool,
    hook_queue_size: u64,
    on_acquired: Option<Py<PyAny>>,
    on_rejected: Option<Py<PyAny>>,
    on_lost: Option<Py<PyAny>>,
    on_released: Option<Py<PyAny>>,
    on_backend_error: Option<Py<PyAny>>,
    failure_policy: Option<Py<PyAny>>,
}

impl PythonSide {
    fn objects(&self) -> [&Option<Py<PyAny>>; 6] {
        [
            &self.on_acquired,
            &self.on_rejected,
            &self.on_lost,
            &self.on_released,
            &self.on_backend_error,
            &self.failure_policy,
        ]
    }
}

/// Two configs are equal with the same hooks and policy objects (by identity: a callable has
/// no other equality worth trusting).
impl PartialEq for PythonSide {
    fn eq(&self, other: &Self) -> bool {
        let same = |a: &Option<Py<PyAny>>, b: &Option<Py<PyAny>>| match (a, b) {
            (None, None) => true,
            (Some(a), Some(b)) => a.as_ptr() == b.as_ptr(),
            _ => false,
        };
        self.include_lease_headers == other.include_lease_headers
            && self.hook_queue_size == other.hook_queue_size
            && self
                .objects()
                .iter()
                .zip(other.objects())
                .all(|(a, b)| same(a, b))
    }
}

/// The events a hook queue holds by default before it drops new ones (0.6's default).
const HOOK_QUEUE_SIZE: u64 = 1024;

#[pymethods]
impl LeaseConfig {
    #[new]
    #[pyo3(signature = (
        lease_seconds = None,
        max_per_user = None,
        max_global = None,
        key_prefix = None,
        *,
        global_pool = true,
        renew_every = None,
        redis_timeout = None,
        wait_timeout = None,
        line_order = None,
        max_waiting = None,
        wait_for_own_quota = false,
        retry_after = None,
        on_lost = None,
        failure_mode = None,
        fallback_workers = None,
        identity_secret = None,
        disclose_usage = true,
        trusted_proxies = None,
        proxy_header = None,
        fail_open = None,
        retry_after_seconds = None,
        acquire_timeout = None,
        failure_policy = None,
        include_lease_headers = false,
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
        global_pool: bool,
        renew_every: Option<&Bound<'_, PyAny>>,
        redis_timeout: Option<&Bound<'_, PyAny>>,
        wait_timeout: Option<&Bound<'_, PyAny>>,
        line_order: Option<&Bound<'_, PyAny>>,
        max_waiting: Option<&Bound<'_, PyAny>>,
        wait_for_own_quota: bool,
        retry_after: Option<&Bound<'_, PyAny>>,
        on_lost: Option<&Bound<'_, PyAny>>,
        failure_mode: Option<&Bound<'_, PyAny>>,
        fallback_workers: Option<&Bound<'_, PyAny>>,
        identity_secret: Option<&Bound<'_, PyAny>>,
        disclose_usage: bool,
        trusted_proxies: Option<&Bound<'_, PyAny>>,
        proxy_header: Option<&Bound<'_, PyAny>>,
        fail_open: Option<&Bound<'_, PyAny>>,
        retry_after_seconds: Option<&Bound<'_, PyAny>>,
        acquire_timeout: Option<&Bound<'_, PyAny>>,
        failure_policy: Option<&Bound<'_, PyAny>>,
        include_lease_headers: bool,
        on_acquired: Option<&Bound<'_, PyAny>>,
        on_rejected: Option<&Bound<'_, PyAny>>,
        on_released: Option<&Bound<'_, PyAny>>,
        on_backend_error: Option<&Bound<'_, PyAny>>,
        hook_queue_size: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let lease_seconds = args::seconds("lease_seconds", lease_seconds, 30.0)?;
        if !(MIN_LEASE_SECONDS..=MAX_LEASE_SECONDS).contains(&lease_seconds) {
            return Err(PyValueError::new_err(format!(
                "lease_seconds={lease_seconds} is out of range: use {MIN_LEASE_SECONDS} to {MAX_LEASE_SECONDS} seconds (a lease is how long a slot survives a dead holder; 10 to 60 is typical)"
            )));
        }
        let renew_every = args::seconds("renew_every", renew_every, lease_seconds / 3.0)?;
        if !(renew_every > 0.0 && renew_every <= lease_seconds / 2.0) {
            return Err(PyValueError::new_err(format!(
                "renew_every={renew_every} must be above 0 and at most lease_seconds / 2 = {} so a lease is renewed at least twice before it expires; leave it unset for lease_seconds / 3",
                lease_seconds / 2.0
            )));
        }
        let redis_timeout = args::seconds("redis_timeout", redis_timeout, 1.0)?;
        if !(0.001..=60.0).contains(&redis_timeout) {
            return Err(PyValueError::new_err(format!(
                "redis_timeout={redis_timeout} is out of range: use 0.001 to 60 seconds (it bounds every Redis call)"
            )));
        }
        let (retry_after_name, retry_after) = one_of_two_names(
            ("retry_after", retry_after),
            ("retry_after_seconds", retry_after_seconds),
        )?;
        let retry_after = args::seconds(retry_after_name, retry_after, 5.0)?;
        if !(1.0..=3600.0).contains(&retry_after) {
            return Err(PyValueError::new_err(format!(
                "retry_after={retry_after} is out of range: use 1 to 3600 seconds (the longest Retry-After a rejected client is told)"
            )));
        }
        // 0.6's acquire_timeout waits for a slot whichever cap is full, the user's own included.
        let (wait_name, wait) = one_of_two_names(
            ("wait_timeout", wait_timeout),
            ("acquire_timeout", acquire_timeout),
        )?;
        let wait_timeout = args::wait_seconds(wait, 0.0)?;
        let wait_for_own_quota =
            wait_for_own_quota || (wait_name == "acquire_timeout" && wait_timeout > 0.0 && global_pool);
        if wait_for_own_quota && !global_pool {
            return Err(PyValueError::new_err(
                "wait_for_own_quota needs the global pool (the lines live in its hash tag): drop global_pool=False, or wait_for_own_quota",
            ));
        }
        let lost_hook = args::given(on_lost)
            .filter(|hook| !hook.is_instance_of::<PyString>())
            .map(|hook| hook_field("on_lost", Some(hook)))
            .transpose()?
            .flatten();
        let lost_hook_given = lost_hook.is_some();
        let python_side = PythonSide {
            include_lease_headers,
            hook_queue_size: match args::capacity("hook_queue_size", hook_queue_size, HOOK_QUEUE_SIZE)? {
                0 => return Err(PyValueError::new_err("hook_queue_size must be at least 1")),
                n => n,
            },
            on_acquired: hook_field("on_acquired", on_acquired)?,
            on_rejected: hook_field("on_rejected", on_rejected)?,
            on_lost: lost_hook,
            on_released: hook_field("on_released", on_released)?,
            on_backend_error: hook_field("on_backend_error", on_backend_error)?,
            failure_policy: args::given(failure_policy).map(|policy| policy.clone().unbind()),
        };
        let config = Config {
            lease_seconds,
            max_per_user: args::capacity("max_per_user", max_per_user, 3)?,
            max_global: match (global_pool, args::capacity("max_global", max_global, 1000)?) {
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
            key_prefix: prefix_field(key_prefix)?,
            renew_every,
            redis_timeout,
            wait_timeout,
            line_order: choice_field(
                "line_order",
                line_order,
                &[("fair", LineOrder::Fair), ("arrival", LineOrder::Arrival)],
            )?,
            max_waiting: args::capacity("max_waiting", max_waiting, 0)?,
            wait_for_own_quota,
            retry_after,
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
            "LeaseConfig(lease_seconds={:?}, max_per_user={}, max_global={}, global_pool={}, key_prefix={:?}, renew_every={:?}, redis_timeout={:?}, wait_timeout={:?}, line_order={:?}, max_waiting={}, wait_for_own_quota={}, retry_after={:?}, on_lost={:?}, failure_mode={:?}, fallback_workers={}, identity_secret={}, disclose_usage={}, trusted_proxies={:?}, proxy_header={:?})",
            c.lease_seconds,
            c.max_per_user,
            c.max_global,
            if c.global_pool { "True" } else { "False" },
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

fn prefix_field(value: Option<&Bound<'_, PyAny>>) -> PyResult<String> {
    let Some(value) = args::given(value) else {
        return Ok("stream_lease".into());
    };
    let Ok(prefix) = value.cast::<PyString>() else {
        return Err(PyTypeError::new_err(format!(
            "key_prefix must be a str, got {} {}",
            type_name(value),
            value.repr()?
        )));
    };
    let prefix = args::utf8("key_prefix", prefix)?;
    if prefix.is_empty() || prefix.len() > MAX_PREFIX_LEN {
        return Err(PyValueError::new_err(format!(
            "key_prefix must be 1 to {MAX_PREFIX_LEN} bytes long, got {} bytes",
            prefix.len()
        )));
    }
    if let Some(bad) = prefix
        .chars()
        .find(|c| matches!(c, '{' | '}') || c.is_whitespace() || c.is_control())
    {
        return Err(PyValueError::new_err(format!(
            "key_prefix {prefix:?} contains {bad:?}: braces are added by the library (Redis Cluster hash tags) and whitespace is not allowed; use letters, digits, ':', '_', '-' or '.'"
        )));
    }
    Ok(prefix)
}

/// A value that has two names (this package's and the 0.6 API's): whichever was given, with
/// its name; refused when both were.
type Named<'a, 'py> = (&'static str, Option<&'a Bound<'py, PyAny>>);

fn one_of_two_names<'a, 'py>(ours: Named<'a, 'py>, theirs: Named<'a, 'py>) -> PyResult<Named<'a, 'py>> {
    match (args::given(ours.1), args::given(theirs.1)) {
        (Some(_), Some(_)) => Err(PyValueError::new_err(format!(
            "{} and {} are one setting ({} is its 0.6 name): pass one of them",
            ours.0, theirs.0, theirs.0
        ))),
        (None, Some(value)) => Ok((theirs.0, Some(value))),
        _ => Ok(ours),
    }
}

/// `failure_mode`, or 0.6's `fail_open` or `failure_policy.fallback_mode`: those given must
/// agree.
fn failure_mode_field(
    failure_mode: Option<&Bound<'_, PyAny>>,
    fail_open: Option<&Bound<'_, PyAny>>,
    failure_policy: Option<&Bound<'_, PyAny>>,
) -> PyResult<FailureMode> {
    let choices = [("closed", FailureMode::Closed), ("open", FailureMode::Open)];
    let mut given: Vec<(String, FailureMode)> = Vec::new();
    if let Some(mode) = args::given(failure_mode) {
        let chosen = choice_field("failure_mode", Some(mode), &choices)?;
        given.push((format!("failure_mode={}", mode.repr()?), chosen));
    }
    if let Some(open) = args::given(fail_open) {
        if !open.is_instance_of::<PyBool>() {
            return Err(PyTypeError::new_err(format!(
                "fail_open must be a bool, got {} {}",
                type_name(open),
                open.repr()?
            )));
        }
        let mode = if open.is_truthy()? {
            FailureMode::Open
        } else {
            FailureMode::Closed
        };
        given.push((format!("fail_open={}", open.repr()?), mode));
    }
    if let Some(policy) = args::given(failure_policy) {
        let fallback = match policy.cast::<PyDict>() {
            Ok(dict) => dict.get_item("fallback_mode")?,
            Err(_) => policy.getattr("fallback_mode").ok(),
        };
        let Some(fallback) = fallback else {
            return Err(PyTypeError::new_err(format!(
                "failure_policy must be a BackendFailurePolicy (or a dict with fallback_mode), got {}",
                type_name(policy)
            )));
        };
        let mode = match fallback.extract::<String>().as_deref() {
            Ok("fail_open") => FailureMode::Open,
            Ok("fail_closed") => FailureMode::Closed,
            _ => {
                return Err(PyValueError::new_err(format!(
                    "failure_policy.fallback_mode must be FallbackMode.FAIL_OPEN or FallbackMode.FAIL_CLOSED, got {}",
                    fallback.repr()?
                )))
            }
        };
        given.push(("failure_policy".into(), mode));
    }
    let Some((first_name, first)) = given.first() else {
        return Ok(FailureMode::Closed);
    };
    match given.iter().find(|(_, mode)| mode != first) {
        None => Ok(*first),
        Some((other, _)) => Err(PyValueError::new_err(format!(
            "{first_name} and {other} disagree on what to do when Redis is down: pass one of them"
        ))),
    }
}

/// A lifecycle hook: a callable (sync or async), or None.
fn hook_field(name: &str, value: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Py<PyAny>>> {
    match args::given(value) {
        None => Ok(None),
        Some(hook) if hook.is_callable() => Ok(Some(hook.clone().unbind())),
        Some(other) => Err(PyTypeError::new_err(format!(
            "{name} must be a callable (a function or a coroutine function), got {} {}",
            type_name(other),
            other.repr()?
        ))),
    }
}

/// One of `choices`, by name; the first is the default.
fn choice_field<T: Copy>(name: &str, value: Option<&Bound<'_, PyAny>>, choices: &[(&str, T)]) -> PyResult<T> {
    let Some(value) = args::given(value) else {
        return Ok(choices[0].1);
    };
    let given = value.cast::<PyString>().ok().map(|s| s.to_string());
    match choices
        .iter()
        .find(|(choice, _)| given.as_deref() == Some(*choice))
    {
        Some((_, chosen)) => Ok(*chosen),
        None => {
            let names: Vec<&str> = choices.iter().map(|(choice, _)| *choice).collect();
            Err(PyValueError::new_err(format!(
                "{name} must be one of {names:?}, got {}",
                value.repr()?
            )))
        }
    }
}

/// The shortest HMAC key accepted: 128 bits, so guessing the key is out of reach.
const MIN_SECRET_BYTES: usize = 16;

/// Where the identity secret comes from when `identity_secret` is not given: one variable that
/// a deployment sets for every worker and for the CLI.
pub const SECRET_VARIABLE: &str = "STREAM_LEASE_IDENTITY_SECRET";

fn secret_field(value: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<u8>> {
    let Some(value) = args::given(value) else {
        return secret_from_environment();
    };
    let secret = if let Ok(s) = value.cast::<PyString>() {
        args::utf8("identity_secret", s)?.into_bytes()
    } else if let Ok(b) = value.cast::<PyBytes>() {
        b.as_bytes().to_vec()
    } else {
        return Err(PyTypeError::new_err(format!(
            "identity_secret must be str or bytes, got {}",
            type_name(value)
        )));
    };
    long_enough("identity_secret", secret)
}

/// The secret in `SECRET_VARIABLE`; none when it is unset or empty.
fn secret_from_environment() -> PyResult<Vec<u8>> {
    match std::env::var(SECRET_VARIABLE) {
        Ok(secret) if !secret.is_empty() => long_enough(SECRET_VARIABLE, secret.into_bytes()),
        Ok(_) | Err(std::env::VarError::NotPresent) => Ok(Vec::new()),
        Err(std::env::VarError::NotUnicode(_)) => Err(PyValueError::new_err(format!(
            "{SECRET_VARIABLE} is not valid UTF-8: set it to 16 or more random bytes written as text (e.g. secrets.token_hex(16))"
        ))),
    }
}

fn long_enough(source: &str, secret: Vec<u8>) -> PyResult<Vec<u8>> {
    if secret.len() < MIN_SECRET_BYTES {
        return Err(PyValueError::new_err(format!(
            "{source} is {} bytes long: use at least {MIN_SECRET_BYTES} random bytes \
             (e.g. secrets.token_hex(16)) from a secret store (for none, leave identity_secret \
             None and {SECRET_VARIABLE} unset); a short key lets whoever reads Redis test \
             guessed user ids against the keys",
            secret.len()
        )));
    }
    Ok(secret)
}
