//! The budget arguments of an acquire (`budgets=`, `reserve=`, `on_budget=`), and the handle's
//! token counting.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::args::{self, type_name};
use crate::budget::{BudgetRequest, OnBudget, Price, TOP_UP};
use crate::rate::price::{answer_price, tokens_within};
use crate::rate::{RatePolicy, MAX_LIMIT};

/// What an acquire asks of its budgets (`budgets`: each budget with the identity it counts, if
/// not the user's), its cost budgets priced at `price` (the model's); None without any budget
/// argument. Left out, the reservation is one top-up increment of answer tokens (at most what
/// the smallest budget pays for).
pub fn request(
    budgets: Vec<RatePolicy>,
    reserve: Option<&Bound<'_, PyAny>>,
    on_budget: Option<&Bound<'_, PyAny>>,
    price: Option<Price>,
) -> PyResult<Option<BudgetRequest>> {
    let (reserve, on_budget) = (args::given(reserve), args::given(on_budget));
    if budgets.is_empty() && reserve.is_none() && on_budget.is_none() {
        return Ok(None);
    }
    let policies = budgets;
    let (input, output) = match reserve {
        Some(reserve) => estimate(reserve)?,
        // In answer tokens: what each budget's limit pays for at the model's price.
        None => (
            0,
            policies
                .iter()
                .map(|p| tokens_within(p.limit, answer_price(p.unit, price.as_ref())))
                .fold(TOP_UP, u64::min),
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
    }))
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
