//! The identity secret: the HMAC key that hashes user ids into Redis keys, given or read from
//! the environment, and long enough that guessing it is out of reach.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};

use super::super::args::{self, type_name};

/// The shortest HMAC key accepted: 128 bits, so guessing the key is out of reach.
const MIN_SECRET_BYTES: usize = 16;

/// Where the identity secret comes from when `identity_secret` is not given: one variable that
/// a deployment sets for every worker and for the CLI.
pub const SECRET_VARIABLE: &str = "STREAM_LEASE_IDENTITY_SECRET";

pub fn secret_field(value: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<u8>> {
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
