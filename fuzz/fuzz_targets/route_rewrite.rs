//! Route header rewrite on arbitrary header maps:
//! `wharf_route::rewrite::Rewrite::{request, response}`.
//!
//! Input: byte 0 picks `set_headers`, byte 1 `remove_headers` (from a list of
//! plausible names), bytes 2..6 the client address (or none), the rest is
//! `name: value` lines. Properties after `request`: no hop-by-hop header nor
//! any header the client's `connection` named is left (unless `set`), every
//! `set` header has exactly its value, every `remove` header is gone, `via`
//! ends with `1.1 wharf`, and `x-forwarded-for` ends with the client.
#![no_main]

use std::net::{IpAddr, Ipv4Addr};

use http::header::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;
use wharf_route::rewrite::Rewrite;

const NAMES: [&str; 8] = [
    "x-via",
    "x-tenant",
    "x-internal-token",
    "authorization",
    "cookie",
    "x-request-id",
    "accept",
    "content-type",
];

const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "upgrade",
];

fuzz_target!(|data: &[u8]| {
    if data.len() < 6 {
        return;
    }
    let pick = |mask: u8| -> Vec<HeaderName> {
        NAMES
            .iter()
            .enumerate()
            .filter(|(i, _)| mask & (1 << i) != 0)
            .map(|(_, n)| HeaderName::from_static(n))
            .collect()
    };
    let set: Vec<(HeaderName, HeaderValue)> = pick(data[0])
        .into_iter()
        .map(|name| (name, HeaderValue::from_static("set-by-wharf")))
        .collect();
    let remove = pick(data[1]);
    let client =
        (data[2] != 0).then(|| IpAddr::V4(Ipv4Addr::new(data[2], data[3], data[4], data[5])));
    let mut headers = HeaderMap::new();
    for line in data[6..].split(|b| *b == b'\n') {
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            continue;
        };
        let value = line[colon + 1..].trim_ascii();
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(&line[..colon]),
            HeaderValue::from_bytes(value),
        ) {
            headers.append(name, value);
        }
    }
    let named_by_connection: Vec<HeaderName> = headers
        .get_all("connection")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();

    let rewrite = Rewrite::new(set.clone(), remove.clone());
    let mut request = headers.clone();
    rewrite.request(&mut request, client);
    let is_set = |name: &HeaderName| set.iter().any(|(n, _)| n == name);
    for name in HOP_BY_HOP {
        assert!(!request.contains_key(name), "{name} forwarded");
    }
    for name in &named_by_connection {
        if !is_set(name) && name != "x-forwarded-for" && name != "via" {
            assert!(
                !request.contains_key(name),
                "{name} (named by connection) forwarded"
            );
        }
    }
    for (name, value) in &set {
        let values: Vec<_> = request.get_all(name).iter().collect();
        assert_eq!(values, [value], "{name} not set exactly");
    }
    for name in &remove {
        if !is_set(name) {
            assert!(!request.contains_key(name), "{name} not removed");
        }
    }
    let via: Vec<_> = request.get_all("via").iter().collect();
    assert_eq!(
        via.last().map(|v| v.as_bytes()),
        Some(b"1.1 wharf".as_slice())
    );
    if let Some(client) = client {
        let forwarded = request
            .get("x-forwarded-for")
            .expect("x-forwarded-for added");
        let forwarded = forwarded.to_str().expect("x-forwarded-for is text");
        assert!(
            forwarded.ends_with(&client.to_string()),
            "x-forwarded-for {forwarded:?}"
        );
    }

    let (mut response, ()) = http::Response::new(()).into_parts();
    response.headers = headers;
    rewrite.response(&mut response);
    let response = response.headers;
    for name in HOP_BY_HOP {
        assert!(!response.contains_key(name), "{name} relayed to the client");
    }
});
