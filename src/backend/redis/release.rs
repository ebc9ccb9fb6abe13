//! The calls that take many leases: `lua/release.lua` (leases removed) and `lua/reclaim.lua`
//! (leases checked one by one, taken back or removed), and their replies.

use std::sync::Arc;

use redis::{FromRedisValue, Value};

use super::layout::{lease_tally, KeyIndex, KeysAndArgs, Shape};
use super::scripts::{self, Invocation, LuaScript};
use crate::keys::LineKeys;
use crate::lease::LeaseRecord;

/// What a call that takes many leases sends of each beside its id, its holders and its pools.
#[derive(Clone, Copy, PartialEq)]
enum PerLease {
    /// release.lua: the tally its release takes out (`keepalive::lease_tally`).
    TallyTakenOut,
    /// reclaim.lua: each pool's capacity.
    Capacities,
}

/// A call that takes many leases. KEYS: each distinct pool and holders key once, in order of
/// first use (`lead` may add more after them); ARGV: what `lead` adds, then per lease: id and
/// its shape: weight, the KEYS index of its holders, pool count k, and k KEYS indexes (each
/// followed by the pool's capacity, `PerLease::Capacities`); then, for `PerLease::TallyTakenOut`,
/// its tally taken out.
fn leases_invocation(
    script: &'static LuaScript,
    leases: &[Arc<LeaseRecord>],
    per_lease: PerLease,
    lead: impl FnOnce(&mut Invocation),
) -> Invocation {
    let mut invocation = script.prepare_invoke();
    let mut key_index = KeyIndex::default();
    let keys = leases
        .iter()
        .flat_map(|l| l.pools.iter().map(|p| &*p.key).chain([&*l.holders]));
    for key in keys {
        key_index.index(&mut invocation, key);
    }
    lead(&mut invocation);
    for lease in leases {
        let mut shape = Shape::default();
        shape
            .push(lease.weight)
            .push(key_index.of(&lease.holders))
            .push(lease.pools.len());
        for pool in &lease.pools {
            shape.push(key_index.of(&pool.key));
            if per_lease == PerLease::Capacities {
                shape.push(pool.capacity);
            }
        }
        invocation.arg(lease.id.as_str()).arg(shape.into_arg());
        if per_lease == PerLease::TallyTakenOut {
            invocation.arg(lease_tally(lease, true));
        }
    }
    invocation
}

/// The keys and arguments of release.lua's call for `leases`, with no line to wake, as the store
/// sends it for `holder`: what tests and benchmarks that run the script themselves send.
pub fn release_call(holder: u64, leases: &[Arc<LeaseRecord>]) -> KeysAndArgs {
    let invocation = release_invocation(leases, None, holder);
    (invocation.keys, invocation.args)
}

/// release.lua's call for `leases`, waking the waiters of `line` (with its channel) if given.
pub fn release_invocation(
    leases: &[Arc<LeaseRecord>],
    line: Option<(&LineKeys, String)>,
    holder: u64,
) -> Invocation {
    leases_invocation(&scripts::RELEASE, leases, PerLease::TallyTakenOut, |invocation| {
        match line {
            Some((line, channel)) => invocation.key(&line.line).arg(channel),
            None => invocation.arg(""),
        };
        invocation.arg(holder);
    })
}

/// release.lua's reply, one answer per lease (a call of one lease answers alone): whether it was
/// still there (`Ok`), or the text of the error its removal met; None for a reply of another
/// shape.
pub fn decode_release(reply: &Value, leases: usize) -> Option<Vec<Result<bool, String>>> {
    let answers = match reply {
        answer if leases == 1 => std::slice::from_ref(answer),
        Value::Array(answers) if answers.len() == leases => answers,
        _ => return None,
    };
    answers
        .iter()
        .map(|answer| match answer {
            Value::Int(present) => Some(Ok(*present == 1)),
            Value::BulkString(_) | Value::SimpleString(_) => {
                Some(Err(String::from_redis_value_ref(answer).unwrap_or_default()))
            }
            _ => None,
        })
        .collect()
}

/// reclaim.lua's call for `leases`, for this manager's `holder` and lease duration. Replies with
/// three lists of 1-based positions in `leases`: those lost, reclaimed and revoked.
pub fn reclaim_invocation(leases: &[Arc<LeaseRecord>], holder: u64, ttl_ms: u64) -> Invocation {
    leases_invocation(&scripts::RECLAIM, leases, PerLease::Capacities, |invocation| {
        invocation.arg(holder).arg(ttl_ms);
    })
}

#[cfg(test)]
mod tests {
    use super::super::layout::read;
    use super::super::line::tests::line;
    use super::*;
    use crate::keys::{Pool, PoolRole};
    use crate::lease::Store;

    fn lease_in(keys: &[&str], weight: u32) -> Arc<LeaseRecord> {
        let pools = keys
            .iter()
            .map(|key| Pool::new("pool", (*key).into(), 4, PoolRole::Shared))
            .collect();
        Arc::new(LeaseRecord::new(pools, weight, Store::Main))
    }

    #[test]
    fn leases_name_each_key_once_and_point_at_it() {
        let leases = [lease_in(&["{t}:a", "{t}:b"], 2), lease_in(&["{t}:b"], 1)];
        let line = line();
        let release = release_invocation(&leases, Some((&line, "{t}:line:wake".into())), 7);
        assert_eq!(
            read::keys(&release),
            ["{t}:a", "{t}:b", "{t}:holders", "{t}:line"]
        );
        let args = read::args(&release);
        assert_eq!(args[..2], ["{t}:line:wake", "7"]);
        assert_eq!(
            (args[2], read::shape(args[3].as_bytes())),
            (&*leases[0].id, vec![2, 3, 2, 1, 2])
        );
        let taken_out = |lease: &LeaseRecord| format!("-{}", lease.units() * ((1 << 44) + lease.id_value()));
        assert_eq!(args[4], taken_out(&leases[0]));
        assert_eq!(
            (args[5], read::shape(args[6].as_bytes())),
            (&*leases[1].id, vec![1, 3, 1, 2])
        );
        assert_eq!(args[7], taken_out(&leases[1]));
        let reclaim = reclaim_invocation(&leases[1..], 7, 30_000);
        assert_eq!(read::keys(&reclaim), ["{t}:b", "{t}:holders"]);
        assert_eq!(read::args(&reclaim)[..2], ["7", "30000"]);
        assert_eq!(read::shape(reclaim.args[3].as_slice()), [1, 2, 1, 1, 4]);
        assert_eq!(
            read::args(&release_invocation(&leases[1..], None, 7))[..2],
            ["", "7"]
        );
    }

    #[test]
    fn a_release_reply_answers_each_lease() {
        let reply = Value::Array(vec![
            Value::Int(1),
            Value::Int(0),
            Value::BulkString(b"WRONGTYPE Operation against a key".to_vec()),
        ]);
        assert_eq!(
            decode_release(&reply, 3),
            Some(vec![
                Ok(true),
                Ok(false),
                Err("WRONGTYPE Operation against a key".into())
            ])
        );
        assert_eq!(decode_release(&reply, 2), None);
        assert_eq!(
            decode_release(&Value::Int(1), 1),
            Some(vec![Ok(true)]),
            "one lease, alone"
        );
        assert_eq!(decode_release(&Value::Nil, 1), None);
    }
}
