//! Request-rate policies: at most `limit` units per window, counted per identity, every policy
//! of one hit decided together (Redis: `lua/hit.lua`; one process: `backend/memory/rate.rs`).
//!
//! A policy's definition and checks are in `policy.rs`, a hit's decisions in `decision.rs`, and
//! the changes a budget's top-ups and settlements make to counters in `adjustment.rs`, what a
//! stream's start is checked against in `start.rs`, how a cost budget prices tokens in
//! `price.rs`, the thresholds its use is told at in `alerts.rs`, and the answer sizes learned
//! per model from settled streams in `answer_sizes.rs`; the headers that tell a client its
//! decisions in `headers.rs`; the units a process holds ahead of its hits in
//! `leased_units.rs`.

mod adjustment;
mod alerts;
pub mod answer_sizes;
mod calendar;
mod decision;
mod headers;
mod leased_units;
mod notation;
mod policy;
pub mod price;
mod start;

pub use self::adjustment::{Adjustment, AnswerKeys, AnswerSample, Settlement, TopUp, ToppedUp};
pub use self::alerts::Thresholds;
pub use self::decision::{Ahead, Bucket, Decision, HitOutcome, RateCheck};
pub use self::headers::{rate_limit_headers, PolicyState, PoolState};
pub use self::leased_units::{LeasedUnits, Serving};
pub use self::notation::{parse_rate, parse_window, Window};
pub use self::policy::{
    check_costs, check_hit, Algorithm, Period, RatePolicy, Unit, MAX_LIMIT, MAX_WINDOW_MS, SLICES,
};
pub use self::price::{Price, Usage};
pub use self::start::{local_shares, start_costs, Reservation, StartError, TooLarge};
