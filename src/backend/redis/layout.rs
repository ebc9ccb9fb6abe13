//! What the scripts' calls share in how they lay out their keys and arguments (each script's own
//! layout is in the file named after it), and the error of a reply no script gives.

use std::collections::HashMap;
use std::fmt::Write as _;

use super::scripts::Invocation;
use crate::errors::CoreError;
use crate::lease::LeaseRecord;

/// A request's numbers in one argument, the prelude's `shape_of` (a batch of alike requests is
/// parsed once, and each argument costs Redis about a thousand instructions to take in).
#[derive(Default)]
pub struct Shape(String);

/// A call's keys and arguments, as sent (what the private functions of tests and benchmarks
/// answer).
pub type KeysAndArgs = (Vec<Vec<u8>>, Vec<Vec<u8>>);

/// What a shape holds: `shape_of` reads runs of digits, so a sign or a fraction would shift
/// every number after it.
pub trait Unsigned: std::fmt::Display {}

macro_rules! unsigned {
    ($($t:ty),*) => { $(impl Unsigned for $t {})* };
}

unsigned!(u8, u32, u64, usize);

impl Shape {
    pub fn push(&mut self, number: impl Unsigned) -> &mut Self {
        if !self.0.is_empty() {
            self.0.push(' ');
        }
        let _ = write!(self.0, "{number}");
        self
    }

    pub fn into_arg(self) -> String {
        self.0
    }
}

/// What each member adds to its holder's tally beside its id's value: 2^44 (`TALLY_UNIT` in
/// `lua/prelude/holders.lua`, which says why).
pub const TALLY_UNIT_BITS: u32 = 44;

/// What a whole lease moves its holder's tally by (the scripts' `count_lease`): its members
/// (weight x pools) each add a unit and its id's value; `taken_out` for a release. Empty past
/// what an `INCRBY` takes (2^19 members): the script then computes it.
pub fn lease_tally(record: &LeaseRecord, taken_out: bool) -> String {
    let units = i128::from(record.units());
    let tally = units * ((1i128 << TALLY_UNIT_BITS) + i128::from(record.id_value()));
    let tally = if taken_out { -tally } else { tally };
    i64::try_from(tally).map_or_else(|_| String::new(), |tally| tally.to_string())
}

/// The KEYS of a call that names keys by index: each key once, numbered from 1 in order of
/// first use.
#[derive(Default)]
pub struct KeyIndex<'k>(HashMap<&'k str, usize>);

impl<'k> KeyIndex<'k> {
    /// The key's index, adding it to the call's KEYS at its first use.
    pub fn index(&mut self, invocation: &mut Invocation, key: &'k str) -> usize {
        let next = self.0.len() + 1;
        *self.0.entry(key).or_insert_with(|| {
            invocation.key(key);
            next
        })
    }

    /// The index of a key already added.
    pub fn of(&self, key: &str) -> usize {
        self.0[key]
    }
}

pub fn unexpected_reply(script: &str, reply: &dyn std::fmt::Debug) -> CoreError {
    CoreError::Backend(format!(
        "unexpected reply {reply:?} from the {script} script; is another version of fastapi_stream_lease using the same key_prefix?"
    ))
}

/// Test readers of what the calls send, as the scripts read it.
#[cfg(test)]
pub mod read {
    use super::super::scripts::Invocation;

    /// An argument as text.
    pub fn text(arg: &[u8]) -> &str {
        std::str::from_utf8(arg).expect("UTF-8")
    }

    /// The numbers of a shape, as the prelude's `shape_of` reads them (runs of digits).
    pub fn shape(arg: &[u8]) -> Vec<u64> {
        text(arg)
            .split(|c: char| !c.is_ascii_digit())
            .filter(|word| !word.is_empty())
            .map(|word| word.parse().expect("digits"))
            .collect()
    }

    /// The call's keys, as text.
    pub fn keys(invocation: &Invocation) -> Vec<&str> {
        invocation.keys.iter().map(|key| text(key)).collect()
    }

    /// The call's arguments, as text.
    pub fn args(invocation: &Invocation) -> Vec<&str> {
        invocation.args.iter().map(|arg| text(arg)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::super::scripts::RELEASE;
    use super::*;
    use crate::keys::{Pool, PoolRole};
    use crate::lease::Store;

    #[test]
    fn a_shape_reads_back_number_for_number() {
        let mut shape = Shape::default();
        shape.push(3u32).push(0u64).push(u64::MAX).push(7usize);
        assert_eq!(read::shape(shape.into_arg().as_bytes()), [3, 0, u64::MAX, 7]);
    }

    #[test]
    fn a_lease_tally_past_what_incrby_takes_is_left_to_the_script() {
        let pool = || Pool::new("pool", "{t}:a".into(), 0, PoolRole::Shared);
        let lease = LeaseRecord::new(vec![pool()], 3, Store::Main);
        let tally = 3 * ((1i64 << TALLY_UNIT_BITS) + lease.id_value() as i64);
        assert_eq!(lease_tally(&lease, false), tally.to_string());
        assert_eq!(lease_tally(&lease, true), (-tally).to_string());
        let heavy = LeaseRecord::new(vec![pool()], 1 << 19, Store::Main);
        assert_eq!(
            lease_tally(&heavy, false),
            "",
            "2^19 members: the script counts them"
        );
    }

    #[test]
    fn a_key_index_names_each_key_once_in_order_of_first_use() {
        let mut invocation = RELEASE.prepare_invoke();
        let mut keys = KeyIndex::default();
        let indexes: Vec<usize> = ["a", "b", "a", "c", "b"]
            .iter()
            .map(|key| keys.index(&mut invocation, key))
            .collect();
        assert_eq!(indexes, [1, 2, 1, 3, 2]);
        assert_eq!(read::keys(&invocation), ["a", "b", "c"]);
        assert_eq!(keys.of("c"), 3);
    }
}
