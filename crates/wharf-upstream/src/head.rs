//! Message heads on the wire: the request head written upstream, and the response head read
//! back with its framing (RFC 9112 §6.3) and keep-alive decision.

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode, Version};

use crate::error::UpstreamError;

/// Largest response head accepted (status line and headers).
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Most response header lines accepted.
pub const MAX_HEADERS: usize = 128;

/// How a response body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
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
pub(crate) struct ParsedHead {
    pub(crate) status: StatusCode,
    pub(crate) version: Version,
    pub(crate) headers: HeaderMap,
    pub(crate) framing: Framing,
    /// The connection may carry another request once this body is read.
    pub(crate) keep_alive: bool,
}

/// What the head parser made of the buffered bytes.
#[derive(Debug)]
pub(crate) enum HeadParse {
    /// More bytes are needed.
    Partial,
    /// An interim (1xx) response of this many bytes: skip it and parse the next head.
    Interim(usize),
    /// A final response head of this many bytes.
    Complete(usize, ParsedHead),
}

/// How the request body is delimited on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RequestFraming {
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
pub(crate) fn request_framing(method: &Method, ended: bool, exact: Option<u64>) -> RequestFraming {
    match (ended, exact) {
        (true, _) | (_, Some(0)) if !expects_body(method) => RequestFraming::None,
        (true, _) => RequestFraming::Length(0),
        (false, Some(len)) => RequestFraming::Length(len),
        (false, None) => RequestFraming::Chunked,
    }
}

/// Writes `METHOD target HTTP/1.1`, the headers (minus any framing headers: the body's own
/// framing is written instead) and the blank line into `out`.
///
/// `target` is the origin-form request target; it must not contain whitespace or control
/// characters (a request line cannot be split).
pub(crate) fn encode_request_head(
    method: &Method,
    target: &str,
    headers: &HeaderMap,
    framing: RequestFraming,
    out: &mut Vec<u8>,
) -> Result<(), UpstreamError> {
    if target.is_empty() || target.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err(UpstreamError::MalformedHead(format!(
            "request target {target:?} is empty or holds whitespace or control characters"
        )));
    }
    out.extend_from_slice(method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in headers {
        if name == header::CONTENT_LENGTH || name == header::TRANSFER_ENCODING {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    match framing {
        RequestFraming::None => {}
        RequestFraming::Length(len) => {
            out.extend_from_slice(b"content-length: ");
            out.extend_from_slice(len.to_string().as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        RequestFraming::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
    }
    out.extend_from_slice(b"\r\n");
    Ok(())
}

/// Parses a response head from the front of `buf` (the answer to a `method` request).
pub(crate) fn parse_response_head(buf: &[u8], method: &Method) -> Result<HeadParse, UpstreamError> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut slots);
    let len = match response.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => {
            if buf.len() > MAX_HEAD_BYTES {
                return Err(UpstreamError::HeadTooLarge {
                    limit: MAX_HEAD_BYTES,
                });
            }
            return Ok(HeadParse::Partial);
        }
        Err(httparse::Error::TooManyHeaders) => {
            return Err(UpstreamError::MalformedHead(format!(
                "more than {MAX_HEADERS} header lines"
            )))
        }
        Err(error) => return Err(UpstreamError::MalformedHead(error.to_string())),
    };
    if len > MAX_HEAD_BYTES {
        return Err(UpstreamError::HeadTooLarge {
            limit: MAX_HEAD_BYTES,
        });
    }
    let code = response.code.unwrap_or(0);
    let status = StatusCode::from_u16(code)
        .map_err(|_| UpstreamError::MalformedHead(format!("status code {code}")))?;
    if status == StatusCode::SWITCHING_PROTOCOLS {
        return Err(UpstreamError::MalformedHead(
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
    // One copy of the head, exactly its size: header values point into it, so they never
    // keep a (much larger) read buffer alive, e.g. in a cache entry.
    let head = Bytes::copy_from_slice(&buf[..len]);
    let mut headers = HeaderMap::with_capacity(response.headers.len());
    for slot in response.headers.iter() {
        let name = HeaderName::from_bytes(slot.name.as_bytes())
            .map_err(|_| UpstreamError::MalformedHead(format!("header name {:?}", slot.name)))?;
        let start = slot.value.as_ptr() as usize - buf.as_ptr() as usize;
        let value = HeaderValue::from_maybe_shared(head.slice(start..start + slot.value.len()))
            .map_err(|_| UpstreamError::MalformedHead(format!("value of header {name}")))?;
        headers.append(name, value);
    }
    let (framing, mut keep_alive) = framing(method, status, version, &mut headers)?;
    keep_alive &= connection_persists(version, &headers);
    Ok(HeadParse::Complete(
        len,
        ParsedHead {
            status,
            version,
            headers,
            framing,
            keep_alive,
        },
    ))
}

/// The body's framing (RFC 9112 §6.3), and whether it allows the connection to persist.
/// A `content-length` next to `transfer-encoding` is removed (the coding wins, and the
/// connection is closed after, as the RFC asks of intermediaries).
fn framing(
    method: &Method,
    status: StatusCode,
    version: Version,
    headers: &mut HeaderMap,
) -> Result<(Framing, bool), UpstreamError> {
    if *method == Method::HEAD
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        return Ok((Framing::Empty, true));
    }
    if headers.contains_key(header::TRANSFER_ENCODING) {
        if version == Version::HTTP_10 {
            return Err(UpstreamError::Framing(
                "transfer-encoding in an HTTP/1.0 response".to_owned(),
            ));
        }
        let mut codings = headers
            .get_all(header::TRANSFER_ENCODING)
            .iter()
            .flat_map(|value| value.as_bytes().split(|&b| b == b','))
            .map(|coding| coding.trim_ascii())
            .filter(|coding| !coding.is_empty());
        let only_chunked = codings
            .next()
            .is_some_and(|first| first.eq_ignore_ascii_case(b"chunked"))
            && codings.next().is_none();
        if !only_chunked {
            return Err(UpstreamError::Framing(
                "transfer-encoding other than chunked".to_owned(),
            ));
        }
        let had_length = headers.remove(header::CONTENT_LENGTH).is_some();
        return Ok((Framing::Chunked, !had_length));
    }
    let mut declared: Option<u64> = None;
    for value in headers.get_all(header::CONTENT_LENGTH) {
        for part in value.as_bytes().split(|&b| b == b',') {
            let part = part.trim_ascii();
            let len = parse_length(part).ok_or_else(|| {
                UpstreamError::Framing(format!(
                    "content-length {:?}",
                    String::from_utf8_lossy(value.as_bytes())
                ))
            })?;
            if declared.is_some_and(|earlier| earlier != len) {
                return Err(UpstreamError::Framing(
                    "content-length given twice with different values".to_owned(),
                ));
            }
            declared = Some(len);
        }
    }
    match declared {
        Some(len) => {
            // Several equal values become one, so the relayed head states it once.
            if headers.get_all(header::CONTENT_LENGTH).iter().count() > 1
                || headers
                    .get(header::CONTENT_LENGTH)
                    .is_some_and(|value| value.as_bytes().contains(&b','))
            {
                headers.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
            }
            Ok((Framing::Length(len), true))
        }
        None => Ok((Framing::UntilClose, false)),
    }
}

/// A content-length: 1 to 19 decimal digits (no sign, no spaces).
fn parse_length(text: &[u8]) -> Option<u64> {
    if text.is_empty() || text.len() > 19 || !text.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(text).ok()?.parse().ok()
}

/// Keep-alive by the `connection` header: HTTP/1.1 persists unless `close`; HTTP/1.0 only
/// with `keep-alive`.
fn connection_persists(version: Version, headers: &HeaderMap) -> bool {
    let mut close = false;
    let mut keep_alive = false;
    for value in headers.get_all(header::CONNECTION) {
        for option in value.as_bytes().split(|&b| b == b',') {
            let option = option.trim_ascii();
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

    fn parse(wire: &str) -> Result<HeadParse, UpstreamError> {
        parse_response_head(wire.as_bytes(), &Method::GET)
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
        assert!(matches!(
            parse(&flood),
            Err(UpstreamError::HeadTooLarge { .. })
        ));
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
    fn request_heads() {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("a.example"));
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("99"));
        headers.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("gzip"));
        let mut out = Vec::new();
        let framing = request_framing(&Method::GET, true, Some(0));
        encode_request_head(&Method::GET, "/a?b=1", &headers, framing, &mut out).unwrap();
        assert_eq!(out, b"GET /a?b=1 HTTP/1.1\r\nhost: a.example\r\n\r\n");

        out.clear();
        let framing = request_framing(&Method::POST, true, Some(0));
        encode_request_head(&Method::POST, "/", &HeaderMap::new(), framing, &mut out).unwrap();
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
            let error = encode_request_head(&Method::GET, bad, &headers, framing, &mut out);
            assert!(error.is_err(), "{bad:?}");
        }
    }
}
