use super::*;

fn space(secret: &[u8]) -> KeySpace {
    KeySpace::with("app", secret, 2, Some(0))
}

#[test]
fn without_a_global_pool_each_user_has_a_tag_of_its_own() {
    let space = KeySpace::with("app", b"", 2, None);
    let pools = space.pools_for(Some("alice"), &[]);
    assert_eq!(pools.len(), 1);
    let digest = space.identity_digest("alice");
    assert_eq!(&*pools[0].key, format!("{{app:{digest}}}:user"));
    assert_eq!(&*pools[0].holders, format!("{{app:{digest}}}:holders"));
}

#[test]
fn keys_share_one_hash_tag_and_hide_the_identity() {
    let pools = space(b"").pools_for(Some("alice@example.com"), &[]);
    assert!(pools.iter().all(|p| p.key.starts_with("{app}:")));
    assert!(pools.iter().all(|p| !p.key.contains("alice")));
    assert_eq!(pools[0].capacity, 2);
    assert_eq!(pools[1].capacity, 0);
}

#[test]
fn resources_share_the_tag_and_need_no_identity() {
    let pools = space(b"").pools_for(None, &[("db".into(), 5)]);
    let db = Pool::new("db", "{app}:resource:db".into(), 5, PoolRole::Shared);
    assert_eq!(pools, vec![db]);
    assert_eq!(space(b"").pools_for(Some("u"), &[("db".into(), 5)]).len(), 3);
    assert!(check_resource("db", 5).is_ok());
    assert!(check_resource("a b", 5).is_err() && check_resource("db", 0).is_err());
    assert!(
        check_resource("per_user", 5).is_err(),
        "reserved for the user's own quota"
    );
}

#[test]
fn a_digest_is_the_identitys_hmac_sha256() {
    // RFC 4231, test case 2, its first 128 bits; twice, from the one keyed state.
    let keys = space(b"Jefe");
    for _ in 0..2 {
        assert_eq!(
            keys.identity_digest("what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c7"
        );
    }
}

#[test]
fn the_secret_changes_every_digest() {
    assert_ne!(
        space(b"").identity_digest("u1"),
        space(b"s3cret").identity_digest("u1")
    );
    assert_eq!(
        space(b"k").identity_digest("u1"),
        space(b"k").identity_digest("u1")
    );
    assert_eq!(space(b"k").identity_digest("u1").len(), 32);
}

#[test]
fn a_models_answers_live_in_the_tag_of_the_counter_and_hide_its_name() {
    let keys = space(b"k");
    let answers = keys.answers_key("{app:ab}:rate:tpm", "gpt-x");
    assert_eq!(
        answers,
        format!("{{app:ab}}:answers:{}", keys.identity_digest("gpt-x"))
    );
    assert!(!answers.contains("gpt"));
    let own = keys.own_answers_key(&answers, "alice");
    assert_eq!(own, format!("{answers}:{}", keys.identity_digest("alice")));
    assert!(!own.contains("alice"));
}

#[test]
fn holders_share_the_tag_of_their_pools() {
    assert_eq!(holders_key("{app}:user:ab"), "{app}:holders");
    assert_eq!(holders_key("{app:ab}:user"), "{app:ab}:holders");
    assert_eq!(hash_tag("plain"), "plain");
}

#[test]
fn identities_are_checked() {
    assert!(check_identity("").is_err());
    assert!(check_identity(&"x".repeat(MAX_IDENTITY_BYTES + 1)).is_err());
    assert!(check_identity(&"x".repeat(MAX_IDENTITY_BYTES)).is_ok());
}

#[test]
fn a_rate_counter_is_named_by_its_scope_and_digest_in_the_identitys_tag() {
    use crate::rate::{Algorithm, Unit};
    let minute = RatePolicy::new("per_minute", 5, 60_000, Algorithm::SlidingWindow, Unit::Requests).unwrap();
    let tokens = RatePolicy::new("tokens", 800, 86_400_000, Algorithm::FixedWindow, Unit::Tokens).unwrap();
    // The counters live in Redis across releases of the library: their names must not move.
    let shared = space(b"k");
    let digest = shared.identity_digest("alice");
    assert_eq!(
        shared.rate_key("alice", &minute),
        format!("{{app}}:rate:per_minute:60000s:{digest}")
    );
    assert_eq!(
        shared.rate_key("alice", &tokens),
        format!("{{app}}:rate:tokens:86400000ft:{digest}")
    );
    let tagged = KeySpace::with("app", b"k", 2, None);
    assert_eq!(
        tagged.rate_key("alice", &minute),
        format!("{{app:{digest}}}:rate:per_minute:60000s")
    );
    assert_eq!(
        tagged.rate_key_of_digest(&digest, &tokens),
        tagged.rate_key("alice", &tokens)
    );
}
