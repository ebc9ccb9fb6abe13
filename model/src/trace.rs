//! Runs of the checker, and counterexamples as readable traces.

use std::fmt::Write;
use std::time::{Duration, Instant};

use stateright::{Checker, Expectation, Model, Path};

use crate::config::{bits, ModelConfig};
use crate::process::{Call, Phase, Round};
use crate::protocol::{Action, ProtocolModel, State};

/// What an exhaustive run found.
pub struct Outcome {
    pub unique_states: usize,
    pub max_depth: usize,
    pub elapsed: Duration,
    /// `always` and `eventually` properties with a counterexample, each with its trace.
    pub counterexamples: Vec<(&'static str, String)>,
    /// `sometimes` properties never reached.
    pub unreached: Vec<&'static str>,
}

impl Outcome {
    /// The names of the properties a counterexample was found for.
    pub fn violated(&self) -> Vec<&'static str> {
        self.counterexamples.iter().map(|(name, _)| *name).collect()
    }

    pub fn summary(&self) -> String {
        format!(
            "{} states, depth {}, {:.1} s; counterexamples: {:?}; sometimes unreached: {:?}",
            self.unique_states,
            self.max_depth,
            self.elapsed.as_secs_f64(),
            self.violated(),
            self.unreached
        )
    }
}

/// Explores every state of the configuration, depth first with leases of one class taken as
/// interchangeable (symmetry reduction).
pub fn check(cfg: ModelConfig, threads: usize) -> Outcome {
    explore(cfg, threads, false)
}

/// Explores every state of the configuration; `shortest`: breadth first, without symmetry
/// reduction (more states, slower), so that each counterexample found on one thread is a
/// shortest one.
pub fn explore(cfg: ModelConfig, threads: usize, shortest: bool) -> Outcome {
    let started = Instant::now();
    let builder = ProtocolModel::new(cfg).checker().threads(threads);
    if shortest {
        outcome(builder.spawn_bfs().join(), started)
    } else {
        outcome(builder.symmetry().spawn_dfs().join(), started)
    }
}

fn outcome(checker: impl Checker<ProtocolModel>, started: Instant) -> Outcome {
    let elapsed = started.elapsed();
    let properties = checker.model().properties();
    let mut discoveries = checker.discoveries();
    let mut counterexamples = Vec::new();
    let mut unreached = Vec::new();
    for property in &properties {
        let found = discoveries.remove(property.name);
        match (&property.expectation, found) {
            (Expectation::Sometimes, None) => unreached.push(property.name),
            (Expectation::Sometimes, Some(_)) => {}
            (_, Some(path)) => counterexamples.push((property.name, format_path(&checker.model().cfg, path))),
            (_, None) => {}
        }
    }
    Outcome {
        unique_states: checker.unique_state_count(),
        max_depth: checker.max_depth(),
        elapsed,
        counterexamples,
        unreached,
    }
}

/// One line per step: the action, then the state it led to.
pub fn format_path(cfg: &ModelConfig, path: Path<State, Action>) -> String {
    let mut out = String::new();
    for (i, (state, action)) in path.into_vec().into_iter().enumerate() {
        let _ = writeln!(out, "     {}", summary(cfg, &state));
        if let Some(action) = action {
            let _ = writeln!(out, "{:>3}. {:?}", i + 1, action);
        }
    }
    out
}

/// The state in one line: Redis (members, entries, counts), each lease, each holder.
pub fn summary(cfg: &ModelConfig, s: &State) -> String {
    let mut out = String::from("redis[");
    for l in 0..cfg.leases.len() {
        let pools: Vec<String> = bits(s.redis.members[l]).map(|p| p.to_string()).collect();
        let _ = write!(out, "L{l}:{{{}}} ", pools.join(","));
    }
    for h in 0..cfg.holders {
        let entry = s.redis.entry[h].map_or("-".to_string(), |t| t.to_string());
        let count = s.redis.count[h].map_or("-".to_string(), |c| c.to_string());
        let sum = if cfg.sum_of_ids {
            let summed: Vec<String> = bits(cfg.leases_of(h))
                .filter(|&l| s.redis.summed[l] != 0)
                .map(|l| format!("L{l}x{}", s.redis.summed[l]))
                .collect();
            format!(",sum={{{}}}", summed.join(","))
        } else {
            String::new()
        };
        let _ = write!(
            out,
            "H{h}:entry={entry},count={count}{sum},index={:b} ",
            s.redis.index[h]
        );
    }
    out.pop();
    out.push(']');
    if let Some(snapshot) = &s.snapshot {
        let members: Vec<String> = (0..cfg.leases.len())
            .filter(|&l| snapshot.members[l] != 0)
            .map(|l| format!("L{l}"))
            .collect();
        let _ = write!(out, " snapshot[{}]", members.join(","));
    }
    if let Some(late) = s.late {
        let _ = write!(out, " late={late:?}");
    }
    out.push_str(" leases[");
    for l in 0..cfg.leases.len() {
        let lease = &s.leases[l];
        let phase = match lease.phase {
            Phase::Idle => "idle".to_string(),
            Phase::Acquiring => match lease.acquire {
                Call::Sent => format!("acquiring(sent,{})", lease.sent),
                Call::Ran(reply) => format!("acquiring({reply:?},{})", lease.sent),
                Call::None => "acquiring".into(),
            },
            Phase::Held => "held".into(),
            Phase::Released => "released".into(),
        };
        let release = if lease.release { "+release" } else { "" };
        let unremoved = if lease.unremoved { "+unremoved" } else { "" };
        let _ = write!(
            out,
            "L{l}(H{}):{phase}{release}{unremoved} ",
            cfg.leases[l].holder
        );
    }
    out.pop();
    out.push_str("] holders[");
    for h in 0..cfg.holders {
        let holder = &s.holders[h];
        let round = match holder.round {
            Round::Idle => "idle".to_string(),
            round => format!("{round:?}"),
        };
        let _ = write!(
            out,
            "H{h}:deadline={},entry_known={},round={round},tally={:?}{}{}{} calm={} ",
            holder.deadline,
            holder.entry_known,
            holder.tally,
            if holder.exposed { ",exposed" } else { "" },
            if holder.stalled { ",stalled" } else { "" },
            if holder.granted > 0 {
                format!(",granted={}", holder.granted)
            } else {
                String::new()
            },
            holder.calm
        );
    }
    out.pop();
    out.push(']');
    out
}
