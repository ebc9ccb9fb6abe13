//! `lua/acquire.lua`'s call and reply: the head a batch of acquires shares and each one's keys
//! and arguments (the layout is described at the top of the script), the outcome its reply
//! says, and what gives back a grant or a place in line whose caller went away.

use std::sync::Arc;

use super::batched::{batch_call, OneCall, Undo};
use super::budget::settle_invocation;
use super::hit::{decisions, rate_args, RATE_ANSWER_LEN};
use super::layout::{lease_tally, unexpected_reply, KeysAndArgs, Shape};
use super::line::{leave_invocation, line_keys};
use super::release::release_invocation;
use super::scripts::{self, Invocation};
use crate::backend::{AcquireOutcome, InLine, Placed};
use crate::config::{GrantTerms, LineOrder};
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

/// What an acquire asks beside its lease: the grant's terms, how it stands to the line, the
/// rate policies its start counts against, the channel of the line's wake-ups and the holder.
pub struct Asked<'a> {
    pub terms: GrantTerms,
    pub in_line: Option<InLine<'a>>,
    pub rates: &'a RateCheck,
    pub channel: String,
    pub holder: u64,
}

/// The request of the lease `lease` (under its id), with the head it shares with the acquires
/// of its batch; it keeps nothing to give back (see `Undo`).
pub fn acquire_request(lease: &LeaseRecord, asked: &Asked<'_>) -> OneCall {
    let Asked {
        terms,
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
    // The head's numbers in one argument: a manager sends few distinct ones, each parsed once.
    let mut numbers = Shape::default();
    numbers
        .push(terms.ttl_ms)
        .push(u8::from(in_line.is_some()))
        .push(u8::from(in_line.is_some_and(|l| l.order == LineOrder::Arrival)))
        .push(u8::from(in_line.is_some_and(|l| l.own_waits)))
        .push(u8::from(terms.fencing))
        .push(terms.renew_every_ms)
        .push(u8::from(terms.entry_known_until_ms.is_some()));
    head.arg(channel).arg(holder).arg(numbers.into_arg());
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
        .arg(lease.id.as_str())
        .arg(waiter.map_or("", |w| w.id.as_str()))
        .arg(shape.into_arg())
        .arg(lease_tally(lease, false));
    invocation.key(&rates.keys);
    rate_args(&mut invocation, &rates.policies, &rates.costs, &[]);
    OneCall::of(invocation, Some(head), &lease.holders, None)
}

/// The keys and arguments of the call that decides `leases` (at least one, all in one tag) in order for `holder`, on `terms`, without a line or rate policies: what the
/// store sends, for tests that run the script themselves.
pub fn acquire_call(holder: u64, terms: GrantTerms, leases: &[Arc<LeaseRecord>]) -> KeysAndArgs {
    let rates = RateCheck::default();
    let asked = Asked {
        terms,
        in_line: None,
        rates: &rates,
        channel: String::new(),
        holder,
    };
    let requests: Vec<OneCall> = leases
        .iter()
        .map(|lease| acquire_request(lease, &asked))
        .collect();
    let call = batch_call(&scripts::ACQUIRE, &requests);
    (call.keys, call.args)
}

/// The outcome a request's reply says, for the lease, line and rate policies it asked with;
/// `entry_known_until_ms`: the entry life it trusted (`GrantTerms`), from which a grant is
/// dated then (the script, which did not read the entry, says nothing of it).
pub fn decode_acquire(
    reply: &[u64],
    lease: &LeaseRecord,
    in_line: Option<InLine<'_>>,
    policies: &[RatePolicy],
    sent_at_ms: u64,
    entry_known_until_ms: Option<u64>,
) -> CoreResult<AcquireOutcome> {
    let pools = &lease.pools;
    let n = pools.len();
    match reply {
        [GRANTED, life, fencing_token, rest @ ..] if rest.len() == n + RATE_ANSWER_LEN * policies.len() => {
            Ok(AcquireOutcome::Granted {
                used: rest[..n].to_vec(),
                entry_life_ms: match entry_known_until_ms {
                    Some(until) => Some(until.saturating_sub(sent_at_ms)),
                    None => (*life > 0).then_some(*life),
                },
                fencing_token: (*fencing_token > 0).then_some(*fencing_token),
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
                ahead: Vec::new(),
            }))
        }
        [WAIT, ticket, index, current, places @ ..]
            if places.len() == n && (1..=n as u64).contains(index) =>
        {
            Ok(AcquireOutcome::Wait(Placed {
                ticket: *ticket,
                places: places.to_vec(),
                full: (*index as usize - 1, *current),
            }))
        }
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
#[path = "acquire_tests.rs"]
mod tests;
