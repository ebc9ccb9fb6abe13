//! Checks one configuration of the protocol model and prints what it found, each
//! counterexample as a trace: `cargo run -p protocol-model --release -- [variant]
//! [key=value ...]`. The variant is the protocol the code runs (the default),
//! `without_safeguards` (the exact count and the one-step prune, every safeguard off) or
//! `growing_count` (a count of granted members that only grows, no prune, every safeguard off).
//! Keys: `leases=0k,0,1` (the holder of each lease; `k`: held from the start, never ended),
//! `pools=0+1,0+2` (after `leases`: the pools of each lease, its own quota first; default pool
//! 0), `caps=2` (pool capacities, 0 = unlimited), `ttl`, `time=0/1`, `restores`, `restarts`, `stalls`,
//! `failures`, `observer=0/1`, `threads`, `shortest=1` (breadth first on one thread, without
//! symmetry reduction: every trace is a shortest one); then one safeguard on or off, whatever
//! the variant: `two_step=0/1`, `windows_survive=0/1`, `late_grants_lost=0/1`,
//! `check_on_excess=0/1`, `sum_of_ids=0/1`, `prune_unexplained=0/1`, `reclaim_recounts=0/1`,
//! `walk_when_full=0/1`, `reap_before_rejoining=0/1`; and the acquire's bookkeeping:
//! `acquire_reaps=0/1`, `acquire_extends_live_entry=0/1`, `grant_dated_by_entry=0/1`,
//! `entry_check=read/trust_known/trust_always`.

use protocol_model::config::Prune;
use protocol_model::trace::explore;
use protocol_model::{EntryCheck, LeaseSpec, ModelConfig};

fn main() {
    let mut cfg = ModelConfig::small();
    let mut variant: fn(ModelConfig) -> ModelConfig = |cfg| cfg;
    let mut switches: Vec<(String, bool)> = Vec::new();
    let mut shortest = false;
    let mut threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    for arg in std::env::args().skip(1) {
        let Some((key, value)) = arg.split_once('=') else {
            variant = match arg.as_str() {
                "growing_count" => ModelConfig::growing_count,
                "without_safeguards" => ModelConfig::without_safeguards,
                other => panic!(
                    "unknown variant {other}: use growing_count or without_safeguards (the default is the code's protocol), or key=value"
                ),
            };
            continue;
        };
        let list = || value.split(',').map(|v| v.parse::<usize>().expect("a number"));
        let n = || value.parse::<u8>().expect("a number");
        match key {
            "leases" => {
                // A holder per lease; "0k": held from the start and never ended.
                cfg.leases = value
                    .split(',')
                    .map(|l| match l.strip_suffix('k') {
                        Some(holder) => LeaseSpec::kept(holder.parse().expect("a holder")),
                        None => LeaseSpec::new(l.parse().expect("a holder")),
                    })
                    .collect();
                cfg.holders = cfg.leases.iter().map(|l| l.holder + 1).max().unwrap_or(1);
            }
            "pools" => {
                for (lease, pools) in cfg.leases.iter_mut().zip(value.split(',')) {
                    lease.pools = pools.split('+').map(|p| p.parse().expect("a pool")).collect();
                }
            }
            "entry_check" => {
                cfg.entry_check = match value {
                    "read" => EntryCheck::Read,
                    "trust_known" => EntryCheck::TrustKnown,
                    "trust_always" => EntryCheck::TrustAlways,
                    other => panic!("unknown entry_check {other}: read, trust_known or trust_always"),
                }
            }
            "caps" => cfg.capacities = list().map(|c| c as u8).collect(),
            "ttl" => cfg.ttl = n(),
            "time" => cfg.time = n() == 1,
            "restores" => cfg.restores = n(),
            "restarts" => cfg.restarts = n(),
            "stalls" => cfg.stalls = n(),
            "failures" => cfg.failures = n(),
            "observer" => cfg.observer = n() == 1,
            "threads" => threads = n() as usize,
            "shortest" => shortest = n() == 1,
            "two_step"
            | "windows_survive"
            | "late_grants_lost"
            | "check_on_excess"
            | "sum_of_ids"
            | "prune_unexplained"
            | "reclaim_recounts"
            | "walk_when_full"
            | "reap_before_rejoining"
            | "acquire_reaps"
            | "acquire_extends_live_entry"
            | "grant_dated_by_entry" => {
                switches.push((key.to_owned(), n() == 1));
            }
            other => panic!("unknown key {other}"),
        }
    }
    cfg = variant(cfg);
    for (safeguard, on) in switches {
        match safeguard.as_str() {
            "two_step" => cfg.prune = if on { Prune::TwoStep } else { Prune::KeepList },
            "windows_survive" => cfg.windows_survive = on,
            "late_grants_lost" => cfg.late_grants_lost = on,
            "check_on_excess" => cfg.check_on_excess = on,
            "sum_of_ids" => cfg.sum_of_ids = on,
            "prune_unexplained" => cfg.prune_unexplained = on,
            "walk_when_full" => cfg.walk_when_full = on,
            "reap_before_rejoining" => cfg.reap_before_rejoining = on,
            "acquire_reaps" => cfg.acquire_reaps = on,
            "acquire_extends_live_entry" => cfg.acquire_extends_live_entry = on,
            "grant_dated_by_entry" => cfg.grant_dated_by_entry = on,
            _ => cfg.reclaim_recounts = on,
        }
    }
    if shortest {
        threads = 1;
    }
    let outcome = explore(cfg, threads, shortest);
    println!("{}", outcome.summary());
    for (name, trace) in &outcome.counterexamples {
        println!("\n== {name}\n{trace}");
    }
}
