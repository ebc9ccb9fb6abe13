//! `ProxyRule`: `trusted_proxies` and `proxy_header` checked once, and the client's address of a
//! connection found by the core's rule (`client_address.rs`).

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyString;

use super::args::{self, type_name};
use crate::client_address::{self, DEFAULT_PROXY_HEADER};

/// Which peers are reverse proxies, and the header they write the client's address into.
#[pyclass(frozen, module = "fastapi_stream_lease")]
pub struct ProxyRule {
    rule: client_address::ProxyRule,
}

#[pymethods]
impl ProxyRule {
    #[new]
    #[pyo3(signature = (trusted_proxies = None, proxy_header = None))]
    fn py_new(
        trusted_proxies: Option<&Bound<'_, PyAny>>,
        proxy_header: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        Ok(ProxyRule {
            rule: proxy_rule(trusted_proxies, proxy_header)?,
        })
    }

    /// The proxy header's name in lower case, as ASGI servers pass header names.
    #[getter]
    fn header(&self) -> String {
        self.rule.header_name().to_ascii_lowercase()
    }

    /// The client's address of a connection from `peer` (None without one) carrying `lines`,
    /// the proxy header's lines in the order received.
    fn client(&self, peer: Option<&str>, lines: Vec<String>) -> String {
        let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
        self.rule.client(peer, &lines)
    }
}

/// `trusted_proxies` (addresses or CIDR networks: `10.0.0.0/8`, `192.168.1.7`, `fd00::/8`) and
/// `proxy_header`, checked here so that a typo fails at start-up, not per request.
pub fn proxy_rule(
    trusted_proxies: Option<&Bound<'_, PyAny>>,
    proxy_header: Option<&Bound<'_, PyAny>>,
) -> PyResult<client_address::ProxyRule> {
    let header = match args::given(proxy_header) {
        None => DEFAULT_PROXY_HEADER.to_owned(),
        Some(value) => match value.cast::<PyString>() {
            Ok(name) => args::utf8("proxy_header", name)?,
            Err(_) => {
                return Err(PyTypeError::new_err(format!(
                    "proxy_header must be a str such as 'X-Forwarded-For', got {} {}",
                    type_name(value),
                    value.repr()?
                )))
            }
        },
    };
    client_address::ProxyRule::new(networks(trusted_proxies)?, &header)
        .map_err(|error| PyValueError::new_err(error.to_string()))
}

fn networks(value: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<String>> {
    let Some(value) = args::given(value) else {
        return Ok(Vec::new());
    };
    if value.is_instance_of::<PyString>() {
        return Err(PyTypeError::new_err(
            "trusted_proxies must be a list of networks, e.g. ['10.0.0.0/8'], not a str",
        ));
    }
    value
        .try_iter()?
        .map(|entry| {
            let entry = entry?;
            match entry.cast::<PyString>() {
                Ok(text) => args::utf8("trusted proxy", text),
                Err(_) => Err(PyTypeError::new_err(format!(
                    "trusted proxy {} is a {}: write each network as a str, such as '10.0.0.0/8'",
                    entry.repr()?,
                    type_name(&entry)
                ))),
            }
        })
        .collect()
}
