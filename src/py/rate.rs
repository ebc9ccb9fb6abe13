//! `RateLimit`: a request-rate policy, checked once at construction (the core's `RatePolicy`).

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple};

use super::args::{self, type_name};
use crate::rate::{
    check_hit, parse_rate, parse_window, Algorithm, Period, RatePolicy, Unit, Window, MAX_LIMIT,
};

/// At most ``limit`` hits per ``per`` seconds for each identity, across every worker.
///
/// ``per`` is seconds, or a window as text: ``"second"``, ``"minute"``, ``"hour"``, with a count
/// (``"30 seconds"``, ``"2 hours"``). ``per="day"``, ``"week"`` or ``"month"`` makes a calendar
/// window: a fixed window from one UTC boundary to the next (midnight; Monday at midnight, ISO
/// weeks; the 1st at midnight), so ``reset`` is the time to that boundary. A number of seconds
/// (``per=30 * 86400``) is a window of that length, whatever the date.
/// The limit may be written as a rate that names its window, ``per`` left out:
/// ``RateLimit("chat", "5/minute")``, ``"100 per hour"``, ``"10/30 seconds"``, read as the
/// ``limits`` package (and slowapi) reads them; ``"1/day"`` is the calendar day, as ``per="day"``.
///
/// ``name`` scopes the counter (``"chat_per_minute"``): two policies with different names never
/// share one. ``algorithm="sliding_window"`` (the default) never lets any ``per``-second window
/// hold more than ``limit``; ``"fixed_window"`` counts from a window's first hit until ``per``
/// seconds later, then starts again. ``unit="requests"`` (the default) counts hits and stream
/// starts; ``"tokens"`` makes the policy a token budget for LLM streams (``acquire(budgets=...)``),
/// ``"input_tokens"`` / ``"output_tokens"`` count only the prompt's or the answer's tokens, and
/// ``"cost"`` makes a budget in money: the tokens priced from a :class:`Prices` table, in an
/// integer unit the app chooses (cents, microdollars).
/// ``enforce=False`` makes a request rate a dry run: counted and reported (headers,
/// ``RateDecision.would_refuse``, metrics) but never refusing, to roll a new limit out safely.
/// ``alert_at=(0.5, 0.9)`` (fractions of ``limit``, checked as the manager's are) makes this
/// policy's threshold alerts come at those instead of the manager's ``alert_at``; ``()``
/// silences them; None (the default) keeps the manager's.
/// ``lease_units=True`` lets each process take units of a busy identity ahead of its hits and
/// serve the hits that follow from them without a round trip to Redis: the limit still holds
/// across every worker, and a hit may be refused while other processes hold units unused (see
/// "Leased units" in the rate-limit docs). Request rates only.
#[pyclass(frozen, eq, hash, module = "fastapi_stream_lease")]
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RateLimit {
    pub policy: RatePolicy,
}

#[pymethods]
impl RateLimit {
    #[new]
    #[pyo3(
        signature = (name, limit, per = None, algorithm = None, unit = None, *, enforce = None, alert_at = None, lease_units = None),
        text_signature = "(name, limit, per=None, algorithm=None, unit=None, *, enforce=True, alert_at=None, lease_units=False)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn py_new(
        name: &Bound<'_, PyAny>,
        limit: &Bound<'_, PyAny>,
        per: Option<&Bound<'_, PyAny>>,
        algorithm: Option<&Bound<'_, PyAny>>,
        unit: Option<&Bound<'_, PyAny>>,
        enforce: Option<&Bound<'_, PyAny>>,
        alert_at: Option<&Bound<'_, PyAny>>,
        lease_units: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let enforce = args::flag("enforce", enforce, true)?;
        let lease_units = args::flag("lease_units", lease_units, false)?;
        let Ok(name) = name.cast::<PyString>() else {
            return Err(PyTypeError::new_err(format!(
                "name must be a str, got {}",
                type_name(name)
            )));
        };
        let name = args::utf8("name", name)?;
        let own_alert_at = args::given(alert_at).map(args::thresholds).transpose()?;
        let (limit, window) = limit_and_window(limit, args::given(per))?;
        let algorithm = args::choice("algorithm", algorithm)?;
        let unit = match args::choice("unit", unit)? {
            None => Unit::Requests,
            Some(name) => Unit::parse(&name).map_err(args::invalid)?,
        };
        let policy = match window {
            Window::Calendar(period) => calendar_policy(&name, limit, period, algorithm.as_deref(), unit),
            Window::Ms(window_ms) => {
                let algorithm = match algorithm {
                    None => Algorithm::SlidingWindow,
                    Some(name) => Algorithm::parse(&name).map_err(args::invalid)?,
                };
                RatePolicy::new(&name, limit, window_ms, algorithm, unit)
            }
        };
        policy
            .and_then(|policy| policy.enforcing(enforce))
            .and_then(|policy| policy.leasing(lease_units))
            .map(|policy| RateLimit {
                policy: RatePolicy {
                    own_alert_at,
                    ..policy
                },
            })
            .map_err(args::invalid)
    }

    #[getter]
    fn name(&self) -> &str {
        &self.policy.name
    }

    #[getter]
    fn limit(&self) -> u64 {
        self.policy.limit
    }

    /// The window, in seconds (a calendar window's longest: 31 days for a month).
    #[getter]
    fn per(&self) -> f64 {
        self.policy.window_ms as f64 / 1000.0
    }

    /// A calendar window's period (``"day"``, ``"week"``, ``"month"``, in UTC), else None.
    #[getter]
    fn calendar(&self) -> Option<&'static str> {
        match self.policy.algorithm {
            Algorithm::Calendar(period) => Some(period.name()),
            _ => None,
        }
    }

    #[getter]
    fn algorithm(&self) -> &'static str {
        self.policy.algorithm.name()
    }

    /// What the policy counts: ``"requests"``, ``"tokens"``, ``"input_tokens"``,
    /// ``"output_tokens"`` or ``"cost"``.
    #[getter]
    fn unit(&self) -> &'static str {
        self.policy.unit.name()
    }

    /// False: a dry run, counted and reported but never refusing.
    #[getter]
    fn enforce(&self) -> bool {
        self.policy.enforce
    }

    /// True: each process takes units ahead of its hits and serves hits from them.
    #[getter]
    fn lease_units(&self) -> bool {
        self.policy.lease_units
    }

    /// The fractions of ``limit`` this policy alerts at, ascending (``()``: never); None: the
    /// manager's.
    #[getter]
    fn alert_at<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        self.policy
            .own_alert_at
            .as_ref()
            .map(|own| PyTuple::new(py, own.fractions()))
            .transpose()
    }

    fn __repr__(&self) -> String {
        let unit = match self.policy.unit {
            Unit::Requests => String::new(),
            other => format!(", unit='{}'", other.name()),
        };
        let enforce = if self.policy.enforce {
            ""
        } else {
            ", enforce=False"
        };
        let per = match self.calendar() {
            Some(period) => format!("'{period}'"),
            None => format!("{:?}", self.per()),
        };
        let alert_at = match &self.policy.own_alert_at {
            None => String::new(),
            Some(own) => {
                let fractions = own.fractions();
                let listed: Vec<String> = fractions.iter().map(|f| format!("{f:?}")).collect();
                // A tuple of one keeps its comma, as Python writes it.
                let comma = if fractions.len() == 1 { "," } else { "" };
                format!(", alert_at=({}{comma})", listed.join(", "))
            }
        };
        let lease_units = if self.policy.lease_units {
            ", lease_units=True"
        } else {
            ""
        };
        format!(
            // Names are plain ASCII (checked), so quoting them is enough.
            "RateLimit('{}', {}, per={per}, algorithm='{}'{unit}{enforce}{alert_at}{lease_units})",
            &*self.policy.name,
            self.policy.limit,
            self.policy.algorithm.name()
        )
    }
}

/// A calendar window's policy: `per` names the period; the algorithm, if given, is a fixed
/// window (a calendar window is one).
/// `RateLimit(name, "5/minute")` or `RateLimit(name, 5, per)`, `per` in seconds or as text
/// (`"minute"`, `"30 seconds"`, `"day"`): the limit and its window.
fn limit_and_window(limit: &Bound<'_, PyAny>, per: Option<&Bound<'_, PyAny>>) -> PyResult<(u64, Window)> {
    let (limit, window) = match (limit.cast::<PyString>(), per) {
        (Ok(rate), None) => parse_rate(&args::utf8("limit", rate)?).map_err(args::invalid)?,
        (Ok(rate), Some(_)) => {
            return Err(PyTypeError::new_err(format!(
                "limit {:?} is a rate that names its window: leave per out, or pass limit as an int",
                args::utf8("limit", rate)?
            )))
        }
        (Err(_), None) => {
            return Err(PyTypeError::new_err(
                "RateLimit needs its window: per=60 (seconds), per=\"minute\" (second, minute, hour, day, week, month), or the limit as a rate, \"5/minute\"",
            ))
        }
        (Err(_), Some(per)) => {
            let limit = args::int_in("limit", limit, 1..=MAX_LIMIT)?;
            let window = match per.cast::<PyString>() {
                Ok(text) => parse_window(&args::utf8("per", text)?).map_err(args::invalid)?,
                Err(_) => {
                    let seconds = args::seconds("per", Some(per), 0.0)?;
                    Window::Ms((seconds.max(0.0) * 1000.0).round() as u64)
                }
            };
            return Ok((limit, window));
        }
    };
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(args::invalid(format!(
            "limit={limit} is out of range: use 1 to {MAX_LIMIT}"
        )));
    }
    Ok((limit, window))
}

fn calendar_policy(
    name: &str,
    limit: u64,
    period: Period,
    algorithm: Option<&str>,
    unit: Unit,
) -> Result<RatePolicy, String> {
    let per = period.name();
    match algorithm {
        None | Some("fixed_window") => RatePolicy::calendar(name, limit, period, unit),
        Some(other) => Err(format!(
            "rate limit {name:?}: per={per:?} is a calendar window, a fixed window: leave algorithm out (or \"fixed_window\"), not {other:?}; for a sliding window give per in seconds"
        )),
    }
}

/// `alert_at` checked as every manager and policy checks it: the fractions kept, ascending,
/// each to a millionth.
#[pyfunction]
pub fn checked_thresholds<'py>(
    py: Python<'py>,
    alert_at: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyTuple>> {
    PyTuple::new(py, args::thresholds(alert_at)?.fractions())
}

/// Checks the policies of a hit of `cost` as every hit does (at least one, each named once,
/// each able to allow the cost), so that route forms fail at start-up, not per request.
#[pyfunction]
pub fn check_rate_limits(policies: &Bound<'_, PyAny>, cost: &Bound<'_, PyAny>) -> PyResult<()> {
    let cost = args::int_in("cost", cost, 0..=MAX_LIMIT)?;
    check_hit(&policies_of(policies)?, cost).map_err(args::invalid)
}

/// The policies of a route form, each a `RateLimit`: a form counts the identity its `key`
/// gives, so a policy paired with one of its own is refused, saying where pairs belong.
pub fn policies_of(value: &Bound<'_, PyAny>) -> PyResult<Vec<RatePolicy>> {
    value
        .try_iter()?
        .map(|item| {
            let item = item?;
            if item.is_instance_of::<PyTuple>() {
                return Err(PyTypeError::new_err(
                    "a route's rate limits count the identity its key gives: pass RateLimit values here; a (RateLimit, identity) pair is for hit(), acquire(), usage() and reset()",
                ));
            }
            policy_of(&item)
        })
        .collect()
}

/// The policies of one call, each a `RateLimit` (counting the call's identity) or a
/// `(RateLimit, identity)` pair (counting that identity: a team, an API key).
pub fn keyed_policies_of(value: &Bound<'_, PyAny>) -> PyResult<KeyedPolicies> {
    keyed_policies_and_values(value).map(|(keyed, _)| keyed)
}

/// Policies as the core takes them, each with the identity paired with it, if any.
pub type KeyedPolicies = Vec<(RatePolicy, Option<String>)>;

/// `keyed_policies_of`, with the `RateLimit` values themselves, in the same order (a hit's
/// decisions show them).
pub fn keyed_policies_and_values(value: &Bound<'_, PyAny>) -> PyResult<(KeyedPolicies, Vec<Py<RateLimit>>)> {
    let (mut keyed, mut values) = (Vec::new(), Vec::new());
    for item in value.try_iter()? {
        let (limit, identity) = keyed_limit_of(&item?)?;
        keyed.push((limit.get().policy.clone(), identity));
        values.push(limit.unbind());
    }
    Ok((keyed, values))
}

fn keyed_limit_of<'py>(item: &Bound<'py, PyAny>) -> PyResult<(Bound<'py, RateLimit>, Option<String>)> {
    let Ok(pair) = item.cast::<PyTuple>() else {
        return Ok((rate_limit_of(item)?, None));
    };
    if pair.len() != 2 {
        return Err(PyTypeError::new_err(format!(
            "a policy with an identity of its own is a (RateLimit, identity) pair, got a tuple of {}: pass (RateLimit(...), team_id)",
            pair.len()
        )));
    }
    let limit = rate_limit_of(&pair.get_item(0)?)?;
    let name = &limit.get().policy.name;
    let identity = pair.get_item(1)?;
    let Ok(text) = identity.cast::<PyString>() else {
        return Err(PyTypeError::new_err(format!(
            "the identity paired with rate limit {:?} must be a str, got {}: pass str(...) if your ids are numbers",
            &**name,
            type_name(&identity)
        )));
    };
    let identity = args::utf8(
        &format!("the identity paired with rate limit {:?}", &**name),
        text,
    )?;
    Ok((limit, Some(identity)))
}

fn policy_of(item: &Bound<'_, PyAny>) -> PyResult<RatePolicy> {
    rate_limit_of(item).map(|limit| limit.get().policy.clone())
}

fn rate_limit_of<'py>(item: &Bound<'py, PyAny>) -> PyResult<Bound<'py, RateLimit>> {
    item.cast::<RateLimit>().cloned().map_err(|_| {
        PyTypeError::new_err(format!(
            "rate limits must be RateLimit values or (RateLimit, identity) pairs, got {}: build them with RateLimit(name, limit, per=seconds)",
            type_name(item)
        ))
    })
}
