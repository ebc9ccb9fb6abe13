//! Scripts that decide a batch of requests in one call (acquire.lua, hit.lua: the prelude's
//! `decide_each`): the layout of such a call, the reply to each request, and the group commit
//! (`crate::group_commit`) that gathers the requests that come while calls are in flight.

use std::sync::Arc;

use redis::{FromRedisValue, Value};

use super::connection::Link;
use super::layout::{unexpected_reply, Shape};
use super::scripts::{Invocation, LuaScript};
use crate::errors::CoreResult;
use crate::group_commit::{Batches, GroupCommit};
use crate::keys;
use crate::lease::monotonic_ms;

/// Requests one batched call decides at most: bounds how long one call blocks Redis.
const REQUESTS_PER_CALL: usize = 64;

/// One request's decision failed (in a batch: the others were decided).
const FAILED: i64 = 6;

/// What a request whose caller went away while its call was in flight gives back, from the
/// reply it got (an acquire's grant or place in line: `acquire::AcquireUndo`).
pub trait Undo: Send + Sync {
    /// The calls, in order, that give back what `reply` took, for the manager's `holder`.
    fn invocations(self: Box<Self>, reply: &[u64], holder: u64) -> Vec<Invocation>;
}

/// One request of a batched call: its keys and arguments, and the hash tag they are in.
pub struct OneCall {
    pub tag: String,
    /// The keys and arguments it shares with the others of its batch, sent once per call
    /// (acquire.lua's head: its tag's holders and line, the lease duration, the holder...): two
    /// requests go in one call only when their heads are the same.
    pub head_keys: Vec<Vec<u8>>,
    pub head_args: Vec<Vec<u8>>,
    pub keys: Vec<Vec<u8>>,
    pub args: Vec<Vec<u8>>,
    /// For an acquire: what to give back if its caller goes away while its call is in flight.
    pub undo: Option<Box<dyn Undo>>,
}

impl OneCall {
    /// The request `invocation` built, with what it shares with its batch (`head`), its keys in
    /// the hash tag of `key`.
    pub fn of(
        invocation: Invocation,
        head: Option<Invocation>,
        key: &str,
        undo: Option<Box<dyn Undo>>,
    ) -> Self {
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

/// The call that decides `requests` (at least one, all with the first one's head): its frame
/// (one shape: the count of requests, the head's counts of keys and of arguments, each
/// request's), the head's arguments (its keys come first), then all of the requests' arguments
/// and keys in order.
pub fn batch_call(script: &'static LuaScript, requests: &[OneCall]) -> Invocation {
    let head = &requests[0];
    let mut frame = Shape::default();
    frame
        .push(requests.len())
        .push(head.head_keys.len())
        .push(head.head_args.len());
    for request in requests {
        frame.push(request.keys.len()).push(request.args.len());
    }
    let mut invocation = script.prepare_invoke();
    invocation
        .arg(frame.into_arg())
        .arg(&head.head_args)
        .key(&head.head_keys);
    for request in requests {
        invocation.key(&request.keys).arg(&request.args);
    }
    invocation
}

/// The replies to a call of `requests` requests: a call of one answers with its reply alone
/// (the prelude's `decide_each`), a call of several with a list; None for a list of another
/// length.
pub fn replies_of(reply: &Value, requests: usize) -> Option<&[Value]> {
    match reply {
        reply if requests == 1 => Some(std::slice::from_ref(reply)),
        Value::Array(replies) if replies.len() == requests => Some(replies),
        _ => None,
    }
}

/// One request's reply: its numbers, or (`Err`) the text of the error its decision met; None
/// for a reply of neither shape.
pub fn decode_one(reply: &Value) -> Option<Result<Vec<u64>, String>> {
    if let Value::Array(items) = reply {
        if let [Value::Int(FAILED), message] = items.as_slice() {
            return Some(Err(String::from_redis_value_ref(message).unwrap_or_default()));
        }
    }
    Vec::<u64>::from_redis_value_ref(reply).ok().map(Ok)
}

/// Sends the requests of a script that decides batches; it answers each.
pub struct BatchedCalls {
    link: Arc<Link>,
    script: &'static LuaScript,
    /// The manager's holder id, for what undoes an acquire.
    holder: u64,
}

/// A request's reply, as the script gives it, and when its call left this process (Redis ran
/// the script later: a grant's deadline counted from then is never late).
pub struct Replied {
    pub sent_at_ms: u64,
    pub reply: Vec<u64>,
}

impl BatchedCalls {
    pub fn of(script: &'static LuaScript, link: &Arc<Link>, holder: u64) -> Arc<GroupCommit<Self>> {
        Arc::new(GroupCommit::new(BatchedCalls {
            link: Arc::clone(link),
            script,
            holder,
        }))
    }

    fn name(&self) -> &str {
        self.script.function.rsplit('_').next().unwrap_or("batched")
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
        let invocation = batch_call(self.script, requests);
        let sent_at_ms = monotonic_ms();
        let reply = match self.link.run::<Value>(&invocation).await {
            Ok(reply) => reply,
            Err(error) => return requests.iter().map(|_| Err(error.clone())).collect(),
        };
        let Some(replies) = replies_of(&reply, requests.len()) else {
            return requests
                .iter()
                .map(|_| Err(unexpected_reply(self.name(), &reply)))
                .collect();
        };
        replies
            .iter()
            .map(|reply| match decode_one(reply) {
                Some(Ok(reply)) => Ok(Replied { sent_at_ms, reply }),
                // As Redis would have answered it for a call of its own.
                Some(Err(message)) => Err(self.link.errors.error_text(&message)),
                None => Err(unexpected_reply(self.name(), reply)),
            })
            .collect()
    }

    /// An acquire whose caller was cancelled while its call was in flight (an aborted waiter)
    /// gives back what it took (its `Undo`). A failed call leaves an over-count, never an
    /// under-count. A hit that counted stays counted.
    async fn unanswered(&self, request: OneCall, Replied { reply, .. }: Replied) {
        let Some(undo) = request.undo else {
            return;
        };
        for invocation in undo.invocations(&reply, self.holder) {
            let _ = self.link.run::<Value>(&invocation).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::layout::read;
    use super::super::scripts::HIT;
    use super::*;

    fn request(head: &[&str], keys: &[&str], args: &[&str]) -> OneCall {
        let mut invocation = HIT.prepare_invoke();
        invocation.key(keys).arg(args);
        let mut shared = HIT.prepare_invoke();
        shared.key(&head[..1]).arg(&head[1..]);
        OneCall::of(invocation, Some(shared), "{t}:k", None)
    }

    /// Keys and arguments, as text.
    type Part<'a> = (Vec<&'a str>, Vec<&'a str>);

    /// The requests of a call, read back as the prelude's `decide_each` reads them: the head's
    /// keys and arguments, then each request's.
    fn decide_each(call: &Invocation) -> (Part<'_>, Vec<Part<'_>>) {
        let (keys, args) = (read::keys(call), read::args(call));
        let frame = read::shape(call.args[0].as_slice());
        let number = |i: usize| usize::try_from(frame[i]).expect("a count");
        let (requests, head_keys, head_args) = (number(0), number(1), number(2));
        let (mut key_base, mut arg_base) = (head_keys, 1 + head_args);
        let mut each = Vec::new();
        for r in 0..requests {
            let (key_count, arg_count) = (number(3 + 2 * r), number(4 + 2 * r));
            each.push((
                keys[key_base..key_base + key_count].to_vec(),
                args[arg_base..arg_base + arg_count].to_vec(),
            ));
            (key_base, arg_base) = (key_base + key_count, arg_base + arg_count);
        }
        assert_eq!(
            (key_base, arg_base),
            (keys.len(), args.len()),
            "nothing left over"
        );
        (
            (keys[..head_keys].to_vec(), args[1..1 + head_args].to_vec()),
            each,
        )
    }

    #[test]
    fn a_batch_reads_back_as_its_head_and_its_requests_in_order() {
        let head = ["{t}:holders", "30000", "fair"];
        let requests = [
            request(&head, &["{t}:a"], &["one", "1 2"]),
            request(&head, &["{t}:a", "{t}:b"], &["two"]),
            request(&head, &[], &[]),
        ];
        let call = batch_call(&HIT, &requests);
        let ((head_keys, head_args), each) = decide_each(&call);
        assert_eq!(head_keys, ["{t}:holders"]);
        assert_eq!(head_args, ["30000", "fair"]);
        assert_eq!(
            each,
            [
                (vec!["{t}:a"], vec!["one", "1 2"]),
                (vec!["{t}:a", "{t}:b"], vec!["two"]),
                (vec![], vec![]),
            ]
        );
    }

    #[test]
    fn a_call_of_one_request_answers_with_its_reply_alone() {
        let one = Value::Array(vec![Value::Int(1), Value::Int(0)]);
        assert_eq!(replies_of(&one, 1), Some(std::slice::from_ref(&one)));
        let two = Value::Array(vec![one.clone(), one.clone()]);
        assert_eq!(replies_of(&two, 2).map(<[Value]>::len), Some(2));
        assert_eq!(replies_of(&two, 3), None);
        assert_eq!(replies_of(&Value::Nil, 2), None);
    }

    #[test]
    fn a_request_answers_its_numbers_or_its_own_error() {
        let numbers = Value::Array(vec![Value::Int(1), Value::Int(0), Value::Int(3)]);
        assert_eq!(decode_one(&numbers), Some(Ok(vec![1, 0, 3])));
        let failed = Value::Array(vec![
            Value::Int(FAILED),
            Value::BulkString(b"WRONGTYPE Operation against a key".to_vec()),
        ]);
        assert_eq!(
            decode_one(&failed),
            Some(Err("WRONGTYPE Operation against a key".into()))
        );
        assert_eq!(decode_one(&Value::SimpleString("OK".into())), None);
    }
}
