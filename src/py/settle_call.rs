//! The settle script's call for a settlement that only counts an answer's size, as the Redis
//! store sends it, for tests that run the script on a server of their own: its layout is
//! encoded once, in `backend/redis/budget.rs`.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::backend::{settle_call as encoded, KeysAndArgs};
use crate::rate::{answer_sizes, AnswerKeys, AnswerSample, Settlement};

/// The keys and arguments of the ``settle`` script's call that settles ``settlement_id`` by
/// counting an answer of ``answer_tokens`` tokens in the identity's histogram ``own_key`` and
/// so in its model's ``answers_key`` (its bucket computed as the store computes it), with
/// nothing to charge or give back.
#[pyfunction(name = "_settle_call")]
pub fn settle_call(
    settlement_id: String,
    answers_key: String,
    own_key: String,
    answer_tokens: u64,
) -> PyResult<KeysAndArgs> {
    let settlement = Settlement {
        id: settlement_id,
        adjustments: Vec::new(),
        answer: Some(AnswerSample {
            keys: AnswerKeys {
                model: answers_key,
                own: own_key,
            },
            bucket: answer_sizes::bucket_of(answer_tokens),
        }),
    };
    encoded(&settlement).ok_or_else(|| PyValueError::new_err("a settlement with an answer always has a call"))
}
