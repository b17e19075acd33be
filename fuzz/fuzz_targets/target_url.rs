//! The `url` parameter's parser and the SSRF classifier:
//! `wharf_proxy::destination::{parse_target, DestinationPolicy::check_url,
//! special_range}`.
//!
//! Properties checked on every input (a violation is a crash):
//! - a parsed target is http(s), has a host, no userinfo, no fragment;
//! - with `allow_private_networks = false`, an IP-literal host is refused
//!   exactly when `special_range` names its range, `localhost` and
//!   `*.localhost` are refused, and no numeric host is left as a name;
//! - the first 16 input bytes, read as addresses: every address std does not
//!   call global is refused (IPv4-mapped excepted: classified by its IPv4),
//!   and a refused IPv4 is refused in every IPv6 form that embeds it.
#![no_main]
// `is_global` is unstable (rust-lang/rust#27709); fuzzing runs on nightly.
#![feature(ip)]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use libfuzzer_sys::fuzz_target;
use url::Host;
use wharf_proxy::destination::{parse_target, special_range, DestinationPolicy};

fuzz_target!(|data: &[u8]| {
    if let Some(bytes) = data.get(..16) {
        classify(bytes);
    }
    let Ok(raw) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(url) = parse_target(raw) else {
        return;
    };
    assert!(matches!(url.scheme(), "http" | "https"), "{url}");
    assert!(
        url.username().is_empty() && url.password().is_none(),
        "{url}"
    );
    assert!(url.fragment().is_none(), "{url}");
    let host = url.host().expect("a parsed target has a host");

    let strict = DestinationPolicy::new(false, &[]);
    let open = DestinationPolicy::new(true, &[]);
    assert!(
        open.check_url(&url).is_ok(),
        "{url} refused with private networks allowed"
    );
    let refused = strict.check_url(&url).is_err();
    match host {
        Host::Ipv4(ip) => assert_eq!(refused, special_range(IpAddr::V4(ip)).is_some(), "{url}"),
        Host::Ipv6(ip) => assert_eq!(refused, special_range(IpAddr::V6(ip)).is_some(), "{url}"),
        Host::Domain(name) => {
            let bare = name.trim_end_matches('.').to_ascii_lowercase();
            if bare == "localhost" || bare.ends_with(".localhost") {
                assert!(refused, "{url}: local name allowed");
            }
            assert!(
                bare.parse::<IpAddr>().is_err(),
                "{url}: a numeric host was left as a name (it would reach DNS)"
            );
        }
    }

    // allow_hosts: the URL's own host (and port) passes, another host does not.
    let port = url
        .port_or_known_default()
        .expect("http(s) has a default port");
    let own = match url.host().expect("checked above") {
        Host::Ipv6(ip) => format!("[{ip}]:{port}"),
        other => format!("{other}:{port}"),
    };
    let listed = DestinationPolicy::new(true, &[own.to_ascii_lowercase()]);
    assert!(
        listed.check_url(&url).is_ok(),
        "{url} refused by its own allow_hosts entry {own}"
    );
    let other_entry = "fuzz-other.example:1";
    if own.eq_ignore_ascii_case(other_entry) {
        return;
    }
    let other = DestinationPolicy::new(true, &[other_entry.to_owned()]);
    assert!(
        other.check_url(&url).is_err(),
        "{url} allowed by an unrelated allow_hosts entry"
    );
});

fn classify(bytes: &[u8]) {
    let v4 = Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]);
    let mut octets = [0u8; 16];
    octets.copy_from_slice(&bytes[..16]);
    let v6 = Ipv6Addr::from(octets);

    for ip in [IpAddr::V4(v4), IpAddr::V6(v6)] {
        let mapped = matches!(ip, IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some());
        if !ip.is_global() && !mapped {
            assert!(
                special_range(ip).is_some(),
                "{ip} is not global, yet allowed"
            );
        }
    }
    if let Some(mapped) = v6.to_ipv4_mapped() {
        assert_eq!(
            special_range(IpAddr::V6(v6)).is_some(),
            special_range(IpAddr::V4(mapped)).is_some(),
            "{v6} and {mapped} classified differently"
        );
    }
    if special_range(IpAddr::V4(v4)).is_some() {
        let [a, b, c, d] = v4.octets();
        let embedded = [
            v4.to_ipv6_mapped(),
            v4.to_ipv6_compatible(),
            Ipv6Addr::new(
                0x64,
                0xff9b,
                0,
                0,
                0,
                0,
                u16::from_be_bytes([a, b]),
                u16::from_be_bytes([c, d]),
            ),
            Ipv6Addr::new(
                0x2002,
                u16::from_be_bytes([a, b]),
                u16::from_be_bytes([c, d]),
                0,
                0,
                0,
                0,
                1,
            ),
            // Teredo carries the client address obfuscated (bitwise not).
            Ipv6Addr::new(
                0x2001,
                0,
                0x4136,
                0xe378,
                0x8000,
                0x63bf,
                !u16::from_be_bytes([a, b]),
                !u16::from_be_bytes([c, d]),
            ),
        ];
        for ip in embedded {
            assert!(
                special_range(IpAddr::V6(ip)).is_some(),
                "{v4} refused but {ip} allowed"
            );
        }
    }
}
