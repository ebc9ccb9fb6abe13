//! The budget arguments of an acquire (`budgets=`, `reserve=`, `on_budget=`), and the handle's
//! token counting.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple};

use super::args::{self, type_name};
use crate::budget::{BudgetRequest, OnBudget, Price, AUTO_ANSWER, TOP_UP};
use crate::rate::price::{answer_price, answer_room, tokens_within};
use crate::rate::{RatePolicy, MAX_LIMIT};

/// What a request says of its own size, for `reserve="auto"`: its model, the prompt's tokens
/// and its `max_tokens`, each as given (or None).
pub struct Sizing<'a, 'py> {
    pub model: Option<&'a Bound<'py, PyAny>>,
    pub prompt_tokens: Option<&'a Bound<'py, PyAny>>,
    pub max_tokens: Option<&'a Bound<'py, PyAny>>,
}

/// What an acquire asks of its budgets (`budgets`: each budget with the identity it counts, if
/// not the user's), its cost budgets priced at `price` (the model's); None without any budget
/// argument. Left out, the reservation is one top-up increment of answer tokens (at most what
/// the smallest budget pays for). A model named (`model=`) learns its answers' sizes from the
/// stream's settlement.
pub fn request(
    budgets: Vec<RatePolicy>,
    reserve: Option<&Bound<'_, PyAny>>,
    on_budget: Option<&Bound<'_, PyAny>>,
    price: Option<Price>,
    sizing: Sizing<'_, '_>,
) -> PyResult<Option<BudgetRequest>> {
    let (reserve, on_budget) = (args::given(reserve), args::given(on_budget));
    let auto = sized_by_request(reserve);
    if !auto && (args::given(sizing.prompt_tokens).is_some() || args::given(sizing.max_tokens).is_some()) {
        return Err(PyValueError::new_err(
            "prompt_tokens= and max_tokens= size reserve=\"auto\": pass reserve=\"auto\" with them, or reserve=(prompt_tokens, max_tokens)",
        ));
    }
    if budgets.is_empty() && reserve.is_none() && on_budget.is_none() {
        return Ok(None);
    }
    let policies = budgets;
    let model = args::choice("model", sizing.model)?.filter(|model| !model.is_empty());
    let (input, output, learned_within) = match reserve {
        Some(reserve) if auto => auto_estimate(reserve, &policies, price.as_ref(), sizing)?,
        Some(reserve) => {
            let (input, output) = estimate(reserve)?;
            (input, output, None)
        }
        // In answer tokens: what each budget's limit pays for at the model's price.
        None => (
            0,
            policies
                .iter()
                .map(|p| tokens_within(p.limit, answer_price(p.unit, price.as_ref())))
                .fold(TOP_UP, u64::min),
            None,
        ),
    };
    let on_budget = match args::choice("on_budget", on_budget)? {
        None => OnBudget::Cut,
        Some(name) => OnBudget::parse(&name).map_err(args::invalid)?,
    };
    Ok(Some(BudgetRequest {
        policies,
        input,
        output,
        on_budget,
        price,
        model,
        learned_within,
        answers: None,
    }))
}

/// Whether `reserve` is a str (`"auto"`, else refused as not a size): sized from the request.
pub fn sized_by_request(reserve: Option<&Bound<'_, PyAny>>) -> bool {
    args::given(reserve).is_some_and(|r| r.cast::<PyString>().is_ok())
}

/// `reserve="auto"`: the prompt's tokens and the request's `max_tokens`, or without it
/// `AUTO_ANSWER` answer tokens, at most what every budget holds after the prompt (a
/// `max_tokens` above that is kept, to be refused as a reservation that never fits); without
/// it, what every budget holds after the prompt too, within which the manager puts the model's
/// learned size in place of `AUTO_ANSWER`.
fn auto_estimate(
    reserve: &Bound<'_, PyAny>,
    policies: &[RatePolicy],
    price: Option<&Price>,
    sizing: Sizing<'_, '_>,
) -> PyResult<(u64, u64, Option<u64>)> {
    if args::choice("reserve", Some(reserve))?.as_deref() != Some("auto") {
        return Err(PyValueError::new_err(format!(
            "reserve={} is not a size: pass \"auto\" (with model=, prompt_tokens= and max_tokens=), an int or a (prompt_tokens, answer_tokens) pair",
            reserve.repr()?
        )));
    }
    if args::choice("model", sizing.model)?.is_none_or(|model| model.is_empty()) {
        return Err(PyValueError::new_err(
            "reserve=\"auto\" needs model=\"...\" (the model the request names), with prompt_tokens= and max_tokens= when the request gives them",
        ));
    }
    let input = args::given(sizing.prompt_tokens)
        .map(|t| tokens("prompt_tokens", t))
        .transpose()?
        .unwrap_or(0);
    if let Some(max_tokens) = args::given(sizing.max_tokens) {
        return Ok((input, tokens("max_tokens", max_tokens)?, None));
    }
    let room = policies
        .iter()
        .map(|p| answer_room(p.unit, p.limit, price, input))
        .fold(MAX_LIMIT, u64::min);
    Ok((input, AUTO_ANSWER.min(room), Some(room)))
}

/// `reserve=n` (tokens of the answer, or of prompt and answer together for a `"tokens"` budget)
/// or `reserve=(prompt_tokens, answer_tokens)`.
fn estimate(reserve: &Bound<'_, PyAny>) -> PyResult<(u64, u64)> {
    match reserve.cast::<PyTuple>() {
        Ok(pair) if pair.len() == 2 => Ok((
            tokens("reserve[0] (the prompt's tokens)", &pair.get_item(0)?)?,
            tokens("reserve[1] (the answer's tokens)", &pair.get_item(1)?)?,
        )),
        Ok(_) => Err(PyTypeError::new_err(
            "reserve must be an int or a (prompt_tokens, answer_tokens) pair",
        )),
        Err(_) if reserve.is_instance_of::<pyo3::types::PyInt>() => Ok((0, tokens("reserve", reserve)?)),
        Err(_) => Err(PyTypeError::new_err(format!(
            "reserve must be an int or a (prompt_tokens, answer_tokens) pair, got {}",
            type_name(reserve)
        ))),
    }
}

/// A count of tokens: a non-negative int within what counters hold exactly.
pub fn tokens(name: &str, value: &Bound<'_, PyAny>) -> PyResult<u64> {
    args::int_in(name, value, 0..=MAX_LIMIT)
}
