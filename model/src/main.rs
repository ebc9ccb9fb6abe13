//! Runs the protocol model's check and prints what it found:
//! `cargo run -p protocol-model --release -- [old] [key=value ...]`
//! (keys: leases=H,Hk,.. the holder of each lease, k: held from the start, caps=C,C,.. pool capacities, ttl, restores,
//! restarts, stalls, failures, observer=0/1, limit=max states).

use protocol_model::trace::check;
use protocol_model::{LeaseSpec, ModelConfig};

fn main() {
    let mut cfg = ModelConfig::small();
    let mut old = false;
    let mut fixed = false;
    let mut threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    for arg in std::env::args().skip(1) {
        if arg == "old" || arg == "fixed" {
            old |= arg == "old";
            fixed |= arg == "fixed";
            continue;
        }
        let (key, value) = arg.split_once('=').expect("key=value");
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
            "caps" => cfg.capacities = list().map(|c| c as u8).collect(),
            "ttl" => cfg.ttl = n(),
            "time" => cfg.time = n() == 1,
            "restores" => cfg.restores = n(),
            "restarts" => cfg.restarts = n(),
            "stalls" => cfg.stalls = n(),
            "failures" => cfg.failures = n(),
            "observer" => cfg.observer = n() == 1,
            "threads" => threads = n() as usize,
            other => panic!("unknown key {other}"),
        }
    }
    if old {
        cfg = cfg.old();
    }
    if fixed {
        cfg = cfg.fixed();
    }
    let outcome = check(cfg, threads);
    println!("{}", outcome.summary());
    for (name, trace) in &outcome.counterexamples {
        println!("\n== {name}\n{trace}");
    }
}
