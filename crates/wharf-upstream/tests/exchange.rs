//! Exchanges against scripted upstreams on loopback: framing, reuse, truncation, request
//! bodies, early answers, interim responses.
#![allow(clippy::unwrap_used)]
#![allow(clippy::disallowed_methods)] // raw clients of the servers the tests start

use std::convert::Infallible;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use wharf_upstream::{
    Connection, FieldEdits, HeadFields, IdlePool, PoolLimits, RequestHead, ResponseBody,
    UpstreamError,
};

const LIMITS: PoolLimits = PoolLimits {
    max_idle_per_key: 4,
    max_idle_total: 16,
    idle_timeout: Duration::from_secs(30),
    max_connecting_per_key: 2,
    max_connect_wait: Duration::from_secs(5),
};

/// A server that runs `script` on every accepted connection and counts connections.
struct Scripted {
    addr: std::net::SocketAddr,
    connections: Arc<AtomicUsize>,
}

impl Scripted {
    async fn start<F, Fut>(script: F) -> Scripted
    where
        F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let counter = connections.clone();
        let script = Arc::new(script);
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                counter.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(script(stream));
            }
        });
        Scripted { addr, connections }
    }

    async fn connect(&self) -> Connection {
        Connection::new(TcpStream::connect(self.addr).await.unwrap())
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

/// Reads one request head (and nothing more).
async fn read_head(stream: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte).await.ok()? == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    Some(String::from_utf8(head).unwrap())
}

fn get_headers() -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(
        http::header::HOST,
        HeaderValue::from_static("upstream.test"),
    );
    headers
}

async fn get(
    connection: Connection,
    slot: Option<wharf_upstream::PoolSlot>,
) -> Result<http::Response<ResponseBody>, wharf_upstream::SendError> {
    let headers = get_headers();
    let head = RequestHead {
        method: &Method::GET,
        target: "/thing?x=1",
        headers: &headers,
        edits: FieldEdits::NONE,
        response_fields: HeadFields::All,
    };
    connection
        .send(head, std::pin::pin!(Empty::<Bytes>::new()), slot)
        .await
}

async fn read_all(body: ResponseBody) -> Result<Vec<u8>, UpstreamError> {
    let mut body = body;
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            out.extend_from_slice(&data);
        }
    }
    Ok(out)
}

/// A 200 response carrying `body` with its length stated, kept for the whole test run (as
/// [`serve_each`] takes its responses).
fn ok_response(body: &[u8]) -> &'static [u8] {
    let mut wire =
        format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len()).into_bytes();
    wire.extend_from_slice(body);
    Vec::leak(wire)
}

/// Serves `responses` in turn on one connection, one per request head.
async fn serve_each(mut stream: TcpStream, responses: Vec<&'static [u8]>) {
    for response in responses {
        if read_head(&mut stream).await.is_none() {
            return;
        }
        if stream.write_all(response).await.is_err() {
            return;
        }
    }
    // Keep the connection open until the client closes it.
    let mut rest = Vec::new();
    let _ = stream.read_to_end(&mut rest).await;
}

#[tokio::test]
async fn content_length_and_chunked_bodies_reuse_one_connection() {
    let server = Scripted::start(|stream| {
        serve_each(
            stream,
            vec![
                b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nx-one: 1\r\n\r\nhello",
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\nx-trailer: t\r\n\r\n",
                b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n",
            ],
        )
    })
    .await;
    let pool = IdlePool::new(LIMITS);
    let (slot, idle) = pool.check_out("up");
    assert!(idle.is_none());
    let response = get(server.connect().await, Some(slot)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["x-one"], "1");
    assert_eq!(read_all(response.into_body()).await.unwrap(), b"hello");
    assert_eq!(
        pool.idle_count(),
        1,
        "a body read to its end returns the connection"
    );

    let (slot, idle) = pool.check_out("up");
    let connection = idle.expect("the pooled connection");
    assert!(connection.is_reused());
    let response = get(connection, Some(slot)).await.unwrap();
    assert!(!response.headers().contains_key("content-length"));
    assert_eq!(read_all(response.into_body()).await.unwrap(), b"abcde");

    let (slot, idle) = pool.check_out("up");
    let response = get(idle.unwrap(), Some(slot)).await.unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    assert!(response.body().is_end_stream_now());
    assert_eq!(pool.idle_count(), 1, "an empty body returns it at once");
    assert_eq!(server.connections(), 1);
}

/// `is_end_stream` without importing the trait in every assertion.
trait EndNow {
    fn is_end_stream_now(&self) -> bool;
}

impl EndNow for ResponseBody {
    fn is_end_stream_now(&self) -> bool {
        http_body::Body::is_end_stream(self)
    }
}

#[tokio::test]
async fn request_heads_go_out_exactly() {
    let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel();
    let server = Scripted::start(move |mut stream| {
        let seen = seen_tx.clone();
        async move {
            let head = read_head(&mut stream).await.unwrap();
            seen.send(head).unwrap();
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                .await;
        }
    })
    .await;
    let response = get(server.connect().await, None).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        seen_rx.recv().await.unwrap(),
        "GET /thing?x=1 HTTP/1.1\r\nhost: upstream.test\r\n\r\n"
    );
}

#[tokio::test]
async fn close_delimited_bodies_end_at_eof_and_are_not_reused() {
    let server = Scripted::start(|mut stream| async move {
        read_head(&mut stream).await;
        let _ = stream
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nuntil the end")
            .await;
    })
    .await;
    let pool = IdlePool::new(LIMITS);
    let (slot, _) = pool.check_out("up");
    let response = get(server.connect().await, Some(slot)).await.unwrap();
    assert_eq!(
        read_all(response.into_body()).await.unwrap(),
        b"until the end"
    );
    assert_eq!(pool.idle_count(), 0);
}

#[tokio::test]
async fn early_ends_are_errors_not_short_bodies() {
    let cases: [(&'static [u8], &str); 3] = [
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly this",
            "9 bytes received of 100",
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n",
            "body ended early: 5 bytes",
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhelloXX",
            "chunked",
        ),
    ];
    for (wire, expected) in cases {
        let server = Scripted::start(move |mut stream| async move {
            read_head(&mut stream).await;
            let _ = stream.write_all(wire).await;
        })
        .await;
        let pool = IdlePool::new(LIMITS);
        let (slot, _) = pool.check_out("up");
        let response = get(server.connect().await, Some(slot)).await.unwrap();
        let error = read_all(response.into_body()).await.unwrap_err();
        assert!(error.to_string().contains(expected), "{error}");
        assert_eq!(pool.idle_count(), 0);
    }
}

#[tokio::test]
async fn broken_heads_are_errors() {
    let cases: [(&'static [u8], &str); 3] = [
        (b"", "connection closed before a response head (0 bytes"),
        (
            b"HTTP/1.1 200 OK\r\ncontent-le",
            "connection closed before a response head (27",
        ),
        (b"HTTP/1.1 two hundred\r\n\r\n", "malformed response head"),
    ];
    for (wire, expected) in cases {
        let server = Scripted::start(move |mut stream| async move {
            read_head(&mut stream).await;
            let _ = stream.write_all(wire).await;
        })
        .await;
        let error = get(server.connect().await, None).await.unwrap_err();
        assert!(
            error.error.to_string().contains(expected),
            "{}",
            error.error
        );
        assert!(!error.stale, "a new connection is never stale");
    }
}

#[tokio::test]
async fn a_pooled_connection_closed_by_the_upstream_is_not_handed_out() {
    let server = Scripted::start(|mut stream| async move {
        read_head(&mut stream).await;
        let _ = stream
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            .await;
        // Close right after: the keep-alive connection dies while idle in the pool.
    })
    .await;
    let pool = IdlePool::new(LIMITS);
    let (slot, _) = pool.check_out("up");
    let response = get(server.connect().await, Some(slot)).await.unwrap();
    read_all(response.into_body()).await.unwrap();
    assert_eq!(pool.idle_count(), 1);
    // The close reaches the reactor shortly; the sweep applies the same check as a call.
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        pool.sweep();
        if pool.idle_count() == 0 {
            break;
        }
    }
    assert_eq!(
        pool.idle_count(),
        0,
        "a closed idle connection stayed in the pool"
    );
    let (_, handed_out) = pool.check_out("up");
    assert!(handed_out.is_none());
}

#[tokio::test]
async fn a_stale_connection_failure_says_so() {
    // The upstream answers once, then reads the next request and closes without a word.
    let server = Scripted::start(|mut stream| async move {
        read_head(&mut stream).await;
        let _ = stream
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            .await;
        read_head(&mut stream).await;
    })
    .await;
    let pool = IdlePool::new(LIMITS);
    let (slot, _) = pool.check_out("up");
    let response = get(server.connect().await, Some(slot)).await.unwrap();
    read_all(response.into_body()).await.unwrap();
    let (slot, idle) = pool.check_out("up");
    let error = get(idle.unwrap(), Some(slot)).await.unwrap_err();
    assert!(error.stale, "{}", error.error);
}

/// Regression (stop 52): a connection opened ahead and kept idle counted as new until a call
/// used it, so an upstream that dropped it unanswered (closed while it waited, or never
/// accepted: a full listen backlog) failed the call with 502 instead of a retry.
#[tokio::test]
async fn a_connection_opened_ahead_that_the_upstream_drops_unanswered_is_stale() {
    // The upstream reads the first request on the connection and closes without a word.
    let server = Scripted::start(|mut stream| async move {
        read_head(&mut stream).await;
    })
    .await;
    let pool = IdlePool::new(LIMITS);
    let kept = pool.keep_idle("up", 1);
    let server = &server;
    kept.fill(&|| async move { Ok::<_, Infallible>(server.connect().await) })
        .await
        .unwrap();
    let (slot, idle) = pool.check_out("up");
    let connection = idle.expect("the connection opened ahead");
    assert!(connection.is_reused(), "it waited in the pool");
    let error = get(connection, Some(slot)).await.unwrap_err();
    assert!(error.stale, "{}", error.error);
}

#[tokio::test]
async fn bytes_after_the_message_keep_the_connection_out_of_the_pool() {
    let server = Scripted::start(|stream| {
        serve_each(
            stream,
            vec![b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n"],
        )
    })
    .await;
    let pool = IdlePool::new(LIMITS);
    let (slot, _) = pool.check_out("up");
    let response = get(server.connect().await, Some(slot)).await.unwrap();
    assert_eq!(read_all(response.into_body()).await.unwrap(), b"ok");
    assert_eq!(pool.idle_count(), 0);
}

#[tokio::test]
async fn interim_responses_are_skipped() {
    let server = Scripted::start(|stream| {
        serve_each(
            stream,
            vec![b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </s>\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 1\r\n\r\n!"],
        )
    })
    .await;
    let response = get(server.connect().await, None).await.unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(read_all(response.into_body()).await.unwrap(), b"!");
}

/// Echoes the request body's framing and length: reads a head, then the body by
/// content-length or chunked, and answers `len=N`.
async fn body_echo(mut stream: TcpStream) {
    let Some(head) = read_head(&mut stream).await else {
        return;
    };
    let lower = head.to_ascii_lowercase();
    let mut body = Vec::new();
    if let Some(pos) = lower.find("content-length: ") {
        let len: usize = lower[pos + 16..]
            .split("\r\n")
            .next()
            .unwrap()
            .parse()
            .unwrap();
        body.resize(len, 0);
        stream.read_exact(&mut body).await.unwrap();
    } else if lower.contains("transfer-encoding: chunked") {
        let mut raw = Vec::new();
        let mut byte = [0u8; 1];
        while !raw.ends_with(b"0\r\n\r\n") {
            stream.read_exact(&mut byte).await.unwrap();
            raw.push(byte[0]);
        }
        body = raw;
    }
    let answer = format!(
        "framing={} len={}",
        if lower.contains("chunked") {
            "chunked"
        } else {
            "length"
        },
        body.len()
    );
    let response = format!(
        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{answer}",
        answer.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
}

#[tokio::test]
async fn request_bodies_by_length_and_chunked() {
    let server = Scripted::start(body_echo).await;
    let headers = get_headers();
    let post = RequestHead {
        method: &Method::POST,
        target: "/in",
        headers: &headers,
        edits: FieldEdits::NONE,
        response_fields: HeadFields::All,
    };
    let response = server
        .connect()
        .await
        .send(
            post,
            std::pin::pin!(Full::new(Bytes::from_static(b"0123456789"))),
            None,
        )
        .await
        .unwrap();
    assert_eq!(
        read_all(response.into_body()).await.unwrap(),
        b"framing=length len=10"
    );

    let chunks = futures_stream(vec![b"abc".as_slice(), b"defg".as_slice()]);
    let response = server
        .connect()
        .await
        .send(post, std::pin::pin!(chunks), None)
        .await
        .unwrap();
    // "3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n" is 22 bytes on the wire.
    assert_eq!(
        read_all(response.into_body()).await.unwrap(),
        b"framing=chunked len=22"
    );
}

/// A body of unknown length made of `parts`.
fn futures_stream(
    parts: Vec<&'static [u8]>,
) -> StreamBody<impl futures_util::Stream<Item = Result<Frame<Bytes>, Infallible>>> {
    StreamBody::new(futures_util::stream::iter(
        parts
            .into_iter()
            .map(|part| Ok(Frame::data(Bytes::from_static(part)))),
    ))
}

#[tokio::test]
async fn an_upstream_that_answers_before_taking_the_body_is_heard() {
    let server = Scripted::start(|mut stream| async move {
        read_head(&mut stream).await;
        let _ = stream
            .write_all(
                b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
            )
            .await;
        tokio::time::sleep(Duration::from_secs(5)).await;
    })
    .await;
    let headers = get_headers();
    let post = RequestHead {
        method: &Method::POST,
        target: "/upload",
        headers: &headers,
        edits: FieldEdits::NONE,
        response_fields: HeadFields::All,
    };
    // A body that never ends: only the early answer can finish the call.
    let (_tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(1);
    let body = StreamBody::new(tokio_stream_from(rx));
    let response = tokio::time::timeout(
        Duration::from_secs(3),
        server
            .connect()
            .await
            .send(post, std::pin::pin!(body), None),
    )
    .await
    .expect("the early answer ends the call")
    .unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn interim_answers_while_the_body_waits_do_not_stop_the_body() {
    // RFC 9110 §15.2: a client parses a 1xx it did not ask for. An upstream that sends
    // `100 Continue` (here with a `103` after it) and then reads the body is not answering
    // yet: the body goes on, and the final answer follows it. Before, the interim answer
    // ended the sending and the call waited for an answer that never came.
    let (interim_sent, interim_out) = tokio::sync::mpsc::channel::<()>(1);
    let server = Scripted::start(move |mut stream| {
        let interim_sent = interim_sent.clone();
        async move {
            read_head(&mut stream).await;
            let interim =
                b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </s>\r\n\r\n";
            stream.write_all(interim).await.unwrap();
            let _ = interim_sent.send(()).await;
            let mut raw = Vec::new();
            let mut byte = [0u8; 1];
            while !raw.ends_with(b"0\r\n\r\n") {
                if stream.read(&mut byte).await.unwrap() == 0 {
                    return;
                }
                raw.push(byte[0]);
            }
            let answer = format!("len={}", raw.len());
            let response = format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{answer}",
                answer.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
        }
    })
    .await;
    let mut interim_out = interim_out;
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(1);
    let connection = server.connect().await;
    let call = tokio::spawn(async move {
        let headers = get_headers();
        let post = RequestHead {
            method: &Method::POST,
            target: "/upload",
            headers: &headers,
            edits: FieldEdits::NONE,
            response_fields: HeadFields::All,
        };
        let body = StreamBody::new(tokio_stream_from(rx));
        let response = connection.send(post, std::pin::pin!(body), None).await?;
        Ok::<_, wharf_upstream::SendError>((
            response.status(),
            read_all(response.into_body()).await,
        ))
    });
    tx.send(Ok(Frame::data(Bytes::from_static(b"abc"))))
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(3), interim_out.recv())
        .await
        .expect("the upstream got the request head");
    // Time for the connection to see the interim answers while the body waits. The pause
    // cannot fail the test; too short, it would only let a regression go unseen.
    tokio::time::sleep(Duration::from_millis(50)).await;
    tx.send(Ok(Frame::data(Bytes::from_static(b"defg"))))
        .await
        .unwrap();
    drop(tx);
    let (status, body) = tokio::time::timeout(Duration::from_secs(3), call)
        .await
        .expect("the final answer came after the body")
        .unwrap()
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    // "3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n" is 22 bytes on the wire.
    assert_eq!(body.unwrap(), b"len=22");
}

/// A receiver as a stream.
fn tokio_stream_from(
    mut rx: tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, Infallible>>,
) -> impl futures_util::Stream<Item = Result<Frame<Bytes>, Infallible>> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

#[tokio::test]
async fn idle_connections_are_bounded() {
    let server = Scripted::start(|stream| {
        serve_each(
            stream,
            vec![b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"],
        )
    })
    .await;
    let pool = IdlePool::new(LIMITS);
    // Slots first (the pool is empty), then the calls: each returns its connection.
    let slots: Vec<_> = (0..LIMITS.max_idle_per_key + 2)
        .map(|_| pool.check_out("up").0)
        .collect();
    for slot in slots {
        drop(get(server.connect().await, Some(slot)).await.unwrap());
    }
    assert_eq!(pool.idle_count(), LIMITS.max_idle_per_key);
    let short = IdlePool::new(PoolLimits {
        idle_timeout: Duration::from_millis(50),
        ..LIMITS
    });
    let (slot, _) = short.check_out("up");
    drop(get(server.connect().await, Some(slot)).await.unwrap());
    assert_eq!(short.idle_count(), 1);
    tokio::time::sleep(Duration::from_millis(80)).await;
    short.sweep();
    assert_eq!(short.idle_count(), 0, "idle past the timeout: closed");
}

/// Moves what is left of `body` out through a pipe by `splice(2)` once it can be spliced
/// (its read-ahead bytes come as frames first); the bytes and how many of them were
/// spliced, or the body's error.
async fn splice_all(mut body: ResponseBody) -> Result<(Vec<u8>, usize), UpstreamError> {
    use rustix::pipe::{pipe_with, PipeFlags};
    let mut out = Vec::new();
    while !body.can_splice() {
        match body.frame().await {
            Some(frame) => out.extend_from_slice(&frame?.into_data().unwrap()),
            None => return Ok((out, 0)),
        }
    }
    let read_ahead = out.len();
    let (read_end, write_end) = pipe_with(PipeFlags::NONBLOCK | PipeFlags::CLOEXEC).unwrap();
    loop {
        let moved =
            std::future::poll_fn(|cx| body.poll_splice_to(cx, write_end.as_fd(), 64 * 1024))
                .await?;
        if moved == 0 {
            let spliced = out.len() - read_ahead;
            return Ok((out, spliced));
        }
        let mut chunk = vec![0u8; moved];
        let read = rustix::io::read(&read_end, &mut chunk).unwrap();
        assert_eq!(read, moved, "what was spliced in is in the pipe");
        out.extend_from_slice(&chunk);
    }
}

#[tokio::test]
async fn a_spliced_body_arrives_whole_and_returns_its_connection() {
    const LEN: usize = 1_000_000;
    let body: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
    let wire = ok_response(&body);
    let server = Scripted::start(move |stream| {
        serve_each(
            stream,
            vec![wire, b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"],
        )
    })
    .await;
    let pool = IdlePool::new(LIMITS);
    let (slot, _) = pool.check_out("up");
    let response = get(server.connect().await, Some(slot)).await.unwrap();
    let (received, spliced) = splice_all(response.into_body()).await.unwrap();
    assert!(received == body);
    // What came with the head was read into the buffer; the rest went by splice.
    assert!(spliced >= LEN - 64 * 1024, "{spliced} of {LEN} spliced");
    assert_eq!(
        pool.idle_count(),
        1,
        "the spliced body's end returns the connection"
    );

    let (slot, idle) = pool.check_out("up");
    let response = get(idle.unwrap(), Some(slot)).await.unwrap();
    assert_eq!(read_all(response.into_body()).await.unwrap(), b"ok");
    assert_eq!(server.connections(), 1);
}

#[tokio::test]
async fn a_spliced_body_raises_its_sockets_receive_buffer_and_a_read_one_does_not() {
    use rustix::net::sockopt::socket_recv_buffer_size;
    const LEN: usize = 300_000;
    let wire = ok_response(&vec![b'x'; LEN]);
    let server = Scripted::start(move |stream| serve_each(stream, vec![wire, wire])).await;

    // The same socket seen through a second descriptor, to ask for its buffer afterwards.
    let spliced = TcpStream::connect(server.addr).await.unwrap();
    let probe = spliced.as_fd().try_clone_to_owned().unwrap();
    let before = socket_recv_buffer_size(&probe).unwrap();
    assert!(
        before < wharf_upstream::SPLICED_RECEIVE_BUFFER,
        "a new socket starts below the spliced size ({before}): else this test shows nothing"
    );
    let response = get(Connection::new(spliced), None).await.unwrap();
    let (received, _) = splice_all(response.into_body()).await.unwrap();
    assert_eq!(received.len(), LEN);
    let after = socket_recv_buffer_size(&probe).unwrap();
    assert!(
        after >= wharf_upstream::SPLICED_RECEIVE_BUFFER.min(before * 2),
        "spliced: {before} -> {after}"
    );

    // Read as frames, the kernel keeps sizing the buffer itself: nothing is set.
    let read = TcpStream::connect(server.addr).await.unwrap();
    let probe = read.as_fd().try_clone_to_owned().unwrap();
    let response = get(Connection::new(read), None).await.unwrap();
    assert_eq!(read_all(response.into_body()).await.unwrap().len(), LEN);
    let kernel_sized = socket_recv_buffer_size(&probe).unwrap();
    assert_ne!(
        kernel_sized,
        wharf_upstream::SPLICED_RECEIVE_BUFFER,
        "a body read, not spliced, leaves the buffer to the kernel"
    );
}

#[tokio::test]
async fn a_spliced_body_that_ends_early_is_an_error_and_closes_its_connection() {
    let server = Scripted::start(|mut stream| async move {
        read_head(&mut stream).await;
        let _ = stream
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 300000\r\n\r\n")
            .await;
        let _ = stream.write_all(&[b'x'; 100_000]).await;
    })
    .await;
    let pool = IdlePool::new(LIMITS);
    let (slot, _) = pool.check_out("up");
    let response = get(server.connect().await, Some(slot)).await.unwrap();
    let error = splice_all(response.into_body()).await.unwrap_err();
    assert!(
        error
            .to_string()
            .contains("100000 bytes received of 300000"),
        "{error}"
    );
    assert_eq!(pool.idle_count(), 0);
}
