//! The budget rules of docs/guide/token-budgets.md, on one stream's ledger.

use super::*;
use crate::budget::account::ROLL_AHEAD_MS;
use crate::rate::{Algorithm, Bucket, RatePolicy, Unit};

const A: Bucket = Bucket { slot: 1, epoch: 7 };
const B: Bucket = Bucket { slot: 2, epoch: 7 };
/// Room enough for the slack.
const ROOMY: u64 = SLACK_ROOM;

/// A held stream whose one budget (of `unit`, 60 s) reserved `(input, output)` into bucket A,
/// which leaves at 60 s; its budgets have `room` left.
fn stream(
    algorithm: Algorithm,
    unit: Unit,
    (input, output): (u64, u64),
    room: u64,
    on_budget: OnBudget,
) -> Ledger {
    let policy = RatePolicy::new("budget", 10_000, 60_000, algorithm, unit).unwrap();
    let reserved = vec![Charge {
        bucket: A,
        tokens: unit.of(input, output),
        leaves_ms: 60_000,
    }];
    let request = BudgetRequest {
        policies: vec![policy.clone()],
        input,
        output,
        on_budget,
        price: None,
        ..BudgetRequest::default()
    };
    let mut ledger = Ledger::new(vec![Account::new("key".into(), policy, reserved)], &request, room);
    ledger.hold();
    ledger
}

/// The usual stream: a sliding window, roomy budgets, cut when they run out.
fn ledger(unit: Unit, input: u64, output: u64) -> Ledger {
    stream(
        Algorithm::SlidingWindow,
        unit,
        (input, output),
        ROOMY,
        OnBudget::Cut,
    )
}

/// A report of `input` prompt tokens (none cached) and `output` answer tokens.
fn usage(input: u64, output: u64) -> Usage {
    Usage {
        input,
        cached_input: 0,
        output,
    }
}

fn answer(granted: u64, bucket: Bucket, room: u64) -> ToppedUp {
    ToppedUp {
        granted,
        room,
        buckets: vec![Some((bucket, 60_000))],
    }
}

/// Runs a round: takes the stream's top-up and answers it with `granted` tokens into B.
fn round(ledger: &mut Ledger, granted: u64, room: u64) -> TopUp {
    let top_up = ledger.take_due(0).expect("a top-up due");
    assert!(ledger
        .topped_up(top_up.want, &answer(granted, B, room), (0, 0))
        .is_empty());
    top_up
}

/// (refunded from A, refunded from B, charged now) in a settlement.
fn totals(adjustments: &[Adjustment]) -> (u64, u64, u64) {
    let from = |bucket| {
        adjustments
            .iter()
            .filter(|a| a.refund_from == Some(bucket))
            .map(|a| a.tokens)
            .sum()
    };
    let now = adjustments
        .iter()
        .filter(|a| a.refund_from.is_none())
        .map(|a| a.tokens)
        .sum();
    (from(A), from(B), now)
}

#[test]
fn a_stream_is_due_a_top_up_once_less_than_half_an_increment_of_its_reservation_is_left() {
    let mut ledger = ledger(Unit::OutputTokens, 0, 1_000);
    assert!(
        !ledger.consume(1_000 - TOP_UP / 2).unwrap(),
        "half an increment left"
    );
    assert!(ledger.consume(1).unwrap(), "due: the top-up loop is woken");
    assert!(!ledger.consume(1).unwrap(), "woken once");
}

#[test]
fn a_top_up_brings_the_stream_one_increment_ahead_of_what_it_streamed() {
    let mut ledger = ledger(Unit::OutputTokens, 0, 1_000);
    ledger.consume(900).unwrap();
    let top_up = round(&mut ledger, 156, ROOMY);
    assert_eq!((top_up.moved[0], top_up.want), (900, 900 + TOP_UP - 1_000));
    assert_eq!(ledger.covered, ledger.output + TOP_UP);
    assert!(!ledger.is_due());
}

#[test]
fn with_room_to_spare_a_stream_runs_one_increment_past_its_reservation_before_it_waits() {
    let mut ledger = ledger(Unit::OutputTokens, 0, 100);
    ledger.consume(100 + TOP_UP).unwrap();
    assert!(!ledger.is_waiting(), "within the slack");
    ledger.consume(1).unwrap();
    assert!(ledger.is_waiting(), "past the slack: it waits for its top-up");
    round(&mut ledger, TOP_UP, ROOMY);
    assert!(!ledger.is_waiting());
}

#[test]
fn with_little_room_left_a_stream_waits_as_soon_as_it_passes_its_reservation() {
    let mut tight = stream(
        Algorithm::SlidingWindow,
        Unit::OutputTokens,
        (0, 100),
        SLACK_ROOM - 1,
        OnBudget::Cut,
    );
    tight.consume(100).unwrap();
    assert!(!tight.is_waiting());
    tight.consume(1).unwrap();
    assert!(tight.is_waiting());
    // A top-up that leaves the budgets roomy gives the slack back, one that does not takes it.
    let mut roomy = ledger(Unit::OutputTokens, 0, 100);
    roomy.consume(100).unwrap();
    round(&mut roomy, TOP_UP, SLACK_ROOM - 1);
    roomy.consume(TOP_UP + 1).unwrap();
    assert!(roomy.is_waiting());
}

#[test]
fn a_stream_within_the_reservation_it_made_is_never_cut() {
    let mut ledger = ledger(Unit::OutputTokens, 0, 1_000);
    ledger.consume(1_000).unwrap();
    round(&mut ledger, 0, 0); // the window is full
    assert!(!ledger.is_exhausted() && !ledger.is_waiting());
    assert_eq!(
        totals(&ledger.end().unwrap()),
        (0, 0, 0),
        "the reservation was streamed"
    );
}

#[test]
fn a_top_up_short_of_what_the_stream_streamed_past_its_reservation_cuts_it() {
    let mut ledger = ledger(Unit::OutputTokens, 0, 100);
    ledger.consume(300).unwrap(); // 200 past the reservation, within the slack
    ledger.consume(100).unwrap();
    let top_up = round(&mut ledger, 50, ROOMY);
    assert_eq!((top_up.moved[0], top_up.want), (100, 400 + TOP_UP - 100));
    assert!(!top_up.forced);
    assert!(ledger.is_exhausted());
    assert!(matches!(ledger.consume(1), Err(CoreError::BudgetExhausted(name)) if name == "budget"));
    // Settled to what it streamed: the reservation left A with the move, the 50 granted come
    // back from B, the other 300 streamed are charged now.
    assert_eq!(totals(&ledger.end().unwrap()), (0, 50, 400 - 100));
}

#[test]
fn under_finish_a_stream_is_never_cut_and_its_top_ups_are_granted_above_the_limit() {
    let mut ledger = stream(
        Algorithm::SlidingWindow,
        Unit::OutputTokens,
        (0, 100),
        ROOMY,
        OnBudget::Finish,
    );
    ledger.consume(400).unwrap();
    let top_up = round(&mut ledger, 0, 0);
    assert!(
        top_up.forced,
        "the store grants a forced top-up whatever the room"
    );
    assert!(!ledger.is_exhausted());
    ledger.consume(100).unwrap();
}

#[test]
fn a_stream_cut_by_its_budget_streams_at_most_one_increment_and_a_chunk_past_its_grants() {
    for chunk in [1, 7, 50, 255, 300] {
        for round_every in [1, 3, 1_000] {
            let mut ledger = ledger(Unit::OutputTokens, 0, 100);
            let mut chunks = 0;
            while ledger.consume(chunk).is_ok() {
                chunks += 1;
                let runs_a_round = chunks % round_every == 0 || ledger.is_waiting();
                if let Some(top_up) = runs_a_round.then(|| ledger.take_due(0)).flatten() {
                    // The window is full: every top-up finds no room.
                    ledger.topped_up(top_up.want, &answer(0, B, 0), (0, 0));
                }
                assert!(!ledger.is_waiting(), "answered: the stream goes on or is cut");
            }
            assert!(
                ledger.output <= 100 + TOP_UP + chunk,
                "chunk {chunk}, a round every {round_every}: streamed {}",
                ledger.output
            );
        }
    }
}

#[test]
fn each_round_moves_the_tokens_streamed_since_the_last_out_of_their_reservation() {
    let mut ledger = ledger(Unit::Tokens, 100, 1_000);
    assert!(ledger.take_due(0).is_none(), "nothing streamed, nothing due");
    ledger.consume(300).unwrap();
    let top_up = round(&mut ledger, 0, ROOMY);
    // The prompt's 100 stay where they were reserved; the 300 streamed leave bucket A.
    assert_eq!((top_up.moved[0], top_up.want), (300, 0));
    assert_eq!(top_up.give_back, vec![vec![(A, 300)]]);
    ledger.consume(200).unwrap();
    let top_up = round(&mut ledger, 0, ROOMY);
    assert_eq!((top_up.moved[0], top_up.give_back), (200, vec![vec![(A, 200)]]));
    // Settled: the prompt stays, the 500 not streamed come back, nothing more is charged.
    assert_eq!(totals(&ledger.end().unwrap()), (500, 0, 0));
}

#[test]
fn a_stream_whose_budgets_count_only_the_prompt_has_nothing_to_move_or_top_up() {
    let mut ledger = ledger(Unit::InputTokens, 100, 1_000);
    assert!(!ledger.consume(5_000).unwrap(), "never due");
    assert!(ledger.take_due(0).is_none());
    assert!(!ledger.is_waiting());
    assert_eq!(totals(&ledger.end().unwrap()), (0, 0, 0));
}

#[test]
fn a_stream_shorter_than_a_round_is_charged_its_tokens_where_it_ended() {
    let mut ledger = ledger(Unit::OutputTokens, 0, 1_000);
    ledger.consume(300).unwrap();
    // No round ran: the whole reservation goes back to A, the 300 are charged now.
    assert_eq!(totals(&ledger.end().unwrap()), (1_000, 0, 300));
}

#[test]
fn a_grant_never_held_gives_its_whole_reservation_back() {
    let mut ledger = ledger(Unit::Tokens, 100, 1_000);
    ledger.held = false;
    assert_eq!(totals(&ledger.end().unwrap()), (1_100, 0, 0));
}

#[test]
fn a_report_replaces_the_estimate_and_the_count() {
    let mut ledger = ledger(Unit::Tokens, 100, 1_000);
    ledger.consume(400).unwrap();
    ledger.report(usage(80, 600)).unwrap();
    assert_eq!(ledger.used(), (80, 600));
    assert_eq!(ledger.references(), ((100, 1_000), 400));
    // The prompt's 80 stay in A, the other 1,020 reserved come back, the 600 are charged now.
    assert_eq!(totals(&ledger.end().unwrap()), (1_020, 0, 600));
}

#[test]
fn a_report_below_the_count_is_charged_the_count() {
    let mut ledger = ledger(Unit::OutputTokens, 0, 1_000);
    ledger.consume(400).unwrap();
    ledger.report(usage(0, 100)).unwrap();
    assert_eq!(ledger.used(), (0, 400));
    assert_eq!(totals(&ledger.end().unwrap()), (1_000, 0, 400));
}

#[test]
fn counting_and_reporting_after_the_release_are_refused_and_a_second_end_settles_nothing() {
    let mut ledger = ledger(Unit::OutputTokens, 0, 1_000);
    assert!(ledger.end().is_some());
    assert!(ledger.end().is_none());
    assert!(matches!(ledger.consume(1), Err(CoreError::Misuse(m)) if m.contains("consume() after")));
    assert!(
        matches!(ledger.report(usage(1, 1)), Err(CoreError::Misuse(m)) if m.contains("report_usage() after"))
    );
    assert!(ledger.take_due(0).is_none());
}

#[test]
fn a_top_up_answered_after_the_settlement_is_given_back_from_its_bucket() {
    let mut ledger = ledger(Unit::OutputTokens, 0, 100);
    ledger.consume(200).unwrap();
    let top_up = ledger.take_due(0).unwrap();
    assert_eq!(top_up.want, 200 + TOP_UP - 100);
    ledger.end().unwrap();
    let refunds = ledger.topped_up(top_up.want, &answer(top_up.want, B, ROOMY), (0, 0));
    assert_eq!(totals(&refunds), (0, top_up.want, 0));
}

#[test]
fn a_failed_move_leaves_its_tokens_counted_where_they_were_reserved() {
    let mut ledger = ledger(Unit::OutputTokens, 0, 1_000);
    ledger.consume(300).unwrap();
    let top_up = ledger.take_due(0).unwrap();
    assert!(ledger.top_up_failed(top_up.want, false), "tried again next round");
    assert!(ledger.is_due());
    // Never given back, never charged again: the 300 stay counted in A.
    assert_eq!(totals(&ledger.end().unwrap()), (700, 0, 0));
}

#[test]
fn a_failed_top_up_is_granted_here_under_failure_mode_open_and_charged_at_settlement() {
    let mut ledger = ledger(Unit::OutputTokens, 0, 100);
    ledger.consume(400).unwrap();
    assert!(ledger.is_waiting());
    let top_up = ledger.take_due(0).unwrap();
    assert!(!ledger.top_up_failed(top_up.want, true), "nothing to try again");
    assert!(!ledger.is_waiting() && !ledger.is_exhausted());
    assert_eq!(ledger.covered, 400 + TOP_UP);
    // The 100 moved stay in A (their call may have run); the other 300 are charged now.
    assert_eq!(totals(&ledger.end().unwrap()), (0, 0, 300));
}

#[test]
fn a_sliding_reservation_rolls_before_its_bucket_leaves_and_a_fixed_one_after() {
    let mut sliding = ledger(Unit::OutputTokens, 0, 1_000);
    assert!(sliding.take_due(60_000 - ROLL_AHEAD_MS - 1).is_none());
    let roll = sliding.take_due(60_000 - ROLL_AHEAD_MS).unwrap();
    assert_eq!((roll.want, roll.give_back), (1_000, vec![vec![(A, 1_000)]]));
    let mut fixed = stream(
        Algorithm::FixedWindow,
        Unit::OutputTokens,
        (0, 1_000),
        ROOMY,
        OnBudget::Cut,
    );
    assert!(
        fixed.take_due(59_999).is_none(),
        "taken again in the same window is no use"
    );
    assert_eq!(fixed.take_due(60_000).unwrap().want, 1_000);
}

#[test]
fn a_rolled_reservation_is_held_in_the_bucket_it_rolled_into() {
    let mut ledger = ledger(Unit::OutputTokens, 0, 1_000);
    let roll = ledger.take_due(60_000).unwrap();
    ledger.topped_up(roll.want, &answer(roll.want, B, ROOMY), (60_000, 60_000));
    assert_eq!(ledger.covered, 1_000);
    assert_eq!(totals(&ledger.end().unwrap()), (0, 1_000, 0));
}

#[test]
fn a_failed_roll_keeps_its_charges_where_they_were() {
    let mut ledger = ledger(Unit::OutputTokens, 0, 1_000);
    let roll = ledger.take_due(60_000).unwrap();
    ledger.top_up_failed(roll.want, false);
    assert_eq!(ledger.covered, 1_000);
    assert_eq!(totals(&ledger.end().unwrap()), (1_000, 0, 0));
}

#[test]
fn an_answer_is_sized_only_when_the_stream_started_was_not_cut_and_counted_some() {
    let mut finished = ledger(Unit::OutputTokens, 0, 1_000);
    assert_eq!(finished.answer(), None, "nothing counted");
    finished.consume(300).unwrap();
    assert_eq!(finished.answer(), Some(300));
    finished.report(usage(10, 320)).unwrap();
    assert_eq!(finished.answer(), Some(320), "the model's figure, as charged");

    let mut cut = ledger(Unit::OutputTokens, 0, 100);
    cut.consume(400).unwrap();
    let top_up = cut.take_due(0).unwrap();
    cut.topped_up(top_up.want, &answer(0, B, 0), (0, 0));
    assert!(cut.is_exhausted());
    assert_eq!(cut.answer(), None, "cut for its budget");

    let policy = RatePolicy::new(
        "budget",
        10_000,
        60_000,
        Algorithm::SlidingWindow,
        Unit::OutputTokens,
    );
    let request = BudgetRequest {
        output: 100,
        ..BudgetRequest::default()
    };
    let account = Account::new("key".into(), policy.unwrap(), Vec::new());
    let mut never_started = Ledger::new(vec![account], &request, ROOMY);
    never_started.consume(5).unwrap();
    assert_eq!(never_started.answer(), None, "never held");
}
