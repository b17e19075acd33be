//! Pattern bodies over time: large `/bytes`, `/stream` pacing, `/truncate` aborts, `/stall`,
//! `/delay-headers`.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use wharf_testbed::{expected_body, pattern_byte};

use crate::support::{client, get, raw_exchange, split_head, start, PATIENCE};

/// Checks `frame` against the pattern at offset `pos`, using a one-period-longer reference.
fn assert_pattern_at(reference: &[u8], pos: u64, frame: &[u8]) {
    let window = reference.len() - 251;
    for (k, piece) in frame.chunks(window).enumerate() {
        let at = pos + (k * window) as u64;
        let phase = (at % 251) as usize;
        assert!(
            piece == &reference[phase..phase + piece.len()],
            "body differs from the pattern in the {} bytes at offset {at}",
            piece.len()
        );
    }
}

#[tokio::test]
async fn large_bytes_stream_the_whole_pattern() {
    let tb = start().await;
    let len: u64 = 64 * 1024 * 1024 + 7;
    let resp = client().get(tb.url(&format!("/bytes/{len}")).parse().unwrap());
    let resp = tokio::time::timeout(PATIENCE, resp).await.unwrap().unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["content-length"], len.to_string().as_str());
    let reference = expected_body(1024 * 1024 + 251);
    let mut body = resp.into_body();
    let mut pos = 0u64;
    tokio::time::timeout(PATIENCE, async {
        while let Some(frame) = body.frame().await {
            let data = frame.unwrap().into_data().unwrap();
            assert_pattern_at(&reference, pos, &data);
            pos += data.len() as u64;
        }
    })
    .await
    .unwrap();
    assert_eq!(pos, len);
}

#[tokio::test]
async fn stream_sends_headers_first_then_paced_chunks() {
    let tb = start().await;
    let started = Instant::now();
    let uri = tb.url("/stream?first_byte_ms=400&total_ms=1400&bytes=1000&chunks=5");
    let resp = tokio::time::timeout(PATIENCE, client().get(uri.parse().unwrap()))
        .await
        .unwrap()
        .unwrap();
    let headers_at = started.elapsed();
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(resp.headers().get("content-length").is_none());
    assert_eq!(resp.headers()["transfer-encoding"], "chunked");

    let mut body = resp.into_body();
    let mut got = Vec::new();
    let mut arrivals = Vec::new();
    tokio::time::timeout(PATIENCE, async {
        while let Some(frame) = body.frame().await {
            let data = frame.unwrap().into_data().unwrap();
            arrivals.push(started.elapsed());
            got.extend_from_slice(&data);
        }
    })
    .await
    .unwrap();
    let end_at = started.elapsed();
    assert_eq!(got, expected_body(1000));
    assert!(
        arrivals.len() >= 2,
        "the body came in one piece: {arrivals:?}"
    );
    let first_at = arrivals[0];
    // Timers never fire early: these lower bounds hold on any machine.
    assert!(
        first_at >= Duration::from_millis(400),
        "first chunk at {first_at:?}"
    );
    assert!(
        end_at >= Duration::from_millis(1400),
        "body done at {end_at:?}"
    );
    // Ordering: headers, then the first chunk, then (much later) the end.
    assert!(
        headers_at < first_at,
        "headers {headers_at:?}, first chunk {first_at:?}"
    );
    assert!(
        first_at < end_at,
        "first chunk {first_at:?}, end {end_at:?}"
    );
}

#[tokio::test]
async fn truncate_aborts_after_n_bytes_with_content_length() {
    let tb = start().await;
    let raw = raw_exchange(&tb, "GET /truncate?bytes=1000 HTTP/1.1\r\nhost: t\r\n\r\n").await;
    let (head, body) = split_head(&raw);
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("content-length: 2000\r\n"), "{head}");
    assert_eq!(body, &expected_body(1000)[..]);

    // A client sees an error, never a short complete body.
    let resp = client()
        .get(tb.url("/truncate?bytes=1000").parse().unwrap())
        .await
        .unwrap();
    let collected = tokio::time::timeout(PATIENCE, resp.into_body().collect())
        .await
        .unwrap();
    assert!(collected.is_err());
}

#[tokio::test]
async fn truncate_chunked_aborts_without_the_last_chunk() {
    let tb = start().await;
    let raw = raw_exchange(
        &tb,
        "GET /truncate?bytes=1000&chunked=1 HTTP/1.1\r\nhost: t\r\n\r\n",
    )
    .await;
    let (head, mut rest) = split_head(&raw);
    assert!(head.contains("transfer-encoding: chunked\r\n"), "{head}");
    assert!(!head.contains("content-length"), "{head}");
    let mut body = Vec::new();
    // Decode the chunks that did arrive; the stream must end without a zero-size chunk.
    while !rest.is_empty() {
        let line_end = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("a chunk size line");
        let size =
            usize::from_str_radix(std::str::from_utf8(&rest[..line_end]).unwrap(), 16).unwrap();
        assert_ne!(size, 0, "the terminating chunk must not be sent");
        let data = &rest[line_end + 2..];
        body.extend_from_slice(&data[..size]);
        rest = &data[size + 2..];
    }
    assert_eq!(body, expected_body(1000));

    let resp = client()
        .get(tb.url("/truncate?bytes=1000&chunked=1").parse().unwrap())
        .await
        .unwrap();
    let collected = tokio::time::timeout(PATIENCE, resp.into_body().collect())
        .await
        .unwrap();
    assert!(collected.is_err());
}

#[tokio::test]
async fn truncate_delivers_large_bodies_before_the_abort() {
    let tb = start().await;
    let n = 8 * 1024 * 1024 + 3;
    let raw = raw_exchange(
        &tb,
        &format!("GET /truncate?bytes={n} HTTP/1.1\r\nhost: t\r\n\r\n"),
    )
    .await;
    let (head, body) = split_head(&raw);
    assert!(
        head.contains(&format!("content-length: {}\r\n", 2 * n)),
        "{head}"
    );
    assert_eq!(body.len(), n);
    assert_pattern_at(&expected_body(1024 * 1024 + 251), 0, body);
}

#[tokio::test]
async fn truncate_zero_bytes_still_truncates() {
    let tb = start().await;
    let raw = raw_exchange(&tb, "GET /truncate?bytes=0 HTTP/1.1\r\nhost: t\r\n\r\n").await;
    let (head, body) = split_head(&raw);
    assert!(head.contains("content-length: 1\r\n"), "{head}");
    assert!(body.is_empty());
}

#[tokio::test]
async fn truncate_over_h2c_resets_the_stream() {
    let tb = start().await;
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let req = Request::get(tb.url("/truncate?bytes=500"))
        .body(Empty::new())
        .unwrap();
    let resp = client.request(req).await.unwrap();
    let collected = tokio::time::timeout(PATIENCE, resp.into_body().collect())
        .await
        .unwrap();
    assert!(collected.is_err());
}

#[tokio::test]
async fn stall_pauses_mid_body() {
    let tb = start().await;
    let started = Instant::now();
    let resp = client()
        .get(tb.url("/stall?bytes=100&ms=300").parse().unwrap())
        .await
        .unwrap();
    assert_eq!(resp.headers()["content-length"], "200");
    let mut body = resp.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    let first_at = started.elapsed();
    assert!(!first.is_empty() && first.len() <= 100);
    let mut got = first.to_vec();
    while let Some(frame) = body.frame().await {
        got.extend_from_slice(&frame.unwrap().into_data().unwrap());
    }
    let end_at = started.elapsed();
    assert_eq!(got, expected_body(200));
    assert!(end_at >= Duration::from_millis(300), "done at {end_at:?}");
    assert!(first_at < end_at);
}

#[tokio::test]
async fn delay_headers_waits_before_the_head() {
    let tb = start().await;
    let started = Instant::now();
    let reply = get(&tb, "/delay-headers?ms=200&bytes=10").await;
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.header("content-length"), Some("10"));
    assert_eq!(&reply.body[..], &expected_body(10)[..]);
}

#[tokio::test]
async fn pattern_helpers_agree() {
    let body = expected_body(600);
    assert!(body
        .iter()
        .enumerate()
        .all(|(i, b)| *b == pattern_byte(i as u64)));
    assert_eq!(body[251], 0);
    // The helpers also describe /bytes, /stream and /stall bodies: one pattern from offset 0.
    let tb = start().await;
    let reply = get(&tb, "/stream?first_byte_ms=0&total_ms=0&bytes=600").await;
    assert_eq!(&reply.body[..], &body[..]);
}
