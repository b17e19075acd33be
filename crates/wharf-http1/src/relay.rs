//! Response header fields relayed as they came: a pass-through proxy that passes on a
//! fixed set of an upstream's fields need not build a [`HeaderMap`] of them (a name lookup,
//! a hash and a validated value per field) only for the server to write them out again.
//!
//! [`HeadFields::Relay`] asks the response parser to copy the listed fields' lines into one
//! buffer, [`RelayedFields`], and to put into the head's map only the fields that decide the
//! framing and the connection (`content-length`, `transfer-encoding`, `connection`), which
//! the client side needs and which are never relayed as lines. The server writes the lines
//! after the map's fields ([`crate::response::encode_response_head`]); a server that needs
//! a map (HTTP/2) merges them back in with [`RelayedFields::append_to`].

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use crate::error::MessageError;

/// Which header fields of a response head are kept, and how.
#[derive(Debug, Clone, Copy)]
pub enum HeadFields {
    /// Every field, in the head's [`HeaderMap`].
    All,
    /// Only the fields of these names, as lines in a [`RelayedFields`]; the framing and
    /// connection fields go to the head's map. Names are given in lower case (as
    /// [`HeaderName::as_str`] gives them), matched without regard to case and written as
    /// given. Plain strings, not header names: matching them is a length check and a byte
    /// comparison per listed name, where a header name would be looked up each time.
    Relay(&'static [&'static str]),
}

/// Header lines of an upstream's response, each `name: value\r\n`, to be written as they
/// are. Built only by the response parser: every name is one the caller listed and never a
/// framing or connection field, and every value passed the parser's checks (tab, visible
/// ASCII, space, obs-text: all bytes a [`HeaderValue`] accepts).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RelayedFields {
    lines: Vec<u8>,
    has_date: bool,
}

impl RelayedFields {
    /// The lines, ready for the wire.
    pub fn as_bytes(&self) -> &[u8] {
        &self.lines
    }

    /// Whether the lines include `date` (the server then writes none of its own).
    pub fn has_date(&self) -> bool {
        self.has_date
    }

    /// Appends the lines' fields to `headers`, for a server that writes from a map.
    pub fn append_to(&self, headers: &mut HeaderMap) {
        for line in self.lines.split(|&b| b == b'\n') {
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

/// Fields that decide framing and persistence: always in the head's map, never relayed.
const FRAMING: [(&str, HeaderName); 3] = [
    ("content-length", header::CONTENT_LENGTH),
    ("transfer-encoding", header::TRANSFER_ENCODING),
    ("connection", header::CONNECTION),
];

/// The relay-mode split of a parsed head's fields (`slots`): the framing fields as a map,
/// the `relayed` ones as lines.
pub(crate) fn relay_fields(
    head_len: usize,
    slots: &[httparse::Header<'_>],
    relayed: &[&str],
) -> Result<(HeaderMap, RelayedFields), MessageError> {
    let mut headers = crate::recycle::header_map_with_capacity(FRAMING.len());
    let mut lines = Vec::with_capacity(head_len);
    let mut has_date = false;
    for slot in slots {
        let name = slot.name.as_bytes();
        if let Some((_, framing)) = FRAMING.iter().find(|(known, _)| matches_name(known, name)) {
            // A copy of the value alone: these are few and short, where the full parse
            // shares one copy of the whole head among all its values.
            let value = HeaderValue::from_bytes(slot.value)
                .map_err(|_| MessageError::Malformed(format!("value of header {framing}")))?;
            headers.append(framing.clone(), value);
        } else if let Some(kept) = relayed.iter().find(|known| matches_name(known, name)) {
            debug_assert!(!kept.bytes().any(|b| b.is_ascii_uppercase()), "{kept}");
            has_date |= *kept == "date";
            lines.extend_from_slice(kept.as_bytes());
            lines.extend_from_slice(b": ");
            lines.extend_from_slice(slot.value);
            lines.extend_from_slice(b"\r\n");
        }
    }
    let lines = RelayedFields { lines, has_date };
    Ok((headers, lines))
}

/// `wire` (a field name as received) is `known` (lower case), in any case.
#[inline(always)] // a length check that fails, mostly: not worth a call
fn matches_name(known: &str, wire: &[u8]) -> bool {
    known.len() == wire.len() && known.as_bytes().eq_ignore_ascii_case(wire)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::response::{parse_response_head, Framing, HeadParse, ParsedHead};
    use http::Method;

    const KEPT: &[&str] = &["content-type", "etag", "date"];

    fn relayed(wire: &str) -> ParsedHead {
        match parse_response_head(wire.as_bytes(), &Method::GET, HeadFields::Relay(KEPT)) {
            Ok(HeadParse::Complete(_, head)) => head,
            other => panic!("{wire:?}: {other:?}"),
        }
    }

    #[test]
    fn listed_fields_become_lines_and_framing_fields_stay_in_the_map() {
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
        assert_eq!(head.headers.len(), 2, "{:?}", head.headers);
        assert_eq!(head.headers[header::CONTENT_LENGTH], "5");
        assert_eq!(head.headers[header::CONNECTION], "close");
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
            "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n",
        ] {
            assert!(
                parse_response_head(wire.as_bytes(), &Method::GET, HeadFields::Relay(KEPT))
                    .is_err(),
                "{wire:?}"
            );
        }
        let chunked =
            relayed("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 9\r\n\r\n");
        assert_eq!(chunked.framing, Framing::Chunked);
        assert!(!chunked.keep_alive);
        assert!(!chunked.headers.contains_key(header::CONTENT_LENGTH));
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
}
