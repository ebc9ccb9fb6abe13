//! Money budgets (`unit="cost"`) on one stream's ledger: tokens priced in the budget's unit at
//! reservation, in each round and at settlement, the charge rounded up once for the stream.

use super::*;
use crate::rate::{Algorithm, Bucket, Price, RatePolicy, Unit};

const A: Bucket = Bucket { slot: 1, epoch: 7 };
const B: Bucket = Bucket { slot: 2, epoch: 7 };

/// 0.15 units a prompt token, 0.6 an answer token, 0.075 a cached prompt token.
const PRICE: Price = Price {
    input: 150_000,
    output: 600_000,
    cached_input: 75_000,
};

/// A held stream that reserved `(input, output)` tokens into bucket A of each budget named, of
/// its unit, priced at `PRICE`.
fn stream(budgets: &[(&str, Unit)], (input, output): (u64, u64)) -> Ledger {
    let request = BudgetRequest {
        policies: Vec::new(),
        input,
        output,
        on_budget: OnBudget::Cut,
        price: Some(PRICE),
    };
    let accounts = budgets
        .iter()
        .map(|(name, unit)| {
            let policy = RatePolicy::new(name, 100_000, 60_000, Algorithm::SlidingWindow, *unit).unwrap();
            let usage = Usage {
                input,
                cached_input: 0,
                output,
            };
            let units = crate::rate::price::units_of(*unit, Some(&PRICE), usage);
            let reserved = vec![Charge {
                bucket: A,
                tokens: units,
                leaves_ms: 60_000,
            }];
            Account::new((*name).into(), policy, reserved)
        })
        .collect();
    let mut ledger = Ledger::new(accounts, &request, SLACK_ROOM);
    ledger.hold();
    ledger
}

/// (refunded from A, refunded from B, charged now) to `key` in a settlement.
fn totals(adjustments: &[Adjustment], key: &str) -> (u64, u64, u64) {
    let sum = |refund_from| {
        adjustments
            .iter()
            .filter(|a| a.key == key && a.refund_from == refund_from)
            .map(|a| a.tokens)
            .sum()
    };
    (sum(Some(A)), sum(Some(B)), sum(None))
}

#[test]
fn a_stream_of_one_token_chunks_is_charged_the_ceiling_of_its_whole_cost_not_a_unit_a_chunk() {
    let mut ledger = stream(&[("spend", Unit::Cost)], (10, 1_000));
    let mut moved = 0;
    for _ in 0..100 {
        ledger.consume(1).unwrap();
        let top_up = ledger.take_due(0).expect("the token streamed moves");
        moved += top_up.moved[0];
        let answer = ToppedUp {
            granted: 0,
            room: SLACK_ROOM,
            buckets: vec![Some((B, 60_000))],
        };
        assert!(ledger.topped_up(top_up.want, &answer, (0, 0)).is_empty());
    }
    // 10 * 0.15 + 100 * 0.6 = 61.5 units: 62 in all, the prompt's 2 kept where reserved.
    assert_eq!(moved, 60, "a ceiling per chunk would have moved 100");
    // Reserved 10 * 0.15 + 1,000 * 0.6 = 601.5: 602, less the 2 kept and the 60 moved.
    assert_eq!(totals(&ledger.end().unwrap(), "spend"), (540, 0, 0));
}

#[test]
fn a_report_with_cached_prompt_tokens_is_charged_the_cached_price() {
    let mut ledger = stream(&[("spend", Unit::Cost)], (10, 1_000));
    ledger.consume(100).unwrap();
    ledger
        .report(Usage {
            input: 10,
            cached_input: 10,
            output: 100,
        })
        .unwrap();
    // 10 * 0.075 + 100 * 0.6 = 60.75: 61, of which the prompt's 1 stays in A (of 2 reserved).
    assert_eq!(totals(&ledger.end().unwrap(), "spend"), (601, 0, 60));
}

#[test]
fn a_token_budget_and_a_cost_budget_are_each_charged_in_their_own_unit() {
    let mut ledger = stream(&[("tokens", Unit::Tokens), ("spend", Unit::Cost)], (10, 100));
    ledger.consume(100).unwrap();
    let top_up = ledger.take_due(0).expect("due: its reservation is used up");
    assert_eq!(top_up.moved, [100, 60]);
    assert_eq!(top_up.prices, [1_000_000, 600_000]);
    assert_eq!(top_up.want, TOP_UP);
    let answer = ToppedUp {
        granted: TOP_UP,
        room: SLACK_ROOM,
        buckets: vec![Some((B, 60_000)), Some((B, 60_000))],
    };
    ledger.topped_up(top_up.want, &answer, (0, 0));
    let settled = ledger.end().unwrap();
    // The top-up's 256 tokens came back to B, in tokens and in units (256 * 0.6 = 153.6: 154).
    assert_eq!(totals(&settled, "tokens"), (0, TOP_UP, 0));
    assert_eq!(totals(&settled, "spend"), (0, 154, 0));
}
