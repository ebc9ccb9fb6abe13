use super::*;

fn rule(proxies: &[&str], header: &str) -> ProxyRule {
    ProxyRule::new(proxies.iter().map(|p| p.to_string()).collect(), header).unwrap()
}

#[test]
fn a_header_from_a_peer_that_is_no_proxy_is_the_clients_own_text() {
    let rule = rule(&["10.0.0.0/8"], "X-Forwarded-For");
    assert_eq!(
        rule.client(Some("198.51.100.7"), &["203.0.113.9"]),
        "198.51.100.7"
    );
}

#[test]
fn the_walk_goes_from_the_right_past_trusted_proxies() {
    let rule = rule(&["10.0.0.0/8"], "X-Forwarded-For");
    let lines = ["1.1.1.1, 203.0.113.9", "10.0.0.8"];
    assert_eq!(rule.client(Some("10.1.2.3"), &lines), "203.0.113.9");
    // All hops are proxies: the leftmost is the client.
    assert_eq!(rule.client(Some("10.1.2.3"), &["10.0.0.9, 10.0.0.8"]), "10.0.0.9");
}

#[test]
fn a_malformed_entry_stops_the_walk() {
    let rule = rule(&["10.0.0.0/8"], "X-Forwarded-For");
    assert_eq!(
        rule.client(Some("10.1.2.3"), &["203.0.113.9, unknown, 10.0.0.8"]),
        "10.0.0.8"
    );
}

#[test]
fn without_the_header_the_peer_is_the_client() {
    let rule = rule(&["10.0.0.0/8"], "CF-Connecting-IP");
    assert_eq!(rule.client(Some("10.1.2.3"), &[]), "10.1.2.3");
}

#[test]
fn forwarded_elements_name_their_for_node() {
    let rule = rule(&["10.0.0.0/8"], "forwarded");
    let lines = [
        r#"for="_hidden", for=198.51.100.1;proto=https"#,
        r#"For="[2001:db8:cafe::17]:4711""#,
    ];
    assert_eq!(rule.client(Some("10.1.2.3"), &lines), "2001:db8:cafe::17");
    let behind = [r#"for=192.0.2.60;proto=http;by=203.0.113.43, for="10.0.0.8:80""#];
    assert_eq!(rule.client(Some("10.1.2.3"), &behind), "192.0.2.60");
    // An element with no `for`, or two, stops the walk.
    assert_eq!(
        rule.client(Some("10.1.2.3"), &["for=192.0.2.1", "proto=https"]),
        "10.1.2.3"
    );
    let twice = ["for=192.0.2.1;for=192.0.2.2"];
    assert_eq!(rule.client(Some("10.1.2.3"), &twice), "10.1.2.3");
    // A quoted `;` belongs to its value.
    let host = [r#"for=192.0.2.1;host="a;for=203.0.113.9""#];
    assert_eq!(rule.client(Some("10.1.2.3"), &host), "192.0.2.1");
}

#[test]
fn a_clients_unbalanced_quote_does_not_swallow_the_proxies_hops() {
    let forwarded = rule(&["10.0.0.0/8"], "Forwarded");
    let lines = [r#"for="203.0.113.9"#, "for=198.51.100.1"];
    assert_eq!(forwarded.client(Some("10.1.2.3"), &lines), "198.51.100.1");
    let lines = [r#"for="203.0.113.9, for=198.51.100.1"#];
    assert_eq!(forwarded.client(Some("10.1.2.3"), &lines), "198.51.100.1");
    let forwarded_for = rule(&["10.0.0.0/8"], "X-Forwarded-For");
    assert_eq!(
        forwarded_for.client(Some("10.1.2.3"), &[r#""203.0.113.9, 198.51.100.1"#]),
        "198.51.100.1"
    );
}

#[test]
fn a_single_address_header_is_read_from_its_last_line() {
    let rule = rule(&["10.0.0.0/8"], "X-Real-IP");
    assert_eq!(
        rule.client(Some("10.1.2.3"), &["203.0.113.9", "198.51.100.1"]),
        "198.51.100.1"
    );
    assert_eq!(
        rule.client(Some("10.1.2.3"), &["203.0.113.9, 198.51.100.1"]),
        "10.1.2.3"
    );
}

#[test]
fn ipv4_mapped_peers_are_their_ipv4_address() {
    let rule = rule(&["10.0.0.0/8", "::1"], "X-Forwarded-For");
    assert_eq!(
        rule.client(Some("::ffff:10.0.0.1"), &["203.0.113.9:4711"]),
        "203.0.113.9"
    );
    assert_eq!(rule.client(Some("::1"), &["[2001:db8::1]:80"]), "2001:db8::1");
    assert_eq!(rule.client(Some("::ffff:198.51.100.7"), &[]), "198.51.100.7");
    assert_eq!(rule.client(None, &[]), "unknown");
}

#[test]
fn networks_and_header_names_are_checked() {
    for good in ["10.0.0.0/8", "192.168.1.7", "fd00::/8", "0.0.0.0/0", "::/0"] {
        assert!(Network::parse(good).is_some(), "{good}");
    }
    for bad in [
        "nope",
        "10.0.0.0/33",
        "10.0.0.0/",
        "10.0.0.0/+8",
        "fd00::/129",
        "",
    ] {
        assert!(Network::parse(bad).is_none(), "{bad}");
    }
    assert!(Network::parse("0.0.0.0/0")
        .unwrap()
        .contains("203.0.113.9".parse().unwrap()));
    for (mapped, ipv4) in [
        ("::ffff:10.0.0.0/104", "10.0.0.0/8"),
        ("::ffff:192.0.2.7", "192.0.2.7"),
        ("::FFFF:0.0.0.0/96", "0.0.0.0/0"),
    ] {
        let refused = ProxyRule::new(vec![mapped.to_owned()], DEFAULT_PROXY_HEADER);
        assert_eq!(
            refused,
            Err(ProxyRuleError::Mapped(mapped.to_owned(), ipv4.to_owned()))
        );
        assert!(refused
            .unwrap_err()
            .to_string()
            .contains(&format!("write it as '{ipv4}'")));
    }
    assert!(ProxyRule::new(vec!["::/0".to_owned(), "::ffff:0:0/95".to_owned()], "Forwarded").is_ok());
    let error = ProxyRule::new(vec![], "X Real IP").unwrap_err();
    assert!(error.to_string().contains("is not a header name"));
    assert_eq!(
        ProxyRule::new(vec![], ""),
        Err(ProxyRuleError::Header(String::new()))
    );
}
