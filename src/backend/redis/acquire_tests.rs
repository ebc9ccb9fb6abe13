use super::super::hit::tests::policy;
use super::super::layout::read;
use super::super::line::tests::line;
use super::*;
use crate::backend::Waiter;
use crate::config::LineOrder;
use crate::keys::{Pool, PoolRole};
use crate::lease::Store;

fn lease() -> Arc<LeaseRecord> {
    let pools = vec![
        Pool::new("per_user", "{t}:user:a".into(), 2, PoolRole::Own),
        Pool::new("global", "{t}:global".into(), 10, PoolRole::Shared),
    ];
    Arc::new(LeaseRecord::new(pools, 3, Store::Main))
}

fn rates() -> RateCheck {
    RateCheck {
        keys: vec!["{t}:rate:a".into()],
        policies: vec![policy("a", 5)],
        costs: vec![1],
    }
}

#[test]
fn an_acquire_reads_back_as_the_script_reads_it() {
    let (lease, line, rates) = (lease(), line(), rates());
    let waiter = Waiter {
        id: "w1".into(),
        ttl_ms: 4000,
    };
    let in_line = InLine {
        line: &line,
        waiter: Some(&waiter),
        priority: 7,
        order: LineOrder::Arrival,
        max_waiting: &[0, 50],
        own_waits: true,
    };
    let asked = Asked {
        terms: GrantTerms {
            ttl_ms: 30_000,
            fencing: true,
            renew_every_ms: 10_000,
            entry_known_until_ms: None,
        },
        in_line: Some(in_line),
        rates: &rates,
        channel: "!{t}:line:wake".into(),
        holder: 777,
    };
    let call = acquire_request(&lease, &asked);
    let text = |items: &[Vec<u8>]| items.iter().map(|i| read::text(i).to_owned()).collect::<Vec<_>>();
    assert_eq!(
        text(&call.head_keys),
        ["{t}:holders", "{t}:line", "{t}:line:alive", "{t}:line:tickets"]
    );
    assert_eq!(text(&call.head_args[..2]), ["!{t}:line:wake", "777"]);
    // lease ms, line keys, arrival order, own waits, fencing, renewal period, entry trusted
    assert_eq!(read::shape(&call.head_args[2]), [30_000, 1, 1, 1, 1, 10_000, 0]);
    assert_eq!(text(&call.keys), ["{t}:user:a", "{t}:global", "{t}:rate:a"]);
    let args = text(&call.args);
    assert_eq!(args[..2], [lease.id.as_str(), "w1"]);
    // weight, waiter liveness, own pools, n, priority, capacities, max_waiting
    assert_eq!(
        read::shape(call.args[2].as_slice()),
        [3, 4000, 1, 2, 7, 2, 10, 0, 50]
    );
    // the lease's tally: 2 pools x weight 3, each member a unit and the id's value (24 bits)
    let tally = 6 * ((1u64 << 44) + lease.id_value());
    assert_eq!(args[3], tally.to_string());
    assert_eq!(args[4..], ["f", "5", "60000", "1", "1"]);
    assert_eq!(call.tag, "t");
}

#[test]
fn an_acquire_without_a_line_sends_no_line_keys() {
    let lease = lease();
    let terms = GrantTerms {
        ttl_ms: 30_000,
        fencing: false,
        renew_every_ms: 10_000,
        entry_known_until_ms: None,
    };
    let (keys, args) = acquire_call(777, terms, &[Arc::clone(&lease), Arc::clone(&lease)]);
    let keys: Vec<&str> = keys.iter().map(|k| read::text(k)).collect();
    assert_eq!(
        keys,
        [
            "{t}:holders",
            "{t}:user:a",
            "{t}:global",
            "{t}:user:a",
            "{t}:global"
        ]
    );
    let args: Vec<&str> = args.iter().map(|a| read::text(a)).collect();
    // the frame: two requests; a head of 1 key, 3 args; each request's counts; then the head's
    // args, then the requests'
    assert_eq!(read::shape(args[0].as_bytes()), [2, 1, 3, 2, 4, 2, 4]);
    assert_eq!(args[1..3], ["", "777"]);
    assert_eq!(read::shape(args[3].as_bytes()), [30_000, 0, 0, 0, 0, 10_000, 0]);
    assert_eq!(args[4], lease.id.as_str());
    assert_eq!(read::shape(args[6].as_bytes()), [3, 0, 1, 2, 0, 2, 10, 0, 0]);
    // An entry the process knows to live long enough: the head says the call may trust it.
    let trusting = GrantTerms {
        entry_known_until_ms: Some(40_000),
        ..terms
    };
    let (_, args) = acquire_call(777, trusting, &[lease]);
    assert_eq!(read::shape(&args[3])[6], 1);
}

#[test]
fn each_reply_of_the_script_decodes_to_its_outcome() {
    let (lease, line, rates) = (lease(), line(), rates());
    let in_line = InLine {
        line: &line,
        waiter: None,
        priority: 0,
        order: LineOrder::Fair,
        max_waiting: &[0, 50],
        own_waits: false,
    };
    let decode = |reply: &[u64]| decode_acquire(reply, &lease, Some(in_line), &rates.policies, 9, None);
    let Ok(AcquireOutcome::Granted {
        used,
        entry_life_ms,
        fencing_token,
        rates: decisions,
        sent_at_ms,
    }) = decode(&[GRANTED, 0, 1_700_000_000_000_001, 1, 4, 2, 500, 3, 1, 0])
    else {
        panic!("granted")
    };
    assert_eq!(
        (used, fencing_token, sent_at_ms),
        (vec![1, 4], Some(1_700_000_000_000_001), 9)
    );
    assert_eq!(entry_life_ms, None, "the entry was not live: written anew");
    let Ok(AcquireOutcome::Granted { fencing_token, .. }) = decode(&[GRANTED, 1, 0, 1, 4, 2, 500, 3, 1, 0])
    else {
        panic!("granted")
    };
    assert_eq!(fencing_token, None, "a head that asks for no token gets 0: none");
    assert_eq!(decisions[0].remaining, 3);
    // A grant that trusted the entry life its process knew is dated from that, whatever the
    // reply's figure; one whose trust ran out on the way arrives with no life left (overdue).
    for (until, life) in [(25_009, 25_000), (5, 0)] {
        let trusted = decode_acquire(
            &[GRANTED, 20_000, 0, 1, 4, 2, 500, 3, 1, 0],
            &lease,
            Some(in_line),
            &rates.policies,
            9,
            Some(until),
        );
        let Ok(AcquireOutcome::Granted { entry_life_ms, .. }) = trusted else {
            panic!("granted")
        };
        assert_eq!(entry_life_ms, Some(life));
    }
    let Ok(AcquireOutcome::RateLimited(limited)) = decode(&[RATE_LIMITED, 1, 800, 5, 800, 0, 0, 1]) else {
        panic!("rate limited")
    };
    assert_eq!(limited.refused, Some((0, 800)));
    assert!(limited.decisions[0].would_refuse);
    assert_eq!(
        decode(&[WAIT, 12, 2, 50, 0, 3]).ok(),
        Some(AcquireOutcome::Wait(Placed {
            ticket: 12,
            places: vec![0, 3],
            full: (1, 50),
        }))
    );
    assert_eq!(decode(&[BANNED, 1500]).ok(), Some(AcquireOutcome::Banned(1500)));
    let Ok(AcquireOutcome::Rejected(refused)) = decode(&[REFUSED, 1, 2, 30_000]) else {
        panic!("refused")
    };
    assert_eq!(
        (&*refused.limit, refused.capacity, refused.current),
        ("per_user", 2, 2)
    );
    let Ok(AcquireOutcome::LineFull { full, displaced }) = decode(&[LINE_FULL, 2, 50, 100, 1]) else {
        panic!("line full")
    };
    assert_eq!(
        (&*full.limit, full.capacity, full.current, displaced),
        ("global", 50, 50, true)
    );
}

#[test]
fn a_reply_of_another_shape_is_an_error() {
    let (lease, rates) = (lease(), rates());
    let decode = |reply: &[u64]| decode_acquire(reply, &lease, None, &rates.policies, 0, None);
    for reply in [
        &[][..],
        &[GRANTED, 1, 1, 4],
        &[GRANTED, 1, 1, 4, 2, 500, 3, 1, 0],
        &[GRANTED, 1, 7, 1, 4, 2, 500, 3, 1],
        &[RATE_LIMITED, 2, 800, 5, 800, 0, 0, 1],
        &[WAIT, 12, 2, 50, 0],
        &[WAIT, 12, 3, 50, 0, 3],
        &[REFUSED, 3, 2, 30_000],
        &[REFUSED, 1, 2, 30_000, 1],
        &[9],
    ] {
        assert!(decode(reply).is_err(), "{reply:?}");
    }
}

#[test]
fn a_grant_nobody_takes_is_released_and_a_place_nobody_takes_is_left() {
    let undo = |waiter| {
        Box::new(AcquireUndo {
            lease: lease(),
            waiter,
            rates: RateCheck::default(),
        })
    };
    let names = |calls: Vec<Invocation>| -> Vec<String> {
        calls
            .iter()
            .map(|call| {
                call.script
                    .function
                    .rsplit('_')
                    .next()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect()
    };
    let waiting = Some((line(), "w1".to_owned()));
    assert_eq!(
        names(undo(None).invocations(&[GRANTED, 1, 7, 1, 4], 7)),
        ["release"]
    );
    assert_eq!(
        names(undo(waiting.clone()).invocations(&[WAIT, 12, 2, 50, 0, 3], 7)),
        ["leave"]
    );
    assert!(undo(None).invocations(&[WAIT, 12, 2, 50, 0, 3], 7).is_empty());
    assert!(undo(waiting).invocations(&[REFUSED, 1, 2, 30_000], 7).is_empty());
}
