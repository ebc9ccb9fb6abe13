//! The model of leased units (`protocol_model::leased_units`) checked exhaustively: every
//! property holds with the safeguards the code has, and turning one off breaks the property it
//! guards.

use protocol_model::discoveries;
use protocol_model::leased_units::{
    LeasedUnitsConfig, LeasedUnitsModel, COUNTED_WITHIN_LIMIT, SERVED_HERE, SERVED_IN_ITS_WINDOW,
};

/// The properties that have a counterexample (or, for `sometimes`, an example) in `cfg`.
fn discovered(cfg: LeasedUnitsConfig) -> Vec<&'static str> {
    discoveries::discovered(LeasedUnitsModel { cfg })
}

#[test]
fn with_every_safeguard_no_window_serves_more_than_the_limit() {
    assert_eq!(discovered(LeasedUnitsConfig::small()), [SERVED_HERE]);
}

#[test]
fn freshness_dated_from_the_answer_serves_units_after_their_window() {
    let cfg = LeasedUnitsConfig {
        dated_from_send: false,
        ..LeasedUnitsConfig::small()
    };
    assert!(discovered(cfg).contains(&SERVED_IN_ITS_WINDOW));
}

#[test]
fn taking_ahead_past_half_the_room_counts_over_the_limit() {
    let cfg = LeasedUnitsConfig {
        half_the_room: false,
        ..LeasedUnitsConfig::small()
    };
    assert!(discovered(cfg).contains(&COUNTED_WITHIN_LIMIT));
}
