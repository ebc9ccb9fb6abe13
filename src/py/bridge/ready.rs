//! An awaitable whose outcome is known when it is made (a hit served from units held here, the
//! embedded store's work): awaiting it gives the value, or raises the error, at once, with no
//! event loop's future made, looked up or resolved for it.

use pyo3::exceptions::{PyBaseException, PyStopIteration};
use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};

/// Its own iterator, as an awaitable's `__await__` returns: each step ends the await with the
/// outcome, so it can be awaited more than once, as an asyncio future can.
#[pyclass(frozen, module = "fastapi_stream_lease._core")]
pub struct Ready {
    outcome: Result<Py<PyAny>, Py<PyBaseException>>,
}

impl Ready {
    pub fn new(py: Python<'_>, outcome: PyResult<Py<PyAny>>) -> Self {
        Ready {
            outcome: outcome.map_err(|error| error.into_value(py)),
        }
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
            Err(error) => Err(PyErr::from_value(error.bind(py).clone().into_any())),
        }
    }

    /// The error's traceback holds the frames that awaited it, and a frame may hold this: the
    /// cycle collector must see the way back.
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        match &self.outcome {
            Ok(value) => visit.call(value),
            Err(error) => visit.call(error),
        }
    }
}
