//! The acquire and release scripts' calls as the Redis store sends them, for tests and
//! benchmarks that run the scripts on a server of their own: their layouts are encoded once, in
//! `backend/redis/acquire.rs` and `backend/redis/release.rs`.

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::backend::{
    acquire_call as encoded_acquire, release_call as encoded_release, KeysAndArgs, HOLDER_IDS,
};
use crate::config::GrantTerms;
use crate::keys::{self, Pool, PoolRole};
use crate::lease::{LeaseId, LeaseRecord, Store};

/// A lease of the call: its id, weight, and pools as (key, capacity), all shared pools.
type Lease = (String, u32, Vec<(String, u64)>);

/// The leases of a call as records of the Redis store, each under its given id (what a script
/// counts of a lease, its tally, is worked out from it); an error names what is wrong: an id
/// the core would not make, a lease that takes nothing, a pool outside the first lease's hash
/// tag, none at all.
fn records(leases: &[Lease]) -> PyResult<Vec<Arc<LeaseRecord>>> {
    let Some((_, _, first_pools)) = leases.first() else {
        return Err(PyValueError::new_err("leases is empty: pass at least one lease"));
    };
    let tag = first_pools.first().map_or("", |(key, _)| keys::hash_tag(key));
    let mut records = Vec::with_capacity(leases.len());
    for (id, weight, pools) in leases {
        if pools.is_empty() || *weight == 0 {
            return Err(PyValueError::new_err(format!(
                "lease {id:?} takes nothing: give it a weight of 1 or more and at least one pool"
            )));
        }
        if let Some((key, _)) = pools.iter().find(|(key, _)| keys::hash_tag(key) != tag) {
            return Err(PyValueError::new_err(format!(
                "pool {key:?} of lease {id:?} is not in the hash tag {{{tag}}}: one call takes the leases of one tag"
            )));
        }
        let pools = pools
            .iter()
            .map(|(key, capacity)| Pool::new("pool", key.clone(), *capacity, PoolRole::Shared))
            .collect();
        let mut record = LeaseRecord::new(pools, *weight, Store::Main);
        record.id = LeaseId::parse(id).ok_or_else(|| {
            PyValueError::new_err(format!(
                "lease id {id:?} is not one the core makes: give 32 lowercase hex digits (uuid4().hex)"
            ))
        })?;
        records.push(Arc::new(record));
    }
    Ok(records)
}

fn check_holder(holder: u64) -> PyResult<()> {
    if (1..HOLDER_IDS).contains(&holder) {
        return Ok(());
    }
    Err(PyValueError::new_err(format!(
        "holder={holder} is out of range: use 1 to {}",
        HOLDER_IDS - 1
    )))
}

/// The keys and arguments of the ``acquire`` script's call that decides ``leases`` in order, as
/// the Redis store sends it for holder ``holder``, leases of ``ttl_ms`` ms, without a waiting
/// line or rate limits, renewed every third of a lease (the default); each grant takes a
/// fencing token when ``fencing_tokens``. Each lease is
/// ``(lease id, weight, [(pool key, capacity), ...])``: an id as the core makes them (32
/// lowercase hex digits), capacity 0 for unlimited; all pools are in one hash tag, whose holders
/// key leads the keys.
#[pyfunction(name = "_acquire_call", signature = (holder, ttl_ms, leases, *, fencing_tokens = false))]
pub fn acquire_call(
    holder: u64,
    ttl_ms: u64,
    leases: Vec<Lease>,
    fencing_tokens: bool,
) -> PyResult<KeysAndArgs> {
    check_holder(holder)?;
    let terms = GrantTerms {
        ttl_ms,
        fencing: fencing_tokens,
        renew_every_ms: ttl_ms / 3,
        entry_known_until_ms: None,
    };
    Ok(encoded_acquire(holder, terms, &records(&leases)?))
}

/// The keys and arguments of the ``release`` script's call that releases ``leases``, as the
/// Redis store sends it for holder ``holder``, with no waiting line to wake. Each lease is
/// given as to ``_acquire_call`` (capacities unused).
#[pyfunction(name = "_release_call", signature = (holder, leases))]
pub fn release_call(holder: u64, leases: Vec<Lease>) -> PyResult<KeysAndArgs> {
    check_holder(holder)?;
    Ok(encoded_release(holder, &records(&leases)?))
}
