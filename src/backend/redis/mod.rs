//! Redis, standalone, cluster or behind Sentinel: the script calls. The connection is in
//! `connection.rs`, URLs in `url.rs`, the renewal round's calls in `keepalive.rs`, the scripts
//! in `scripts.rs` (their text in `src/lua/`; keys and states in `docs/design.md`).

mod connection;
mod keepalive;
mod scripts;
mod url;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use self::connection::Link;
use self::scripts::{Invocation, LuaScript};
pub use self::url::redact;
use super::{AcquireOutcome, InLine, Placed};
use crate::errors::{CoreError, CoreResult, Rejection};
use crate::group_commit::{Batches, GroupCommit};
use crate::keys::{self, LineKeys};
use crate::lease::{monotonic_ms, LeaseRecord};
use crate::rate::{Bucket, Decision, HitOutcome, RateCheck, RatePolicy, Settlement, TopUp, ToppedUp};
use redis::{FromRedisValue, Value};

/// Holder ids stay below 2^48: exact as Redis scores, and printed the same by Lua and Rust.
const HOLDER_IDS: u64 = 1 << 48;

/// The acquire script's reply codes (named in `lua/prelude.lua`).
const REFUSED: u64 = 0;
const GRANTED: u64 = 1;
const WAIT: u64 = 2;
const RATE_LIMITED: u64 = 3;
const BANNED: u64 = 4;
const LINE_FULL: u64 = 5;
/// One request's decision failed (in a batch: the others were decided).
const FAILED: i64 = 6;

/// Requests one batched call (acquire.lua, hit.lua) decides at most: bounds how long one call
/// blocks Redis.
const REQUESTS_PER_CALL: usize = 64;

pub struct RedisBackend {
    link: Arc<Link>,
    /// Acquires (hits) that come while one is in flight go together, decided in order by one
    /// call.
    acquires: Arc<GroupCommit<BatchedCalls>>,
    hits: Arc<GroupCommit<BatchedCalls>>,
    /// This manager's holder id: it scores its leases in every pool and keeps them alive with
    /// one entry per hash tag (see `docs/design.md`).
    holder: u64,
    /// Where each tag's keep-alive goes on refreshing the holder's pools (absent: from the start).
    cursors: Mutex<HashMap<String, String>>,
}

impl RedisBackend {
    pub fn new(url: &str, timeout: Duration, ca_pem: Option<Vec<u8>>) -> CoreResult<Self> {
        let link = Arc::new(url::open(url, timeout, ca_pem)?);
        let holder =
            1 + u64::from_le_bytes(uuid::Uuid::new_v4().as_bytes()[..8].try_into().expect("8 bytes"))
                % (HOLDER_IDS - 1);
        Ok(RedisBackend {
            acquires: BatchedCalls::of(&scripts::ACQUIRE, &link, holder),
            hits: BatchedCalls::of(&scripts::HIT, &link, holder),
            link,
            holder,
            cursors: Mutex::new(HashMap::new()),
        })
    }

    pub fn is_cluster(&self) -> bool {
        self.link.is_cluster()
    }

    pub fn target(&self) -> &str {
        &self.link.target
    }

    pub fn call_stats(&self) -> super::CallStats {
        self.link.call_stats()
    }

    pub async fn acquire(
        &self,
        lease: &Arc<LeaseRecord>,
        ttl_ms: u64,
        in_line: Option<InLine<'_>>,
        rates: &RateCheck,
    ) -> CoreResult<AcquireOutcome> {
        let pools = &lease.pools;
        // What the acquires of a batch share goes once per call (acquire.lua's head).
        let mut head = scripts::ACQUIRE.prepare_invoke();
        head.key(&*lease.holders);
        if let Some(in_line) = in_line {
            line_keys(&mut head, in_line.line);
            head.key(&in_line.line.tickets);
        }
        head.arg(ttl_ms)
            .arg(u8::from(in_line.is_some()))
            .arg(in_line.map_or(String::new(), |l| self.wake_channel(l.line)))
            .arg(self.holder)
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
            .arg(lease.id.as_str())
            .arg(waiter.map_or("", |w| w.id.as_str()))
            .arg(shape.0);
        invocation.key(&rates.keys);
        rate_args(&mut invocation, &rates.policies, &rates.costs);
        let undo = Undo {
            lease: Arc::clone(lease),
            waiter: in_line.and_then(|l| l.waiter.map(|w| (l.line.clone(), w.id.clone()))),
            rates: rates.clone(),
        };
        let Replied { sent_at_ms, reply } = self
            .acquires
            .submit(OneCall::of(invocation, Some(head), &lease.holders, Some(undo)))
            .await?;
        let n = pools.len();
        match reply.as_slice() {
            [GRANTED, alive @ (0 | 1), rest @ ..] if rest.len() == n + 4 * rates.policies.len() => {
                Ok(AcquireOutcome::Granted {
                    used: rest[..n].to_vec(),
                    holder_was_alive: *alive == 1,
                    rates: decisions(&rates.policies, &rest[n..]),
                    sent_at_ms,
                })
            }
            [RATE_LIMITED, index, retry_ms, states @ ..]
                if states.len() == 4 * rates.policies.len()
                    && (1..=rates.policies.len() as u64).contains(index) =>
            {
                Ok(AcquireOutcome::RateLimited(HitOutcome {
                    decisions: decisions(&rates.policies, states),
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

    /// This manager's holder leaves the tags of `holders_keys` (one hash slot) where it holds
    /// nothing; returns how many.
    pub async fn depart(&self, holders_keys: &[String]) -> CoreResult<u64> {
        let mut invocation = scripts::DEPART.prepare_invoke();
        invocation.key(holders_keys).arg(self.holder);
        self.link.run(&invocation).await
    }

    pub async fn leave(&self, line: &LineKeys, waiter_id: &str) -> CoreResult<()> {
        let invocation = leave_invocation(line, waiter_id, self.holder);
        self.link.run::<u64>(&invocation).await.map(drop)
    }

    /// One write keeps all of this process's waiters in line; `waiter_ids` (every waiter it
    /// has) lets the script take out any it no longer has. Returns those whose places went to
    /// other users' waiters.
    pub async fn heartbeat(
        &self,
        line: &LineKeys,
        waiter_ids: &[String],
        ttl_ms: u64,
    ) -> CoreResult<Vec<String>> {
        let mut invocation = scripts::HEARTBEAT.prepare_invoke();
        line_keys(&mut invocation, line);
        invocation.arg(ttl_ms).arg(self.holder).arg(waiter_ids);
        self.link.run(&invocation).await
    }

    pub async fn release(
        &self,
        leases: &[Arc<LeaseRecord>],
        line: Option<&LineKeys>,
    ) -> CoreResult<Vec<CoreResult<bool>>> {
        // A cluster's batch is of one slot: the line joins it only when it shares that slot
        // (without a global pool, users' own tags have no line).
        let line = line.filter(|line| {
            !self.is_cluster()
                || leases
                    .first()
                    .is_some_and(|lease| keys::hash_tag(&line.line) == lease.hash_tag())
        });
        let line = line.map(|line| (line, self.wake_channel(line)));
        let invocation = release_invocation(leases, line, self.holder);
        let reply: Vec<Value> = self.link.run(&invocation).await?;
        if reply.len() != leases.len() {
            return Err(unexpected_reply("release", &reply));
        }
        reply
            .iter()
            .map(|answer| match answer {
                Value::Int(present) => Ok(Ok(*present == 1)),
                Value::BulkString(_) | Value::SimpleString(_) => {
                    let message = String::from_redis_value_ref(answer).unwrap_or_default();
                    Ok(Err(self.link.error_text(&message)))
                }
                _ => Err(unexpected_reply("release", &reply)),
            })
            .collect()
    }

    /// Calls `woken` for every wake-up published on the line's channel, until the subscription
    /// breaks (the caller subscribes again); on a cluster the channel is sharded (SSUBSCRIBE).
    pub async fn listen(&self, line: &LineKeys, woken: impl Fn()) -> CoreResult<()> {
        let mut subscription = self.link.subscribe(&line.channel).await?;
        while subscription.next().await.is_some() {
            woken();
        }
        Ok(())
    }

    /// The channel as the scripts take it: on a cluster it is sharded (see the prelude's
    /// `wake`).
    fn wake_channel(&self, line: &LineKeys) -> String {
        if self.is_cluster() {
            format!("!{}", line.channel)
        } else {
            line.channel.clone()
        }
    }

    pub async fn hit(
        &self,
        keys: &[String],
        policies: &[RatePolicy],
        cost: u64,
        consume: bool,
    ) -> CoreResult<HitOutcome> {
        let mut invocation = scripts::HIT.prepare_invoke();
        invocation.key(keys).arg(u8::from(consume));
        rate_args(&mut invocation, policies, &vec![cost; policies.len()]);
        let Some(first_key) = keys.first() else {
            return Err(CoreError::Panic("a hit without a policy".into()));
        };
        let Replied { reply, .. } = self
            .hits
            .submit(OneCall::of(invocation, None, first_key, None))
            .await?;
        let [refused, retry_ms, per_policy @ ..] = reply.as_slice() else {
            return Err(unexpected_reply("hit", &reply));
        };
        if per_policy.len() != 4 * policies.len() || *refused as usize > policies.len() {
            return Err(unexpected_reply("hit", &reply));
        }
        Ok(HitOutcome {
            decisions: decisions(policies, per_policy),
            refused: (*refused > 0).then(|| (*refused as usize - 1, *retry_ms)),
        })
    }

    pub async fn revoke(
        &self,
        pool_key: &str,
        holders: &str,
        ban_ms: u64,
        remember_ms: u64,
    ) -> CoreResult<u64> {
        let mut invocation = scripts::REVOKE.prepare_invoke();
        invocation.key(pool_key).key(holders).arg(ban_ms).arg(remember_ms);
        self.link.run(&invocation).await
    }

    pub async fn revoked(&self, holders: &str) -> CoreResult<Vec<String>> {
        let mut invocation = scripts::REVOKED.prepare_invoke();
        invocation.key(holders);
        self.link.run(&invocation).await
    }

    pub async fn forget_rates(&self, keys: &[String]) -> CoreResult<()> {
        let mut invocation = scripts::FORGET.prepare_invoke();
        invocation.key(keys);
        self.link.run::<u64>(&invocation).await.map(drop)
    }

    pub async fn top_up(&self, top_ups: &[&TopUp]) -> CoreResult<Vec<ToppedUp>> {
        let mut invocation = scripts::TOP_UP.prepare_invoke();
        let mut keys = KeyIndex::default();
        for top_up in top_ups {
            invocation
                .arg(top_up.want)
                .arg(u8::from(top_up.forced))
                .arg(top_up.moved)
                .arg(top_up.keys.len());
            for ((key, policy), give_back) in top_up.keys.iter().zip(&top_up.policies).zip(&top_up.give_back)
            {
                let index = keys.index(&mut invocation, key);
                invocation
                    .arg(index)
                    .arg(policy.algorithm.code())
                    .arg(policy.limit)
                    .arg(policy.window_ms)
                    .arg(give_back.len());
                for (bucket, tokens) in give_back {
                    invocation.arg(bucket.slot).arg(bucket.epoch).arg(tokens);
                }
            }
        }
        let reply: Vec<u64> = self.link.run(&invocation).await?;
        let mut rest = reply.as_slice();
        let mut answers = Vec::with_capacity(top_ups.len());
        for top_up in top_ups {
            let n = top_up.keys.len();
            let [granted, room, after @ ..] = rest else {
                return Err(unexpected_reply("top-up", &reply));
            };
            if after.len() < 3 * n {
                return Err(unexpected_reply("top-up", &reply));
            }
            answers.push(ToppedUp {
                granted: *granted,
                room: *room,
                buckets: after[..3 * n]
                    .chunks(3)
                    .map(|taken| Bucket::of(taken[0], taken[1]).map(|bucket| (bucket, taken[2])))
                    .collect(),
            });
            rest = &after[3 * n..];
        }
        Ok(answers)
    }

    pub async fn settle(&self, settlement: &Settlement) -> CoreResult<()> {
        match settle_invocation(settlement) {
            Some(invocation) => self.link.run::<i64>(&invocation).await.map(drop),
            None => Ok(()),
        }
    }

    /// `pool_keys`: at least one, all of one tag.
    pub async fn count(&self, pool_keys: &[String], ttl_ms: u64) -> CoreResult<Vec<u64>> {
        let mut invocation = scripts::COUNT.prepare_invoke();
        invocation
            .key(pool_keys)
            .key(keys::holders_key(&pool_keys[0]))
            .arg(ttl_ms);
        let counts: Vec<u64> = self.link.run(&invocation).await?;
        if counts.len() != pool_keys.len() {
            return Err(unexpected_reply("count", &counts));
        }
        Ok(counts)
    }
}

/// One request of a batched call: its keys and arguments, and the hash tag they are in.
struct OneCall {
    tag: String,
    /// The keys and arguments it shares with the others of its batch, sent once per call
    /// (acquire.lua's head: its tag's holders and line, the lease duration, the holder...): two
    /// requests go in one call only when their heads are the same.
    head_keys: Vec<Vec<u8>>,
    head_args: Vec<Vec<u8>>,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
    /// For an acquire: what to give back if its caller goes away while its call is in flight.
    undo: Option<Undo>,
}

/// An acquire's lease, the line and id of its waiter, and what its grant takes from rate
/// policies.
struct Undo {
    lease: Arc<LeaseRecord>,
    waiter: Option<(LineKeys, String)>,
    rates: RateCheck,
}

impl OneCall {
    /// The request `invocation` built, with what it shares with its batch (`head`), its keys in
    /// the hash tag of `key`.
    fn of(invocation: Invocation, head: Option<Invocation>, key: &str, undo: Option<Undo>) -> Self {
        let (head_keys, head_args) = head.map_or_else(Default::default, |head| (head.keys, head.args));
        OneCall {
            tag: keys::hash_tag(key).to_owned(),
            head_keys,
            head_args,
            keys: invocation.keys,
            args: invocation.args,
            undo,
        }
    }
}

/// Sends the requests of a script that decides batches (acquire.lua, hit.lua: the prelude's
/// `decide_each`): after the count of requests, the head they share (its counts of keys and of
/// arguments, then its arguments; its keys come first), each one's count of keys and of
/// arguments, then all of their arguments and keys in order; it answers each.
struct BatchedCalls {
    link: Arc<Link>,
    script: &'static LuaScript,
    /// The manager's holder id, for what undoes an acquire.
    holder: u64,
}

/// A request's reply, as the script gives it, and when its call left this process (Redis ran
/// the script later: a grant's deadline counted from then is never late).
pub struct Replied {
    sent_at_ms: u64,
    reply: Vec<u64>,
}

impl BatchedCalls {
    fn of(script: &'static LuaScript, link: &Arc<Link>, holder: u64) -> Arc<GroupCommit<Self>> {
        Arc::new(GroupCommit::new(BatchedCalls {
            link: Arc::clone(link),
            script,
            holder,
        }))
    }
}

impl Batches for BatchedCalls {
    type Request = OneCall;
    type Answer = Replied;
    const MOST_PER_CALL: usize = REQUESTS_PER_CALL;

    fn together(&self, first: &OneCall, other: &OneCall) -> bool {
        first.tag == other.tag && first.head_keys == other.head_keys && first.head_args == other.head_args
    }

    async fn send(&self, requests: &[OneCall]) -> Vec<CoreResult<Replied>> {
        let mut invocation = self.script.prepare_invoke();
        let head = &requests[0];
        invocation
            .arg(requests.len())
            .arg(head.head_keys.len())
            .arg(head.head_args.len())
            .arg(&head.head_args)
            .key(&head.head_keys);
        for request in requests {
            invocation.arg(request.keys.len()).arg(request.args.len());
        }
        for request in requests {
            invocation.key(&request.keys).arg(&request.args);
        }
        let sent_at_ms = monotonic_ms();
        match self.link.run::<Vec<Value>>(&invocation).await {
            Ok(replies) if replies.len() == requests.len() => replies
                .into_iter()
                .map(|reply| self.answer(reply).map(|reply| Replied { sent_at_ms, reply }))
                .collect(),
            Ok(replies) => requests
                .iter()
                .map(|_| Err(unexpected_reply(self.name(), &replies)))
                .collect(),
            Err(error) => requests.iter().map(|_| Err(error.clone())).collect(),
        }
    }

    /// An acquire whose caller was cancelled while its call was in flight (an aborted waiter):
    /// its grant gives back all it took, its slots (released without a wake-up: waiters look
    /// again within a second), its reservation and its rate units; its place in line is given
    /// up. A failed call leaves an over-count, never an under-count. A hit that counted stays
    /// counted.
    async fn unanswered(&self, request: OneCall, Replied { reply, .. }: Replied) {
        let Some(undo) = request.undo else {
            return;
        };
        let invocation = match (reply.first(), &undo.waiter) {
            (Some(&GRANTED), _) => {
                let taken = reply.get(2 + undo.lease.pools.len()..).unwrap_or_default();
                let decisions = decisions(&undo.rates.policies, taken);
                let refunds = undo.rates.refunds(&decisions, 0..decisions.len());
                let untaken = Settlement::untaken(undo.lease.id.as_str(), refunds);
                if let Some(refund) = settle_invocation(&untaken) {
                    let _ = self.link.run::<Value>(&refund).await;
                }
                release_invocation(&[undo.lease], None, self.holder)
            }
            (Some(&WAIT), Some((line, waiter_id))) => leave_invocation(line, waiter_id, self.holder),
            _ => return,
        };
        let _ = self.link.run::<Value>(&invocation).await;
    }
}

impl BatchedCalls {
    fn name(&self) -> &str {
        self.script.function.rsplit('_').next().unwrap_or("batched")
    }

    /// One request's numbers, or the error its decision met (as Redis would have answered it
    /// for a call of its own).
    fn answer(&self, reply: Value) -> CoreResult<Vec<u64>> {
        if let Value::Array(items) = &reply {
            if let [Value::Int(FAILED), message] = items.as_slice() {
                let message = String::from_redis_value_ref(message).unwrap_or_default();
                return Err(self.link.error_text(&message));
            }
        }
        Vec::<u64>::from_redis_value_ref(&reply).map_err(|_| unexpected_reply(self.name(), &reply))
    }
}

/// Each rate policy as the scripts take it: algorithm, limit, window in ms, its cost.
fn rate_args(invocation: &mut Invocation, policies: &[RatePolicy], costs: &[u64]) {
    for (policy, cost) in policies.iter().zip(costs) {
        invocation
            .arg(policy.algorithm.code())
            .arg(policy.limit)
            .arg(policy.window_ms)
            .arg(cost);
    }
}

/// The policies' decisions from a reply's (used, reset_ms, bucket, epoch) quadruples.
fn decisions(policies: &[RatePolicy], answers: &[u64]) -> Vec<Decision> {
    policies
        .iter()
        .zip(answers.chunks(4))
        .map(|(policy, a)| Decision::new(policy.clone(), a[0], a[1], Bucket::of(a[2], a[3])))
        .collect()
}

/// The KEYS of a call that names keys by index: each key once, numbered from 1 in order of
/// first use.
#[derive(Default)]
struct KeyIndex<'k>(HashMap<&'k str, usize>);

impl<'k> KeyIndex<'k> {
    fn index(&mut self, invocation: &mut Invocation, key: &'k str) -> usize {
        let next = self.0.len() + 1;
        *self.0.entry(key).or_insert_with(|| {
            invocation.key(key);
            next
        })
    }
}

/// The line's keys in the order every script takes them: the line, then the liveness of the
/// processes with waiters.
fn line_keys(invocation: &mut Invocation, line: &LineKeys) {
    invocation.key(&line.line).key(&line.alive);
}

/// A request's numbers in one argument, the prelude's `shape_of` (a batch of alike requests is
/// parsed once, and each argument costs Redis about a thousand instructions to take in).
#[derive(Default)]
struct Shape(String);

/// What a shape holds: `shape_of` reads runs of digits, so a sign or a fraction would shift
/// every number after it.
trait Unsigned: std::fmt::Display {}

macro_rules! unsigned {
    ($($t:ty),*) => { $(impl Unsigned for $t {})* };
}

unsigned!(u8, u32, u64, usize);

impl Shape {
    fn push(&mut self, number: impl Unsigned) -> &mut Self {
        if !self.0.is_empty() {
            self.0.push(' ');
        }
        let _ = write!(self.0, "{number}");
        self
    }
}

/// release.lua's call for `leases`, waking the waiters of `line` (with its channel) if given.
fn release_invocation(
    leases: &[Arc<LeaseRecord>],
    line: Option<(&LineKeys, String)>,
    holder: u64,
) -> Invocation {
    batch_invocation(&scripts::RELEASE, leases, false, |invocation| {
        match line {
            Some((line, channel)) => invocation.key(&line.line).arg(channel),
            None => invocation.arg(""),
        };
        invocation.arg(holder);
    })
}

/// settle.lua's call for a settlement; None when it changes nothing.
fn settle_invocation(settlement: &Settlement) -> Option<Invocation> {
    let first = settlement.adjustments.first()?;
    let marker = keys::settled_key(&first.key, &settlement.id);
    let mut invocation = scripts::SETTLE.prepare_invoke();
    let mut keys = KeyIndex::default();
    keys.index(&mut invocation, &marker);
    for adjustment in &settlement.adjustments {
        let index = keys.index(&mut invocation, &adjustment.key);
        invocation
            .arg(index)
            .arg(adjustment.policy.algorithm.code())
            .arg(adjustment.policy.window_ms)
            .arg(adjustment.tokens)
            .arg(adjustment.refund_from.map_or(0, |b| b.slot))
            .arg(adjustment.refund_from.map_or(0, |b| b.epoch));
    }
    Some(invocation)
}

/// leave.lua's call: a waiter out of the line.
fn leave_invocation(line: &LineKeys, waiter_id: &str, holder: u64) -> Invocation {
    let mut invocation = scripts::LEAVE.prepare_invoke();
    line_keys(&mut invocation, line);
    invocation.arg(waiter_id).arg(holder);
    invocation
}

/// A batched call (reclaim, release). KEYS: each distinct pool and holders key once, in order
/// of first use (`lead` may add more after them); ARGV: what `lead` adds, then per lease: id
/// and its shape: weight, the KEYS index of its holders, pool count k, and k KEYS indexes (each
/// followed by the pool's capacity, `with_capacity`).
fn batch_invocation(
    script: &'static LuaScript,
    leases: &[Arc<LeaseRecord>],
    with_capacity: bool,
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
    let key_index = key_index.0;
    lead(&mut invocation);
    for lease in leases {
        let mut shape = Shape::default();
        shape
            .push(lease.weight)
            .push(key_index[&*lease.holders])
            .push(lease.pools.len());
        for pool in &lease.pools {
            shape.push(key_index[&*pool.key]);
            if with_capacity {
                shape.push(pool.capacity);
            }
        }
        invocation.arg(lease.id.as_str()).arg(shape.0);
    }
    invocation
}

fn unexpected_reply(script: &str, reply: &dyn std::fmt::Debug) -> CoreError {
    CoreError::Backend(format!(
        "unexpected reply {reply:?} from the {script} script; is another version of fastapi_stream_lease using the same key_prefix?"
    ))
}
