//! Token budgets: `lua/topup.lua` (streams' budgets topped up, many in one call),
//! `lua/settle.lua` (an ended stream's budgets settled and its answer's size counted, at most
//! once), both naming their counters by KEYS index, and `lua/answers.lua` (a model's histogram
//! of answer sizes read).

use super::layout::KeysAndArgs;
use super::layout::{unexpected_reply, KeyIndex};
use super::scripts::{self, Invocation};
use crate::errors::CoreResult;
use crate::keys;
use crate::rate::answer_sizes::{self, BUCKETS};
use crate::rate::{Bucket, Settlement, TopUp, ToppedUp};

/// topup.lua's call: per top-up, the answer tokens it wants, whether it is forced and its count
/// of policies, then per policy the KEYS index of its counter, algorithm, limit, window in ms,
/// the units moved, its units per million answer tokens and its count of buckets to give back
/// to, each slot, epoch and units.
pub fn top_up_invocation(top_ups: &[&TopUp]) -> Invocation {
    let mut invocation = scripts::TOP_UP.prepare_invoke();
    let mut keys = KeyIndex::default();
    for top_up in top_ups {
        invocation
            .arg(top_up.want)
            .arg(u8::from(top_up.forced))
            .arg(top_up.keys.len());
        let policies = top_up.keys.iter().zip(&top_up.policies);
        let amounts = top_up.moved.iter().zip(&top_up.prices).zip(&top_up.give_back);
        for ((key, policy), ((moved, price), give_back)) in policies.zip(amounts) {
            let index = keys.index(&mut invocation, key);
            invocation
                .arg(index)
                .arg(policy.algorithm.code())
                .arg(policy.limit)
                .arg(policy.window_ms)
                .arg(moved)
                .arg(price)
                .arg(give_back.len());
            for (bucket, tokens) in give_back {
                invocation.arg(bucket.slot).arg(bucket.epoch).arg(tokens);
            }
        }
    }
    invocation
}

/// topup.lua's reply: per top-up, the tokens granted and the room left, then per policy the
/// slot, epoch and tokens of the bucket its share went to.
pub fn decode_top_up(reply: &[u64], top_ups: &[&TopUp]) -> CoreResult<Vec<ToppedUp>> {
    let mut rest = reply;
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

/// settle.lua's call for a settlement (KEYS 1: its marker, in the tag of its first counter, or
/// of the histograms when it has none; the KEYS index of the model's histogram, the answer's
/// bucket, the KEYS index of the identity's own histogram and the percentile that sizes an
/// identity, 0 0 0 0 without an answer to count; then per adjustment the KEYS index of its
/// counter, algorithm, window in ms, tokens, and the slot and epoch of the bucket to refund
/// from, 0 0 to charge); None when it changes nothing.
pub fn settle_invocation(settlement: &Settlement) -> Option<Invocation> {
    let answer = settlement.answer.as_ref();
    let first = settlement
        .adjustments
        .first()
        .map(|adjustment| &adjustment.key)
        .or(answer.map(|answer| &answer.keys.model))?;
    let marker = keys::settled_key(first, &settlement.id);
    let mut invocation = scripts::SETTLE.prepare_invoke();
    let mut keys = KeyIndex::default();
    keys.index(&mut invocation, &marker);
    match answer {
        Some(answer) => {
            let model = keys.index(&mut invocation, &answer.keys.model);
            let own = keys.index(&mut invocation, &answer.keys.own);
            invocation
                .arg(model)
                .arg(answer.bucket)
                .arg(own)
                .arg(answer_sizes::PERCENTILE);
        }
        None => {
            invocation.arg(0).arg(0).arg(0).arg(0);
        }
    }
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

/// settle.lua's keys and arguments for a settlement, as `settle_invocation` makes them, for
/// tests that run the script alone; None when it changes nothing.
pub fn settle_call(settlement: &Settlement) -> Option<KeysAndArgs> {
    settle_invocation(settlement).map(|call| (call.keys, call.args))
}

/// answers.lua's call: a model's histogram, and an identity's own when `own` is given, all
/// their buckets.
pub fn answers_invocation(model: &str, own: Option<&str>) -> Invocation {
    let mut invocation = scripts::ANSWERS.prepare_invoke();
    invocation.key(model);
    if let Some(own) = own {
        invocation.key(own);
    }
    invocation.arg(BUCKETS);
    invocation
}

#[cfg(test)]
mod tests {
    use super::super::hit::tests::policy;
    use super::super::layout::read;
    use super::*;
    use crate::rate::{Adjustment, AnswerKeys, AnswerSample};

    fn top_up(keys: &[&str]) -> TopUp {
        TopUp {
            keys: keys.iter().map(|key| (*key).to_owned()).collect(),
            policies: keys.iter().map(|_| policy("tokens", 1000)).collect(),
            give_back: keys.iter().map(|_| Vec::new()).collect(),
            moved: keys.iter().map(|_| 0).collect(),
            prices: keys.iter().map(|_| 1_000_000).collect(),
            want: 100,
            forced: false,
        }
    }

    #[test]
    fn top_ups_share_their_counters_keys() {
        let (one, two) = (top_up(&["{u}:a"]), top_up(&["{u}:a", "{u}:b"]));
        let call = top_up_invocation(&[&one, &two]);
        assert_eq!(read::keys(&call), ["{u}:a", "{u}:b"]);
        assert_eq!(
            read::args(&call),
            [
                "100", "0", "1", "1", "f", "1000", "60000", "0", "1000000", "0", //
                "100", "0", "2", "1", "f", "1000", "60000", "0", "1000000", "0", "2", "f", "1000", "60000",
                "0", "1000000", "0",
            ]
        );
    }

    #[test]
    fn a_top_up_reply_answers_each_top_up() {
        let (one, two) = (top_up(&["{u}:a"]), top_up(&["{u}:a", "{u}:b"]));
        let reply = [100, 900, 5, 1, 100, 40, 0, 0, 0, 0, 6, 2, 40];
        let answers = decode_top_up(&reply, &[&one, &two]).expect("decoded");
        assert_eq!((answers[0].granted, answers[0].room), (100, 900));
        assert_eq!(answers[0].buckets, [Some((Bucket { slot: 5, epoch: 1 }, 100))]);
        assert_eq!(
            answers[1].buckets,
            [None, Some((Bucket { slot: 6, epoch: 2 }, 40))]
        );
        assert!(decode_top_up(&reply[..12], &[&one, &two]).is_err());
    }

    #[test]
    fn a_settlement_names_its_marker_first_and_nothing_to_settle_sends_nothing() {
        let adjustment = |tokens, refund_from| Adjustment {
            key: "{u}:a".into(),
            policy: policy("tokens", 1000),
            tokens,
            refund_from,
        };
        let settlement = Settlement {
            id: "lease-1".into(),
            adjustments: vec![adjustment(30, None), adjustment(20, Bucket::of(5, 1))],
            answer: None,
        };
        let call = settle_invocation(&settlement).expect("a call");
        assert_eq!(read::keys(&call), ["{u}:settled:lease-1", "{u}:a"]);
        assert_eq!(
            read::args(&call),
            ["0", "0", "0", "0", "2", "f", "60000", "30", "0", "0", "2", "f", "60000", "20", "5", "1"]
        );
        let nothing = Settlement {
            id: "lease-2".into(),
            adjustments: Vec::new(),
            answer: None,
        };
        assert!(settle_invocation(&nothing).is_none());
    }

    #[test]
    fn a_settlement_counts_its_answer_in_its_identitys_histogram_even_with_nothing_to_adjust() {
        let answer = AnswerSample {
            keys: AnswerKeys {
                model: "{u}:answers:ab".into(),
                own: "{u}:answers:ab:cd".into(),
            },
            bucket: 9,
        };
        let settlement = Settlement {
            id: "lease-3".into(),
            adjustments: Vec::new(),
            answer: Some(answer),
        };
        let call = settle_invocation(&settlement).expect("a call");
        assert_eq!(
            read::keys(&call),
            ["{u}:settled:lease-3", "{u}:answers:ab", "{u}:answers:ab:cd"]
        );
        assert_eq!(read::args(&call), ["2", "9", "3", "95"]);
    }
}
