//! Endpoints whose bodies are the pattern: `/bytes/N`, `/stream`, `/truncate`, `/stall`,
//! `/delay-headers`.
//!
//! Each only decides headers and a [`Schedule`]; the body itself ([`TestbedBody`]) slices the
//! static pattern, so no endpoint here allocates in proportion to the body it sends.

use std::time::Duration;

use http::header::{
    HeaderValue, CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE, ETAG, IF_NONE_MATCH, LAST_MODIFIED,
};
use http::{HeaderMap, StatusCode};

use crate::body::{Ending, Schedule, Segment, TestbedBody};
use crate::error::RequestError;
use crate::query::{parse_number, Query, MAX_BYTES, MAX_MS};
use crate::respond::{with_status, Resp, OCTETS};

/// `cache-control` of `/bytes/N`.
const BYTES_CACHE_CONTROL: HeaderValue = HeaderValue::from_static("max-age=60");

/// `last-modified` of `/bytes/N`: fixed, so validators are stable across restarts.
const BYTES_LAST_MODIFIED: HeaderValue = HeaderValue::from_static("Mon, 01 Jan 2024 00:00:00 GMT");

/// Most chunks `/stream` accepts.
const MAX_CHUNKS: u64 = 10_000;

/// The `etag` of `/bytes/{n}`.
fn bytes_etag(n: u64) -> HeaderValue {
    HeaderValue::try_from(format!("\"bytes-{n}\""))
        .expect("quotes and digits form a valid header value")
}

/// A response carrying `body` as pattern bytes, typed as octets.
fn pattern_response(status: StatusCode, schedule: Schedule) -> Resp {
    let mut resp = with_status(status, TestbedBody::pattern(schedule));
    resp.headers_mut().insert(CONTENT_TYPE, OCTETS);
    resp
}

/// `/bytes/N`: N pattern bytes with `content-length`, `cache-control: max-age=60`, an `etag`
/// (`"bytes-N"`) and a fixed `last-modified`. A matching `If-None-Match` gets 304.
pub(crate) fn bytes(request_headers: &HeaderMap, raw: &str) -> Result<Resp, RequestError> {
    let n = parse_number("/bytes/N", raw, 0, MAX_BYTES)?;
    let etag = bytes_etag(n);
    let not_modified = request_headers
        .get_all(IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|tag| tag.trim())
        .any(|tag| tag == "*" || tag.strip_prefix("W/").unwrap_or(tag) == etag);
    let mut resp = if not_modified {
        with_status(StatusCode::NOT_MODIFIED, TestbedBody::empty())
    } else {
        let mut resp = pattern_response(StatusCode::OK, Schedule::immediate(n));
        resp.headers_mut()
            .insert(CONTENT_LENGTH, HeaderValue::from(n));
        resp
    };
    let headers = resp.headers_mut();
    headers.insert(CACHE_CONTROL, BYTES_CACHE_CONTROL);
    headers.insert(ETAG, etag);
    headers.insert(LAST_MODIFIED, BYTES_LAST_MODIFIED);
    Ok(resp)
}

/// `/stream?first_byte_ms=1000&total_ms=2500&bytes=10000&chunks=10`: headers at once, no
/// `content-length` (chunked on HTTP/1.1), the pattern split into `chunks` near-equal parts,
/// the first at `first_byte_ms`, the last at `total_ms`, the others evenly between. The first
/// part is never empty when `bytes > 0`.
pub(crate) fn stream(query: Query<'_>) -> Result<Resp, RequestError> {
    let first_ms = query.number("first_byte_ms", 1000, 0, MAX_MS)?;
    let total_ms = query.number("total_ms", first_ms.max(2500), first_ms, MAX_MS)?;
    let bytes = query.bytes("bytes", 10_000)?;
    let chunks = query.number("chunks", 10, 1, MAX_CHUNKS)?;
    let segments = (0..chunks)
        .map(|k| Segment {
            at: Duration::from_millis(spread_ms(first_ms, total_ms, k, chunks)),
            len: part_end(bytes, k + 1, chunks) - part_end(bytes, k, chunks),
        })
        .collect();
    Ok(pattern_response(
        StatusCode::OK,
        Schedule::new(segments, Ending::Finish, false),
    ))
}

/// When part `k` of `chunks` is due: `first` for the first, `total` for the last.
fn spread_ms(first: u64, total: u64, k: u64, chunks: u64) -> u64 {
    if chunks <= 1 {
        return first;
    }
    first + (total - first) * k / (chunks - 1)
}

/// End offset of the first `k` of `chunks` parts of `bytes`: ceil(bytes·k/chunks), so the
/// early parts get the remainder and the first part is non-empty.
fn part_end(bytes: u64, k: u64, chunks: u64) -> u64 {
    let end = (u128::from(bytes) * u128::from(k)).div_ceil(u128::from(chunks));
    u64::try_from(end).unwrap_or(bytes)
}

/// `/truncate?bytes=1024&chunked=0`: declares `content-length: 2N` (1 when N is 0), sends N
/// pattern bytes, then aborts the connection. With `chunked=1`: no length, chunked encoding,
/// N bytes and then the abort instead of the terminating chunk. (HTTP/2: the stream is reset.)
pub(crate) fn truncate(query: Query<'_>) -> Result<Resp, RequestError> {
    let n = query.bytes("bytes", 1024)?;
    let chunked = query.flag("chunked")?;
    // The body may start late, so that concurrent calls overlap one fetch.
    let first_byte = query.millis("first_byte_ms", 0)?;
    let segments = vec![Segment {
        at: first_byte,
        len: n,
    }];
    let mut resp = pattern_response(
        StatusCode::OK,
        Schedule::new(segments, Ending::Abort, false),
    );
    if !chunked {
        let declared = if n == 0 { 1 } else { 2 * n };
        resp.headers_mut()
            .insert(CONTENT_LENGTH, HeaderValue::from(declared));
    }
    Ok(resp)
}

/// `/stall?bytes=1024&ms=6000`: `content-length: 2N`, N pattern bytes at once, then nothing
/// for `ms`, then the other N: a mid-body stall for body timeouts. The body is complete if
/// the client waits.
pub(crate) fn stall(query: Query<'_>) -> Result<Resp, RequestError> {
    let n = query.bytes("bytes", 1024)?;
    let pause = query.millis("ms", 6000)?;
    let segments = vec![
        Segment {
            at: Duration::ZERO,
            len: n,
        },
        Segment { at: pause, len: n },
    ];
    let mut resp = pattern_response(
        StatusCode::OK,
        Schedule::new(segments, Ending::Finish, true),
    );
    resp.headers_mut()
        .insert(CONTENT_LENGTH, HeaderValue::from(2 * n));
    Ok(resp)
}

/// `/delay-headers?ms=1000&bytes=1024`: nothing for `ms` (not even headers), then 200 with N
/// pattern bytes at once: for first-byte timeouts.
pub(crate) async fn delay_headers(query: Query<'_>) -> Result<Resp, RequestError> {
    let delay = query.millis("ms", 1000)?;
    let n = query.bytes("bytes", 1024)?;
    tokio::time::sleep(delay).await;
    let mut resp = pattern_response(StatusCode::OK, Schedule::immediate(n));
    resp.headers_mut()
        .insert(CONTENT_LENGTH, HeaderValue::from(n));
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cover_the_body_and_start_non_empty() {
        for (bytes, chunks) in [(10_000, 10), (7, 10), (1, 3), (0, 4), (1 << 40, 7), (5, 1)] {
            let sizes: Vec<u64> = (0..chunks)
                .map(|k| part_end(bytes, k + 1, chunks) - part_end(bytes, k, chunks))
                .collect();
            assert_eq!(sizes.iter().sum::<u64>(), bytes, "{bytes}/{chunks}");
            if bytes > 0 {
                assert!(sizes[0] > 0, "{bytes}/{chunks}: {sizes:?}");
            }
            let (min, max) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
            assert!(max - min <= 1, "{bytes}/{chunks}: {sizes:?}");
        }
    }

    #[test]
    fn parts_are_spread_from_first_to_total() {
        assert_eq!(spread_ms(1000, 2500, 0, 10), 1000);
        assert_eq!(spread_ms(1000, 2500, 9, 10), 2500);
        assert_eq!(spread_ms(1000, 2500, 3, 10), 1500);
        assert_eq!(spread_ms(100, 900, 0, 1), 100);
    }
}
