//! Hostile clients (issue 7): exact bytes over raw TCP. Each attempt gets a
//! clear 4xx or a closed connection, and a normal call made during or right
//! after it is served.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use crate::faults::{
    assert_no_wharf_panic, assert_slots_released, metrics_page, via_proxy, watch_panics,
    ScriptedOrigin,
};
use crate::support::*;

/// What came back on one raw connection.
struct RawReply {
    text: String,
    /// The server closed (or reset) the connection within the limit.
    closed: bool,
}

impl RawReply {
    /// The status codes of every response head received, in order.
    fn statuses(&self) -> Vec<u16> {
        self.text
            .match_indices("HTTP/1.1 ")
            .filter_map(|(at, _)| self.text.get(at + 9..at + 12)?.parse().ok())
            .collect()
    }
}

/// Sends `request` on a new connection and reads until the server closes it
/// or `limit` passes.
async fn exchange(addr: SocketAddr, request: &[u8], limit: Duration) -> RawReply {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    // The server may answer and close before reading everything: not an error.
    let _ = stream.write_all(request).await;
    let mut out = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    let deadline = tokio::time::Instant::now() + limit;
    let closed = loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break true,
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Err(_) => break false,
        }
    };
    RawReply {
        text: String::from_utf8_lossy(&out).into_owned(),
        closed,
    }
}

/// A testbed, a proxy allowed to reach it, and a route at `/echo` to its
/// echo endpoint (so a test sees what a backend would receive).
async fn hostile_stack(server: &str) -> Stack {
    let testbed = spawn_testbed("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let wharf = start_wharf(&format!(
        "{}[services.proxy]\ntype = \"proxy\"\npath = \"/proxy\"\nallow_private_networks = true\nallow_hosts = [\"127.0.0.1:{port}\"]\n\
         [services.echo]\ntype = \"route\"\npath_prefix = \"/echo\"\nbackends = [\"http://127.0.0.1:{port}\"]\n",
        server_table(&format!("{server}\n")),
        port = testbed.addr().port()
    ))
    .await;
    Stack { testbed, wharf }
}

/// A normal proxied call is served whole.
async fn assert_normal_call_served(stack: &Stack, case: &str) {
    let response = get(&stack.proxy_url("/bytes/1000", Some(60))).await;
    assert_eq!(response.status, 200, "{case}: normal call refused");
    assert_eq!(
        response.bytes().as_ref(),
        expected_body(1000).as_slice(),
        "{case}"
    );
}

/// How a smuggling attempt must be answered.
#[derive(Debug, Clone, Copy)]
enum Verdict {
    /// 400, then the connection closes.
    BadRequest,
    /// One well-framed answer (the body framed by `transfer-encoding`, as
    /// RFC 9112 §6.3 says), then the connection closes: nothing sent after
    /// the body is taken as a second request.
    OneAnswerThenClose,
}

#[tokio::test]
async fn request_smuggling_attempts_get_400_or_a_closed_connection() {
    watch_panics();
    let stack = hostile_stack("").await;
    let smuggled = "GET /smuggled HTTP/1.1\r\nhost: x\r\n\r\n";
    let cases: Vec<(&str, String, Verdict)> = vec![
        (
            "content-length and transfer-encoding",
            format!("POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 40\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n{smuggled}"),
            Verdict::OneAnswerThenClose,
        ),
        (
            "transfer-encoding then content-length",
            format!("POST /echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\ncontent-length: 40\r\n\r\n0\r\n\r\n{smuggled}"),
            Verdict::OneAnswerThenClose,
        ),
        (
            "duplicate differing content-length",
            format!("POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\ncontent-length: 45\r\n\r\nhello{smuggled}"),
            Verdict::BadRequest,
        ),
        (
            "content-length list with differing values",
            format!("POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 5, 45\r\n\r\nhello{smuggled}"),
            Verdict::BadRequest,
        ),
        (
            "signed content-length",
            format!("POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: +5\r\n\r\nhello{smuggled}"),
            Verdict::BadRequest,
        ),
        (
            "obs-fold continuation line",
            format!("GET /echo HTTP/1.1\r\nhost: x\r\nx-folded: a\r\n b\r\n\r\n{smuggled}"),
            Verdict::BadRequest,
        ),
        (
            "obs-fold continuing content-length",
            format!("POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n 0\r\n\r\nhello{smuggled}"),
            Verdict::BadRequest,
        ),
        (
            "transfer-encoding chunked, identity",
            format!("POST /echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked, identity\r\n\r\n0\r\n\r\n{smuggled}"),
            Verdict::BadRequest,
        ),
        (
            "transfer-encoding identity",
            format!("POST /echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: identity\r\ncontent-length: 5\r\n\r\nhello{smuggled}"),
            Verdict::BadRequest,
        ),
        (
            "transfer-encoding xchunked",
            format!("POST /echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: xchunked\r\n\r\n0\r\n\r\n{smuggled}"),
            Verdict::BadRequest,
        ),
        (
            "transfer-encoding in HTTP/1.0",
            format!("POST /echo HTTP/1.0\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n{smuggled}"),
            Verdict::BadRequest,
        ),
        (
            "space before the colon",
            format!("POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length : 5\r\n\r\nhello{smuggled}"),
            Verdict::BadRequest,
        ),
    ];
    for (case, request, verdict) in cases {
        let reply = exchange(stack.wharf.addr, request.as_bytes(), Duration::from_secs(3)).await;
        let statuses = reply.statuses();
        assert!(reply.closed, "{case}: connection kept open\n{}", reply.text);
        assert!(
            !reply.text.contains("/smuggled"),
            "{case}: the smuggled request was answered\n{}",
            reply.text
        );
        match verdict {
            Verdict::BadRequest => {
                assert_eq!(statuses, [400], "{case}\n{}", reply.text);
            }
            Verdict::OneAnswerThenClose => {
                assert_eq!(statuses.len(), 1, "{case}\n{}", reply.text);
                // What the backend received: one framing, the chunked one.
                assert!(
                    !reply.text.contains(r#"["content-length","40"]"#),
                    "{case}: forwarded with both framings\n{}",
                    reply.text
                );
                assert!(
                    reply.text.contains(r#""body_len":0"#),
                    "{case}: the backend saw a body other than the chunked one\n{}",
                    reply.text
                );
            }
        }
        assert_normal_call_served(&stack, case).await;
    }
    assert_slots_released(&stack.wharf, "echo").await;
    assert_no_wharf_panic("smuggling");
}

#[tokio::test]
async fn oversized_request_line_and_headers_get_4xx() {
    watch_panics();
    let stack = hostile_stack("").await;
    let target = encode(&stack.testbed.url("/fast"));
    let long_line = format!(
        "GET /proxy?url={target}&pad={} HTTP/1.1\r\nhost: x\r\n\r\n",
        "a".repeat(100 * 1024)
    );
    let mut many_headers = format!("GET /proxy?url={target} HTTP/1.1\r\nhost: x\r\n");
    for i in 0..500 {
        many_headers.push_str(&format!("x-h{i}: {i}\r\n"));
    }
    many_headers.push_str("\r\n");
    let mut just_over = format!("GET /proxy?url={target} HTTP/1.1\r\nhost: x\r\n");
    for i in 0..33 {
        just_over.push_str(&format!("x-big-{i}: {}\r\n", "b".repeat(2000)));
    }
    just_over.push_str("\r\n");
    let huge_header = format!(
        "GET /proxy?url={target} HTTP/1.1\r\nhost: x\r\nx-huge: {}\r\n\r\n",
        "h".repeat(1024 * 1024)
    );
    let endless_line = format!("GET /{}", "x".repeat(1024 * 1024));
    for (case, request) in [
        ("100 KiB request line", long_line),
        ("500 headers", many_headers),
        ("66 KB of headers, over max_header_bytes", just_over),
        ("one 1 MiB header", huge_header),
        ("1 MiB request line without an end", endless_line),
    ] {
        let reply = exchange(stack.wharf.addr, request.as_bytes(), Duration::from_secs(3)).await;
        let statuses = reply.statuses();
        assert!(
            statuses.len() <= 1 && statuses.iter().all(|s| (400..500).contains(s)),
            "{case}: got {statuses:?}\n{:.300}",
            reply.text
        );
        assert!(
            !statuses.is_empty() || reply.closed,
            "{case}: neither an answer nor a close"
        );
        assert_normal_call_served(&stack, case).await;
    }
    assert_no_wharf_panic("oversized heads");
}

#[tokio::test]
async fn invalid_percent_encoding_and_utf8_in_url_get_400() {
    watch_panics();
    let stack = hostile_stack("").await;
    for query in [
        "url=%zz",
        "url=%f",
        "url=%",
        "url=http%3A%2F%2F127.0.0.1%2F%ff%fe",
        "url=http%3A%2F%2F%C0%AF",
        "url=http%3A%2F%2Fa.example%2F%ED%A0%80",
        "url=http%3A%2F%2Fa.example%2F%00",
        "url=http%3A%2F%2Fa.example%0D%0Ax-injected%3A%201",
        "url=%E0%A4%A",
    ] {
        let response = get(&stack.wharf.url(&format!("/proxy?{query}"))).await;
        assert_eq!(response.status, 400, "{query}: {:?}", response.body);
        assert_eq!(response.json()["error"], "bad_request", "{query}");
    }
    // Bytes that are not even valid in a request target.
    for target in [
        b"/proxy?url=\xff\xfe".as_slice(),
        b"/proxy?url=http://a.example/\x00".as_slice(),
        b"/proxy?url=\x7f".as_slice(),
    ] {
        let mut request = b"GET ".to_vec();
        request.extend_from_slice(target);
        request.extend_from_slice(b" HTTP/1.1\r\nhost: x\r\n\r\n");
        let reply = exchange(stack.wharf.addr, &request, Duration::from_secs(3)).await;
        assert_eq!(reply.statuses(), [400], "{:?}\n{}", target, reply.text);
        assert!(reply.closed);
    }
    assert_normal_call_served(&stack, "invalid url").await;
    assert_no_wharf_panic("invalid url");
}

#[tokio::test]
async fn ten_thousand_byte_url_is_served_and_cached() {
    watch_panics();
    let stack = hostile_stack("").await;
    let base = stack.testbed.url("/bytes/777?pad=");
    let probe = stack.proxy_url(&format!("/bytes/777?pad={}", ""), Some(60));
    let overhead = probe.len() - stack.wharf.url("").len() + "GET  HTTP/1.1".len();
    let pad = "p".repeat(10_000 - overhead);
    let url = stack.proxy_url(&format!("/bytes/777?pad={pad}"), Some(60));
    let line = format!("GET {} HTTP/1.1", &url[stack.wharf.url("").len()..]);
    assert_eq!(line.len(), 10_000, "{base}");
    let first = get(&url).await;
    assert_eq!(first.status, 200, "{:?}", first.body);
    assert_eq!(first.header("x-cache"), "miss");
    assert_eq!(first.bytes().as_ref(), expected_body(777).as_slice());
    let second = get(&url).await;
    assert_eq!(second.header("x-cache"), "hit");
    assert_eq!(second.bytes().as_ref(), expected_body(777).as_slice());
    assert_eq!(stack.testbed.hits("/bytes/777"), 1);
    assert_no_wharf_panic("long url");
}

#[tokio::test]
async fn slowloris_flood_is_closed_while_normal_calls_are_served() {
    watch_panics();
    let stack = hostile_stack("header_read_timeout = \"400ms\"").await;
    let trickles: Vec<_> = (0..40)
        .map(|i| {
            let addr = stack.wharf.addr;
            tokio::spawn(async move {
                let mut stream = TcpStream::connect(addr).await.unwrap();
                let started = Instant::now();
                let head = format!(
                    "GET /proxy?i={i} HTTP/1.1\r\nhost: x\r\nx-slow: {}",
                    "a".repeat(100)
                );
                for byte in head.bytes() {
                    if stream.write_all(&[byte]).await.is_err() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                let mut buf = [0u8; 1024];
                let closed = matches!(
                    tokio::time::timeout(Duration::from_secs(3), stream.read(&mut buf)).await,
                    Ok(Ok(0)) | Ok(Err(_))
                );
                (closed, started.elapsed())
            })
        })
        .collect();
    for i in 0..10 {
        assert_normal_call_served(&stack, &format!("during slowloris, call {i}")).await;
    }
    for trickle in trickles {
        let (closed, after) = trickle.await.unwrap();
        assert!(closed, "a slowloris connection was kept open");
        assert!(
            after < Duration::from_secs(4),
            "closed only after {after:?}"
        );
    }
    assert_no_wharf_panic("slowloris");
}

/// An origin that sends `len` bytes as fast as it may, counting what the
/// socket took.
async fn counting_origin(len: u64) -> (ScriptedOrigin, Arc<AtomicU64>) {
    let written = Arc::new(AtomicU64::new(0));
    let counter = written.clone();
    let origin = ScriptedOrigin::start(move |_seen, mut stream| {
        let counter = counter.clone();
        async move {
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {len}\r\ncache-control: max-age=60\r\n\r\n"
            );
            if stream.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            let block = vec![b'z'; 64 * 1024];
            let mut left = len;
            while left > 0 {
                let n = left.min(block.len() as u64) as usize;
                if stream.write_all(&block[..n]).await.is_err() {
                    return;
                }
                counter.fetch_add(n as u64, Ordering::Relaxed);
                left -= n as u64;
            }
        }
    })
    .await;
    (origin, written)
}

/// Sends a GET and never reads the answer (a small receive buffer).
async fn slow_reader(addr: SocketAddr, path_and_query: &str) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(16 * 1024).unwrap();
    let mut stream = socket.connect(addr).await.unwrap();
    stream
        .write_all(format!("GET {path_and_query} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    stream
}

/// Waits until `written` stops growing for 400 ms (or 6 s pass); returns it.
async fn settled(written: &AtomicU64) -> u64 {
    let started = Instant::now();
    let mut last = written.load(Ordering::Relaxed);
    let mut still_since = Instant::now();
    while started.elapsed() < Duration::from_secs(6) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = written.load(Ordering::Relaxed);
        if now != last {
            last = now;
            still_since = Instant::now();
        } else if still_since.elapsed() > Duration::from_millis(400) {
            break;
        }
    }
    last
}

#[tokio::test]
async fn slow_reader_of_a_large_body_does_not_make_wharf_buffer_it() {
    watch_panics();
    // Loopback socket buffers (autotuned, up to tcp_rmem's 32 MiB max here)
    // hold ~11-13 MB in practice; a proxy buffering the body would read it all.
    const BODY: u64 = 128 << 20;
    const BOUND: u64 = 48 << 20;
    let testbed = spawn_testbed("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let wharf = start_wharf(&format!(
        "[services.proxy]\ntype = \"proxy\"\npath = \"/proxy\"\nallow_private_networks = true\nmax_object_bytes = \"1MiB\"\n\
         [services.other]\ntype = \"proxy\"\npath = \"/other\"\nallow_private_networks = true\nallow_hosts = [\"127.0.0.1:{}\"]\n",
        testbed.addr().port()
    ))
    .await;
    for duration in [None, Some(60)] {
        let (origin, written) = counting_origin(BODY).await;
        let url = via_proxy(&wharf, &origin.url("/large"), duration);
        let reader = slow_reader(wharf.addr, &url[wharf.url("").len()..]).await;
        let held = settled(&written).await;
        assert!(
            held < BOUND,
            "cacheDuration {duration:?}: {held} bytes of a {BODY}-byte body were read from the origin for a client that reads nothing"
        );
        // Others are served meanwhile, on this service and on another.
        let fine = get(&via_proxy(&wharf, &testbed.url("/bytes/500"), Some(60))).await;
        assert_eq!(fine.status, 200);
        let other = get(&wharf.url(&format!(
            "/other?url={}",
            encode(&testbed.url("/bytes/500"))
        )))
        .await;
        assert_eq!(other.bytes().as_ref(), expected_body(500).as_slice());
        // The reader leaves: its call ends and the origin is let go.
        drop(reader);
        assert_slots_released(&wharf, "proxy").await;
    }
    assert_no_wharf_panic("slow reader");
}

/// A client that stops reading must not hold its call slot forever: with
/// every slot taken by such clients, the service would refuse everyone.
#[tokio::test]
async fn slow_readers_do_not_hold_call_slots_forever() {
    watch_panics();
    let wharf = start_wharf(&format!(
        "{}[services.proxy]\ntype = \"proxy\"\npath = \"/proxy\"\nallow_private_networks = true\n\
         max_concurrent_calls = 2\nmax_queued_calls = 4\nqueue_timeout = \"1s\"\ntotal_timeout = \"1s\"\n",
        server_table("idle_timeout = \"1s\"\n"),
    ))
    .await;
    let (origin, _written) = counting_origin(64 << 20).await;
    let url = via_proxy(&wharf, &origin.url("/large"), None);
    let path = &url[wharf.url("").len()..];
    let _readers = [
        slow_reader(wharf.addr, path).await,
        slow_reader(wharf.addr, path).await,
    ];
    let (small, _) = counting_origin(100).await;
    let normal = via_proxy(&wharf, &small.url("/small"), None);
    let last = Arc::new(AtomicU64::new(0));
    let served = poll_until(Duration::from_secs(5), || {
        let (normal, last) = (normal.clone(), last.clone());
        async move {
            let status = get(&normal).await.status.as_u16();
            last.store(u64::from(status), Ordering::Relaxed);
            status == 200
        }
    })
    .await;
    let last = last.load(Ordering::Relaxed);
    let page = metrics_page(&wharf).await;
    let outstanding = sample(&page, "wharf_calls_outstanding{service=\"proxy\"}");
    assert!(
        served,
        "two clients that stopped reading still hold both call slots (max_concurrent_calls = 2) \
         past idle_timeout (1s): the session must cut a call whose response makes no write \
         progress (found in issue 7, fixed in 87bd0dd); last status {last}, calls outstanding \
         {outstanding:?}"
    );
}

#[tokio::test]
async fn connection_flood_beyond_max_connections_is_bounded_and_drains() {
    watch_panics();
    let stack = hostile_stack("max_connections = 16\nheader_read_timeout = \"400ms\"").await;
    let mut flood = Vec::new();
    for _ in 0..64 {
        flood.push(TcpStream::connect(stack.wharf.addr).await.unwrap());
    }
    // The admin listener is not counted: it answers during the flood.
    let page = metrics_page(&stack.wharf).await;
    let active = sample(&page, "wharf_sessions_active").unwrap();
    assert!(active <= 16.0, "{active} sessions beyond max_connections");
    let started = Instant::now();
    let response = tokio::time::timeout(
        Duration::from_secs(8),
        get(&stack.proxy_url("/bytes/1000", Some(60))),
    )
    .await
    .expect("a normal call was never served during the flood");
    assert_eq!(response.bytes().as_ref(), expected_body(1000).as_slice());
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "served only after {:?}",
        started.elapsed()
    );
    for _ in 0..5 {
        let page = metrics_page(&stack.wharf).await;
        let active = sample(&page, "wharf_sessions_active").unwrap();
        assert!(active <= 16.0, "{active} sessions beyond max_connections");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Every flooding connection is closed by the server in the end.
    for mut stream in flood {
        let mut buf = [0u8; 64];
        let closed = matches!(
            tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await,
            Ok(Ok(0)) | Ok(Err(_))
        );
        assert!(closed, "a flooding connection was kept open");
    }
    assert!(
        poll_until(Duration::from_secs(3), || async {
            sample(&metrics_page(&stack.wharf).await, "wharf_sessions_active") == Some(0.0)
        })
        .await,
        "sessions_active did not return to 0"
    );
    assert_no_wharf_panic("connection flood");
}
