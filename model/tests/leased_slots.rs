//! The model of a global pool's slots leased in slabs (`protocol_model::leased_slots`) checked
//! exhaustively: every property holds with the safeguards the code has, and turning one off
//! breaks the property it guards.

use protocol_model::discoveries;
use protocol_model::leased_slots::{LeasedSlotsConfig, LeasedSlotsModel, SERVED_AHEAD, SERVED_FROM_COUNTED};

/// The properties that have a counterexample (or, for `sometimes`, an example) in `cfg`.
fn discovered(cfg: LeasedSlotsConfig) -> Vec<&'static str> {
    discoveries::discovered(LeasedSlotsModel { cfg })
}

#[test]
fn with_every_safeguard_every_stream_is_served_from_a_slab_the_store_counts() {
    assert_eq!(discovered(LeasedSlotsConfig::small()), [SERVED_AHEAD]);
}

#[test]
fn a_slab_still_serving_while_its_give_back_is_on_its_way_serves_streams_the_store_dropped() {
    let cfg = LeasedSlotsConfig {
        withdrawn_when_given_back: false,
        ..LeasedSlotsConfig::small()
    };
    assert!(discovered(cfg).contains(&SERVED_FROM_COUNTED));
}

#[test]
fn a_slab_found_lost_that_does_not_end_its_streams_leaves_them_uncounted() {
    let cfg = LeasedSlotsConfig {
        loss_ends_streams: false,
        ..LeasedSlotsConfig::small()
    };
    assert!(discovered(cfg).contains(&SERVED_FROM_COUNTED));
}
