//! Response header fields as wire lines, written as they are: a pass-through proxy that
//! passes on a fixed set of an upstream's fields, or a route that passes on all but the
//! hop-by-hop ones, need not build a [`HeaderMap`] of them (a name lookup, a hash and a
//! validated value per field) only for the server to write them out again, and a cache
//! need not clone a stored head's map for every hit.
//!
//! [`HeadFields::Relay`] asks the response parser to copy the fields [`Relayed`] names (a
//! list, or all but a list) into one buffer, [`RelayedFields`], and to build no map: the
//! fields that decide the framing and the connection (`content-length`,
//! `transfer-encoding`, `connection`) are read where they lie, never kept as lines, and
//! what they say is in the parsed head's framing and keep-alive (a server states the
//! length from the body's size). [`RelayedFields::from_map`]
//! encodes a map's fields once, for a head served many times. The server writes the lines
//! after the map's fields ([`crate::response::encode_response_head`]); a server that needs
//! a map (HTTP/2) merges them back in with [`RelayedFields::append_to`].

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue};

use crate::fields::{list_items, push_field, stated_by_server};
use crate::response::encode_fields;

/// Which header fields of a response head are kept, and how.
///
/// One pointer wide: it is held by every exchange waiting on an upstream (the proxy's
/// `waiting_calls_stay_small` bounds such a call's size).
#[derive(Debug, Clone, Copy)]
pub enum HeadFields {
    /// Every field, in the head's [`HeaderMap`].
    All,
    /// The fields [`Relayed`] says, as lines in a [`RelayedFields`]; the head's map is
    /// empty but for what `Relayed` says (the framing and connection fields are read, not
    /// kept; nor is `keep-alive`).
    Relay(&'static Relayed),
}

/// Which fields a head kept as lines ([`HeadFields::Relay`]) keeps.
#[derive(Debug)]
pub enum Relayed {
    /// Only the fields of these names. Names are given in lower case (as
    /// [`HeaderName::as_str`] gives them), matched without regard to case and written as
    /// given. Plain strings, not header names: matching them is a length check and a byte
    /// comparison per listed name, where a header name would be looked up each time.
    Only(&'static [&'static str]),
    /// Every field but the hop-by-hop ones, names written in lower case: left out are the
    /// fields of these names (lower case), those the head's `connection` lines name (RFC
    /// 9110 §7.6.1) and the framing and connection fields. The head's map holds the
    /// `content-length` of a response without a body (to HEAD, 304), which the server
    /// states from the map. For a forward that passes on whatever the upstream sent.
    AllBut(&'static [&'static str]),
}

/// Header lines of a response, each `name: value\r\n`, to be written as they are. Built by
/// the response parser or from a map, never from loose bytes: every name is a field name
/// and never a framing or connection field, and every value holds only bytes a
/// [`HeaderValue`] accepts (the parser's checks allow tab, space, visible ASCII and
/// obs-text). Lines built from a map, to be served many times, are shared by clones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayedFields {
    lines: Lines,
    has_date: bool,
}

/// The lines' buffer: a parsed head's own, or shared.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Lines {
    Owned(Vec<u8>),
    Shared(Bytes),
}

impl RelayedFields {
    /// The lines, ready for the wire.
    pub fn as_bytes(&self) -> &[u8] {
        match &self.lines {
            Lines::Owned(lines) => lines,
            Lines::Shared(lines) => lines,
        }
    }

    /// The fields of `headers` as lines, in the map's order, without the framing and
    /// connection fields (and `keep-alive`), which a server states itself.
    pub fn from_map(headers: &HeaderMap) -> Self {
        let mut lines = Vec::new();
        let has_date = encode_fields(headers, &mut lines);
        Self {
            lines: Lines::Shared(Bytes::from(lines)),
            has_date,
        }
    }

    /// Appends the field `name: value` after the lines (a field the server states itself,
    /// a framing or connection field, is not taken: see [`RelayedFields`]).
    pub fn append(&mut self, name: &HeaderName, value: &HeaderValue) {
        if stated_by_server(name.as_str().as_bytes()) {
            return;
        }
        self.has_date |= name == http::header::DATE;
        // Lines shared by a stored head's clones are copied first: the others stay as they are.
        if let Lines::Shared(shared) = &self.lines {
            self.lines = Lines::Owned(shared.to_vec());
        }
        if let Lines::Owned(lines) = &mut self.lines {
            push_field(name.as_str().as_bytes(), value.as_bytes(), lines);
        }
    }

    /// Whether the lines include `date` (the server then writes none of its own).
    pub fn has_date(&self) -> bool {
        self.has_date
    }

    /// Appends the lines' fields to `headers`, for a server that writes from a map.
    pub fn append_to(&self, headers: &mut HeaderMap) {
        for line in self.as_bytes().split(|&b| b == b'\n') {
            let Some(line) = line.strip_suffix(b"\r") else {
                continue;
            };
            let Some(colon) = line.iter().position(|&b| b == b':') else {
                continue;
            };
            let (name, value) = (&line[..colon], &line[colon + 2..]);
            // Both were checked when the lines were built; a failure here would be a bug,
            // and a field left out is its mildest outcome.
            if let (Ok(name), Ok(value)) =
                (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
            {
                headers.append(name, value);
            }
        }
    }
}

/// The lines of the `relayed` fields among a parsed head's `slots` (`head_len` bytes).
pub(crate) fn relay_fields(
    head_len: usize,
    slots: &[httparse::Header<'_>],
    relayed: &[&str],
) -> RelayedFields {
    // Room for the whole head: the lines are never longer. Kept as the `Vec` it is (a
    // pass-through's lines are written once, never cloned), not made a `Bytes`, which would
    // allocate a shared count for a buffer with spare room.
    let mut lines = Vec::with_capacity(head_len);
    let mut has_date = false;
    for slot in slots {
        let name = slot.name.as_bytes();
        let Some(kept) = relayed.iter().find(|known| field_is(known, name)) else {
            continue;
        };
        if stated_by_server(kept.as_bytes()) {
            continue; // read by the parser (the framing fields), stated anew by the server
        }
        has_date |= *kept == "date";
        push_field(kept.as_bytes(), slot.value, &mut lines);
    }
    RelayedFields {
        lines: Lines::Owned(lines),
        has_date,
    }
}

/// The lines of every field among a parsed head's `slots` (`head_len` bytes) except the
/// `omitted` names, the names its `connection` lines list and the framing and connection
/// fields; names written in lower case.
pub(crate) fn relay_fields_but(
    head_len: usize,
    slots: &[httparse::Header<'_>],
    omitted: &[&str],
) -> RelayedFields {
    // The options of `connection` (`connection: close, x-trace`) name hop-by-hop fields of
    // this message. `close` names none, `keep-alive` one left out anyway: with only those
    // (or no `connection`), the usual case, nothing is allocated.
    let mut named: Vec<&[u8]> = Vec::new();
    for slot in slots {
        if field_is("connection", slot.name.as_bytes()) {
            named.extend(list_items(slot.value).filter(|option| {
                !option.eq_ignore_ascii_case(b"close")
                    && !option.eq_ignore_ascii_case(b"keep-alive")
            }));
        }
    }
    let mut lines = Vec::with_capacity(head_len);
    let mut has_date = false;
    for slot in slots {
        // The name is written lower-cased first, then judged, and taken back if left out:
        // one pass over its bytes either way.
        let start = lines.len();
        lines.extend(slot.name.bytes().map(|b| b.to_ascii_lowercase()));
        let name = &lines[start..];
        let left_out = stated_by_server(name)
            || omitted.iter().any(|omitted| omitted.as_bytes() == name)
            || named.iter().any(|option| option.eq_ignore_ascii_case(name));
        if left_out {
            lines.truncate(start);
            continue;
        }
        has_date |= name == b"date";
        lines.extend_from_slice(b": ");
        lines.extend_from_slice(slot.value);
        lines.extend_from_slice(b"\r\n");
    }
    RelayedFields {
        lines: Lines::Owned(lines),
        has_date,
    }
}

/// `wire` (a field name as received, a token httparse accepted) is `known` (lower-case
/// letters, digits and `-`), in any case.
///
/// Eight bytes at a time: every byte of `known` has the 0x20 bit set, and a wire byte
/// matches it when the wire byte with that bit set is equal, which is the same letter in
/// either case, or the same digit or `-` (the other bytes it would let through, CR and
/// control characters, are not in a token). `eq_ignore_ascii_case`, which lowers both sides
/// byte by byte, took ~1,000 instructions per proxied call over a head's fields; this
/// takes 867 fewer (callgrind).
#[inline(always)] // a length check that fails, mostly: not worth a call
pub(crate) fn field_is(known: &str, wire: &[u8]) -> bool {
    let known = known.as_bytes();
    if known.len() != wire.len() {
        return false;
    }
    debug_assert!(
        known
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-'),
        "{known:?}"
    );
    let mut known_words = known.chunks_exact(8);
    let mut wire_words = wire.chunks_exact(8);
    for (known_word, wire_word) in (&mut known_words).zip(&mut wire_words) {
        let (Ok(known_word), Ok(wire_word)) = (
            <[u8; 8]>::try_from(known_word),
            <[u8; 8]>::try_from(wire_word),
        ) else {
            return false; // not reached: both are chunks of eight
        };
        const LOWER: u64 = u64::from_ne_bytes([0x20; 8]);
        if u64::from_ne_bytes(wire_word) | LOWER != u64::from_ne_bytes(known_word) {
            return false;
        }
    }
    known_words
        .remainder()
        .iter()
        .zip(wire_words.remainder())
        .all(|(known, wire)| wire | 0x20 == *known)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::response::{parse_response_head, Framing, HeadParse, ParsedHead};
    use http::header;
    use http::Method;

    // `content-length` is listed as the proxy lists it: it is still never a relayed line.
    const KEPT: Relayed = Relayed::Only(&["content-type", "content-length", "etag", "date"]);

    fn relayed(wire: &str) -> ParsedHead {
        match parse_response_head(wire.as_bytes(), &Method::GET, HeadFields::Relay(&KEPT)) {
            Ok(HeadParse::Complete(_, head)) => head,
            other => panic!("{wire:?}: {other:?}"),
        }
    }

    #[test]
    fn field_names_match_in_any_case_and_nothing_else() {
        for known in ["etag", "content-length", "last-modified", "x-2", "a"] {
            assert!(field_is(known, known.as_bytes()), "{known}");
            assert!(field_is(known, known.to_ascii_uppercase().as_bytes()));
            let mixed: String = known
                .chars()
                .enumerate()
                .map(|(i, c)| {
                    if i % 3 == 0 {
                        c.to_ascii_uppercase()
                    } else {
                        c
                    }
                })
                .collect();
            assert!(field_is(known, mixed.as_bytes()), "{mixed}");
            // Every single-byte change of a token character is a different name.
            for at in 0..known.len() {
                for other in
                    b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                {
                    let mut wire = known.as_bytes().to_vec();
                    if wire[at].eq_ignore_ascii_case(other) {
                        continue;
                    }
                    wire[at] = *other;
                    assert!(
                        !field_is(known, &wire),
                        "{known} vs {:?}",
                        String::from_utf8_lossy(&wire)
                    );
                }
            }
            assert!(!field_is(known, format!("{known}x").as_bytes()));
            assert!(!field_is(known, &known.as_bytes()[1..]));
        }
    }

    #[test]
    fn listed_fields_become_lines_and_framing_fields_are_read_not_kept() {
        let head = relayed(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Secret: 1\r\nContent-Length: 5\r\n\
             ETag: \"a\"\r\netag: \"b\"\r\nConnection: close\r\nSet-Cookie: s=1\r\n\r\n",
        );
        let lines = head.relayed.expect("relay mode gives lines");
        assert_eq!(
            std::str::from_utf8(lines.as_bytes()).unwrap(),
            "content-type: text/plain\r\netag: \"a\"\r\netag: \"b\"\r\n"
        );
        assert!(!lines.has_date());
        assert!(head.headers.is_empty(), "{:?}", head.headers);
        assert_eq!(head.framing, Framing::Length(5));
        assert!(
            !head.keep_alive,
            "connection: close is seen in relay mode too"
        );
    }

    #[test]
    fn relay_mode_refuses_what_the_full_parse_refuses() {
        for wire in [
            "HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: +5\r\n\r\n",
            "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n",
            "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
        ] {
            assert!(
                parse_response_head(wire.as_bytes(), &Method::GET, HeadFields::Relay(&KEPT))
                    .is_err(),
                "{wire:?}"
            );
        }
        let chunked =
            relayed("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 9\r\n\r\n");
        assert_eq!(chunked.framing, Framing::Chunked);
        assert!(
            !chunked.keep_alive,
            "a length beside the coding closes the connection"
        );
        let listed = relayed("HTTP/1.1 200 OK\r\ncontent-length: 5, 5\r\n\r\n");
        assert_eq!(
            (listed.framing, listed.keep_alive),
            (Framing::Length(5), true)
        );
        let old = relayed("HTTP/1.0 200 OK\r\ncontent-length: 1\r\nConnection: Keep-Alive\r\n\r\n");
        assert_eq!((old.framing, old.keep_alive), (Framing::Length(1), true));
        let until_close = relayed("HTTP/1.1 200 OK\r\netag: \"x\"\r\n\r\n");
        assert_eq!(
            (until_close.framing, until_close.keep_alive),
            (Framing::UntilClose, false)
        );
    }

    #[test]
    fn a_map_becomes_lines_without_its_framing_fields() {
        let mut map = HeaderMap::new();
        map.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        map.insert(header::CONTENT_LENGTH, HeaderValue::from_static("3"));
        map.insert(header::CONNECTION, HeaderValue::from_static("close"));
        map.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        map.append("x-cache", HeaderValue::from_static("hit"));
        let lines = RelayedFields::from_map(&map);
        assert_eq!(
            std::str::from_utf8(lines.as_bytes()).unwrap(),
            "content-type: text/plain\r\nx-cache: hit\r\n"
        );
        assert!(!lines.has_date());
        map.insert(
            header::DATE,
            HeaderValue::from_static("Sun, 06 Nov 1994 08:49:37 GMT"),
        );
        let with_date = RelayedFields::from_map(&map);
        assert!(with_date.has_date());
        let mut back = HeaderMap::new();
        with_date.append_to(&mut back);
        assert_eq!(back.len(), 3);
        assert_eq!(back[header::DATE], "Sun, 06 Nov 1994 08:49:37 GMT");
    }

    #[test]
    fn lines_merge_back_into_a_map() {
        let head = relayed(
            "HTTP/1.1 200 OK\r\ndate: Sun, 06 Nov 1994 08:49:37 GMT\r\netag: \"a\"\r\n\
             content-type: a/b; q=\"x:y\"\r\n\r\n",
        );
        let lines = head.relayed.expect("lines");
        assert!(lines.has_date());
        let mut map = HeaderMap::new();
        lines.append_to(&mut map);
        assert_eq!(map.len(), 3);
        assert_eq!(map[header::DATE], "Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(map[header::CONTENT_TYPE], "a/b; q=\"x:y\"");
        assert_eq!(map[header::ETAG], "\"a\"");
    }

    const HOP: Relayed = Relayed::AllBut(&["keep-alive", "proxy-authenticate", "upgrade"]);

    fn all_but(wire: &str, method: &Method) -> ParsedHead {
        match parse_response_head(wire.as_bytes(), method, HeadFields::Relay(&HOP)) {
            Ok(HeadParse::Complete(_, head)) => head,
            other => panic!("{wire:?}: {other:?}"),
        }
    }

    #[test]
    fn all_but_mode_keeps_every_other_field_in_lower_case_and_in_order() {
        let head = all_but(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: Keep-Alive, X-Hop\r\n\
             x-HOP: 1\r\nKeep-Alive: timeout=5\r\nUpgrade: h2c\r\nSet-Cookie: a=1\r\n\
             Content-Length: 5\r\nset-cookie: b=2\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\n\r\n",
            &Method::GET,
        );
        let lines = head.relayed.expect("relay mode gives lines");
        assert_eq!(
            std::str::from_utf8(lines.as_bytes()).unwrap(),
            "content-type: text/plain\r\nset-cookie: a=1\r\nset-cookie: b=2\r\n\
             date: Sun, 06 Nov 1994 08:49:37 GMT\r\n"
        );
        assert!(lines.has_date());
        assert!(head.headers.is_empty(), "{:?}", head.headers);
        assert_eq!((head.framing, head.keep_alive), (Framing::Length(5), true));
    }

    #[test]
    fn all_but_mode_states_the_length_of_an_answer_without_a_body() {
        let wire = "HTTP/1.1 200 OK\r\nContent-Length: 1234\r\nETag: \"a\"\r\n\r\n";
        let head = all_but(wire, &Method::HEAD);
        assert_eq!(head.framing, Framing::Empty);
        assert_eq!(head.headers[header::CONTENT_LENGTH], "1234");
        let not_modified = all_but(
            "HTTP/1.1 304 Not Modified\r\ncontent-length: 7\r\n\r\n",
            &Method::GET,
        );
        assert_eq!(not_modified.headers[header::CONTENT_LENGTH], "7");
        // With a body the length comes from the body's size, as in `Relay` mode.
        let get = all_but(wire, &Method::GET);
        assert_eq!(get.framing, Framing::Length(1234));
        assert!(get.headers.is_empty(), "{:?}", get.headers);
        // An unreadable length is not stated (the full parse's writer skips it too).
        let bad = all_but(
            "HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n",
            &Method::HEAD,
        );
        assert!(bad.headers.is_empty(), "{:?}", bad.headers);
    }

    #[test]
    fn an_appended_field_follows_the_lines_and_framing_fields_are_not_taken() {
        let mut lines = all_but(
            "HTTP/1.1 200 OK\r\nvia: 1.1 backend\r\ncontent-length: 0\r\n\r\n",
            &Method::GET,
        )
        .relayed
        .expect("lines");
        lines.append(&header::VIA, &HeaderValue::from_static("1.1 wharf"));
        lines.append(&header::CONTENT_LENGTH, &HeaderValue::from_static("9"));
        lines.append(&header::CONNECTION, &HeaderValue::from_static("close"));
        assert_eq!(
            std::str::from_utf8(lines.as_bytes()).unwrap(),
            "via: 1.1 backend\r\nvia: 1.1 wharf\r\n"
        );
        // Shared lines (a stored head's) are copied, the other clones left as they were.
        let mut map = HeaderMap::new();
        map.insert(header::ETAG, HeaderValue::from_static("\"a\""));
        let shared = RelayedFields::from_map(&map);
        let mut changed = shared.clone();
        changed.append(
            &header::DATE,
            &HeaderValue::from_static("Sun, 06 Nov 1994 08:49:37 GMT"),
        );
        assert!(changed.has_date() && !shared.has_date());
        assert_eq!(
            std::str::from_utf8(shared.as_bytes()).unwrap(),
            "etag: \"a\"\r\n"
        );
        assert_eq!(
            std::str::from_utf8(changed.as_bytes()).unwrap(),
            "etag: \"a\"\r\ndate: Sun, 06 Nov 1994 08:49:37 GMT\r\n"
        );
    }
}
