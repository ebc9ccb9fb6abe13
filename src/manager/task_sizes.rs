//! Every acquire in flight keeps its future in a task of its own, and every release through
//! Redis is a task of its own until its batched call answers: their sizes are memory per stream
//! in flight. An async block that awaits a future it captured stores that future twice, and a
//! rare path awaited inline sizes every task: these tests keep both out.

use std::sync::Arc;
use std::time::Duration;

use super::{AcquireRequest, Manager};
use crate::backend::MemoryBackend;
use crate::config::{Config, FailureMode, LineOrder, OnLost};
use crate::lease::{LeaseRecord, Store};

fn manager() -> Arc<Manager> {
    let config = Config {
        lease_seconds: 30.0,
        max_per_user: 2,
        max_global: 10,
        global_pool: true,
        lease_global_slots: false,
        key_prefix: "t".into(),
        renew_every: 10.0,
        redis_timeout: 1.0,
        wait_timeout: 0.0,
        line_order: LineOrder::Fair,
        max_waiting: 0,
        wait_for_own_quota: false,
        retry_after: 1.0,
        on_lost: OnLost::Cancel,
        failure_mode: FailureMode::Closed,
        fallback_workers: 1,
        identity_secret: Vec::new(),
        disclose_usage: true,
        enforce_rate_limits: true,
        fencing_tokens: false,
        proxy_rule: Default::default(),
    };
    Arc::new(Manager::new(Box::new(MemoryBackend::default()), config))
}

#[test]
fn an_acquire_in_flight_stays_small() {
    let request = AcquireRequest {
        identity: Some("alice".into()),
        resources: Vec::new(),
        resource_lines: Vec::new(),
        weight: 1,
        max_per_user: None,
        wait: Duration::ZERO,
        priority: 0,
        rate_limits: Vec::new(),
        budget: None,
        policy_identities: Vec::new(),
    };
    let acquire = manager().acquire(request).expect("a valid request");
    let size = std::mem::size_of_val(&acquire);
    assert!(size <= 2048, "an acquire's future takes {size} bytes: box a rare path, or await a captured future through a combinator");
}

#[test]
fn a_release_in_flight_stays_small() {
    let manager = manager();
    let pools = vec![manager.keys.user_pool("alice")];
    let record = Arc::new(LeaseRecord::new(pools, 1, Store::Main));
    let release = Arc::clone(&manager.leases).release_task(record, None);
    let size = std::mem::size_of_val(&release);
    assert!(
        size <= 512,
        "a release's task takes {size} bytes: keep other paths' futures out of it"
    );
}
