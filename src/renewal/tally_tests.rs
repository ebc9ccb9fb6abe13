//! The tallies' judgement of counts and sums of ids, window by window.

use std::sync::Arc;

use super::*;
use crate::keys::{Pool, PoolRole};
use crate::lease::Store;

fn lease(weight: u32) -> Arc<LeaseRecord> {
    let pool = |key: &str| Pool::new("global", key.into(), 0, PoolRole::Shared);
    Arc::new(LeaseRecord::new(
        vec![pool("{t}:user:a"), pool("{t}:global")],
        weight,
        Store::Main,
    ))
}

#[test]
fn a_count_is_short_or_in_excess_only_beyond_every_figure_of_its_window() {
    let tag = "{t}:holders";
    let mut tallies = Tallies::default();
    let (a, b) = (lease(1), lease(2));
    tallies.flight_start(&a, false);
    tallies.hold(&a, true);
    tallies.flight_end(&a, true);
    tallies.open_windows();
    assert!(
        !tallies.close_window(tag, Counted::of(&[&a])),
        "one lease of weight 1 in two pools"
    );
    assert!(tallies.take_excess().is_empty());

    tallies.open_windows();
    tallies.flight_start(&b, false); // its script may or may not run before Redis counts
    tallies.flight_start(&a, true); // a release, then its call
    tallies.hold(&a, false);
    tallies.flight_end(&a, true);
    assert!(!tallies.close_window(tag, Counted::of(&[&a, &b])));
    assert!(tallies.take_excess().is_empty(), "b may have been granted");

    tallies.open_windows();
    tallies.flight_start(&b, false);
    assert!(!tallies.close_window(tag, Counted::of(&[&b])));
    tallies.flight_start(&a, false); // after the answer: not part of that window
    tallies.flight_end(&b, false); // b was refused: it never counted
    assert_eq!(
        tallies.take_excess(),
        vec![tag.to_owned()],
        "4 members, none held"
    );

    tallies.flight_start(&a, false);
    tallies.hold(&a, true);
    tallies.flight_end(&a, true);
    tallies.open_windows();
    assert!(tallies.close_window(tag, Counted::of(&[])), "a grant is missing");
    tallies.open_windows();
    assert!(
        tallies.close_window(tag, Counted { members: 3, ids: 0 }),
        "above the most it may have: checked one by one too"
    );
    assert_eq!(tallies.in_flight(tag), Vec::<String>::new());
}

/// The last lease of a tag lost (swept) while its keep-alive was under way, then its release
/// started, must not drop and recreate the tally without the window's figures: the answer
/// would look like an excess and a prune would follow, with no fault.
#[test]
fn a_tally_keeps_its_window_while_its_last_lease_goes() {
    let tag = "{t}:holders";
    let mut tallies = Tallies::default();
    let a = lease(1);
    tallies.flight_start(&a, false);
    tallies.hold(&a, true);
    tallies.flight_end(&a, true);
    tallies.open_windows();
    tallies.hold(&a, false); // lost at its deadline
    tallies.flight_start(&a, true); // its release
    assert!(!tallies.close_window(tag, Counted::of(&[&a])));
    tallies.flight_end(&a, true);
    assert!(
        tallies.take_excess().is_empty(),
        "2 members were held in the window"
    );
    tallies.open_windows();
    assert!(tallies.by_tag.is_empty(), "then the tally goes");
}

/// A failover that lost a grant and brought back a released lease of the same size left the
/// count right: only the sum of ids tells.
#[test]
fn a_grant_swapped_for_a_release_is_found_by_the_sum_of_ids() {
    let tag = "{t}:holders";
    let mut tallies = Tallies::default();
    let (held, released) = (lease(1), lease(1));
    tallies.flight_start(&held, false);
    tallies.hold(&held, true);
    tallies.flight_end(&held, true);
    tallies.open_windows();
    assert!(tallies.close_window(tag, Counted::of(&[&released])));
    assert_eq!(
        tallies.take_excess(),
        vec![tag.to_owned()],
        "the released lease may be back: pruned at the next round"
    );
    tallies.open_windows();
    assert!(!tallies.close_window(tag, Counted::of(&[&held])));
    assert!(tallies.take_excess().is_empty());
}

/// Leases that change during the keep-alive's call may or may not be counted: any choice of
/// them explains the sum.
#[test]
fn a_sum_is_explained_by_any_choice_of_the_leases_that_changed_during_the_call() {
    let tag = "{t}:holders";
    let (kept, granted, released, stranger) = (lease(1), lease(2), lease(1), lease(2));
    let judged = |counted: &[&Arc<LeaseRecord>]| {
        let mut tallies = Tallies::default();
        for record in [&kept, &released] {
            tallies.flight_start(record, false);
            tallies.hold(record, true);
            tallies.flight_end(record, true);
        }
        tallies.open_windows();
        tallies.flight_start(&granted, false);
        tallies.hold(&granted, true);
        tallies.flight_end(&granted, true);
        tallies.hold(&released, false);
        tallies.flight_start(&released, true);
        let counted: Vec<&LeaseRecord> = counted.iter().map(|lease| &***lease).collect();
        tallies.close_window(tag, Counted::of(&counted))
    };
    for explained in [
        vec![&kept, &granted],
        vec![&kept, &released],
        vec![&kept, &granted, &released],
    ] {
        assert!(!judged(&explained), "{} leases", explained.len());
    }
    assert!(
        judged(&[&stranger, &released]),
        "kept is missing: as many members as kept and granted, another sum"
    );
}

/// A call during which more than `MOST_CHANGES_JUDGED` leases changed has its sum of ids
/// left unjudged (the count still is); one with that many is judged.
#[test]
fn a_sum_is_judged_when_at_most_twelve_leases_changed_during_the_call() {
    let tag = "{t}:holders";
    let judged = |changes: usize| {
        let (held, released) = (lease(1), lease(1));
        let mut tallies = Tallies::default();
        tallies.flight_start(&held, false);
        tallies.hold(&held, true);
        tallies.flight_end(&held, true);
        tallies.open_windows();
        for _ in 0..changes {
            let refused = lease(1);
            tallies.flight_start(&refused, false);
            tallies.flight_end(&refused, false);
        }
        tallies.close_window(tag, Counted::of(&[&released]))
    };
    assert_eq!(MOST_CHANGES_JUDGED, 12, "the number docs/guide/failures.md gives");
    assert!(
        judged(MOST_CHANGES_JUDGED),
        "a grant swapped for a release, found"
    );
    assert!(!judged(MOST_CHANGES_JUDGED + 1), "left to a later call");
}

impl Counted {
    /// What Redis counts for these leases' members.
    pub fn of(leases: &[&LeaseRecord]) -> Self {
        leases
            .iter()
            .fold(Counted { members: 0, ids: 0 }, |counted, lease| Counted {
                members: counted.members + lease.units(),
                ids: counted.ids + lease.units() * lease.id_value(),
            })
    }
}
