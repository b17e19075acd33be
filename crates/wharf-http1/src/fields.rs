//! Rules about header fields shared by requests and responses: building a header map from
//! the parser's slots, content-length, transfer-encoding and connection options.

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::Version;

use crate::error::MessageError;

/// The header map of a parsed head. `buf` is what the parser read and `len` the head's
/// length in it: the head is copied once into a buffer of exactly that size and every value
/// points into the copy, so no value keeps a (much larger) read buffer alive.
pub(crate) fn header_map(
    buf: &[u8],
    len: usize,
    slots: &[httparse::Header<'_>],
) -> Result<(Bytes, HeaderMap), MessageError> {
    let head = Bytes::copy_from_slice(&buf[..len]);
    let headers = header_map_in(&head, buf, slots)?;
    Ok((head, headers))
}

/// [`header_map`] with the head already copied out of `buf` into `head`.
pub(crate) fn header_map_in(
    head: &Bytes,
    buf: &[u8],
    slots: &[httparse::Header<'_>],
) -> Result<HeaderMap, MessageError> {
    let mut headers = crate::recycle::header_map_with_capacity(slots.len());
    for slot in slots {
        let name = HeaderName::from_bytes(slot.name.as_bytes())
            .map_err(|_| MessageError::Malformed(format!("header name {:?}", slot.name)))?;
        let value = HeaderValue::from_maybe_shared(slice_of(head, buf, slot.value))
            .map_err(|_| MessageError::Malformed(format!("value of header {name}")))?;
        headers.append(name, value);
    }
    Ok(headers)
}

/// Which of the fields a server reads itself were in a head, read from the parser's names
/// ([`FieldsSeen::of_slots`]), whether or not a map of them is built.
///
/// Why: most requests carry a `host` and none of the others, and each question put to the
/// map (how many hosts? any `connection`, `transfer-encoding`, `content-length`,
/// `expect`?) is a hash and a probe: ~370 instructions per request, against a comparison
/// of each name with five standard ones here. The request's rules are asked only when their
/// field is there: a build that called each rule over an empty list of lines instead
/// measured +262 and +290 instructions per call (pass-through, cache hit). A response's
/// framing still asks its map (its notes are not used: a route forward measured the same
/// either way).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct FieldsSeen {
    /// `host` lines.
    pub(crate) hosts: usize,
    /// A `connection` line.
    pub(crate) connection: bool,
    /// A `transfer-encoding` line.
    pub(crate) transfer_encoding: bool,
    /// A `content-length` line.
    pub(crate) content_length: bool,
    /// An `expect` line.
    pub(crate) expect: bool,
}

impl FieldsSeen {
    /// The notes of a head's `slots`, from the parser's names (any case).
    pub(crate) fn of_slots(slots: &[httparse::Header<'_>]) -> Self {
        use crate::relay::field_is;
        let mut seen = FieldsSeen::default();
        for slot in slots {
            let name = slot.name.as_bytes();
            if field_is("host", name) {
                seen.hosts += 1;
            } else if field_is("connection", name) {
                seen.connection = true;
            } else if field_is("transfer-encoding", name) {
                seen.transfer_encoding = true;
            } else if field_is("content-length", name) {
                seen.content_length = true;
            } else if field_is("expect", name) {
                seen.expect = true;
            }
        }
        seen
    }

    /// Whether a field the server's own rules read (persistence, framing, `expect`) is
    /// there: those rules read it from the map.
    pub(crate) fn has_rule_fields(&self) -> bool {
        self.connection || self.transfer_encoding || self.content_length || self.expect
    }
}

/// Appends the line `name: value` and its end: every head written here, request or
/// response, spells its fields this way.
#[inline(always)] // left to `#[inline]` it stayed a call, dearer than its four copies (callgrind)
pub(crate) fn push_field(name: &[u8], value: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// `part` (a slice of `buf`) as a slice of `copy` (a copy of `buf`'s start).
pub(crate) fn slice_of(copy: &Bytes, buf: &[u8], part: &[u8]) -> Bytes {
    let start = part.as_ptr() as usize - buf.as_ptr() as usize;
    copy.slice(start..start + part.len())
}

/// A field that decides a message's framing or persistence: read by the parsers, never
/// relayed as it came.
#[derive(Clone, Copy)]
pub(crate) enum FramingField {
    ContentLength,
    TransferEncoding,
    Connection,
}

/// Whether `name` (lower case) is a field a server states itself instead of passing it on:
/// a framing or connection field, or `keep-alive` (the connection's, hop by hop). Neither a
/// map's fields nor relayed lines ever carry one.
pub(crate) fn stated_by_server(name: &[u8]) -> bool {
    // By length first: it runs for every field a server writes from a map, and nearly every
    // field differs in length from all four (the names are `FramingField::as_str`'s, which a
    // test holds equal).
    match name.len() {
        10 => name == b"connection" || name == b"keep-alive",
        14 => name == b"content-length",
        17 => name == b"transfer-encoding",
        _ => false,
    }
}

impl FramingField {
    #[cfg(test)]
    const ALL: [FramingField; 3] = [
        FramingField::ContentLength,
        FramingField::TransferEncoding,
        FramingField::Connection,
    ];

    pub(crate) fn name(self) -> HeaderName {
        match self {
            FramingField::ContentLength => header::CONTENT_LENGTH,
            FramingField::TransferEncoding => header::TRANSFER_ENCODING,
            FramingField::Connection => header::CONNECTION,
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            FramingField::ContentLength => "content-length",
            FramingField::TransferEncoding => "transfer-encoding",
            FramingField::Connection => "connection",
        }
    }
}

/// The declared content-length: every value of every line must be the same decimal number
/// (RFC 9110 §8.6 allows `5, 5`); several equal values become one line. `None` when absent.
pub(crate) fn content_length(headers: &mut HeaderMap) -> Result<Option<u64>, MessageError> {
    let declared = declared_content_length(|| values(headers, header::CONTENT_LENGTH))?;
    Ok(declared.map(|(len, one_line)| {
        if !one_line {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
        }
        len
    }))
}

/// The byte values of `name`'s lines in `headers`.
pub(crate) fn values<'a>(headers: &'a HeaderMap, name: HeaderName) -> ValueBytes<'a> {
    headers.get_all(name).into_iter().map(HeaderValue::as_bytes)
}

/// The byte values of a field's lines in a map.
pub(crate) type ValueBytes<'a> =
    std::iter::Map<http::header::ValueIter<'a, HeaderValue>, fn(&'a HeaderValue) -> &'a [u8]>;

/// [`content_length`]'s rules over the `content-length` lines' values, wherever they are
/// held: the length, and whether it came as one line of one value.
pub(crate) fn declared_content_length<'a, I: Iterator<Item = &'a [u8]>>(
    lines: impl Fn() -> I,
) -> Result<Option<(u64, bool)>, MessageError> {
    let mut first_lines = lines();
    let Some(first) = first_lines.next() else {
        return Ok(None);
    };
    // One line of plain digits: nearly every message, read without splitting.
    if let Some(len) = parse_content_length(first) {
        if first_lines.next().is_none() {
            return Ok(Some((len, true)));
        }
    }
    let mut declared: Option<u64> = None;
    for value in lines() {
        for part in value.split(|&b| b == b',') {
            let len = parse_content_length(part.trim_ascii()).ok_or_else(|| {
                MessageError::Framing(format!(
                    "content-length {:?}",
                    String::from_utf8_lossy(value)
                ))
            })?;
            if declared.is_some_and(|earlier| earlier != len) {
                return Err(MessageError::Framing(
                    "content-length given twice with different values".to_owned(),
                ));
            }
            declared = Some(len);
        }
    }
    Ok(declared.map(|len| (len, false)))
}

/// A content-length value: 1 to 19 decimal digits (no sign, no spaces; 19 digits always
/// fit a `u64`).
pub fn parse_content_length(text: &[u8]) -> Option<u64> {
    if text.is_empty() || text.len() > 19 {
        return None;
    }
    text.iter().try_fold(0u64, |len, &b| {
        b.is_ascii_digit().then(|| len * 10 + u64::from(b - b'0'))
    })
}

/// Checks `transfer-encoding`: present means it must be exactly one `chunked` coding over
/// all lines, in HTTP/1.1. Returns whether the field is present.
pub(crate) fn is_chunked(headers: &HeaderMap, version: Version) -> Result<bool, MessageError> {
    chunked_coding(|| values(headers, header::TRANSFER_ENCODING), version)
}

/// [`is_chunked`]'s rules over the `transfer-encoding` lines' values.
pub(crate) fn chunked_coding<'a, I: Iterator<Item = &'a [u8]>>(
    lines: impl Fn() -> I,
    version: Version,
) -> Result<bool, MessageError> {
    if lines().next().is_none() {
        return Ok(false);
    }
    if version == Version::HTTP_10 {
        return Err(MessageError::Framing(
            "transfer-encoding in an HTTP/1.0 message".to_owned(),
        ));
    }
    let mut codings = lines().flat_map(list_items);
    let only_chunked = codings
        .next()
        .is_some_and(|first| first.eq_ignore_ascii_case(b"chunked"))
        && codings.next().is_none();
    if only_chunked {
        Ok(true)
    } else {
        Err(MessageError::Framing(
            "transfer-encoding other than chunked".to_owned(),
        ))
    }
}

/// Keep-alive by the `connection` field: HTTP/1.1 persists unless `close`; HTTP/1.0 only with
/// `keep-alive`.
pub(crate) fn connection_persists(version: Version, headers: &HeaderMap) -> bool {
    persists(version, values(headers, header::CONNECTION))
}

/// The items of a field value that is a list (RFC 9110 §5.6.1): split at commas, spaces
/// and tabs around each trimmed, empty items skipped.
pub(crate) fn list_items(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|item| !item.is_empty())
}

/// [`connection_persists`]'s rules over the `connection` lines' values.
pub(crate) fn persists<'a>(version: Version, lines: impl Iterator<Item = &'a [u8]>) -> bool {
    let mut close = false;
    let mut keep_alive = false;
    for value in lines {
        for option in list_items(value) {
            close |= option.eq_ignore_ascii_case(b"close");
            keep_alive |= option.eq_ignore_ascii_case(b"keep-alive");
        }
    }
    if close {
        return false;
    }
    version == Version::HTTP_11 || keep_alive
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_states_the_framing_fields_and_keep_alive_itself_and_no_other() {
        for field in FramingField::ALL {
            assert_eq!(field.name().as_str(), field.as_str());
            assert!(
                stated_by_server(field.as_str().as_bytes()),
                "{}",
                field.as_str()
            );
        }
        assert!(stated_by_server(b"keep-alive"));
        // Names of the same lengths, and near misses.
        for name in [
            "set-cookie",
            "accept-charset",
            "if-modified-since",
            "connections",
            "content-type",
            "date",
            "",
        ] {
            assert!(!stated_by_server(name.as_bytes()), "{name}");
        }
    }
}
