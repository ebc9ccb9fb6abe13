//! A model of fastapi-stream-lease's lease protocol, checked exhaustively with
//! [stateright](https://docs.rs/stateright): holders (processes) acquire, hold and release
//! leases in Redis pools; a renewal loop per holder keeps its entry alive, compares Redis' count
//! of its members, and their sum of ids, with its own tallies, takes back or loses leases whose
//! members went missing, and prunes members it does not hold; dead holders are reaped by
//! whatever script runs next; Redis may fail over to an earlier snapshot, restart empty, or
//! answer late; a process may stall.
//!
//! Each action is one atomic step: a Lua script run by Redis (`src/lua/`, in [`redis`]), or a
//! step of a process between two awaits (`src/renewal/`, `src/manager/admit.rs`, in
//! [`protocol`]), or a tick, or a fault. The properties are in [`properties`]; [`checked`] makes
//! the stateright model of the two. docs/design.md
//! ("The protocol model") says what is left out and what a run covers. [`leased_units`] and
//! [`leased_slots`] are models of their own: the units of a request rate a process takes ahead
//! of its hits, and the global pool's slots it takes in slabs ([`discoveries`] says what a
//! check of one found).

pub mod checked;
pub mod config;
pub mod discoveries;
pub mod leased_slots;
pub mod leased_units;
pub mod process;
pub mod properties;
pub mod protocol;
pub mod redis;
pub mod trace;

pub use config::{Count, EntryCheck, LeaseSpec, ModelConfig};
pub use protocol::{Action, ProtocolModel, State};
