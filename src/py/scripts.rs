//! The core's Lua scripts as the server runs each alone, for the tests and benchmarks that call
//! one directly (redis-py's `register_script`) instead of assembling it again.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::backend::{script_names, script_source};

/// The code of the core's script `name` as a script of its own (EVAL, EVALSHA), to the byte as
/// the core sends it where a server has no functions: the prelude, the start of a call, the
/// script. Raises ValueError for a name that is not one of the core's scripts.
#[pyfunction]
#[pyo3(name = "_script_source")]
pub fn source(name: &str) -> PyResult<String> {
    script_source(name).ok_or_else(|| {
        let names: Vec<&str> = script_names().collect();
        PyValueError::new_err(format!(
            "no script named {name:?}: the core's scripts are {}",
            names.join(", ")
        ))
    })
}
