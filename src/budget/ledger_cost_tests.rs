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
        ..BudgetRequest::default()
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

#[test]
fn a_roll_takes_every_unit_held_past_the_streamed_ones_so_no_rounding_surplus_rolls_again() {
    // 100 answer tokens reserved: 60 units in A, which leaves the window at 60 s.
    let mut ledger = stream(&[("spend", Unit::Cost)], (0, 100));
    ledger.consume(100).unwrap();
    let one_token = |bucket| ToppedUp {
        granted: 1,
        room: 0,
        buckets: vec![Some((bucket, 60_000))],
    };
    // Three top-ups of one token each hold a unit each (rounded up) for 1.8 units of cost.
    for _ in 0..3 {
        let top_up = ledger.take_due(0).expect("due");
        ledger.topped_up(top_up.want, &one_token(B), (0, 0));
        ledger.consume(0).unwrap(); // due again: less than half an increment ahead
    }
    let roll_at = 60_000 - crate::budget::account::ROLL_AHEAD_MS;
    let roll = ledger
        .take_due(roll_at)
        .expect("B is about to leave the window: a roll");
    let given_back: u64 = roll.give_back[0].iter().map(|(_, units)| units).sum();
    assert_eq!(given_back, 3, "the surplus unit goes back with the others");
    assert!(ledger.accounts[0].reserved.is_empty(), "nothing left in B");
    let later = Bucket { slot: 3, epoch: 7 };
    ledger.topped_up(roll.want, &one_token(later), (roll_at, roll_at));
    ledger.due = false;
    assert!(
        ledger.take_due(roll_at).is_none(),
        "nothing held in a bucket about to leave"
    );
}
