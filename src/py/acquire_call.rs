//! The acquire script's call as the Redis store sends it, for tests that run the script on a
//! server of their own: its layout is encoded once, in `backend/redis/acquire.rs`.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::backend::{acquire_call as encoded, KeysAndArgs, HOLDER_IDS};
use crate::config::GrantTerms;
use crate::keys::{self, Pool, PoolRole};
use crate::lease::{LeaseRecord, Store};

/// A lease of the call: its id, weight, and pools as (key, capacity), all shared pools.
type Lease = (String, u32, Vec<(String, u64)>);

/// The keys and arguments of the ``acquire`` script's call that decides ``leases`` in order, as
/// the Redis store sends it for holder ``holder``, leases of ``ttl_ms`` ms, without a waiting
/// line or rate limits, renewed every third of a lease (the default); each grant takes a
/// fencing token when ``fencing_tokens``. Each lease is
/// ``(lease id, weight, [(pool key, capacity), ...])`` (capacity 0: unlimited); all pools are in
/// one hash tag, whose holders key leads the keys.
#[pyfunction(name = "_acquire_call", signature = (holder, ttl_ms, leases, *, fencing_tokens = false))]
pub fn acquire_call(
    holder: u64,
    ttl_ms: u64,
    leases: Vec<Lease>,
    fencing_tokens: bool,
) -> PyResult<KeysAndArgs> {
    if !(1..HOLDER_IDS).contains(&holder) {
        return Err(PyValueError::new_err(format!(
            "holder={holder} is out of range: use 1 to {}",
            HOLDER_IDS - 1
        )));
    }
    let Some((_, _, first_pools)) = leases.first() else {
        return Err(PyValueError::new_err("leases is empty: pass at least one lease"));
    };
    let tag = first_pools.first().map_or("", |(key, _)| keys::hash_tag(key));
    let mut records = Vec::with_capacity(leases.len());
    for (id, weight, pools) in &leases {
        if pools.is_empty() || *weight == 0 {
            return Err(PyValueError::new_err(format!(
                "lease {id:?} takes nothing: give it a weight of 1 or more and at least one pool"
            )));
        }
        if let Some((key, _)) = pools.iter().find(|(key, _)| keys::hash_tag(key) != tag) {
            return Err(PyValueError::new_err(format!(
                "pool {key:?} of lease {id:?} is not in the hash tag {{{tag}}}: one call decides the leases of one tag"
            )));
        }
        let pools = pools
            .iter()
            .map(|(key, capacity)| Pool::new("pool", key.clone(), *capacity, PoolRole::Shared))
            .collect();
        records.push((id.as_str(), LeaseRecord::new(pools, *weight, Store::Main)));
    }
    let leases: Vec<(&str, &LeaseRecord)> = records.iter().map(|(id, lease)| (*id, lease)).collect();
    let terms = GrantTerms {
        ttl_ms,
        fencing: fencing_tokens,
        renew_every_ms: ttl_ms / 3,
        entry_known_until_ms: None,
    };
    Ok(encoded(holder, terms, &leases))
}
