//! Fault injection (issue 7): scripted origins that misbehave on purpose,
//! over real sockets, and what a client of wharf sees.
//!
//! For every fault: the documented status (502/504 JSON) when it happens
//! before the response head, a visible truncation when it happens after; no
//! panic in wharf's code; every bulkhead slot released (`/metrics`); and no
//! partial entry left in the cache (the next call is a `miss` that gets the
//! whole body once the origin behaves, the one after a `hit`).
//!
//! Not covered here: a broken config on reload (reload is not built yet).

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::support::*;

// ---------------------------------------------------------------------------
// Shared with tests/hostile.rs: panic watch, /metrics, scripted origins.
// ---------------------------------------------------------------------------

/// Panics raised outside the test files (wharf's crates or its dependencies).
static WHARF_PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());
static PANIC_HOOK: Once = Once::new();

/// Records every panic whose location is not in a test file, so a test can
/// assert that wharf never panicked (a panic in a spawned task only prints).
pub(crate) fn watch_panics() {
    PANIC_HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let in_test_code = info.location().is_some_and(|location| {
                let file = location.file();
                file.starts_with("tests/") || file.contains("wharf-test-support")
            });
            if !in_test_code {
                WHARF_PANICS
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .push(info.to_string());
            }
            previous(info);
        }));
    });
}

/// Fails if any code outside the tests panicked since [`watch_panics`].
pub(crate) fn assert_no_wharf_panic(case: &str) {
    let panics = WHARF_PANICS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .clone();
    assert!(
        panics.is_empty(),
        "{case}: wharf code panicked: {panics:#?}"
    );
}

/// The admin `/metrics` page.
pub(crate) async fn metrics_page(wharf: &RunningHost) -> String {
    let page = get(&wharf.admin_url("/metrics")).await;
    String::from_utf8(page.bytes().to_vec()).unwrap()
}

/// Polls `/metrics` until `service` has no call outstanding or queued.
pub(crate) async fn assert_slots_released(wharf: &RunningHost, service: &str) {
    let outstanding = format!("wharf_calls_outstanding{{service=\"{service}\"}}");
    let queued = format!("wharf_calls_queued{{service=\"{service}\"}}");
    let released = poll_until(Duration::from_secs(5), || async {
        let page = metrics_page(wharf).await;
        sample(&page, &outstanding) == Some(0.0) && sample(&page, &queued) == Some(0.0)
    })
    .await;
    let page = metrics_page(wharf).await;
    assert!(
        released,
        "bulkhead slot leaked: {} = {:?}, {} = {:?}",
        outstanding,
        sample(&page, &outstanding),
        queued,
        sample(&page, &queued)
    );
}

/// What a scripted origin knows about the request it answers.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    /// How many requests for the same target came before this one.
    pub(crate) nth: usize,
    /// The request target (path and query).
    pub(crate) target: String,
}

type Handler = dyn Fn(Seen, TcpStream) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync;

/// An origin on 127.0.0.1 whose every connection is handed, after its first
/// request head, to a script that may answer, stall, lie or reset.
pub(crate) struct ScriptedOrigin {
    pub(crate) addr: SocketAddr,
    seen: Arc<Mutex<HashMap<String, usize>>>,
    task: JoinHandle<()>,
}

impl ScriptedOrigin {
    pub(crate) async fn start<F, Fut>(script: F) -> ScriptedOrigin
    where
        F: Fn(Seen, TcpStream) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let handler: Arc<Handler> = Arc::new(move |seen, stream| Box::pin(script(seen, stream)));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let counts = seen.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    continue;
                };
                let handler = handler.clone();
                let counts = counts.clone();
                tokio::spawn(async move {
                    let Some(target) = read_request_head(&mut stream).await else {
                        return;
                    };
                    let nth = {
                        let mut counts = counts.lock().unwrap();
                        let count = counts.entry(target.clone()).or_insert(0);
                        *count += 1;
                        *count - 1
                    };
                    handler(Seen { nth, target }, stream).await;
                });
            }
        });
        ScriptedOrigin { addr, seen, task }
    }

    /// `http://ADDR` + `path`.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Requests seen for `target`.
    pub(crate) fn hits(&self, target: &str) -> usize {
        self.seen.lock().unwrap().get(target).copied().unwrap_or(0)
    }
}

impl Drop for ScriptedOrigin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reads one request head; returns its target, or `None` if the peer left.
pub(crate) async fn read_request_head(stream: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf).await.ok()?;
        if n == 0 || head.len() > 256 * 1024 {
            return None;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&head);
    text.split(' ').nth(1).map(str::to_owned)
}

/// The body a behaving origin sends.
fn good_body() -> Vec<u8> {
    expected_body(4096)
}

/// Answers properly (cacheable, `connection: close`), then closes.
async fn behave(mut stream: TcpStream, body: &[u8]) {
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ncontent-length: {}\r\ncache-control: max-age=60\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes()).await;
    let _ = stream.write_all(body).await;
    let _ = stream.shutdown().await;
}

/// `GET url` on a fresh connection; `Err` when no response head came back.
pub(crate) async fn fetch(url: &str) -> Result<TestResponse, String> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let response = client
        .get(url.parse().unwrap())
        .await
        .map_err(|error| format!("{error:?}"))?;
    let (parts, body) = response.into_parts();
    let body = body
        .collect()
        .await
        .map(|collected| collected.to_bytes())
        .map_err(|error| format!("{error:?}"));
    Ok(TestResponse {
        status: parts.status,
        headers: parts.headers,
        body,
    })
}

/// The proxy URL for `target` with an optional `cacheDuration`.
pub(crate) fn via_proxy(wharf: &RunningHost, target: &str, duration: Option<u64>) -> String {
    match duration {
        Some(seconds) => wharf.url(&format!(
            "/proxy?url={}&cacheDuration={seconds}",
            encode(target)
        )),
        None => wharf.url(&format!("/proxy?url={}", encode(target))),
    }
}

/// A proxy service allowed to reach any loopback origin; `extra` keys
/// replace the short default timeouts (first byte 400 ms, total 3 s).
fn proxy_config(extra: &str) -> String {
    let mut keys = String::new();
    for (key, default) in [
        ("first_byte_timeout", "\"400ms\""),
        ("total_timeout", "\"3s\""),
    ] {
        if !extra.contains(key) {
            keys.push_str(&format!("{key} = {default}\n"));
        }
    }
    format!(
        "[services.proxy]\ntype = \"proxy\"\npath = \"/proxy\"\nallow_private_networks = true\n{keys}{extra}\n"
    )
}

// ---------------------------------------------------------------------------
// One misbehaviour, checked with and without caching.
// ---------------------------------------------------------------------------

/// What the origin does after writing its bytes.
#[derive(Debug, Clone, Copy)]
enum Then {
    /// Closes (FIN).
    Close,
    /// Resets (SO_LINGER 0, then close: RST), after a pause so the bytes
    /// written are read first.
    Reset,
    /// Keeps the connection open and silent.
    Stall,
}

/// Bytes an origin sends for its first request of a target, then what it does.
#[derive(Debug, Clone)]
struct Misbehaviour {
    variant: &'static str,
    bytes: Vec<u8>,
    then: Then,
}

impl Misbehaviour {
    fn new(variant: &'static str, bytes: impl Into<Vec<u8>>, then: Then) -> Self {
        Self {
            variant,
            bytes: bytes.into(),
            then,
        }
    }

    async fn perform(self, mut stream: TcpStream) {
        let _ = stream.write_all(&self.bytes).await;
        let _ = stream.flush().await;
        match self.then {
            Then::Close => {
                let _ = stream.shutdown().await;
            }
            Then::Reset => {
                tokio::time::sleep(Duration::from_millis(150)).await;
                stream.set_zero_linger().unwrap();
                drop(stream);
            }
            Then::Stall => {
                tokio::time::sleep(Duration::from_secs(30)).await;
            }
        }
    }
}

/// A response head with `content-length`, cacheable.
fn head_with_length(len: usize) -> String {
    format!("HTTP/1.1 200 OK\r\ncontent-length: {len}\r\ncache-control: max-age=60\r\n\r\n")
}

/// A chunked response head, cacheable.
const CHUNKED_HEAD: &str =
    "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncache-control: max-age=60\r\n\r\n";

/// What the client of wharf must see for the misbehaving fetch.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// A JSON error with this status and kind, before any header was relayed.
    Error(u16, &'static str),
    /// Status 200, then a body that ends in an error (not a clean end).
    Truncated,
}

/// Runs each misbehaviour against a fresh target, cached and pass-through:
/// the first fetch misbehaves, later ones behave.
async fn misbehaves_once(extra: &str, expect: Expect, max_secs: f64, cases: &[Misbehaviour]) {
    watch_panics();
    let scripts: HashMap<String, Misbehaviour> = cases
        .iter()
        .flat_map(|case| {
            ["cached", "bypass"]
                .into_iter()
                .map(move |mode| (format!("/{}/{mode}", case.variant), case.clone()))
        })
        .collect();
    let origin = ScriptedOrigin::start(move |seen, stream| {
        let script = scripts.get(&seen.target).cloned();
        async move {
            match script {
                Some(misbehaviour) if seen.nth == 0 => misbehaviour.perform(stream).await,
                _ => behave(stream, &good_body()).await,
            }
        }
    })
    .await;
    let wharf = start_wharf(&proxy_config(extra)).await;
    for case in cases {
        for (mode, duration) in [("bypass", None), ("cached", Some(60))] {
            let name = format!("{} ({mode})", case.variant);
            let url = via_proxy(
                &wharf,
                &origin.url(&format!("/{}/{mode}", case.variant)),
                duration,
            );
            let started = Instant::now();
            let first = match fetch(&url).await {
                Ok(first) => first,
                Err(error) => panic!("{name}: no response head at all: {error}"),
            };
            let took = started.elapsed().as_secs_f64();
            match expect {
                Expect::Error(status, kind) => {
                    assert_eq!(first.status, status, "{name}: {:?}", first.body);
                    assert_eq!(first.header("content-type"), "application/json", "{name}");
                    assert_eq!(first.json()["error"], kind, "{name}");
                }
                Expect::Truncated => {
                    assert_eq!(first.status, 200, "{name}: {:?}", first.body);
                    assert!(
                        first.body.is_err(),
                        "{name}: a broken origin body reached the client as a complete one ({} bytes)",
                        first.body.as_ref().map_or(0, |b| b.len())
                    );
                }
            }
            assert!(
                took < max_secs,
                "{name}: the fault took {took:.2}s to surface (limit {max_secs}s)"
            );

            let second = get(&url).await;
            let expected_cache = if duration.is_some() { "miss" } else { "bypass" };
            assert_eq!(
                second.header("x-cache"),
                expected_cache,
                "{name}: the failed fetch left something in the cache"
            );
            assert_eq!(second.status, 200, "{name}");
            assert_eq!(second.bytes().as_ref(), good_body().as_slice(), "{name}");
            if duration.is_some() {
                let third = get(&url).await;
                assert_eq!(third.header("x-cache"), "hit", "{name}");
                assert_eq!(third.bytes().as_ref(), good_body().as_slice(), "{name}");
            }
        }
    }
    assert_slots_released(&wharf, "proxy").await;
    assert_no_wharf_panic("misbehaving origin");
}

#[tokio::test]
async fn origin_reset_mid_body_is_a_visible_truncation_and_never_cached() {
    let mut half = head_with_length(10_000).into_bytes();
    half.extend_from_slice(&expected_body(3000));
    let mut chunked_half = CHUNKED_HEAD.as_bytes().to_vec();
    chunked_half.extend_from_slice(b"bb8\r\n");
    chunked_half.extend_from_slice(&expected_body(3000));
    chunked_half.extend_from_slice(b"\r\n");
    misbehaves_once(
        "",
        Expect::Truncated,
        2.0,
        &[
            Misbehaviour::new("reset-content-length", half.clone(), Then::Reset),
            Misbehaviour::new("reset-chunked", chunked_half.clone(), Then::Reset),
            Misbehaviour::new("fin-chunked", chunked_half, Then::Close),
        ],
    )
    .await;
}

#[tokio::test]
async fn origin_reset_before_headers_gets_502() {
    misbehaves_once(
        "",
        Expect::Error(502, "bad_gateway"),
        2.0,
        &[
            Misbehaviour::new("reset-silent", "", Then::Reset),
            Misbehaviour::new("close-silent", "", Then::Close),
            Misbehaviour::new(
                "reset-half-head",
                "HTTP/1.1 200 OK\r\ncontent-le",
                Then::Reset,
            ),
        ],
    )
    .await;
}

#[tokio::test]
async fn content_length_longer_than_the_body_then_close_is_a_visible_truncation() {
    let mut short = head_with_length(5000).into_bytes();
    short.extend_from_slice(&expected_body(2000));
    let mut just_one_short = head_with_length(4096).into_bytes();
    just_one_short.extend_from_slice(&expected_body(4095));
    misbehaves_once(
        "",
        Expect::Truncated,
        2.0,
        &[
            Misbehaviour::new("short-body", short, Then::Close),
            Misbehaviour::new("one-byte-short", just_one_short, Then::Close),
        ],
    )
    .await;
}

#[tokio::test]
async fn origin_stalling_before_headers_gets_504_at_first_byte_timeout() {
    misbehaves_once(
        "",
        Expect::Error(504, "gateway_timeout"),
        2.0,
        &[
            Misbehaviour::new("silent", "", Then::Stall),
            Misbehaviour::new(
                "half-head",
                "HTTP/1.1 200 OK\r\ncontent-length: 5",
                Then::Stall,
            ),
        ],
    )
    .await;
}

#[tokio::test]
async fn origin_stalling_mid_body_is_cut_at_total_timeout() {
    let mut stalled = head_with_length(5000).into_bytes();
    stalled.extend_from_slice(&expected_body(1000));
    let mut chunked = CHUNKED_HEAD.as_bytes().to_vec();
    chunked.extend_from_slice(b"3e8\r\n");
    chunked.extend_from_slice(&expected_body(1000));
    chunked.extend_from_slice(b"\r\n");
    misbehaves_once(
        "total_timeout = \"700ms\"",
        Expect::Truncated,
        2.5,
        &[
            Misbehaviour::new("stall-content-length", stalled, Then::Stall),
            Misbehaviour::new("stall-chunked", chunked, Then::Stall),
        ],
    )
    .await;
}

#[tokio::test]
async fn malformed_status_line_gets_502_without_waiting_for_a_timeout() {
    // The origin stalls after its bytes: a 502 must come from parsing, not
    // from the connection closing or a timeout (which would be a 504).
    misbehaves_once(
        "first_byte_timeout = \"3s\"",
        Expect::Error(502, "bad_gateway"),
        2.0,
        &[
            Misbehaviour::new(
                "non-numeric-status",
                "HTTP/1.1 2x0 OK\r\ncontent-length: 2\r\n\r\nok",
                Then::Stall,
            ),
            Misbehaviour::new(
                "wrong-protocol",
                "SPDY/9 200 OK\r\ncontent-length: 2\r\n\r\nok",
                Then::Stall,
            ),
            Misbehaviour::new(
                "binary-garbage",
                b"\x00\x01\x02\xff\xfe\r\n\r\n".to_vec(),
                Then::Stall,
            ),
            Misbehaviour::new(
                "bad-header-name",
                "HTTP/1.1 200 OK\r\nbad header: x\r\ncontent-length: 2\r\n\r\nok",
                Then::Stall,
            ),
            Misbehaviour::new(
                "two-content-lengths",
                "HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nok",
                Then::Stall,
            ),
        ],
    )
    .await;
}

fn chunked(rest: &[u8]) -> Vec<u8> {
    let mut bytes = CHUNKED_HEAD.as_bytes().to_vec();
    bytes.extend_from_slice(rest);
    bytes
}

/// Regression (issue 7): a body broken before its first byte used to make
/// wharf close the client's connection with no response at all (hyper drops
/// a head it has not flushed when the body fails at its first poll). The
/// proxy now waits for the first body byte before answering, so these get
/// the documented 502 JSON.
#[tokio::test]
async fn body_broken_before_its_first_byte_gets_502_not_a_silent_close() {
    let head_then_reset = head_with_length(5000).into_bytes();
    misbehaves_once(
        "total_timeout = \"3s\"",
        Expect::Error(502, "bad_gateway"),
        2.0,
        &[
            Misbehaviour::new(
                "chunk-size-not-hex",
                chunked(b"zz\r\nhello\r\n0\r\n\r\n"),
                Then::Stall,
            ),
            Misbehaviour::new(
                "chunk-size-overflow",
                chunked(b"fffffffffffffffffffff\r\nhello\r\n0\r\n\r\n"),
                Then::Stall,
            ),
            Misbehaviour::new("head-then-reset", head_then_reset.clone(), Then::Reset),
            Misbehaviour::new("head-then-close", head_then_reset, Then::Close),
            Misbehaviour::new("chunked-head-then-close", CHUNKED_HEAD, Then::Close),
        ],
    )
    .await;
}

#[tokio::test]
async fn bad_chunk_after_the_first_bytes_is_a_visible_truncation_without_a_timeout() {
    misbehaves_once(
        "total_timeout = \"3s\"",
        Expect::Truncated,
        2.0,
        &[
            Misbehaviour::new(
                "chunk-size-negative",
                chunked(b"5\r\nhello\r\n-5\r\nhello\r\n0\r\n\r\n"),
                Then::Stall,
            ),
            Misbehaviour::new(
                "chunk-longer-than-its-size",
                chunked(b"2\r\nhello\r\n0\r\n\r\n"),
                Then::Stall,
            ),
            Misbehaviour::new(
                "chunk-size-garbage-later",
                chunked(b"5\r\nhello\r\nzz\r\n0\r\n\r\n"),
                Then::Stall,
            ),
        ],
    )
    .await;
}

#[tokio::test]
async fn origin_header_flood_gets_502() {
    let mut flood = String::from("HTTP/1.1 200 OK\r\n");
    for i in 0..5000 {
        flood.push_str(&format!("x-flood-{i}: {i}\r\n"));
    }
    flood.push_str("content-length: 2\r\n\r\nok");
    let mut huge_value = String::from("HTTP/1.1 200 OK\r\nx-huge: ");
    huge_value.push_str(&"v".repeat(1024 * 1024));
    huge_value.push_str("\r\ncontent-length: 2\r\n\r\nok");
    misbehaves_once(
        "first_byte_timeout = \"3s\"",
        Expect::Error(502, "bad_gateway"),
        2.0,
        &[
            Misbehaviour::new("five-thousand-headers", flood, Then::Stall),
            Misbehaviour::new("one-mebibyte-header", huge_value, Then::Stall),
        ],
    )
    .await;
}

/// The origin declares 100 bytes and sends more, plus a whole second
/// response, on a connection it keeps open. The client gets exactly the
/// declared body; the extra bytes never become another call's response
/// (no desync on the pooled origin connection) nor part of a cache entry.
#[tokio::test]
async fn body_longer_than_content_length_is_cut_at_the_declared_length() {
    watch_panics();
    let declared = expected_body(100);
    let smuggled =
        b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncache-control: max-age=60\r\n\r\nEVIL!";
    let origin = ScriptedOrigin::start(move |seen, mut stream| {
        let declared = declared.clone();
        async move {
            if !seen.target.starts_with("/long/") || seen.nth > 0 {
                return behave(stream, &good_body()).await;
            }
            let mut response = head_with_length(100).into_bytes();
            response.extend_from_slice(&declared);
            response.extend_from_slice(b"extra bytes past the declared length\r\n");
            response.extend_from_slice(smuggled);
            let _ = stream.write_all(&response).await;
            // Answer a request that would come on this connection properly:
            // a desynchronised client would take "EVIL!" for its answer.
            while read_request_head(&mut stream).await.is_some() {
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\ncache-control: max-age=60\r\n\r\n",
                    good_body().len()
                );
                let _ = stream.write_all(head.as_bytes()).await;
                let _ = stream.write_all(&good_body()).await;
            }
        }
    })
    .await;
    let wharf = start_wharf(&proxy_config("")).await;
    for (mode, duration) in [("cached", Some(60)), ("bypass", None)] {
        let url = via_proxy(&wharf, &origin.url(&format!("/long/{mode}")), duration);
        let first = get(&url).await;
        assert_eq!(first.status, 200, "{mode}");
        assert_eq!(
            first.bytes().as_ref(),
            expected_body(100).as_slice(),
            "{mode}: not exactly the declared body"
        );
        // Other targets on the same origin (the pool may reuse the connection).
        for i in 0..3 {
            let other = get(&via_proxy(
                &wharf,
                &origin.url(&format!("/other/{mode}/{i}")),
                duration,
            ))
            .await;
            assert_eq!(other.status, 200, "{mode}: {:?}", other.body);
            assert_eq!(
                other.bytes().as_ref(),
                good_body().as_slice(),
                "{mode}: a later call got the bytes past the first body (origin connection desync)"
            );
        }
        if duration.is_some() {
            let again = get(&url).await;
            assert_eq!(again.header("x-cache"), "hit");
            assert_eq!(
                again.bytes().as_ref(),
                expected_body(100).as_slice(),
                "the cached entry is not exactly the declared body"
            );
        }
    }
    assert_slots_released(&wharf, "proxy").await;
    assert_no_wharf_panic("body longer than content-length");
}

// ---------------------------------------------------------------------------
// Coalesced readers when the first client leaves.
// ---------------------------------------------------------------------------

const PACED_CHUNKS: usize = 20;
const PACED_CHUNK: usize = 1000;

/// Sends `expected_body(20 000)` in 20 chunks 40 ms apart; with `reset_after`,
/// resets the connection after that many chunks instead.
async fn paced(mut stream: TcpStream, reset_after: Option<usize>) {
    let body = expected_body((PACED_CHUNKS * PACED_CHUNK) as u64);
    let _ = stream
        .write_all(head_with_length(body.len()).as_bytes())
        .await;
    for (i, chunk) in body.chunks(PACED_CHUNK).enumerate() {
        if reset_after == Some(i) {
            stream.set_zero_linger().unwrap();
            return;
        }
        if stream.write_all(chunk).await.is_err() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
}

/// A leader starts a fill and leaves after its first chunk while three
/// followers stream the same fill; the origin finishes or resets.
async fn leader_leaves(reset_after: Option<usize>) {
    watch_panics();
    let full = expected_body((PACED_CHUNKS * PACED_CHUNK) as u64);
    let origin = ScriptedOrigin::start(move |seen, stream| async move {
        if seen.nth == 0 {
            paced(stream, reset_after).await;
        } else {
            behave(stream, &expected_body((PACED_CHUNKS * PACED_CHUNK) as u64)).await;
        }
    })
    .await;
    let wharf = start_wharf(&proxy_config("")).await;
    let url = via_proxy(&wharf, &origin.url("/paced"), Some(60));

    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let response = client.get(url.parse().unwrap()).await.unwrap();
    assert_eq!(response.headers()["x-cache"], "miss");
    let followers: Vec<_> = (0..3)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { get(&url).await })
        })
        .collect();
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert!(first.data_ref().is_some_and(|d| !d.is_empty()));
    drop(body);
    drop(client);

    for follower in followers {
        let follower = follower.await.unwrap();
        assert_eq!(follower.status, 200);
        assert_eq!(follower.header("x-cache"), "coalesced");
        match reset_after {
            None => assert_eq!(
                follower.bytes().as_ref(),
                full.as_slice(),
                "a follower lost bytes when the leader left"
            ),
            Some(_) => assert!(
                follower.body.is_err(),
                "a follower saw a clean end of a reset origin body"
            ),
        }
    }
    let next = get(&url).await;
    let expected = if reset_after.is_some() { "miss" } else { "hit" };
    assert_eq!(next.header("x-cache"), expected);
    assert_eq!(next.bytes().as_ref(), full.as_slice());
    assert_eq!(
        origin.hits("/paced"),
        if reset_after.is_some() { 2 } else { 1 }
    );
    assert_slots_released(&wharf, "proxy").await;
    assert_no_wharf_panic("leader leaves a coalesced fill");
}

#[tokio::test]
async fn leader_leaving_mid_stream_leaves_coalesced_followers_whole() {
    leader_leaves(None).await;
}

#[tokio::test]
async fn leader_leaving_then_origin_reset_truncates_every_coalesced_follower() {
    leader_leaves(Some(10)).await;
}

// ---------------------------------------------------------------------------
// Cache churn, stuck route backends, SIGTERM under load.
// ---------------------------------------------------------------------------

#[tokio::test]
async fn cache_full_with_churn_stays_bounded_and_serves_whole_bodies() {
    watch_panics();
    let stack = stack("cache_max_bytes = \"64KiB\"\nmax_object_bytes = \"16KiB\"").await;
    let limit = 64.0 * 1024.0;
    let urls: Vec<String> = (0..160)
        .map(|i| stack.proxy_url(&format!("/bytes/{}?n={i}", 3000 + i % 7 * 500), Some(60)))
        .collect();
    let lens: Vec<usize> = (0..160).map(|i| 3000 + i % 7 * 500).collect();
    for batch in urls.chunks(8).zip(lens.chunks(8)) {
        let calls: Vec<_> = batch
            .0
            .iter()
            .cloned()
            .map(|url| tokio::spawn(async move { get(&url).await }))
            .collect();
        for (call, len) in calls.into_iter().zip(batch.1) {
            let response = call.await.unwrap();
            assert_eq!(response.status, 200);
            assert_eq!(
                response.bytes().as_ref(),
                expected_body(*len as u64).as_slice()
            );
        }
        let page = metrics_page(&stack.wharf).await;
        let bytes = sample(&page, "wharf_cache_bytes{service=\"proxy\"}").unwrap();
        assert!(bytes <= limit, "cache holds {bytes} bytes, over 64 KiB");
    }
    let page = metrics_page(&stack.wharf).await;
    assert!(
        sample(&page, "wharf_cache_evictions_total{service=\"proxy\"}").unwrap() > 0.0,
        "{page}"
    );
    // Evicted or not, every URL still gets its own whole body.
    for (url, len) in urls.iter().zip(&lens).step_by(9) {
        let again = get(url).await;
        assert!(matches!(again.header("x-cache"), "hit" | "miss"));
        assert_eq!(
            again.bytes().as_ref(),
            expected_body(*len as u64).as_slice()
        );
    }
    assert_slots_released(&stack.wharf, "proxy").await;
    assert_no_wharf_panic("cache churn");
}

#[tokio::test]
async fn route_backend_that_accepts_and_never_answers_gets_504() {
    watch_panics();
    let testbed = spawn_testbed("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let silent = ScriptedOrigin::start(|_seen, stream| async move {
        tokio::time::sleep(Duration::from_secs(30)).await;
        drop(stream);
    })
    .await;
    let wharf = start_wharf(&format!(
        "[services.stuck]\ntype = \"route\"\npath_prefix = \"/stuck\"\nbackends = [\"http://{}\"]\ntimeout = \"300ms\"\nretries = 1\n\
         [services.fine]\ntype = \"route\"\npath_prefix = \"/fast\"\nbackends = [\"http://{}\"]\n",
        silent.addr,
        testbed.addr()
    ))
    .await;
    let started = Instant::now();
    let calls: Vec<_> = (0..4)
        .map(|i| {
            let url = wharf.url(&format!("/stuck/{i}"));
            tokio::spawn(async move { get(&url).await })
        })
        .collect();
    let fine = get(&wharf.url("/fast")).await;
    assert_eq!(
        fine.status, 200,
        "another route was held up by a stuck backend"
    );
    for call in calls {
        let response = call.await.unwrap();
        assert_eq!(response.status, 504, "{:?}", response.body);
        assert_eq!(response.json()["error"], "gateway_timeout");
    }
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "stuck calls took {:?}",
        started.elapsed()
    );
    assert!(silent.hits("/stuck/0") >= 1, "the backend was never asked");
    // A POST with a body (not replayable) is not retried: one timeout.
    let client = Client::builder(TokioExecutor::new()).build_http::<http_body_util::Full<Bytes>>();
    let request = http::Request::post(wharf.url("/stuck/post"))
        .body(http_body_util::Full::new(Bytes::from_static(b"payload")))
        .unwrap();
    let started = Instant::now();
    let response = client.request(request).await.unwrap();
    assert_eq!(response.status(), 504);
    assert!(started.elapsed() < Duration::from_millis(1500));
    assert_slots_released(&wharf, "stuck").await;
    assert_slots_released(&wharf, "fine").await;
    assert_no_wharf_panic("stuck route backend");
}

/// The built binary under mixed load: SIGTERM lets every call in flight
/// finish whole, refuses nothing with a 5xx, and exits 0 within bounds.
#[tokio::test]
async fn sigterm_under_load_drains_every_call_and_exits_zero() {
    let testbed = spawn_testbed("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let config = config_file(
        "faults-sigterm",
        &format!(
            "{}[services.proxy]\ntype = \"proxy\"\npath = \"/proxy\"\nallow_private_networks = true\nallow_hosts = [\"127.0.0.1:{}\"]\n",
            server_table("shutdown_timeout = \"20s\"\n"),
            testbed.addr().port()
        ),
    );
    let wharf = WharfProcess::start(&config);
    let addr = wharf.addr.clone();
    let url = |path: &str, duration: Option<u64>| {
        let target = encode(&testbed.url(path));
        match duration {
            Some(d) => format!("http://{addr}/proxy?url={target}&cacheDuration={d}"),
            None => format!("http://{addr}/proxy?url={target}"),
        }
    };
    // In flight at SIGTERM: slow pass-throughs, a coalesced streaming fill,
    // and distinct cached misses; a client loop keeps making new calls.
    let mut in_flight = Vec::new();
    for i in 0..12 {
        in_flight.push((url(&format!("/slow?ms=1200&i={i}"), None), None));
    }
    let stream = url(
        "/stream?first_byte_ms=100&total_ms=1500&bytes=60000",
        Some(60),
    );
    for _ in 0..6 {
        in_flight.push((stream.clone(), Some(60000)));
    }
    for i in 0..6 {
        in_flight.push((
            url(
                &format!("/stream?first_byte_ms=50&total_ms=1200&bytes=20000&i={i}"),
                Some(60),
            ),
            Some(20000),
        ));
    }
    let calls: Vec<_> = in_flight
        .into_iter()
        .map(|(url, len)| tokio::spawn(async move { (get(&url).await, len) }))
        .collect();
    let fast = url("/bytes/2048", Some(60));
    let keep_calling = tokio::spawn(async move {
        let mut statuses = Vec::new();
        let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
        for _ in 0..400 {
            let sent =
                tokio::time::timeout(Duration::from_secs(5), client.get(fast.parse().unwrap()))
                    .await;
            match sent {
                Ok(Ok(response)) => statuses.push(response.status().as_u16()),
                Ok(Err(_refused_or_closed)) => break,
                Err(_) => panic!("a call made during the drain hung"),
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        statuses
    });
    assert!(
        poll_until(Duration::from_secs(5), || async {
            testbed.hits("/slow") == 12 && testbed.hits("/stream") == 7
        })
        .await,
        "calls did not reach the origin"
    );
    wharf.signal("TERM");
    let signalled = Instant::now();
    for call in calls {
        let (response, len) = call.await.unwrap();
        assert_eq!(
            response.status, 200,
            "an in-flight call was refused: {:?}",
            response.body
        );
        assert!(
            response.body.is_ok(),
            "an in-flight call was cut: {:?}",
            response.body
        );
        if let Some(len) = len {
            assert_eq!(response.bytes().len(), len);
        }
    }
    let statuses = keep_calling.await.unwrap();
    assert!(
        statuses.iter().all(|s| *s == 200),
        "calls during the drain got {statuses:?}"
    );
    let (status, logs) = wharf.wait().await;
    assert!(status.success(), "exit {status:?}\n{logs}");
    assert!(
        signalled.elapsed() < Duration::from_secs(10),
        "drain took {:?}",
        signalled.elapsed()
    );
    assert!(!logs.contains("panicked"), "{logs}");
    assert!(
        TcpStream::connect(&addr).await.is_err(),
        "still accepting after exit"
    );
    remove_config_file(&config);
}
