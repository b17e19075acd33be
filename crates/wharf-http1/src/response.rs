//! Response heads: read by the upstream client with their framing (RFC 9112 §6.3) and
//! keep-alive decision, and written by the server.

use std::mem::MaybeUninit;

use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, StatusCode, Version};

use crate::error::MessageError;
use crate::fields::{
    chunked_coding, declared_content_length, header_map, persists, push_field, stated_by_server,
    values, FramingField,
};
use crate::relay::{field_is, relay_fields, relay_fields_but, HeadFields, Relayed, RelayedFields};

/// Largest response head accepted (status line and headers).
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Most response header lines accepted.
pub const MAX_HEADERS: usize = 128;

/// How a response body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body (HEAD, 1xx, 204, 304).
    Empty,
    /// Exactly this many bytes.
    Length(u64),
    /// The chunked transfer coding.
    Chunked,
    /// Until the upstream closes the connection.
    UntilClose,
}

/// A parsed response head.
#[derive(Debug)]
pub struct ParsedHead {
    /// The status.
    pub status: StatusCode,
    /// HTTP/1.0 or HTTP/1.1.
    pub version: Version,
    /// The header fields: all of them, or none with [`HeadFields::Relay`] (the framing and
    /// connection fields are then read into `framing` and `keep_alive`).
    pub headers: HeaderMap,
    /// With [`HeadFields::Relay`], the relayed fields' lines.
    pub relayed: Option<RelayedFields>,
    /// How the body is delimited.
    pub framing: Framing,
    /// The connection may carry another request once this body is read.
    pub keep_alive: bool,
}

/// What the head parser made of the buffered bytes.
#[derive(Debug)]
pub enum HeadParse {
    /// More bytes are needed.
    Partial,
    /// An interim (1xx) response of this many bytes: skip it and parse the next head.
    Interim(usize),
    /// A final response head of this many bytes.
    Complete(usize, ParsedHead),
}

/// Parses a response head from the front of `buf` (the answer to a `method` request),
/// keeping its header `fields` as asked.
pub fn parse_response_head(
    buf: &[u8],
    method: &Method,
    fields: HeadFields,
) -> Result<HeadParse, MessageError> {
    // Uninitialised slots, as in `parse_request_head`: no 4 KiB of zeroing per parse.
    let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut []);
    let len = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut response,
        buf,
        &mut slots,
    ) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => {
            if buf.len() > MAX_HEAD_BYTES {
                return Err(MessageError::TooLarge {
                    limit: MAX_HEAD_BYTES,
                });
            }
            return Ok(HeadParse::Partial);
        }
        Err(httparse::Error::TooManyHeaders) => {
            return Err(MessageError::TooManyHeaders { limit: MAX_HEADERS })
        }
        Err(error) => return Err(MessageError::Malformed(error.to_string())),
    };
    if len > MAX_HEAD_BYTES {
        return Err(MessageError::TooLarge {
            limit: MAX_HEAD_BYTES,
        });
    }
    let code = response.code.unwrap_or(0);
    let status = StatusCode::from_u16(code)
        .map_err(|_| MessageError::Malformed(format!("status code {code}")))?;
    if status == StatusCode::SWITCHING_PROTOCOLS {
        return Err(MessageError::Malformed(
            "101 switching protocols to a request that asked for no upgrade".to_owned(),
        ));
    }
    if status.is_informational() {
        return Ok(HeadParse::Interim(len));
    }
    let version = match response.version {
        Some(0) => Version::HTTP_10,
        _ => Version::HTTP_11,
    };
    let (headers, relayed, framing, keep_alive) = match fields {
        HeadFields::All => {
            let (_head, mut headers) = header_map(buf, len, response.headers)?;
            let (framing, keep_alive) = framing(method, status, version, &mut headers)?;
            (headers, None, framing, keep_alive)
        }
        HeadFields::Relay(kept) => {
            let slots = &*response.headers;
            let values = |field: FramingField| {
                slots
                    .iter()
                    .filter(move |slot| field_is(field.as_str(), slot.name.as_bytes()))
                    .map(|slot| slot.value)
            };
            let (framing, keep_alive, _) = decide_framing(method, status, version, values)?;
            // The map is empty: the client side takes the framing from the body's size.
            let mut headers = crate::recycle::header_map_with_capacity(0);
            let relayed = match kept {
                Relayed::Only(names) => relay_fields(len, slots, names),
                Relayed::AllBut(omitted) => {
                    // No body, no size to take the length from: the length a GET would get
                    // (HEAD) or the representation's (304) is stated from the map, as with
                    // `All`.
                    if framing == Framing::Empty {
                        let stated = values(FramingField::ContentLength)
                            .next()
                            .and_then(crate::parse_content_length);
                        if let Some(length) = stated {
                            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
                        }
                    }
                    relay_fields_but(len, slots, omitted)
                }
            };
            (headers, Some(relayed), framing, keep_alive)
        }
    };
    Ok(HeadParse::Complete(
        len,
        ParsedHead {
            status,
            version,
            headers,
            relayed,
            framing,
            keep_alive,
        },
    ))
}

/// The body's framing (RFC 9112 §6.3), and whether it allows the connection to persist.
/// A `content-length` next to `transfer-encoding` is removed (the coding wins, and the
/// connection is closed after, as the RFC asks of intermediaries); several equal
/// `content-length` values become one line.
fn framing(
    method: &Method,
    status: StatusCode,
    version: Version,
    headers: &mut HeaderMap,
) -> Result<(Framing, bool), MessageError> {
    let (framing, keep_alive, length_field) = decide_framing(method, status, version, |field| {
        values(headers, field.name())
    })?;
    match length_field {
        LengthField::AsIs => {}
        LengthField::Drop => {
            headers.remove(header::CONTENT_LENGTH);
        }
        LengthField::OneLine(len) => {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
        }
    }
    Ok((framing, keep_alive))
}

/// What becomes of a head's `content-length` lines once its framing is decided.
enum LengthField {
    AsIs,
    /// Ignored: the body is chunked.
    Drop,
    /// Several equal values, to be stated once.
    OneLine(u64),
}

/// [`framing`]'s decision from the framing fields' values, wherever they are held:
/// `values(field)` gives the values of `field`'s lines.
fn decide_framing<'a, I: Iterator<Item = &'a [u8]>>(
    method: &Method,
    status: StatusCode,
    version: Version,
    values: impl Fn(FramingField) -> I,
) -> Result<(Framing, bool, LengthField), MessageError> {
    let persists = persists(version, values(FramingField::Connection));
    if *method == Method::HEAD
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        return Ok((Framing::Empty, persists, LengthField::AsIs));
    }
    if chunked_coding(|| values(FramingField::TransferEncoding), version)? {
        let had_length = values(FramingField::ContentLength).next().is_some();
        let length_field = if had_length {
            LengthField::Drop
        } else {
            LengthField::AsIs
        };
        return Ok((Framing::Chunked, persists && !had_length, length_field));
    }
    match declared_content_length(|| values(FramingField::ContentLength))? {
        Some((len, true)) => Ok((Framing::Length(len), persists, LengthField::AsIs)),
        Some((len, false)) => Ok((Framing::Length(len), persists, LengthField::OneLine(len))),
        None => Ok((Framing::UntilClose, false, LengthField::AsIs)),
    }
}

/// How a response body goes on the wire, as the server decided it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseFraming {
    /// No body is written (HEAD, 1xx, 204, 304); `content-length` is stated as given, if
    /// at all (a HEAD answer states the length a GET would get).
    NoBody {
        /// The `content-length` to state.
        content_length: Option<u64>,
    },
    /// Exactly this many bytes.
    Length(u64),
    /// The chunked transfer coding.
    Chunked,
    /// Until the connection closes (an HTTP/1.0 client, length unknown).
    UntilClose,
}

/// What the server says in `connection`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionOption {
    /// Nothing (HTTP/1.1 persists by default).
    Default,
    /// `connection: close`: this is the last response on the connection.
    Close,
    /// `connection: keep-alive` (for an HTTP/1.0 client that asked for it).
    KeepAlive,
}

/// Writes `HTTP/1.1 status reason`, the headers (minus the framing and connection fields,
/// which the server writes itself), the `relayed` lines, `date` when neither has one, and
/// the blank line.
pub fn encode_response_head(
    status: StatusCode,
    headers: &HeaderMap,
    relayed: Option<&RelayedFields>,
    framing: ResponseFraming,
    connection: ConnectionOption,
    date: &[u8],
    out: &mut Vec<u8>,
) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    let mut has_date = encode_fields(headers, out);
    if let Some(relayed) = relayed {
        has_date |= relayed.has_date();
        out.extend_from_slice(relayed.as_bytes());
    }
    let length = match framing {
        ResponseFraming::NoBody { content_length } => content_length,
        ResponseFraming::Length(len) => Some(len),
        ResponseFraming::Chunked => {
            out.extend_from_slice(b"transfer-encoding: chunked\r\n");
            None
        }
        ResponseFraming::UntilClose => None,
    };
    if let Some(len) = length {
        out.extend_from_slice(b"content-length: ");
        crate::write_decimal(len, out);
        out.extend_from_slice(b"\r\n");
    }
    match connection {
        ConnectionOption::Default => {}
        ConnectionOption::Close => out.extend_from_slice(b"connection: close\r\n"),
        ConnectionOption::KeepAlive => out.extend_from_slice(b"connection: keep-alive\r\n"),
    }
    if !has_date && !date.is_empty() {
        push_field(b"date", date, out);
    }
    out.extend_from_slice(b"\r\n");
}

/// Writes `headers` as `name: value` lines, minus the framing and connection fields (which
/// a server states itself); whether they include `date`.
pub(crate) fn encode_fields(headers: &HeaderMap, out: &mut Vec<u8>) -> bool {
    let mut has_date = false;
    for (name, value) in headers {
        if stated_by_server(name.as_str().as_bytes()) {
            continue;
        }
        has_date |= name == header::DATE;
        push_field(name.as_str().as_bytes(), value.as_bytes(), out);
    }
    has_date
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(wire: &str) -> Result<HeadParse, MessageError> {
        parse_response_head(wire.as_bytes(), &Method::GET, HeadFields::All)
    }

    fn complete(wire: &str) -> ParsedHead {
        match parse(wire) {
            Ok(HeadParse::Complete(len, head)) => {
                assert_eq!(len, wire.find("\r\n\r\n").unwrap() + 4, "{wire}");
                head
            }
            other => panic!("{wire:?}: {other:?}"),
        }
    }

    #[test]
    fn framing_by_rfc_9112() {
        let cases = [
            (
                "HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\n",
                Framing::Length(12),
                true,
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\n",
                Framing::Length(5),
                true,
            ),
            (
                "HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 5\r\n\r\n",
                Framing::Length(5),
                true,
            ),
            (
                "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
                Framing::Chunked,
                true,
            ),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n",
                Framing::Chunked,
                true,
            ),
            (
                "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 9\r\n\r\n",
                Framing::Chunked,
                false,
            ),
            ("HTTP/1.1 200 OK\r\n\r\n", Framing::UntilClose, false),
            (
                "HTTP/1.1 204 No Content\r\ncontent-length: 3\r\n\r\n",
                Framing::Empty,
                true,
            ),
            ("HTTP/1.1 304 Not Modified\r\n\r\n", Framing::Empty, true),
            (
                "HTTP/1.1 200 OK\r\ncontent-length: 3\r\nconnection: close\r\n\r\n",
                Framing::Length(3),
                false,
            ),
            (
                "HTTP/1.0 200 OK\r\ncontent-length: 3\r\n\r\n",
                Framing::Length(3),
                false,
            ),
            (
                "HTTP/1.0 200 OK\r\ncontent-length: 3\r\nconnection: keep-alive\r\n\r\n",
                Framing::Length(3),
                true,
            ),
        ];
        for (wire, framing, keep_alive) in cases {
            let head = complete(wire);
            assert_eq!(
                (head.framing, head.keep_alive),
                (framing, keep_alive),
                "{wire:?}"
            );
            if framing == Framing::Chunked {
                assert!(
                    !head.headers.contains_key(header::CONTENT_LENGTH),
                    "{wire:?}"
                );
            }
            assert!(head.headers.get_all(header::CONTENT_LENGTH).iter().count() <= 1);
        }
        let head = parse_response_head(
            b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\n",
            &Method::HEAD,
            HeadFields::All,
        );
        assert!(matches!(
            head,
            Ok(HeadParse::Complete(
                _,
                ParsedHead {
                    framing: Framing::Empty,
                    ..
                }
            ))
        ));
    }

    #[test]
    fn refuses_ambiguous_or_broken_heads() {
        let cases = [
            (
                "HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n",
                "different values",
            ),
            (
                "HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
                "content-length",
            ),
            (
                "HTTP/1.1 200 OK\r\ncontent-length: 0x10\r\n\r\n",
                "content-length",
            ),
            (
                "HTTP/1.1 200 OK\r\ncontent-length: 99999999999999999999\r\n\r\n",
                "content-length",
            ),
            (
                "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n",
                "other than chunked",
            ),
            (
                "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked, chunked\r\n\r\n",
                "other than chunked",
            ),
            (
                "HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
                "HTTP/1.0",
            ),
            ("HTTP/1.1 2000 OK\r\n\r\n", "malformed"),
            ("HTCPCP/1.0 200 OK\r\n\r\n", "malformed"),
            ("HTTP/1.1 200 OK\r\nbad header\r\n\r\n", "malformed"),
            ("HTTP/1.1 200 OK\r\nfolded: a\r\n b\r\n\r\n", "malformed"),
            ("HTTP/1.1 101 Switching Protocols\r\n\r\n", "101"),
        ];
        for (wire, expected) in cases {
            let error = parse(wire).unwrap_err();
            assert!(error.to_string().contains(expected), "{wire:?}: {error}");
        }
    }

    #[test]
    fn partial_heads_wait_and_huge_ones_fail() {
        assert!(matches!(
            parse("HTTP/1.1 200 OK\r\ncontent-le"),
            Ok(HeadParse::Partial)
        ));
        let mut flood = String::from("HTTP/1.1 200 OK\r\n");
        while flood.len() <= MAX_HEAD_BYTES {
            flood.push_str(&format!("x-filler: {}\r\n", "a".repeat(1000)));
        }
        assert!(matches!(parse(&flood), Err(MessageError::TooLarge { .. })));
        // Exactly as many lines as there are (uninitialised) slots: every one is kept.
        let mut full = String::from("HTTP/1.1 200 OK\r\n");
        for i in 0..MAX_HEADERS {
            full.push_str(&format!("x-{i}: {i}\r\n"));
        }
        full.push_str("\r\n");
        let head = complete(&full);
        assert_eq!(head.headers.len(), MAX_HEADERS);
        let last = MAX_HEADERS - 1;
        assert_eq!(head.headers[format!("x-{last}")], last.to_string());
        let mut many = String::from("HTTP/1.1 200 OK\r\n");
        for i in 0..=MAX_HEADERS {
            many.push_str(&format!("x-{i}: 1\r\n"));
        }
        many.push_str("\r\n");
        assert!(parse(&many)
            .unwrap_err()
            .to_string()
            .contains("header lines"));
    }

    #[test]
    fn interim_responses_are_skipped() {
        assert!(matches!(
            parse("HTTP/1.1 100 Continue\r\n\r\n"),
            Ok(HeadParse::Interim(25))
        ));
        assert!(matches!(
            parse("HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n"),
            Ok(HeadParse::Interim(_))
        ));
    }

    #[test]
    fn header_values_are_kept_exactly() {
        let head = complete("HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nX-A: 1\r\nx-a: 2\r\ncontent-length: 0\r\n\r\n");
        assert_eq!(head.status, StatusCode::OK);
        assert_eq!(head.headers["content-type"], "text/plain; charset=utf-8");
        let all: Vec<_> = head.headers.get_all("x-a").iter().collect();
        assert_eq!(all, ["1", "2"]);
    }

    #[test]
    fn relayed_lines_follow_the_map_and_may_bring_the_date() {
        let wire = "HTTP/1.1 200 OK\r\nETag: \"e\"\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\n\
                    content-length: 2\r\nx-other: 1\r\n\r\n";
        let parsed = match parse_response_head(
            wire.as_bytes(),
            &Method::GET,
            HeadFields::Relay(&Relayed::Only(&["etag", "date"])),
        ) {
            Ok(HeadParse::Complete(_, parsed)) => parsed,
            other => panic!("{other:?}"),
        };
        let mut headers = parsed.headers;
        headers.insert("x-cache", http::HeaderValue::from_static("bypass"));
        let mut out = Vec::new();
        encode_response_head(
            StatusCode::OK,
            &headers,
            parsed.relayed.as_ref(),
            ResponseFraming::Length(2),
            ConnectionOption::Default,
            b"Mon, 07 Nov 1994 00:00:00 GMT",
            &mut out,
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 200 OK\r\nx-cache: bypass\r\netag: \"e\"\r\n\
             date: Sun, 06 Nov 1994 08:49:37 GMT\r\ncontent-length: 2\r\n\r\n",
            "the relayed date, not a second one"
        );
    }

    #[test]
    fn response_heads_for_clients() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/plain"),
        );
        headers.insert(
            header::CONTENT_LENGTH,
            http::HeaderValue::from_static("999"),
        );
        headers.insert(
            header::CONNECTION,
            http::HeaderValue::from_static("upgrade"),
        );
        let mut out = Vec::new();
        encode_response_head(
            StatusCode::OK,
            &headers,
            None,
            ResponseFraming::Length(5),
            ConnectionOption::Default,
            b"Sun, 06 Nov 1994 08:49:37 GMT",
            &mut out,
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 5\r\ndate: Sun, 06 Nov 1994 08:49:37 GMT\r\n\r\n"
        );
        let mut out = Vec::new();
        encode_response_head(
            StatusCode::BAD_GATEWAY,
            &HeaderMap::new(),
            None,
            ResponseFraming::Chunked,
            ConnectionOption::Close,
            b"",
            &mut out,
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 502 Bad Gateway\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
        );
        let mut out = Vec::new();
        encode_response_head(
            StatusCode::NOT_MODIFIED,
            &HeaderMap::new(),
            None,
            ResponseFraming::NoBody {
                content_length: None,
            },
            ConnectionOption::KeepAlive,
            b"",
            &mut out,
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 304 Not Modified\r\nconnection: keep-alive\r\n\r\n"
        );
    }
}
