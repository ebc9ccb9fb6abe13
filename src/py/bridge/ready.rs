//! An awaitable whose outcome is known when it is made (a hit served from units held here, a
//! release done already, the embedded store's work): awaiting it gives the value, or raises the
//! error, at once, with no event loop's future made, looked up or resolved for it.

use pyo3::exceptions::PyStopIteration;
use pyo3::prelude::*;

/// Its own iterator, as an awaitable's `__await__` returns: each step ends the await with the
/// outcome, so it can be awaited more than once, as an asyncio future can.
#[pyclass(frozen, module = "fastapi_stream_lease._core")]
pub struct Ready {
    outcome: PyResult<Py<PyAny>>,
}

impl Ready {
    pub fn new(outcome: PyResult<Py<PyAny>>) -> Self {
        Ready { outcome }
    }
}

#[pymethods]
impl Ready {
    fn __await__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        match &self.outcome {
            Ok(value) => Err(PyStopIteration::new_err((value.clone_ref(py),))),
            Err(error) => Err(error.clone_ref(py)),
        }
    }
}
