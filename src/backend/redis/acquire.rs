//! `lua/acquire.lua`'s call and reply: the head a batch of acquires shares and each one's keys
//! and arguments (the layout is described at the top of the script), the outcome its reply
//! says, and what gives back a grant or a place in line whose caller went away.

use std::sync::Arc;

use super::batched::{batch_call, OneCall, Undo};
use super::budget::settle_invocation;
use super::hit::{decisions, rate_args, RATE_ANSWER_LEN};
use super::layout::{unexpected_reply, Shape};
use super::line::{leave_invocation, line_keys};
use super::release::release_invocation;
use super::scripts::{self, Invocation};
use crate::backend::{AcquireOutcome, InLine, Placed};
use crate::errors::{CoreResult, Rejection};
use crate::keys::LineKeys;
use crate::lease::LeaseRecord;
use crate::rate::{HitOutcome, RateCheck, RatePolicy, Settlement};

/// The script's reply codes (named in `lua/prelude/batches.lua`).
const REFUSED: u64 = 0;
const GRANTED: u64 = 1;
const WAIT: u64 = 2;
const RATE_LIMITED: u64 = 3;
const BANNED: u64 = 4;
const LINE_FULL: u64 = 5;

/// What an acquire asks beside its lease: the lease duration, how it stands to the line, the
/// rate policies its start counts against, the channel of the line's wake-ups and the holder.
pub struct Asked<'a> {
    pub ttl_ms: u64,
    pub in_line: Option<InLine<'a>>,
    pub rates: &'a RateCheck,
    pub channel: String,
    pub holder: u64,
}

/// The request of the lease `lease` under the id `lease_id`, with the head it shares with the
/// acquires of its batch; it keeps nothing to give back (see `Undo`).
pub fn acquire_request(lease_id: &str, lease: &LeaseRecord, asked: &Asked<'_>) -> OneCall {
    let Asked {
        ttl_ms,
        in_line,
        rates,
        ref channel,
        holder,
    } = *asked;
    let pools = &lease.pools;
    let mut head = scripts::ACQUIRE.prepare_invoke();
    head.key(&*lease.holders);
    if let Some(in_line) = in_line {
        line_keys(&mut head, in_line.line);
        head.key(&in_line.line.tickets);
    }
    head.arg(ttl_ms)
        .arg(u8::from(in_line.is_some()))
        .arg(channel)
        .arg(holder)
        .arg(in_line.map_or("fair", |l| l.order.code()))
        .arg(u8::from(in_line.is_some_and(|l| l.own_waits)));
    let mut invocation = scripts::ACQUIRE.prepare_invoke();
    for pool in pools {
        invocation.key(&*pool.key);
    }
    let waiter = in_line.and_then(|l| l.waiter);
    let mut shape = Shape::default();
    shape
        .push(lease.weight)
        .push(waiter.map_or(0, |w| w.ttl_ms))
        .push(lease.own_pools)
        .push(pools.len())
        .push(in_line.map_or(0, |l| l.priority));
    for pool in pools {
        shape.push(pool.capacity);
    }
    for i in 0..pools.len() {
        shape.push(in_line.and_then(|l| l.max_waiting.get(i)).copied().unwrap_or(0));
    }
    invocation
        .arg(lease_id)
        .arg(waiter.map_or("", |w| w.id.as_str()))
        .arg(shape.into_arg());
    invocation.key(&rates.keys);
    rate_args(&mut invocation, &rates.policies, &rates.costs);
    OneCall::of(invocation, Some(head), &lease.holders, None)
}

/// A call's keys and arguments, as sent.
pub type KeysAndArgs = (Vec<Vec<u8>>, Vec<Vec<u8>>);

/// The keys and arguments of the call that decides `leases` (each under its id, at least one,
/// all in one tag) in order for `holder`, leases of `ttl_ms`, without a line or rate policies:
/// what the store sends, for tests that run the script themselves.
pub fn acquire_call(holder: u64, ttl_ms: u64, leases: &[(&str, &LeaseRecord)]) -> KeysAndArgs {
    let rates = RateCheck::default();
    let asked = Asked {
        ttl_ms,
        in_line: None,
        rates: &rates,
        channel: String::new(),
        holder,
    };
    let requests: Vec<OneCall> = leases
        .iter()
        .map(|(id, lease)| acquire_request(id, lease, &asked))
        .collect();
    let call = batch_call(&scripts::ACQUIRE, &requests);
    (call.keys, call.args)
}

/// The outcome a request's reply says, for the lease, line and rate policies it asked with.
pub fn decode_acquire(
    reply: &[u64],
    lease: &LeaseRecord,
    in_line: Option<InLine<'_>>,
    policies: &[RatePolicy],
    sent_at_ms: u64,
) -> CoreResult<AcquireOutcome> {
    let pools = &lease.pools;
    let n = pools.len();
    match reply {
        [GRANTED, alive @ (0 | 1), fencing_token, rest @ ..]
            if rest.len() == n + RATE_ANSWER_LEN * policies.len() =>
        {
            Ok(AcquireOutcome::Granted {
                used: rest[..n].to_vec(),
                holder_was_alive: *alive == 1,
                fencing_token: *fencing_token,
                rates: decisions(policies, &rest[n..]),
                sent_at_ms,
            })
        }
        [RATE_LIMITED, index, retry_ms, states @ ..]
            if states.len() == RATE_ANSWER_LEN * policies.len()
                && (1..=policies.len() as u64).contains(index) =>
        {
            Ok(AcquireOutcome::RateLimited(HitOutcome {
                decisions: decisions(policies, states),
                refused: Some((*index as usize - 1, *retry_ms)),
            }))
        }
        [WAIT, ticket, places @ ..] if places.len() == n => Ok(AcquireOutcome::Wait(Placed {
            ticket: *ticket,
            places: places.to_vec(),
        })),
        [BANNED, ms_left] => Ok(AcquireOutcome::Banned(*ms_left)),
        [code @ (REFUSED | LINE_FULL), index, current, retry_after_ms, displaced @ ..]
            if displaced.len() <= usize::from(*code == LINE_FULL) =>
        {
            let pool = pools
                .get((*index as usize).wrapping_sub(1))
                .ok_or_else(|| unexpected_reply("acquire", &reply))?;
            let refused = |capacity| Rejection {
                limit: pool.name.clone(),
                capacity,
                current: *current,
                retry_after_ms: *retry_after_ms,
                usage_shown: true,
            };
            Ok(match *code {
                REFUSED => AcquireOutcome::Rejected(refused(pool.capacity)),
                _ => {
                    let limit = in_line.and_then(|l| l.max_waiting.get(*index as usize - 1));
                    AcquireOutcome::LineFull {
                        full: refused(limit.copied().unwrap_or(0)),
                        displaced: displaced == [1],
                    }
                }
            })
        }
        _ => Err(unexpected_reply("acquire", &reply)),
    }
}

/// An acquire's lease, the line and id of its waiter, and what its grant takes from rate
/// policies: what gives back its outcome if its caller goes away while its call is in flight.
pub struct AcquireUndo {
    pub lease: Arc<LeaseRecord>,
    pub waiter: Option<(LineKeys, String)>,
    pub rates: RateCheck,
}

impl Undo for AcquireUndo {
    /// The calls, in order, that give back what the reply took: a grant's rate units (as a
    /// settlement of their own) and slots (released without a wake-up: waiters look again
    /// within a second), or a waiter's place in line.
    fn invocations(self: Box<Self>, reply: &[u64], holder: u64) -> Vec<Invocation> {
        match (reply.first(), &self.waiter) {
            (Some(&GRANTED), _) => {
                let taken = reply.get(3 + self.lease.pools.len()..).unwrap_or_default();
                let decisions = decisions(&self.rates.policies, taken);
                let refunds = self.rates.refunds(&decisions, 0..decisions.len());
                let untaken = Settlement::untaken(self.lease.id.as_str(), refunds);
                let refund = settle_invocation(&untaken);
                refund
                    .into_iter()
                    .chain([release_invocation(&[self.lease], None, holder)])
                    .collect()
            }
            (Some(&WAIT), Some((line, waiter_id))) => vec![leave_invocation(line, waiter_id, holder)],
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::hit::tests::policy;
    use super::super::layout::read;
    use super::super::line::tests::line;
    use super::*;
    use crate::backend::Waiter;
    use crate::config::LineOrder;
    use crate::keys::{Pool, PoolRole};
    use crate::lease::Store;

    fn lease() -> Arc<LeaseRecord> {
        let pools = vec![
            Pool::new("per_user", "{t}:user:a".into(), 2, PoolRole::Own),
            Pool::new("global", "{t}:global".into(), 10, PoolRole::Shared),
        ];
        Arc::new(LeaseRecord::new(pools, 3, Store::Main))
    }

    fn rates() -> RateCheck {
        RateCheck {
            keys: vec!["{t}:rate:a".into()],
            policies: vec![policy("a", 5)],
            costs: vec![1],
        }
    }

    #[test]
    fn an_acquire_reads_back_as_the_script_reads_it() {
        let (lease, line, rates) = (lease(), line(), rates());
        let waiter = Waiter {
            id: "w1".into(),
            ttl_ms: 4000,
        };
        let in_line = InLine {
            line: &line,
            waiter: Some(&waiter),
            priority: 7,
            order: LineOrder::Arrival,
            max_waiting: &[0, 50],
            own_waits: true,
        };
        let asked = Asked {
            ttl_ms: 30_000,
            in_line: Some(in_line),
            rates: &rates,
            channel: "!{t}:line:wake".into(),
            holder: 777,
        };
        let call = acquire_request("lease-1", &lease, &asked);
        let text = |items: &[Vec<u8>]| items.iter().map(|i| read::text(i).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            text(&call.head_keys),
            ["{t}:holders", "{t}:line", "{t}:line:alive", "{t}:line:tickets"]
        );
        assert_eq!(
            text(&call.head_args),
            ["30000", "1", "!{t}:line:wake", "777", "arrival", "1"]
        );
        assert_eq!(text(&call.keys), ["{t}:user:a", "{t}:global", "{t}:rate:a"]);
        let args = text(&call.args);
        assert_eq!(args[..2], ["lease-1", "w1"]);
        // weight, waiter liveness, own pools, n, priority, capacities, max_waiting
        assert_eq!(
            read::shape(call.args[2].as_slice()),
            [3, 4000, 1, 2, 7, 2, 10, 0, 50]
        );
        assert_eq!(args[3..], ["f", "5", "60000", "1", "1"]);
        assert_eq!(call.tag, "t");
    }

    #[test]
    fn an_acquire_without_a_line_sends_no_line_keys() {
        let lease = lease();
        let (keys, args) = acquire_call(777, 30_000, &[("a", &lease), ("b", &lease)]);
        let keys: Vec<&str> = keys.iter().map(|k| read::text(k)).collect();
        assert_eq!(
            keys,
            [
                "{t}:holders",
                "{t}:user:a",
                "{t}:global",
                "{t}:user:a",
                "{t}:global"
            ]
        );
        let args: Vec<&str> = args.iter().map(|a| read::text(a)).collect();
        // two requests; a head of 1 key, 6 args; then each request's counts, then theirs
        assert_eq!(args[..9], ["2", "1", "6", "30000", "0", "", "777", "fair", "0"]);
        assert_eq!(args[9..13], ["2", "3", "2", "3"]);
        assert_eq!(args[13], "a");
        assert_eq!(read::shape(args[15].as_bytes()), [3, 0, 1, 2, 0, 2, 10, 0, 0]);
    }

    #[test]
    fn each_reply_of_the_script_decodes_to_its_outcome() {
        let (lease, line, rates) = (lease(), line(), rates());
        let in_line = InLine {
            line: &line,
            waiter: None,
            priority: 0,
            order: LineOrder::Fair,
            max_waiting: &[0, 50],
            own_waits: false,
        };
        let decode = |reply: &[u64]| decode_acquire(reply, &lease, Some(in_line), &rates.policies, 9);
        let Ok(AcquireOutcome::Granted {
            used,
            holder_was_alive,
            fencing_token,
            rates: decisions,
            sent_at_ms,
        }) = decode(&[GRANTED, 1, 1_700_000_000_000_001, 1, 4, 2, 500, 3, 1, 0])
        else {
            panic!("granted")
        };
        assert_eq!(
            (used, holder_was_alive, fencing_token, sent_at_ms),
            (vec![1, 4], true, 1_700_000_000_000_001, 9)
        );
        assert_eq!(decisions[0].remaining, 3);
        let Ok(AcquireOutcome::RateLimited(limited)) = decode(&[RATE_LIMITED, 1, 800, 5, 800, 0, 0, 1])
        else {
            panic!("rate limited")
        };
        assert_eq!(limited.refused, Some((0, 800)));
        assert!(limited.decisions[0].would_refuse);
        assert_eq!(
            decode(&[WAIT, 12, 0, 3]).ok(),
            Some(AcquireOutcome::Wait(Placed {
                ticket: 12,
                places: vec![0, 3],
            }))
        );
        assert_eq!(decode(&[BANNED, 1500]).ok(), Some(AcquireOutcome::Banned(1500)));
        let Ok(AcquireOutcome::Rejected(refused)) = decode(&[REFUSED, 1, 2, 30_000]) else {
            panic!("refused")
        };
        assert_eq!(
            (&*refused.limit, refused.capacity, refused.current),
            ("per_user", 2, 2)
        );
        let Ok(AcquireOutcome::LineFull { full, displaced }) = decode(&[LINE_FULL, 2, 50, 100, 1]) else {
            panic!("line full")
        };
        assert_eq!(
            (&*full.limit, full.capacity, full.current, displaced),
            ("global", 50, 50, true)
        );
    }

    #[test]
    fn a_reply_of_another_shape_is_an_error() {
        let (lease, rates) = (lease(), rates());
        let decode = |reply: &[u64]| decode_acquire(reply, &lease, None, &rates.policies, 0);
        for reply in [
            &[][..],
            &[GRANTED, 1, 1, 4],
            &[GRANTED, 1, 1, 4, 2, 500, 3, 1, 0],
            &[GRANTED, 1, 7, 1, 4, 2, 500, 3, 1],
            &[GRANTED, 2, 7, 1, 4, 2, 500, 3, 1, 0],
            &[RATE_LIMITED, 2, 800, 5, 800, 0, 0, 1],
            &[WAIT, 12, 0],
            &[REFUSED, 3, 2, 30_000],
            &[REFUSED, 1, 2, 30_000, 1],
            &[9],
        ] {
            assert!(decode(reply).is_err(), "{reply:?}");
        }
    }

    #[test]
    fn a_grant_nobody_takes_is_released_and_a_place_nobody_takes_is_left() {
        let undo = |waiter| {
            Box::new(AcquireUndo {
                lease: lease(),
                waiter,
                rates: RateCheck::default(),
            })
        };
        let names = |calls: Vec<Invocation>| -> Vec<String> {
            calls
                .iter()
                .map(|call| {
                    call.script
                        .function
                        .rsplit('_')
                        .next()
                        .unwrap_or_default()
                        .to_owned()
                })
                .collect()
        };
        let waiting = Some((line(), "w1".to_owned()));
        assert_eq!(
            names(undo(None).invocations(&[GRANTED, 1, 7, 1, 4], 7)),
            ["release"]
        );
        assert_eq!(
            names(undo(waiting.clone()).invocations(&[WAIT, 12, 0, 3], 7)),
            ["leave"]
        );
        assert!(undo(None).invocations(&[WAIT, 12, 0, 3], 7).is_empty());
        assert!(undo(waiting).invocations(&[REFUSED, 1, 2, 30_000], 7).is_empty());
    }
}
