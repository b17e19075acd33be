//! Header rewrite of the request and response heads already parsed: the body is never
//! touched. The fields a route always writes (hop-by-hop removal, `x-forwarded-for`,
//! `via`) are edited in the map; a route's own `set_headers` and `remove_headers` are
//! applied as the head is written ([`FieldEdits`]), so a rewrite costs next to nothing more
//! than a plain forward.

use std::net::IpAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use wharf_http1::relay::RelayedFields;
use wharf_http1::request::FieldEdits;

/// Hop-by-hop headers (RFC 9110 §7.6.1): they concern one connection and are never
/// forwarded. Names, as a relay of response lines takes them
/// ([`wharf_http1::relay::Relayed::AllBut`]); `HOP_BY_HOP` for a map.
pub const HOP_BY_HOP_NAMES: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "upgrade",
];

/// [`HOP_BY_HOP_NAMES`] as header names (the standard ones among them compare as such).
const HOP_BY_HOP: [HeaderName; 8] = [
    HeaderName::from_static(HOP_BY_HOP_NAMES[0]),
    HeaderName::from_static(HOP_BY_HOP_NAMES[1]),
    HeaderName::from_static(HOP_BY_HOP_NAMES[2]),
    HeaderName::from_static(HOP_BY_HOP_NAMES[3]),
    HeaderName::from_static(HOP_BY_HOP_NAMES[4]),
    HeaderName::from_static(HOP_BY_HOP_NAMES[5]),
    HeaderName::from_static(HOP_BY_HOP_NAMES[6]),
    HeaderName::from_static(HOP_BY_HOP_NAMES[7]),
];

/// `x-forwarded-for`.
pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// The rewrite rules of one route.
#[derive(Debug, Clone)]
pub struct Rewrite {
    /// Rules on fields the forward itself reads or writes after the rewrite (`host`,
    /// `x-forwarded-for`, `via`): applied to the map, so that it sees their outcome.
    in_map: Rules,
    /// Every other rule, applied as the head is written: the names whose fields the
    /// client sent are left out (set or removed)...
    omit: Vec<HeaderName>,
    /// ...and the set fields written instead.
    add: Vec<(HeaderName, HeaderValue)>,
}

/// Rules applied to a header map.
#[derive(Debug, Clone)]
struct Rules {
    set: Vec<(HeaderName, HeaderValue)>,
    remove: Vec<HeaderName>,
}

impl Rewrite {
    /// `set` replaces any value the client sent; `remove` drops headers.
    pub fn new(set: Vec<(HeaderName, HeaderValue)>, remove: Vec<HeaderName>) -> Self {
        let in_map = |name: &HeaderName| {
            name == header::HOST || name == X_FORWARDED_FOR || name == header::VIA
        };
        let (map_set, add): (Vec<_>, Vec<_>) = set.into_iter().partition(|(name, _)| in_map(name));
        let (map_remove, removed): (Vec<_>, Vec<_>) = remove.into_iter().partition(in_map);
        let mut omit: Vec<HeaderName> = removed;
        for (name, _) in &add {
            if !omit.contains(name) {
                omit.push(name.clone());
            }
        }
        Self {
            in_map: Rules {
                set: map_set,
                remove: map_remove,
            },
            omit,
            add,
        }
    }

    /// Rewrites a request's headers for the backend: hop-by-hop headers
    /// (and those named in `connection`) and `expect` dropped, `x-forwarded-for` appended
    /// with the client, `via` added. The route's own rules are in [`Rewrite::edits`], for the
    /// writer of the head, except those on `host`, `x-forwarded-for` and `via`, which
    /// are applied here first (a `set` `x-forwarded-for` is then extended with the client,
    /// as one the client sent would be).
    pub fn request(&self, headers: &mut HeaderMap, client: Option<IpAddr>) {
        strip_hop_by_hop(headers);
        // The host met the client's expectation (its `100 Continue`, RFC 9110 §10.1.1) and
        // the body comes whole: asked again, the backend's own `100 Continue` would only be
        // one more interim answer for the upstream exchange to skip.
        headers.remove(header::EXPECT);
        for name in &self.in_map.remove {
            headers.remove(name);
        }
        for (name, value) in &self.in_map.set {
            headers.insert(name.clone(), value.clone());
        }
        if let Some(client) = client {
            append_forwarded_for(headers, client);
        }
        add_via(headers);
    }

    /// The route's `set_headers` and `remove_headers`, to apply as the request head is
    /// written (after [`Rewrite::request`]).
    pub fn edits(&self) -> FieldEdits<'_> {
        FieldEdits {
            omit: &self.omit,
            add: &self.add,
        }
    }

    /// Rewrites a backend response's head for the client: hop-by-hop fields dropped, `via`
    /// added. A head kept as lines ([`RelayedFields`], read without the hop-by-hop fields)
    /// gets its `via` after them, so that it follows any the backend sent (RFC 9110
    /// §7.6.3: each hop appends).
    pub fn response(&self, head: &mut http::response::Parts) {
        strip_hop_by_hop(&mut head.headers);
        match head.extensions.get_mut::<RelayedFields>() {
            Some(lines) => lines.append(&header::VIA, &VIA),
            None => add_via(&mut head.headers),
        }
    }
}

/// Drops hop-by-hop headers, including any the `connection` header names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most messages carry none (and without `connection` nothing is named): one pass over
    // the names instead of eight removals, each a hash and a probe, twice per forward.
    if !headers.keys().any(|name| HOP_BY_HOP.contains(name)) {
        return;
    }
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named.iter().chain(HOP_BY_HOP.iter()) {
        headers.remove(name);
    }
}

fn append_forwarded_for(headers: &mut HeaderMap, client: IpAddr) {
    // Every earlier hop, from every x-forwarded-for line (RFC 9110 §5.3:
    // several lines are one comma-separated list), then this client.
    let mut chain = Vec::with_capacity(64);
    let earlier = headers
        .get_all(&X_FORWARDED_FOR)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .map(str::trim)
        .filter(|value| !value.is_empty());
    for hop in earlier {
        chain.extend_from_slice(hop.as_bytes());
        chain.extend_from_slice(b", ");
    }
    push_ip(client, &mut chain);
    if let Ok(value) = HeaderValue::from_bytes(&chain) {
        headers.insert(X_FORWARDED_FOR, value);
    }
}

/// Appends `ip` as text. An IPv4 address is written octet by octet: `Display` goes through
/// the formatting machinery (~1,300 instructions), and this runs on every forwarded call.
fn push_ip(ip: IpAddr, out: &mut Vec<u8>) {
    match ip {
        IpAddr::V4(v4) => {
            for (index, octet) in v4.octets().into_iter().enumerate() {
                if index > 0 {
                    out.push(b'.');
                }
                wharf_http1::write_decimal(u64::from(octet), out);
            }
        }
        IpAddr::V6(v6) => out.extend_from_slice(v6.to_string().as_bytes()),
    }
}

/// This hop's `via` entry.
const VIA: HeaderValue = HeaderValue::from_static("1.1 wharf");

fn add_via(headers: &mut HeaderMap) {
    headers.append(header::VIA, VIA);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_addresses_are_written_as_display_writes_them() {
        for text in [
            "0.0.0.0",
            "9.10.99.100",
            "127.0.0.1",
            "192.168.100.7",
            "255.255.255.255",
            "::1",
            "2001:db8::8a2e:370:7334",
            "::ffff:10.0.0.1",
        ] {
            let ip: IpAddr = text.parse().unwrap();
            let mut written = Vec::new();
            push_ip(ip, &mut written);
            assert_eq!(String::from_utf8(written).unwrap(), ip.to_string());
        }
    }

    #[test]
    fn messages_without_hop_by_hop_fields_are_left_alone() {
        let mut headers = HeaderMap::new();
        headers.insert("x-keep", HeaderValue::from_static("yes"));
        headers.insert(header::HOST, HeaderValue::from_static("example.com"));
        let before = headers.clone();
        strip_hop_by_hop(&mut headers);
        assert_eq!(headers, before);
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        strip_hop_by_hop(&mut headers);
        assert_eq!(headers, before, "keep-alive alone is still found");
    }

    /// The head the writer sends for `headers` after `rewrite`.
    fn written(rewrite: &Rewrite, headers: &mut HeaderMap) -> String {
        rewrite.request(headers, Some("127.0.0.1".parse().unwrap()));
        let mut out = Vec::new();
        let framing = wharf_http1::request::RequestFraming::None;
        wharf_http1::request::encode_request_head(
            &http::Method::GET,
            "/",
            headers,
            rewrite.edits(),
            framing,
            &mut out,
        )
        .unwrap();
        // The map's order after removals is its own; the added fields come last.
        let text = String::from_utf8(out).unwrap();
        let mut lines: Vec<&str> = text.split("\r\n").collect();
        let map_end = lines.len() - 2 - rewrite.edits().add.len();
        let added = lines[map_end..lines.len() - 2].to_vec();
        lines[1..map_end].sort_unstable();
        let mut sorted = lines[..map_end].to_vec();
        sorted.extend(added);
        sorted.extend(["", ""]);
        sorted.join("\r\n")
    }

    #[test]
    fn request_rewrite_as_written() {
        let rewrite = Rewrite::new(
            vec![(
                HeaderName::from_static("x-via"),
                HeaderValue::from_static("wharf"),
            )],
            vec![HeaderName::from_static("x-internal-token")],
        );
        let mut headers = HeaderMap::new();
        headers.insert("x-via", HeaderValue::from_static("client"));
        headers.insert("x-internal-token", HeaderValue::from_static("secret"));
        headers.insert("connection", HeaderValue::from_static("keep-alive, x-hop"));
        headers.insert("x-hop", HeaderValue::from_static("1"));
        headers.insert("x-forwarded-for", HeaderValue::from_static("10.0.0.1"));
        headers.insert("x-keep", HeaderValue::from_static("yes"));
        let head = written(&rewrite, &mut headers);
        assert_eq!(
            head,
            "GET / HTTP/1.1\r\n\
             via: 1.1 wharf\r\n\
             x-forwarded-for: 10.0.0.1, 127.0.0.1\r\n\
             x-keep: yes\r\n\
             x-via: wharf\r\n\r\n"
        );
    }

    #[test]
    fn rules_on_fields_the_forward_writes_apply_before_it_writes_them() {
        let rewrite = Rewrite::new(
            vec![
                (header::HOST, HeaderValue::from_static("backend.internal")),
                (X_FORWARDED_FOR, HeaderValue::from_static("192.0.2.1")),
            ],
            vec![header::VIA],
        );
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("public.example"));
        headers.insert(X_FORWARDED_FOR, HeaderValue::from_static("10.0.0.1"));
        headers.insert(header::VIA, HeaderValue::from_static("1.0 edge"));
        assert!(rewrite.edits().omit.is_empty() && rewrite.edits().add.is_empty());
        let head = written(&rewrite, &mut headers);
        assert_eq!(
            head,
            "GET / HTTP/1.1\r\n\
             host: backend.internal\r\n\
             via: 1.1 wharf\r\n\
             x-forwarded-for: 192.0.2.1, 127.0.0.1\r\n\r\n",
            "the set host is what the forward sees; the client's via is removed, wharf's added"
        );
    }

    #[test]
    fn the_expectation_the_host_answered_is_not_forwarded() {
        let mut headers = HeaderMap::new();
        headers.insert(header::EXPECT, HeaderValue::from_static("100-continue"));
        headers.insert("x-keep", HeaderValue::from_static("yes"));
        let head = written(&Rewrite::new(vec![], vec![]), &mut headers);
        assert_eq!(
            head,
            "GET / HTTP/1.1\r\n\
             via: 1.1 wharf\r\n\
             x-forwarded-for: 127.0.0.1\r\n\
             x-keep: yes\r\n\r\n"
        );
    }

    #[test]
    fn every_forwarded_for_line_is_kept() {
        let mut headers = HeaderMap::new();
        headers.append("x-forwarded-for", HeaderValue::from_static("1.1.1.1"));
        headers.append(
            "x-forwarded-for",
            HeaderValue::from_static("2.2.2.2, 3.3.3.3"),
        );
        Rewrite::new(vec![], vec![]).request(&mut headers, Some("127.0.0.1".parse().unwrap()));
        let all: Vec<_> = headers.get_all("x-forwarded-for").iter().collect();
        assert_eq!(all, ["1.1.1.1, 2.2.2.2, 3.3.3.3, 127.0.0.1"]);
    }
}
