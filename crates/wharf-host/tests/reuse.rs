//! What HTTP/1.1 connections reuse per thread instead of allocating per request: read
//! buffers (h1/spare.rs), header maps, extension maps and response head buffers
//! (`wharf_http1::recycle`, h1/heads.rs), and their counters on `/metrics`. Its own test
//! binary with a single test: the counters are process-wide, and no other test may read,
//! parse or respond meanwhile.
#![allow(clippy::unwrap_used)]
#![allow(clippy::disallowed_methods)] // raw clients of the servers the tests start

use std::net::SocketAddr;
use std::time::Duration;

use http::{HeaderValue, Response};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use wharf_config::{LimitsConfig, ServerConfig};
use wharf_host::body::full;
use wharf_host::{handler, HostBuilder, Mount};

const LIMIT: Duration = Duration::from_secs(5);
/// The kinds of `wharf_kept_objects_total`.
const KEPT_KINDS: [&str; 3] = ["header_map", "extensions", "response_head"];

/// Something a service leaves in its response's extensions.
#[derive(Clone)]
struct Marker;

/// The `/metrics` page now.
async fn metrics_text(admin: SocketAddr) -> String {
    let mut stream = TcpStream::connect(admin).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut text = String::new();
    tokio::time::timeout(LIMIT, stream.read_to_string(&mut text))
        .await
        .unwrap()
        .unwrap();
    text
}

/// The value of the sample `series` (name and labels) in `text`.
fn sample(text: &str, series: &str) -> u64 {
    let prefix = format!("{series} ");
    text.lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("{series} missing from:\n{text}"))
}

fn read_buffers(text: &str, source: &str) -> u64 {
    sample(
        text,
        &format!("wharf_read_buffers_total{{source=\"{source}\"}}"),
    )
}

fn kept(text: &str, kind: &str, source: &str) -> u64 {
    sample(
        text,
        &format!("wharf_kept_objects_total{{kind=\"{kind}\",source=\"{source}\"}}"),
    )
}

#[tokio::test]
async fn keep_alive_requests_reuse_buffers_and_maps_and_count_it() {
    let limits = LimitsConfig {
        max_concurrent_calls: 8,
        max_queued_calls: 8,
        queue_timeout: LIMIT,
    };
    let server = ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        admin_listen: "127.0.0.1:0".parse().unwrap(),
        ..ServerConfig::default()
    };
    let host = HostBuilder::new(server)
        .mount(
            "ok",
            Mount::Exact("/ok".into()),
            &limits,
            handler(|_request| async {
                // A field and an extension: both maps are allocated, for the writer to keep.
                let mut response = Response::new(full("ok"));
                response
                    .headers_mut()
                    .insert("x-kept", HeaderValue::from_static("1"));
                response.extensions_mut().insert(Marker);
                response
            }),
        )
        .bind()
        .await
        .unwrap();
    let (addr, admin) = (host.local_addr(), host.admin_addr());
    let (_stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(host.run(async move {
        let _ = stopped.await;
    }));
    let before = metrics_text(admin).await;
    for kind in KEPT_KINDS {
        // Present from start (sample panics on a missing series).
        let _ = sample(
            &before,
            &format!("wharf_kept_objects_spare{{kind=\"{kind}\"}}"),
        );
    }

    // One connection, requests one after another, served on one core: the first read
    // allocates, every later one takes the buffer the previous gave back, and each
    // response leaves its maps and head buffer for the next request.
    let mut stream = TcpStream::connect(addr).await.unwrap();
    for _ in 0..4 {
        stream
            .write_all(b"GET /ok HTTP/1.1\r\nhost: a\r\n\r\n")
            .await
            .unwrap();
        let mut response = Vec::new();
        while !response.ends_with(b"\r\n\r\nok") {
            let mut chunk = [0u8; 512];
            let n = tokio::time::timeout(LIMIT, stream.read(&mut chunk))
                .await
                .unwrap()
                .unwrap();
            assert!(
                n > 0,
                "closed early: {}",
                String::from_utf8_lossy(&response)
            );
            response.extend_from_slice(&chunk[..n]);
        }
    }
    let after = metrics_text(admin).await;
    let allocated = read_buffers(&after, "allocated") - read_buffers(&before, "allocated");
    let reused = read_buffers(&after, "reused") - read_buffers(&before, "reused");
    assert_eq!(allocated, 1, "reads that allocated");
    assert!(reused >= 3, "reads that reused a buffer: {reused}");
    for kind in KEPT_KINDS {
        let reused = kept(&after, kind, "reused") - kept(&before, kind, "reused");
        assert!(
            reused >= 3,
            "{kind}: {reused} of 4 taken from the kept ones"
        );
    }
}
