//! Read-buffer reuse (h1/spare.rs) and its counters on `/metrics`. Its own test binary: the
//! counters are process-wide, and no other test may read or allocate meanwhile.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::Duration;

use http::Response;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use wharf_config::{LimitsConfig, ServerConfig};
use wharf_host::body::full;
use wharf_host::{handler, HostBuilder, Mount};

const LIMIT: Duration = Duration::from_secs(5);

/// `wharf_read_buffers_total{source}` as `/metrics` shows it now.
async fn read_buffers(admin: SocketAddr, source: &str) -> u64 {
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
    let series = format!("wharf_read_buffers_total{{source=\"{source}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(series.as_str()))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("{series} missing from:\n{text}"))
}

#[tokio::test]
async fn keep_alive_requests_reuse_the_read_buffer_and_count_it() {
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
            handler(|_request| async { Response::new(full("ok")) }),
        )
        .bind()
        .await
        .unwrap();
    let (addr, admin) = (host.local_addr(), host.admin_addr());
    let (_stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(host.run(async move {
        let _ = stopped.await;
    }));
    let reused_before = read_buffers(admin, "reused").await;
    let allocated_before = read_buffers(admin, "allocated").await;

    // One connection, requests one after another, on this test's single-threaded runtime:
    // the first read allocates, every later one takes the buffer the previous gave back.
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
    let reused = read_buffers(admin, "reused").await - reused_before;
    let allocated = read_buffers(admin, "allocated").await - allocated_before;
    assert_eq!(allocated, 1, "reads that allocated");
    assert!(reused >= 3, "reads that reused a buffer: {reused}");
}
