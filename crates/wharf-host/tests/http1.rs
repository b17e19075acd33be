//! wharf's HTTP/1.1 server against raw clients on loopback: keep-alive and pipelining,
//! request bodies (length, chunked, 100-continue, left unread), HEAD, broken response bodies,
//! HTTP/1.0, the session timeouts, a client that leaves mid-call, HTTP/2 prior knowledge.
#![allow(clippy::unwrap_used)]
#![allow(clippy::disallowed_methods)] // raw clients of the servers the tests start

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use wharf_config::{LimitsConfig, ServerConfig};
use wharf_host::body::{full, BoxError, ResponseBody};
use wharf_host::{handler, HostBuilder, Mount, RequestBody};

const LIMIT: Duration = Duration::from_secs(5);

fn limits() -> LimitsConfig {
    LimitsConfig {
        max_concurrent_calls: 64,
        max_queued_calls: 64,
        queue_timeout: Duration::from_secs(5),
    }
}

/// Counts drops of the slow service's future (a cancelled call drops it).
static CANCELLED: AtomicUsize = AtomicUsize::new(0);

struct DropCounter;

impl Drop for DropCounter {
    fn drop(&mut self) {
        CANCELLED.fetch_add(1, Ordering::SeqCst);
    }
}

/// A host on port 0 with test services:
/// `/len` answers the request body's length (read whole), `/ignore` answers at once without
/// reading the body, `/stream` answers a chunked body, `/broken` a body that fails after its
/// first chunk, `/slow` waits 30 s, `/nothing` answers 204.
async fn host(server: ServerConfig) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let builder = HostBuilder::new(server)
        .mount(
            "len",
            Mount::Exact("/len".into()),
            &limits(),
            handler(|request: http::Request<RequestBody>| async move {
                match request.into_body().collect().await {
                    Ok(body) => Response::new(full(format!("len={}", body.to_bytes().len()))),
                    Err(error) => {
                        let mut response = Response::new(full(format!("error={error}")));
                        *response.status_mut() = StatusCode::BAD_REQUEST;
                        response
                    }
                }
            }),
        )
        .mount(
            "ignore",
            Mount::Exact("/ignore".into()),
            &limits(),
            handler(|_request| async { Response::new(full("ignored")) }),
        )
        .mount(
            "stream",
            Mount::Exact("/stream".into()),
            &limits(),
            handler(|_request| async { Response::new(chunks(&[b"abc", b"defg"], false)) }),
        )
        .mount(
            "broken",
            Mount::Exact("/broken".into()),
            &limits(),
            handler(|_request| async { Response::new(chunks(&[b"first-part"], true)) }),
        )
        .mount(
            "slow",
            Mount::Exact("/slow".into()),
            &limits(),
            handler(|_request| async {
                let _counter = DropCounter;
                tokio::time::sleep(Duration::from_secs(30)).await;
                Response::new(full("late"))
            }),
        )
        .mount(
            "fields",
            Mount::Exact("/fields".into()),
            &limits(),
            handler(fields_and_body),
        )
        .mount(
            "fieldless",
            Mount::Exact("/fieldless".into()),
            &limits(),
            handler(fields_and_body).without_request_fields(),
        )
        .mount(
            "nothing",
            Mount::Exact("/nothing".into()),
            &limits(),
            handler(|_request| async {
                let mut response = Response::new(full("dropped"));
                *response.status_mut() = StatusCode::NO_CONTENT;
                response
            }),
        );
    let host = builder.bind().await.unwrap();
    let addr = host.local_addr();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(host.run(async move {
        let _ = stopped.await;
    }));
    (addr, stop)
}

/// Answers how many header fields the request came with and how long its body was.
async fn fields_and_body(request: http::Request<RequestBody>) -> Response<ResponseBody> {
    let fields = request.headers().len();
    let body = request
        .into_body()
        .collect()
        .await
        .map_or(usize::MAX, |body| body.to_bytes().len());
    Response::new(full(format!("fields={fields} body={body};")))
}

fn server_config() -> ServerConfig {
    ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        admin_listen: "127.0.0.1:0".parse().unwrap(),
        ..ServerConfig::default()
    }
}

/// A body of unknown length made of `parts`, optionally failing after them.
fn chunks(parts: &[&'static [u8]], fail: bool) -> ResponseBody {
    let mut frames: Vec<Result<Frame<Bytes>, BoxError>> = parts
        .iter()
        .map(|part| Ok(Frame::data(Bytes::from_static(part))))
        .collect();
    if fail {
        frames.push(Err("the upstream broke".into()));
    }
    ResponseBody::from(StreamBody::new(futures_util::stream::iter(frames)).boxed_unsync())
}

/// Writes `request` and reads until the peer closes or `LIMIT` passes.
async fn exchange(addr: SocketAddr, request: &[u8]) -> (String, bool) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    read_all(&mut stream).await
}

/// Reads until EOF (true) or `LIMIT` (false).
async fn read_all(stream: &mut TcpStream) -> (String, bool) {
    let mut out = Vec::new();
    let closed = tokio::time::timeout(LIMIT, stream.read_to_end(&mut out))
        .await
        .is_ok();
    (String::from_utf8_lossy(&out).into_owned(), closed)
}

/// Reads until `text` contains `needle` (panics after `LIMIT`).
async fn read_until(stream: &mut TcpStream, needle: &str) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(LIMIT, async {
        while !String::from_utf8_lossy(&out).contains(needle) {
            let n = stream.read(&mut buf).await.unwrap();
            assert!(
                n > 0,
                "closed before {needle:?}: {}",
                String::from_utf8_lossy(&out)
            );
            out.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no {needle:?} in {}", String::from_utf8_lossy(&out)));
    String::from_utf8_lossy(&out).into_owned()
}

/// The status codes of the responses in `text` (status lines only, not "HTTP/1.1" in a body).
fn statuses(text: &str) -> Vec<&str> {
    text.match_indices("HTTP/1.1 ")
        .filter_map(|(i, _)| text.get(i + 9..i + 13))
        .filter(|code| code.ends_with(' ') && code[..3].bytes().all(|b| b.is_ascii_digit()))
        .map(|code| &code[..3])
        .collect()
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order_on_one_connection() {
    let (addr, _stop) = host(server_config()).await;
    let request = "POST /len HTTP/1.1\r\nhost: t\r\ncontent-length: 5\r\n\r\nhello\
                   POST /len HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n3;x=1\r\nabc\r\n4\r\ndefg\r\n0\r\ntrailer: t\r\n\r\n\
                   GET /stream HTTP/1.1\r\nhost: t\r\n\r\n\
                   GET /ignore HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n";
    let (text, closed) = exchange(addr, request.as_bytes()).await;
    assert!(closed, "connection: close was not honoured\n{text}");
    assert_eq!(statuses(&text), ["200", "200", "200", "200"], "{text}");
    assert!(text.contains("len=5"), "{text}");
    assert!(
        text.contains("len=7"),
        "the chunked body, trailers dropped: {text}"
    );
    assert!(text.contains("transfer-encoding: chunked\r\n"), "{text}");
    assert!(
        text.contains("\r\n\r\n3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n"),
        "{text}"
    );
    assert!(text.ends_with("ignored"), "{text}");
    assert!(text.contains("connection: close"), "{text}");
    assert!(text.contains("date: "), "{text}");
}

#[tokio::test]
async fn a_service_that_reads_no_fields_gets_none_and_the_framing_rules_still_hold() {
    let (addr, _stop) = host(server_config()).await;
    let request = "GET /fieldless?q=1 HTTP/1.1\r\nHost: t\r\nuser-agent: u\r\naccept: */*\r\n\r\n\
                   GET /fields?q=1 HTTP/1.1\r\nHost: t\r\nuser-agent: u\r\naccept: */*\r\n\r\n\
                   POST /fieldless HTTP/1.1\r\nhost: t\r\ncontent-length: 5\r\n\r\nhello\
                   POST /fieldless HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n\
                   GET /fieldless HTTP/1.1\r\nhost: t\r\nConnection: close\r\n\r\n\
                   GET /fields HTTP/1.1\r\nhost: t\r\n\r\n";
    let (text, closed) = exchange(addr, request.as_bytes()).await;
    assert!(closed, "connection: close was not honoured\n{text}");
    assert_eq!(
        statuses(&text),
        ["200"; 5],
        "nothing after the close: {text}"
    );
    let answers: Vec<&str> = text
        .match_indices("fields=")
        .map(|(i, _)| &text[i..i + text[i..].find(';').unwrap()])
        .collect();
    // The map is kept where the service reads it, or where the framing or the connection's
    // persistence is read from it.
    assert_eq!(
        answers,
        [
            "fields=0 body=0",
            "fields=3 body=0",
            "fields=2 body=5",
            "fields=2 body=3",
            "fields=2 body=0"
        ],
        "{text}"
    );
    // Still one `host`, and a path with no service is still a 404.
    let (text, _) = exchange(addr, b"GET /fieldless HTTP/1.1\r\n\r\n").await;
    assert_eq!(statuses(&text), ["400"], "{text}");
    let (text, _) = exchange(
        addr,
        b"GET /none?x HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(statuses(&text), ["404"], "{text}");
}

#[tokio::test]
async fn expect_continue_gets_100_before_the_body_is_read() {
    let (addr, _stop) = host(server_config()).await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(
            b"PUT /len HTTP/1.1\r\nhost: t\r\nexpect: 100-continue\r\ncontent-length: 3\r\n\r\n",
        )
        .await
        .unwrap();
    let interim = read_until(&mut stream, "\r\n\r\n").await;
    assert!(
        interim.starts_with("HTTP/1.1 100 Continue\r\n\r\n"),
        "{interim}"
    );
    stream.write_all(b"abc").await.unwrap();
    let text = read_until(&mut stream, "len=3").await;
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");

    // A service that answers without reading: no 100, and the connection closes after.
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(
            b"PUT /ignore HTTP/1.1\r\nhost: t\r\nexpect: 100-continue\r\ncontent-length: 3\r\n\r\n",
        )
        .await
        .unwrap();
    let (text, closed) = read_all(&mut stream).await;
    assert!(closed);
    assert_eq!(statuses(&text), ["200"], "{text}");
}

#[tokio::test]
async fn an_unread_body_is_drained_when_small_and_closes_the_connection_when_large() {
    let (addr, _stop) = host(server_config()).await;
    let small = "POST /ignore HTTP/1.1\r\nhost: t\r\ncontent-length: 10\r\n\r\n0123456789\
                 GET /ignore HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n";
    let (text, _) = exchange(addr, small.as_bytes()).await;
    assert_eq!(
        statuses(&text),
        ["200", "200"],
        "the next request was served: {text}"
    );

    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"POST /ignore HTTP/1.1\r\nhost: t\r\ncontent-length: 10000000\r\n\r\n")
        .await
        .unwrap();
    let _ = stream.write_all(&vec![b'x'; 256 * 1024]).await;
    let (text, closed) = read_all(&mut stream).await;
    assert!(closed, "a 10 MB unread body must not be drained");
    assert_eq!(statuses(&text), ["200"], "{text}");
}

#[tokio::test]
async fn head_and_no_content_answers_carry_no_body() {
    let (addr, _stop) = host(server_config()).await;
    let request = "HEAD /ignore HTTP/1.1\r\nhost: t\r\n\r\n\
                   GET /nothing HTTP/1.1\r\nhost: t\r\n\r\n\
                   GET /ignore HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n";
    let (text, _) = exchange(addr, request.as_bytes()).await;
    assert_eq!(statuses(&text), ["200", "204", "200"], "{text}");
    let head = &text[..text.find("HTTP/1.1 204").unwrap()];
    assert!(head.contains("content-length: 7\r\n"), "{head}");
    assert!(
        head.ends_with("\r\n\r\n"),
        "a HEAD answer carries no body: {head:?}"
    );
    let no_content = &text[text.find("HTTP/1.1 204").unwrap()..text.rfind("HTTP/1.1 200").unwrap()];
    assert!(!no_content.contains("content-length"), "{no_content}");
    assert!(!no_content.contains("dropped"), "{no_content}");
}

#[tokio::test]
async fn a_body_that_fails_is_cut_after_what_was_sent() {
    let (addr, _stop) = host(server_config()).await;
    let (text, closed) = exchange(addr, b"GET /broken HTTP/1.1\r\nhost: t\r\n\r\n").await;
    assert!(closed);
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(
        text.contains("a\r\nfirst-part\r\n"),
        "the bytes that came were sent: {text}"
    );
    assert!(
        !text.ends_with("0\r\n\r\n"),
        "no chunked terminator after a failure: {text}"
    );
}

#[tokio::test]
async fn http_1_0_gets_a_close_delimited_body_and_a_close() {
    let (addr, _stop) = host(server_config()).await;
    let (text, closed) = exchange(addr, b"GET /stream HTTP/1.0\r\n\r\n").await;
    assert!(closed);
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(!text.contains("transfer-encoding"), "{text}");
    assert!(text.ends_with("\r\n\r\nabcdefg"), "{text}");
    let (text, _) = exchange(
        addr,
        b"GET /ignore HTTP/1.0\r\nconnection: keep-alive\r\n\r\nGET /ignore HTTP/1.0\r\n\r\n",
    )
    .await;
    assert_eq!(statuses(&text), ["200", "200"], "{text}");
    assert!(text.contains("connection: keep-alive"), "{text}");
}

#[tokio::test]
async fn idle_and_head_timeouts_close_the_connection() {
    let (addr, _stop) = host(ServerConfig {
        idle_timeout: Duration::from_millis(300),
        header_read_timeout: Duration::from_millis(300),
        ..server_config()
    })
    .await;
    // Idle after a response.
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /ignore HTTP/1.1\r\nhost: t\r\n\r\n")
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let (text, closed) = read_all(&mut stream).await;
    assert!(closed && statuses(&text) == ["200"], "{text}");
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "{:?}",
        started.elapsed()
    );
    // A head that never ends (slowloris).
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /ignore HTTP/1.1\r\nhost: t\r\nx-slow: ")
        .await
        .unwrap();
    let (text, closed) = read_all(&mut stream).await;
    assert!(closed && text.is_empty(), "{text}");
    // Nothing at all after accept.
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let (text, closed) = read_all(&mut stream).await;
    assert!(closed && text.is_empty(), "{text}");
}

#[tokio::test]
async fn a_client_that_leaves_cancels_its_call() {
    let (addr, _stop) = host(server_config()).await;
    let before = CANCELLED.load(Ordering::SeqCst);
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /slow HTTP/1.1\r\nhost: t\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(stream);
    let cancelled = tokio::time::timeout(LIMIT, async {
        while CANCELLED.load(Ordering::SeqCst) == before {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(
        cancelled.is_ok(),
        "the slow call went on after its client left"
    );
}

#[tokio::test]
async fn bad_and_oversized_heads_get_json_and_a_close() {
    let (addr, _stop) = host(ServerConfig {
        max_header_bytes: 8 * 1024,
        ..server_config()
    })
    .await;
    let (text, closed) = exchange(addr, b"GET / HTTP/1.1\r\n\r\n").await;
    assert!(closed && statuses(&text) == ["400"], "{text}");
    assert!(text.contains("bad_request"), "{text}");
    let big = format!(
        "GET /ignore HTTP/1.1\r\nhost: t\r\nx: {}\r\n\r\n",
        "a".repeat(9000)
    );
    let (text, closed) = exchange(addr, big.as_bytes()).await;
    assert!(closed && statuses(&text) == ["431"], "{text}");
    assert!(text.contains("headers_too_large"), "{text}");
    let (text, _) = exchange(
        addr,
        b"GET /none HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(statuses(&text), ["404"], "{text}");
}

#[tokio::test]
async fn http2_prior_knowledge_is_served_on_the_same_port() {
    let (addr, _stop) = host(server_config()).await;
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(connection);
    let request = http::Request::post(format!("http://{addr}/len"))
        .body(http_body_util::Full::new(Bytes::from_static(b"four")))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.version(), http::Version::HTTP_2);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "len=4");
}

#[tokio::test]
async fn a_host_that_busy_polls_serves_calls_and_keeps_its_timeouts() {
    // The longest window (10 ms): the cores poll instead of sleeping after each call.
    let (addr, _stop) = host(ServerConfig {
        busy_poll: Duration::from_millis(10),
        idle_timeout: Duration::from_millis(300),
        ..server_config()
    })
    .await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    for call in 0..20 {
        stream
            .write_all(b"GET /ignore HTTP/1.1\r\nhost: t\r\n\r\n")
            .await
            .unwrap();
        let mut head = Vec::new();
        while !head.ends_with(b"ignored") {
            let mut byte = [0; 1];
            stream.read_exact(&mut byte).await.unwrap();
            head.push(byte[0]);
            assert!(head.len() < 4096, "call {call}: no end of the response");
        }
        let text = String::from_utf8_lossy(&head);
        assert_eq!(statuses(&text), ["200"], "call {call}: {text}");
    }
    // A timer due well after the polling window still fires: the idle connection closes.
    let started = std::time::Instant::now();
    let (text, closed) = read_all(&mut stream).await;
    assert!(closed && text.is_empty(), "{text}");
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "{:?}",
        started.elapsed()
    );
}
