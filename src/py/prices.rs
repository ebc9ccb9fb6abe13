//! `Prices`: a price table of models for the cost budgets (`RateLimit(..., unit="cost")`), and
//! the price an acquire's `model=` names.

use std::collections::BTreeMap;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyFloat, PyString, PyTuple};

use super::args::{self, type_name};
use crate::budget::Price;
use crate::rate::price::MAX_PRICE;

/// A price table for the budgets in money (``RateLimit(..., unit="cost")``):
/// ``Prices({"gpt-x": (input, output, cached_input)})``, each price a non-negative int in the
/// budgets' unit (cents, microdollars: the app chooses) per million tokens, for the prompt's
/// tokens, the answer's, and the prompt's tokens read from the provider's cache. Give it to
/// ``acquire(..., model=..., prices=...)`` or once to ``StreamLeaseManager(..., prices=...)``;
/// a model the table lacks is refused with a ``ValueError``.
#[pyclass(frozen, module = "fastapi_stream_lease")]
pub struct Prices {
    table: BTreeMap<String, Price>,
}

#[pymethods]
impl Prices {
    #[new]
    fn new(table: &Bound<'_, PyAny>) -> PyResult<Self> {
        let Ok(table) = table.cast::<PyDict>() else {
            return Err(PyTypeError::new_err(format!(
                "Prices takes a dict of model name to (input, output, cached_input) prices per million tokens, got {}",
                type_name(table)
            )));
        };
        let mut prices = BTreeMap::new();
        for (model, price) in table.iter() {
            let Ok(model) = model.cast::<PyString>() else {
                return Err(PyTypeError::new_err(format!(
                    "a model name in Prices must be a str, got {}",
                    type_name(&model)
                )));
            };
            let model = args::utf8("model name", model)?;
            let price = price_of(&model, &price)?;
            prices.insert(model, price);
        }
        Ok(Prices { table: prices })
    }

    /// The model names, sorted.
    #[getter]
    fn models(&self) -> Vec<String> {
        self.table.keys().cloned().collect()
    }

    /// `model`'s (input, output, cached_input) prices per million tokens.
    fn __getitem__(&self, model: &str) -> PyResult<(u64, u64, u64)> {
        let price = self.price(model)?;
        Ok((price.input, price.output, price.cached_input))
    }

    fn __contains__(&self, model: &str) -> bool {
        self.table.contains_key(model)
    }

    fn __len__(&self) -> usize {
        self.table.len()
    }

    fn __repr__(&self) -> String {
        let entries: Vec<String> = self
            .table
            .iter()
            .map(|(model, p)| format!("{model:?}: ({}, {}, {})", p.input, p.output, p.cached_input))
            .collect();
        format!("Prices({{{}}})", entries.join(", "))
    }
}

impl Prices {
    /// `model`'s price, or an error naming the models the table knows.
    pub fn price(&self, model: &str) -> PyResult<Price> {
        self.table.get(model).copied().ok_or_else(|| {
            let known = match self.table.is_empty() {
                true => "no model".to_owned(),
                false => self.models().join(", "),
            };
            PyValueError::new_err(format!(
                "no price for model {model:?}: Prices knows {known}; add it to the table"
            ))
        })
    }
}

/// One model's `(input, output, cached_input)` prices.
fn price_of(model: &str, price: &Bound<'_, PyAny>) -> PyResult<Price> {
    let what = format!("the price of {model:?}");
    let Ok(triple) = price.cast::<PyTuple>() else {
        return Err(PyTypeError::new_err(format!(
            "{what} must be an (input, output, cached_input) tuple of ints per million tokens, got {}",
            type_name(price)
        )));
    };
    if triple.len() != 3 {
        return Err(PyTypeError::new_err(format!(
            "{what} must be an (input, output, cached_input) tuple of ints per million tokens, got {} values",
            triple.len()
        )));
    }
    let part = |at: usize, name: &str| -> PyResult<u64> {
        let value = triple.get_item(at)?;
        let name = format!("{what}: {name}");
        if value.is_instance_of::<PyFloat>() {
            return Err(PyTypeError::new_err(format!(
                "{name} must be an int, got {}: prices are whole units per million tokens, so choose a unit small enough (in microdollars, $0.15 per million is 150000)",
                value.repr()?
            )));
        }
        args::int_in(&name, &value, 0..=MAX_PRICE)
    };
    let (input, output, cached_input) = (part(0, "input")?, part(1, "output")?, part(2, "cached_input")?);
    Price::new(input, output, cached_input).map_err(args::invalid)
}

/// The price of an acquire's `model` in `prices`; None without a model. A model needs a table.
pub fn resolve(
    model: Option<&Bound<'_, PyAny>>,
    prices: Option<&Bound<'_, PyAny>>,
) -> PyResult<Option<Price>> {
    let Some(model) = args::choice("model", model)? else {
        return Ok(None);
    };
    let Some(prices) = args::given(prices) else {
        return Err(PyTypeError::new_err(format!(
            "model={model:?} needs a price table: pass prices=Prices({{{model:?}: (input, output, cached_input)}}) to acquire or to StreamLeaseManager"
        )));
    };
    let Ok(prices) = prices.cast::<Prices>() else {
        return Err(PyTypeError::new_err(format!(
            "prices must be a Prices table, got {}",
            type_name(prices)
        )));
    };
    prices.get().price(&model).map(Some)
}
