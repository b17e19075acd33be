//! SSRF spellings, table-driven: `parse_target` + `DestinationPolicy::check_url`.
#![allow(clippy::unwrap_used)]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use wharf_proxy::destination::{
    parse_target, special_range, DestinationPolicy, Refusal, TargetError,
};

fn strict() -> DestinationPolicy {
    DestinationPolicy::new(false, &[])
}

fn check(policy: &DestinationPolicy, raw: &str) -> Result<(), Refusal> {
    let url = parse_target(raw).unwrap_or_else(|e| panic!("{raw}: parse failed: {e}"));
    policy.check_url(&url)
}

/// Spellings of special-purpose destinations; each must parse and then be refused (403).
const REFUSED: &[&str] = &[
    // IPv4 loopback, however written.
    "http://127.0.0.1/",
    "http://127.0.0.1./",
    "http://127.255.255.254/",
    "http://2130706433/",
    "http://0x7f.1/",
    "http://0x7F.0.0.1/",
    "http://0177.0.0.1/",
    "http://0177.1/",
    "http://127.1/",
    "http://127.0.1/",
    "http://0x7f000001/",
    "http://017700000001/",
    "http://%31%32%37.0.0.1/",
    "https://127.0.0.1:8443/path?q=1",
    // Local names (RFC 6761).
    "http://localhost/",
    "http://LOCALHOST./",
    "http://localhost:8080/",
    "http://LocalHost/",
    "http://a.b.localhost/",
    "http://foo.localhost./",
    "http://ｌｏｃａｌｈｏｓｔ/",
    // IPv6 loopback, unspecified and IPv4 embedded in IPv6.
    "http://[::1]/",
    "http://[0:0:0:0:0:0:0:1]/",
    "http://[::]/",
    "http://[::ffff:127.0.0.1]/",
    "http://[::ffff:7f00:1]/",
    "http://[::127.0.0.1]/",
    "http://[::8.8.8.8]/",
    "http://[0:0:0:0:0:ffff:10.0.0.1]/",
    "http://[::ffff:169.254.169.254]/",
    "http://[::ffff:0.0.0.0]/",
    "http://[64:ff9b::a00:1]/",
    "http://[64:ff9b::127.0.0.1]/",
    "http://[64:ff9b::169.254.169.254]/",
    "http://[64:ff9b:1::a00:1]/",
    "http://[2002:7f00:1::]/",
    "http://[2002:a9fe:a9fe::1]/",
    "http://[2002:c0a8:101::]/",
    "http://[2001::1]/",
    "http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/",
    // IPv6 special-purpose ranges.
    "http://[fe80::1]/",
    "http://[febf::1]/",
    "http://[fec0::1]/",
    "http://[fc00::1]/",
    "http://[fd12::1]/",
    "http://[fd00:ec2::254]/",
    "http://[ff02::1]/",
    "http://[ff05::1:3]/",
    "http://[2001:db8::1]/",
    "http://[3fff::1]/",
    "http://[100::1]/",
    "http://[2001:2::1]/",
    "http://[2001:20::1]/",
    "http://[5f00::1]/",
    "http://[4000::1]/",
    "http://[::2:0:0:1]/",
    // IPv4 "this network" and unspecified.
    "http://0.0.0.0/",
    "http://0/",
    "http://0x0/",
    "http://0.1.2.3/",
    // Private, link-local (cloud metadata!), CGNAT.
    "http://10.1.2.3/",
    "http://10.255.255.255/",
    "http://012.1.2.3/",
    "http://167772161/",
    "http://172.16.0.1/",
    "http://172.31.255.255/",
    "http://192.168.1.1/",
    "http://0xc0.0xa8.1.1/",
    "http://3232235777/",
    "http://169.254.169.254/",
    "http://169.254.169.254/latest/meta-data/",
    "http://0xa9fea9fe/",
    "http://2852039166/",
    "http://100.64.0.1/",
    "http://100.127.255.255/",
    // Protocol assignments, documentation, benchmarking, 6to4 relay.
    "http://192.0.0.1/",
    "http://192.0.0.170/",
    "http://192.0.2.1/",
    "http://198.51.100.7/",
    "http://203.0.113.9/",
    "http://198.18.0.1/",
    "http://198.19.255.255/",
    "http://192.88.99.1/",
    // Multicast, reserved, broadcast.
    "http://224.0.0.1/",
    "http://239.1.1.1/",
    "http://240.0.0.1/",
    "http://254.1.2.3/",
    "http://255.255.255.255/",
    "http://4294967295/",
];

#[test]
fn special_destinations_are_refused() {
    let policy = strict();
    for raw in REFUSED {
        let result = check(&policy, raw);
        assert!(result.is_err(), "{raw} was not refused");
    }
    assert!(REFUSED.len() >= 40);
}

#[test]
fn refusals_say_why() {
    let policy = strict();
    for (raw, want) in [
        (
            "http://2130706433/",
            "address 127.0.0.1 is in a refused range (loopback)",
        ),
        ("http://LOCALHOST./", "host localhost. is a local name"),
        (
            "http://169.254.169.254/",
            "address 169.254.169.254 is in a refused range (link-local)",
        ),
        (
            "http://[::ffff:7f00:1]/",
            "address ::ffff:127.0.0.1 is in a refused range (ipv4-mapped)",
        ),
        (
            "http://[64:ff9b::a00:1]/",
            "address 64:ff9b::a00:1 is in a refused range (nat64)",
        ),
        (
            "http://[2002:7f00:1::]/",
            "address 2002:7f00:1:: is in a refused range (6to4)",
        ),
        (
            "http://[2001::1]/",
            "address 2001::1 is in a refused range (teredo)",
        ),
        (
            "http://100.64.0.1/",
            "address 100.64.0.1 is in a refused range (cgnat)",
        ),
    ] {
        let err = check(&policy, raw).unwrap_err();
        assert_eq!(err.to_string(), want, "{raw}");
    }
}

/// Public destinations that must pass the strict policy.
const ALLOWED: &[&str] = &[
    "http://8.8.8.8/",
    "http://93.184.216.34:8080/x",
    "https://1.1.1.1/dns-query?name=example.com",
    "http://[2606:4700::1111]/",
    "http://[2a00:1450:4001::200e]:8080/",
    "http://[::ffff:8.8.8.8]/",
    "http://[64:ff9b::808:808]/",
    "http://[2002:808:808::1]/",
    "http://example.com/",
    "https://Example.COM./path",
    "http://localhost.example.com/",
    "http://localhostx/",
    "http://172.32.0.1/",
    "http://172.15.255.255/",
    "http://100.128.0.1/",
    "http://100.63.255.255/",
    "http://192.169.0.1/",
    "http://169.255.0.1/",
    "http://126.255.255.255/",
    "http://128.0.0.1/",
    "http://198.20.0.1/",
    "http://223.255.255.255/",
    "http://11.0.0.1/",
    "http://134744072/",
];

#[test]
fn public_destinations_are_allowed() {
    let policy = strict();
    for raw in ALLOWED {
        if let Err(e) = check(&policy, raw) {
            panic!("{raw} was refused: {e}");
        }
    }
}

#[test]
fn allow_private_networks_allows_ranges_and_local_names() {
    let policy = DestinationPolicy::new(true, &[]);
    for raw in REFUSED.iter().chain(ALLOWED) {
        if let Err(e) = check(&policy, raw) {
            panic!("{raw} was refused with allow_private_networks: {e}");
        }
    }
}

#[test]
fn bad_targets_fail_to_parse() {
    for (raw, want) in [
        ("", "missing"),
        ("ftp://x/", "scheme"),
        ("file:///etc/passwd", "scheme"),
        ("gopher://x/", "scheme"),
        ("javascript:alert(1)", "scheme"),
        ("data:text/plain,hi", "scheme"),
        ("ws://example.com/", "scheme"),
        ("http://user:pw@example.com/", "userinfo"),
        ("http://user@example.com/", "userinfo"),
        ("http://@example.com/", "userinfo"),
        ("http://:@example.com/", "userinfo"),
        ("http://example.com@127.0.0.1/", "userinfo"),
        ("https://user:@example.com/", "userinfo"),
        ("//example.com/", "invalid"),
        ("example.com", "invalid"),
        ("/just/a/path", "invalid"),
        ("http:///x", "nohost"),
        ("http:////x", "nohost"),
        ("http://", "invalid"),
        ("http:example.com", "invalid"),
        ("http:/example.com", "invalid"),
        ("http:\\\\example.com\\", "invalid"),
        ("http://[::1/", "invalid"),
        ("http://[::1]x/", "invalid"),
        ("http://[127.0.0.1]/", "invalid"),
        ("http://[fe80::1%25eth0]/", "invalid"),
        ("http://256.0.0.1/", "invalid"),
        ("http://1.2.3.4.5/", "invalid"),
        ("http://0x100000000/", "invalid"),
        ("http://4294967296/", "invalid"),
        ("http://1.2.3.09/", "invalid"),
        ("http://1.2.3.0x/", "ok-numeric"),
        ("http://exa mple.com/", "invalid"),
        (" http://example.com/", "invalid"),
        ("http://example.com/ ", "invalid"),
        ("http://exa\tmple.com/", "invalid"),
        ("http://example.com/\n", "invalid"),
        ("http://127.0.0.1\0/", "invalid"),
        ("http://example.com:99999/", "invalid"),
        ("http://example.com:port/", "invalid"),
    ] {
        let got = parse_target(raw);
        let kind = match &got {
            Err(TargetError::Missing) => "missing",
            Err(TargetError::Scheme(_)) => "scheme",
            Err(TargetError::UserInfo) => "userinfo",
            Err(TargetError::NoHost) => "nohost",
            Err(TargetError::Invalid(_)) => "invalid",
            // "1.2.3.0x" is a valid WHATWG IPv4 spelling (0x = 0): it must come out numeric.
            Ok(url) if matches!(url.host(), Some(url::Host::Ipv4(_))) => "ok-numeric",
            Ok(_) => "ok",
        };
        assert_eq!(kind, want, "{raw:?} gave {got:?}");
    }
}

#[test]
fn parse_normalises() {
    for (raw, want) in [
        ("http://0x7f.1/a#frag", "http://127.0.0.1/a"),
        ("HTTP://EXAMPLE.com:80/a?b=c#d", "http://example.com/a?b=c"),
        ("https://example.com:443/", "https://example.com/"),
        ("http://[0:0:0:0:0:ffff:7f00:1]/", "http://[::ffff:7f00:1]/"),
        ("http://bücher.example/", "http://xn--bcher-kva.example/"),
        ("http://example.com/a b", "http://example.com/a%20b"),
        ("http://example.com/a\\b", "http://example.com/a/b"),
    ] {
        assert_eq!(parse_target(raw).unwrap().as_str(), want, "{raw}");
    }
}

fn hosts(entries: &[&str]) -> DestinationPolicy {
    let entries: Vec<String> = entries.iter().map(|e| e.to_string()).collect();
    DestinationPolicy::new(false, &entries)
}

#[test]
fn allow_hosts_restrict() {
    let cases: &[(&[&str], &str, bool)] = &[
        (&["example.com"], "http://example.com/", true),
        (&["example.com"], "https://example.com:8443/x", true),
        (&["example.com"], "http://EXAMPLE.COM/", true),
        (&["example.com"], "http://www.example.com/", false),
        (&["example.com"], "http://example.org/", false),
        (&["example.com"], "http://example.com.evil.net/", false),
        (&["example.com:8080"], "http://example.com:8080/", true),
        (&["example.com:8080"], "http://example.com/", false),
        (&["example.com:8080"], "http://example.com:8081/", false),
        (&["example.com:80"], "http://example.com/", true),
        (&["example.com:80"], "http://example.com:80/", true),
        (&["example.com:80"], "https://example.com/", false),
        (&["example.com:443"], "https://example.com/", true),
        (&["example.com:443"], "http://example.com:443/", true),
        (&["example.com:443"], "http://example.com/", false),
        (&["a.test", "b.test:81"], "http://b.test:81/", true),
        (&["a.test", "b.test:81"], "http://b.test/", false),
        (&["8.8.8.8"], "http://8.8.8.8/", true),
        (&["8.8.8.8"], "http://134744072/", true),
        (&["8.8.8.8:53"], "http://8.8.8.8/", false),
        (&["[2606:4700::1111]"], "http://[2606:4700:0::1111]/", true),
        (
            &["[2606:4700::1111]:443"],
            "https://[2606:4700::1111]/",
            true,
        ),
        (&["2606:4700::1111"], "http://[2606:4700::1111]/", true),
        // allow_hosts restricts further; it never lifts a refusal.
        (&["localhost"], "http://localhost/", false),
        (&["127.0.0.1"], "http://127.0.0.1/", false),
        (&[], "http://anything.example/", true),
    ];
    for (entries, raw, want) in cases {
        let got = check(&hosts(entries), raw);
        assert_eq!(got.is_ok(), *want, "{entries:?} {raw}: {got:?}");
        if let Err(e) = got {
            if entries
                .iter()
                .all(|e| !e.contains("localhost") && !e.starts_with("127."))
            {
                assert!(matches!(e, Refusal::NotAllowed(_)), "{raw}: {e}");
            }
        }
    }
    let err = check(&hosts(&["a.test"]), "https://b.test/").unwrap_err();
    assert_eq!(
        err.to_string(),
        "destination b.test:443 is not in allow_hosts"
    );
}

#[test]
fn allow_hosts_still_restrict_with_private_networks() {
    let entries = vec!["127.0.0.1:8080".to_owned(), "localhost".to_owned()];
    let policy = DestinationPolicy::new(true, &entries);
    assert!(check(&policy, "http://127.0.0.1:8080/").is_ok());
    assert!(check(&policy, "http://localhost:9/").is_ok());
    assert!(check(&policy, "http://127.0.0.1:8081/").is_err());
    assert!(check(&policy, "http://10.0.0.1/").is_err());
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn check_addr_classifies_resolved_addresses() {
    let policy = strict();
    for (addr, range) in [
        ("127.0.0.1", Some("loopback")),
        ("127.0.0.53", Some("loopback")),
        ("0.0.0.0", Some("unspecified")),
        ("0.0.0.1", Some("this-network")),
        ("10.0.0.1", Some("private")),
        ("172.20.1.1", Some("private")),
        ("192.168.0.1", Some("private")),
        ("169.254.169.254", Some("link-local")),
        ("100.100.100.200", Some("cgnat")),
        ("192.0.0.8", Some("ietf-protocol-assignments")),
        ("192.0.2.255", Some("documentation")),
        ("198.18.5.5", Some("benchmarking")),
        ("192.88.99.2", Some("6to4-relay")),
        ("233.252.0.1", Some("multicast")),
        ("255.255.255.254", Some("reserved")),
        ("255.255.255.255", Some("broadcast")),
        ("::", Some("unspecified")),
        ("::1", Some("loopback")),
        ("::ffff:192.168.0.1", Some("ipv4-mapped")),
        ("::192.168.0.1", Some("ipv4-compatible")),
        ("64:ff9b::7f00:1", Some("nat64")),
        ("64:ff9b:1::1", Some("nat64-local")),
        ("2002:a00:1::", Some("6to4")),
        ("2001:0:1::", Some("teredo")),
        ("2001:db8:1::", Some("documentation")),
        ("3fff:fff::1", Some("documentation")),
        ("100::abcd", Some("discard")),
        ("fd00::1", Some("unique-local")),
        ("fe80::1", Some("link-local")),
        ("fec0::1", Some("site-local")),
        ("ff0e::1", Some("multicast")),
        ("8.8.8.8", None),
        ("1.1.1.1", None),
        ("::ffff:1.1.1.1", None),
        ("64:ff9b::101:101", None),
        ("2002:101:101::", None),
        ("2606:4700::1111", None),
        ("2001:4860:4860::8888", None),
        ("3fff:1000::1", None),
    ] {
        assert_eq!(special_range(ip(addr)), range, "{addr}");
        let got = policy.check_addr(ip(addr));
        match range {
            Some(range) => assert!(
                matches!(got, Err(Refusal::Address { ip: i, range: r }) if i == ip(addr) && r == range),
                "{addr}: {got:?}"
            ),
            None => assert!(got.is_ok(), "{addr}: {got:?}"),
        }
        assert!(DestinationPolicy::new(true, &[])
            .check_addr(ip(addr))
            .is_ok());
    }
}

/// The IPv4 addresses of the sample: every a.b.0.1, a.b.255.255 and a.b.c.0 for a few c.
fn v4_sample() -> impl Iterator<Item = Ipv4Addr> {
    (0..=255u8).flat_map(|a| {
        (0..=255u8).flat_map(move |b| {
            [
                Ipv4Addr::new(a, b, 0, 1),
                Ipv4Addr::new(a, b, 255, 255),
                Ipv4Addr::new(a, b, 2, 0),
                Ipv4Addr::new(a, b, 99, 7),
                Ipv4Addr::new(a, b, 113, 0),
                Ipv4Addr::new(a, b, 0, 0),
            ]
        })
    })
}

#[test]
fn v4_ranges_agree_with_std() {
    for v4 in v4_sample() {
        let std_says = [
            ("unspecified", v4.is_unspecified()),
            ("loopback", v4.is_loopback()),
            ("private", v4.is_private()),
            ("link-local", v4.is_link_local()),
            ("multicast", v4.is_multicast()),
            ("broadcast", v4.is_broadcast()),
            ("documentation", v4.is_documentation()),
        ];
        let ours = special_range(IpAddr::V4(v4));
        for (name, special) in std_says {
            if special {
                assert_eq!(ours, Some(name), "{v4}");
            }
        }
        if let Some(range) = ours {
            if let Some((_, special)) = std_says.iter().find(|(name, _)| *name == range) {
                assert!(special, "{v4}: we say {range}, std does not");
            } else {
                assert!(
                    std_says.iter().all(|(_, s)| !s),
                    "{v4}: {range} overlaps std"
                );
            }
        }
    }
}

#[test]
fn v6_ranges_agree_with_std() {
    for v4 in v4_sample() {
        let [a, b, c, d] = v4.octets();
        let hi = u16::from_be_bytes([a, b]);
        let lo = u16::from_be_bytes([c, d]);
        let v6 = Ipv6Addr::new(hi, lo, a.into(), 0, 0, 0, 0, b.into());
        let ours = special_range(IpAddr::V6(v6));
        let std_special = v6.is_unspecified()
            || v6.is_loopback()
            || v6.is_multicast()
            || v6.is_unique_local()
            || v6.is_unicast_link_local();
        if std_special {
            assert!(ours.is_some(), "{v6}");
        }
        // Only 2000::/3 holds global unicast.
        if hi >> 13 != 1 {
            assert!(ours.is_some(), "{v6}");
        }
    }
}

#[test]
fn embedded_v4_inherits_its_classification() {
    for v4 in v4_sample() {
        let [a, b, c, d] = v4.octets();
        let hi = u16::from_be_bytes([a, b]);
        let lo = u16::from_be_bytes([c, d]);
        let special = special_range(IpAddr::V4(v4)).is_some();
        for (form, v6) in [
            ("mapped", v4.to_ipv6_mapped()),
            ("nat64", Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, hi, lo)),
            ("6to4", Ipv6Addr::new(0x2002, hi, lo, 0, 0, 0, 0, 1)),
        ] {
            let ours = special_range(IpAddr::V6(v6));
            assert_eq!(ours.is_some(), special, "{form} {v6} of {v4}: {ours:?}");
            // The same through the URL parser, bracketed (a slice of the sample: parsing is slow).
            if d == 1 {
                let url = parse_target(&format!("http://[{v6}]/")).unwrap();
                assert_eq!(strict().check_url(&url).is_err(), special, "{url}");
            }
        }
        // Compatible and Teredo forms are refused whatever they embed.
        let compat = Ipv6Addr::new(0, 0, 0, 0, 0, 0, hi, lo);
        assert!(special_range(IpAddr::V6(compat)).is_some(), "{compat}");
        let teredo = Ipv6Addr::new(0x2001, 0, hi, lo, 0, 0, !hi, !lo);
        assert_eq!(special_range(IpAddr::V6(teredo)), Some("teredo"));
    }
}

#[test]
fn numeric_spellings_never_reach_dns_as_names() {
    // Whatever parses must come out as an address, not a name.
    for raw in [
        "http://2130706433/",
        "http://0x7f.1/",
        "http://0177.0.0.1/",
        "http://127.1/",
        "http://0x7f000001/",
        "http://017700000001/",
        "http://0/",
        "http://8.8.8.8./",
        "http://1.2.3.0x/",
    ] {
        let url = parse_target(raw).unwrap();
        assert!(
            matches!(url.host(), Some(url::Host::Ipv4(_))),
            "{raw} parsed as {:?}",
            url.host()
        );
    }
}
