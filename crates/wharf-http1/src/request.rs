//! Request heads: written by the upstream client, read (strictly) by the server.
//!
//! The server side is where request smuggling is decided, so it refuses every ambiguity a
//! front end and a back end could read differently (RFC 9112 §6 and §11.2): a
//! `transfer-encoding` other than one `chunked` coding, one in HTTP/1.0, content-lengths
//! that differ or are not plain digits, obs-fold, whitespace before a colon, a missing or
//! repeated `host` in HTTP/1.1. A request with both `transfer-encoding: chunked` and
//! `content-length` is read by the chunked framing alone, its `content-length` removed, and
//! the connection closed after it (the RFC's rule for intermediaries).

use std::mem::MaybeUninit;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Uri, Version};

use crate::error::MessageError;
use crate::fields::{
    connection_persists, content_length, header_map_in, is_chunked, push_field, slice_of,
    FieldsSeen,
};

/// How the request body is delimited on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestFraming {
    /// No body and no framing header (GET, HEAD, ...).
    None,
    /// `content-length`.
    Length(u64),
    /// `transfer-encoding: chunked`.
    Chunked,
}

/// Whether a method's request carries a body by convention, so that an empty one is sent
/// with `content-length: 0` (as RFC 9110 §8.6 advises for POST and PUT).
fn expects_body(method: &Method) -> bool {
    !matches!(
        *method,
        Method::GET | Method::HEAD | Method::DELETE | Method::OPTIONS | Method::TRACE
    )
}

/// The framing of a request body whose size hint says `exact` (or unknown) and which may be
/// empty (`ended`).
pub fn request_framing(method: &Method, ended: bool, exact: Option<u64>) -> RequestFraming {
    match (ended, exact) {
        (true, _) | (_, Some(0)) if !expects_body(method) => RequestFraming::None,
        (true, _) => RequestFraming::Length(0),
        (false, Some(len)) => RequestFraming::Length(len),
        (false, None) => RequestFraming::Chunked,
    }
}

/// Changes to a request's header fields made as its head is written, instead of in its
/// map: a route's `set_headers` and `remove_headers`.
///
/// Why: removing a field from a `HeaderMap` and inserting one each hash the name and probe
/// the table; skipping a name while writing is a comparison per field, and an added field
/// is four copies. Callgrind, a route forward with two fields set and one removed: +1,061
/// instructions per call over a plain forward when the map was edited, +455 this way.
#[derive(Debug, Clone, Copy, Default)]
pub struct FieldEdits<'a> {
    /// Fields of these names in the map are not written.
    pub omit: &'a [HeaderName],
    /// Written after the map's fields, in this order.
    pub add: &'a [(HeaderName, HeaderValue)],
}

impl FieldEdits<'_> {
    /// No changes: the map is written as it is.
    pub const NONE: FieldEdits<'static> = FieldEdits {
        omit: &[],
        add: &[],
    };

    /// Whether fields named `name` are written from the map.
    fn keeps(&self, name: &HeaderName) -> bool {
        !self.omit.contains(name)
    }
}

/// Writes `METHOD target HTTP/1.1`, the headers with `edits` applied (minus any framing
/// headers: the body's own framing is written instead) and the blank line into `out`.
///
/// `target` is the origin-form request target; it must not contain whitespace or control
/// characters (a request line cannot be split).
pub fn encode_request_head(
    method: &Method,
    target: &str,
    headers: &HeaderMap,
    edits: FieldEdits<'_>,
    framing: RequestFraming,
    out: &mut Vec<u8>,
) -> Result<(), MessageError> {
    if target.is_empty() || target.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err(MessageError::Malformed(format!(
            "request target {target:?} is empty or holds whitespace or control characters"
        )));
    }
    out.extend_from_slice(method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in headers {
        if edits.keeps(name) {
            write_field(name, value, out);
        }
    }
    for (name, value) in edits.add {
        write_field(name, value, out);
    }
    match framing {
        RequestFraming::None => {}
        RequestFraming::Length(len) => {
            out.extend_from_slice(b"content-length: ");
            crate::write_decimal(len, out);
            out.extend_from_slice(b"\r\n");
        }
        RequestFraming::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
    }
    out.extend_from_slice(b"\r\n");
    Ok(())
}

/// Writes `name: value` and its line end, unless `name` frames a body: the body's own
/// framing is written instead.
#[inline]
fn write_field(name: &HeaderName, value: &HeaderValue, out: &mut Vec<u8>) {
    if name == header::CONTENT_LENGTH || name == header::TRANSFER_ENCODING {
        return;
    }
    push_field(name.as_str().as_bytes(), value.as_bytes(), out);
}

/// The most header lines a request may have, whatever its size.
pub const MAX_REQUEST_HEADERS: usize = 128;

/// A request head read by the server.
#[derive(Debug)]
pub struct ParsedRequest {
    /// The method.
    pub method: Method,
    /// The request target.
    pub uri: Uri,
    /// HTTP/1.0 or HTTP/1.1.
    pub version: Version,
    /// The header fields (`content-length` removed when `transfer-encoding` is present).
    pub headers: HeaderMap,
    /// How the body is delimited: `None`, `Length` or `Chunked`.
    pub framing: RequestFraming,
    /// The connection may carry another request after this one.
    pub keep_alive: bool,
    /// The client waits for `100 Continue` before sending the body.
    pub expect_continue: bool,
}

/// What the request parser made of the buffered bytes.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // returned by value, never stored: no box per request
pub enum RequestParse {
    /// More bytes are needed.
    Partial,
    /// A complete head of this many bytes.
    Complete(usize, ParsedRequest),
}

/// Parses a request head from the front of `buf`; a head (or a partial one) longer than
/// `max_head_bytes` is [`MessageError::TooLarge`].
pub fn parse_request_head(buf: &[u8], max_head_bytes: usize) -> Result<RequestParse, MessageError> {
    parse_request_head_for(buf, max_head_bytes, |_| true)
}

/// [`parse_request_head`] for a reader that may not want the header fields: once the
/// request target is parsed, `wants_fields` is asked with its path. When it says no and the
/// head has none of the fields the server's own rules read (`connection`,
/// `transfer-encoding`, `content-length`, `expect`), the parsed request's map is left empty;
/// the checks are the same (the parser's, the one `host`), and so is every other field of
/// the result. With any of those fields the map is built as always, so the rules that
/// decide framing and persistence read what they always read.
///
/// Why: building the map is most of a request head's cost (httparse's parse aside): ~1,700
/// of a 24,000-instruction proxied call with three fields (callgrind), for a service (the
/// caching URL proxy) that reads none of them.
// Not inlined: inlined into the session's future, each call cost 25-36 instructions more
// (callgrind: pass-through, cache hit, route forward).
#[inline(never)]
pub fn parse_request_head_for(
    buf: &[u8],
    max_head_bytes: usize,
    wants_fields: impl FnOnce(&str) -> bool,
) -> Result<RequestParse, MessageError> {
    // Uninitialised slots: zeroing all of them (4 KiB) on every parse, and again whenever
    // more of a head arrives, showed in profiles of the pass-through path.
    let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_REQUEST_HEADERS];
    let mut request = httparse::Request::new(&mut []);
    let len = match request.parse_with_uninit_headers(buf, &mut slots) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => {
            if buf.len() > max_head_bytes {
                return Err(MessageError::TooLarge {
                    limit: max_head_bytes,
                });
            }
            return Ok(RequestParse::Partial);
        }
        Err(httparse::Error::TooManyHeaders) => {
            return Err(MessageError::TooManyHeaders {
                limit: MAX_REQUEST_HEADERS,
            })
        }
        Err(error) => return Err(MessageError::Malformed(error.to_string())),
    };
    if len > max_head_bytes {
        return Err(MessageError::TooLarge {
            limit: max_head_bytes,
        });
    }
    let method = request.method.unwrap_or("");
    let method = Method::from_bytes(method.as_bytes())
        .map_err(|_| MessageError::Malformed(format!("method {method:?}")))?;
    let version = match request.version {
        Some(0) => Version::HTTP_10,
        _ => Version::HTTP_11,
    };
    let path = request.path.unwrap_or("");
    let head = Bytes::copy_from_slice(&buf[..len]);
    let uri = Uri::from_maybe_shared(slice_of(&head, buf, path.as_bytes()))
        .map_err(|_| MessageError::Malformed(format!("request target {path:?}")))?;
    let seen = FieldsSeen::of_slots(request.headers);
    let mut headers = if wants_fields(uri.path()) || seen.has_rule_fields() {
        header_map_in(&head, buf, request.headers)?
    } else {
        crate::recycle::header_map_with_capacity(0)
    };
    let hosts = seen.hosts;
    if hosts > 1 || (hosts == 0 && version == Version::HTTP_11) {
        return Err(MessageError::Malformed(format!(
            "{hosts} host header lines (HTTP/1.1 needs exactly one)"
        )));
    }
    // Each rule is asked of the map only when the head has the field it reads: without
    // it, every rule's answer is the one given here.
    let mut keep_alive = if seen.connection {
        connection_persists(version, &headers)
    } else {
        version == Version::HTTP_11
    };
    let framing = if seen.transfer_encoding && is_chunked(&headers, version)? {
        if headers.remove(header::CONTENT_LENGTH).is_some() {
            keep_alive = false;
        }
        RequestFraming::Chunked
    } else if seen.content_length {
        match content_length(&mut headers)? {
            Some(0) | None => RequestFraming::None,
            Some(len) => RequestFraming::Length(len),
        }
    } else {
        RequestFraming::None
    };
    let expect_continue = seen.expect
        && version == Version::HTTP_11
        && framing != RequestFraming::None
        && headers
            .get(header::EXPECT)
            .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    Ok(RequestParse::Complete(
        len,
        ParsedRequest {
            method,
            uri,
            version,
            headers,
            framing,
            keep_alive,
            expect_continue,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: usize = 64 * 1024;

    /// The head parsed with its map, after checking that a reader that wants no fields gets
    /// the same answer (the same error, or the same request but for the map).
    fn parse(wire: &str) -> Result<ParsedRequest, MessageError> {
        let complete =
            |parse: Result<RequestParse, MessageError>| -> Result<ParsedRequest, MessageError> {
                match parse? {
                    RequestParse::Complete(len, request) => {
                        assert_eq!(len, wire.find("\r\n\r\n").unwrap() + 4, "{wire}");
                        Ok(request)
                    }
                    RequestParse::Partial => panic!("partial: {wire:?}"),
                }
            };
        let full = complete(parse_request_head(wire.as_bytes(), LIMIT));
        let bare = complete(parse_request_head_for(wire.as_bytes(), LIMIT, |_| false));
        match (&full, &bare) {
            (Ok(full), Ok(bare)) => {
                let same = |r: &ParsedRequest| {
                    (
                        r.method.clone(),
                        r.uri.clone(),
                        r.version,
                        r.framing,
                        r.keep_alive,
                        r.expect_continue,
                    )
                };
                assert_eq!(same(full), same(bare), "{wire:?}");
                if !bare.headers.is_empty() {
                    assert_eq!(full.headers, bare.headers, "{wire:?}");
                }
            }
            (Err(full), Err(bare)) => assert_eq!(full.to_string(), bare.to_string(), "{wire:?}"),
            _ => panic!("{wire:?}: with the map {full:?}, without {bare:?}"),
        }
        full
    }

    #[test]
    fn a_reader_that_wants_no_fields_gets_no_map_unless_a_rule_reads_one() {
        let bare = |wire: &str| {
            let mut asked = None;
            let parsed = parse_request_head_for(wire.as_bytes(), LIMIT, |target| {
                asked = Some(target.to_owned());
                false
            });
            match parsed {
                Ok(RequestParse::Complete(_, request)) => (asked, request),
                other => panic!("{wire:?}: {other:?}"),
            }
        };
        let (asked, request) =
            bare("GET /proxy?url=x HTTP/1.1\r\nHost: a\r\nUser-Agent: b\r\nAccept: */*\r\n\r\n");
        assert_eq!(asked.as_deref(), Some("/proxy"), "asked with the path");
        assert!(request.headers.is_empty());
        assert_eq!(request.uri, "/proxy?url=x");
        assert!(request.keep_alive);
        let (_, request) = bare("GET / HTTP/1.0\r\nx-a: b\r\n\r\n");
        assert!(request.headers.is_empty() && !request.keep_alive);
        // A field a rule reads: the map is built, and the rule decides as always.
        for (wire, keep_alive, framing) in [
            (
                "GET / HTTP/1.1\r\nhost: a\r\nConnection: close\r\n\r\n",
                false,
                RequestFraming::None,
            ),
            (
                "GET / HTTP/1.0\r\nconnection: keep-alive\r\n\r\n",
                true,
                RequestFraming::None,
            ),
            (
                "POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 5\r\n\r\n",
                true,
                RequestFraming::Length(5),
            ),
            (
                "POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\n\r\n",
                true,
                RequestFraming::Chunked,
            ),
        ] {
            let (_, request) = bare(wire);
            assert!(!request.headers.is_empty(), "{wire:?}");
            assert_eq!(
                (request.keep_alive, request.framing),
                (keep_alive, framing),
                "{wire:?}"
            );
        }
        let (_, request) =
            bare("PUT / HTTP/1.1\r\nhost: a\r\ncontent-length: 3\r\nexpect: 100-continue\r\n\r\n");
        assert!(request.expect_continue && !request.headers.is_empty());
        // The one `host` HTTP/1.1 needs is still counted.
        for wire in [
            "GET / HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1\r\nhost: a\r\nHOST: b\r\n\r\n",
        ] {
            let error = parse_request_head_for(wire.as_bytes(), LIMIT, |_| false).unwrap_err();
            assert!(error.to_string().contains("host"), "{wire:?}: {error}");
        }
    }

    #[test]
    fn reads_heads_and_framing() {
        let get = parse("GET /proxy?url=x HTTP/1.1\r\nHost: a\r\nX-A: 1\r\n\r\n").unwrap();
        assert_eq!(get.method, Method::GET);
        assert_eq!(get.uri, "/proxy?url=x");
        assert_eq!(get.headers["host"], "a");
        assert_eq!(
            (get.framing, get.keep_alive, get.expect_continue),
            (RequestFraming::None, true, false)
        );
        let cases = [
            ("POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 5\r\n\r\n", RequestFraming::Length(5), true),
            ("POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 5, 5\r\n\r\n", RequestFraming::Length(5), true),
            ("POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 0\r\n\r\n", RequestFraming::None, true),
            ("POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: Chunked\r\n\r\n", RequestFraming::Chunked, true),
            (
                "POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 40\r\ntransfer-encoding: chunked\r\n\r\n",
                RequestFraming::Chunked,
                false,
            ),
            ("GET / HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n", RequestFraming::None, false),
            ("GET / HTTP/1.0\r\n\r\n", RequestFraming::None, false),
            ("GET / HTTP/1.0\r\nconnection: Keep-Alive\r\n\r\n", RequestFraming::None, true),
            ("GET / HTTP/1.0\r\nConnection: close, keep-alive\r\n\r\n", RequestFraming::None, false),
            ("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\n", RequestFraming::Length(3), true),
        ];
        for (wire, framing, keep_alive) in cases {
            let request = parse(wire).unwrap();
            assert_eq!(
                (request.framing, request.keep_alive),
                (framing, keep_alive),
                "{wire:?}"
            );
            if framing == RequestFraming::Chunked {
                assert!(!request.headers.contains_key(header::CONTENT_LENGTH));
            }
        }
        let expect = parse(
            "PUT /x HTTP/1.1\r\nhost: a\r\nexpect: 100-Continue\r\ncontent-length: 3\r\n\r\n",
        )
        .unwrap();
        assert!(expect.expect_continue);
        let absolute = parse("GET http://a.example/x HTTP/1.1\r\nhost: a.example\r\n\r\n").unwrap();
        assert_eq!(absolute.uri.path(), "/x");
    }

    #[test]
    fn refuses_smuggling_material() {
        let cases = [
            ("POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 5\r\ncontent-length: 45\r\n\r\n", "different values"),
            ("POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 5, 45\r\n\r\n", "different values"),
            ("POST / HTTP/1.1\r\nhost: a\r\ncontent-length: +5\r\n\r\n", "content-length"),
            ("POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 0x5\r\n\r\n", "content-length"),
            ("GET / HTTP/1.1\r\nhost: a\r\nx-folded: a\r\n b\r\n\r\n", "malformed"),
            ("POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 5\r\n 0\r\n\r\n", "malformed"),
            ("POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked, identity\r\n\r\n", "other than chunked"),
            ("POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: identity\r\ncontent-length: 5\r\n\r\n", "other than chunked"),
            ("POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: xchunked\r\n\r\n", "other than chunked"),
            ("POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n", "other than chunked"),
            ("POST / HTTP/1.0\r\ntransfer-encoding: chunked\r\n\r\n", "HTTP/1.0"),
            ("POST / HTTP/1.1\r\nhost: a\r\ncontent-length : 5\r\n\r\n", "malformed"),
            ("GET / HTTP/1.1\r\n\r\n", "host"),
            ("GET / HTTP/1.1\r\nhost: a\r\nhost: b\r\n\r\n", "host"),
            ("GET /\x7f HTTP/1.1\r\nhost: a\r\n\r\n", "malformed"),
            ("GET / HTTP/2.0\r\nhost: a\r\n\r\n", "malformed"),
            ("G@T / HTTP/1.1\r\nhost: a\r\n\r\n", "malformed"),
        ];
        for (wire, expected) in cases {
            let error = parse(wire).unwrap_err();
            assert!(error.to_string().contains(expected), "{wire:?}: {error}");
        }
        let error = parse_request_head(b"GET /\xff\xfe HTTP/1.1\r\nhost: a\r\n\r\n", LIMIT);
        assert!(error.is_err(), "bytes outside ASCII in the target");
    }

    #[test]
    fn bounds_the_head() {
        let mut long = String::from("GET /");
        long.push_str(&"a".repeat(LIMIT));
        assert!(matches!(
            parse_request_head(long.as_bytes(), LIMIT),
            Err(MessageError::TooLarge { .. })
        ));
        assert!(matches!(
            parse_request_head(b"GET / HTTP/1.1\r\nhost: a\r\n", LIMIT),
            Ok(RequestParse::Partial)
        ));
        let mut many = String::from("GET / HTTP/1.1\r\nhost: a\r\n");
        for i in 0..MAX_REQUEST_HEADERS {
            many.push_str(&format!("x-{i}: 1\r\n"));
        }
        many.push_str("\r\n");
        assert!(matches!(
            parse_request_head(many.as_bytes(), LIMIT),
            Err(MessageError::TooManyHeaders { .. })
        ));
        let complete_but_long = format!(
            "GET / HTTP/1.1\r\nhost: a\r\nx: {}\r\n\r\n",
            "b".repeat(200)
        );
        assert!(matches!(
            parse_request_head(complete_but_long.as_bytes(), 100),
            Err(MessageError::TooLarge { limit: 100 })
        ));
    }

    #[test]
    fn request_heads_for_upstreams() {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("a.example"));
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("99"));
        headers.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("gzip"));
        let mut out = Vec::new();
        let framing = request_framing(&Method::GET, true, Some(0));
        encode_request_head(
            &Method::GET,
            "/a?b=1",
            &headers,
            FieldEdits::NONE,
            framing,
            &mut out,
        )
        .unwrap();
        assert_eq!(out, b"GET /a?b=1 HTTP/1.1\r\nhost: a.example\r\n\r\n");

        out.clear();
        let framing = request_framing(&Method::POST, true, Some(0));
        encode_request_head(
            &Method::POST,
            "/",
            &HeaderMap::new(),
            FieldEdits::NONE,
            framing,
            &mut out,
        )
        .unwrap();
        assert_eq!(out, b"POST / HTTP/1.1\r\ncontent-length: 0\r\n\r\n");

        assert_eq!(
            request_framing(&Method::POST, false, Some(7)),
            RequestFraming::Length(7)
        );
        assert_eq!(
            request_framing(&Method::PUT, false, None),
            RequestFraming::Chunked
        );
        for bad in ["", "/a b", "/a\r\nx: y", "/\x7f"] {
            let error = encode_request_head(
                &Method::GET,
                bad,
                &headers,
                FieldEdits::NONE,
                framing,
                &mut out,
            );
            assert!(error.is_err(), "{bad:?}");
        }
    }

    #[test]
    fn edits_omit_map_fields_and_add_their_own_after_them() {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("a.example"));
        headers.append("x-tenant", HeaderValue::from_static("client-1"));
        headers.append("x-tenant", HeaderValue::from_static("client-2"));
        headers.insert("x-secret", HeaderValue::from_static("s"));
        headers.insert("x-keep", HeaderValue::from_static("k"));
        let omit = [
            HeaderName::from_static("x-tenant"),
            HeaderName::from_static("x-secret"),
        ];
        let add = [
            (
                HeaderName::from_static("x-tenant"),
                HeaderValue::from_static("acme"),
            ),
            (header::CONTENT_LENGTH, HeaderValue::from_static("5")),
            (
                HeaderName::from_static("x-via"),
                HeaderValue::from_static("wharf"),
            ),
        ];
        let edits = FieldEdits {
            omit: &omit,
            add: &add,
        };
        let mut out = Vec::new();
        let framing = request_framing(&Method::GET, true, Some(0));
        encode_request_head(&Method::GET, "/", &headers, edits, framing, &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "GET / HTTP/1.1\r\nhost: a.example\r\nx-keep: k\r\n\
             x-tenant: acme\r\nx-via: wharf\r\n\r\n",
            "every x-tenant line of the map replaced, x-secret gone, no framing field added"
        );
    }
}
