//! The data plane's cores, seen from outside: TCP sessions run on the core threads (not on
//! the multi-threaded runtime's workers), new connections are spread over every core, and
//! after shutdown the service address takes no more connections.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::time::Duration;

use http::Response;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use wharf_config::{LimitsConfig, ServerConfig};
use wharf_host::body::full;
use wharf_host::{handler, HostBuilder, Mount};

/// The name of the thread a call ran on, over one new connection.
async fn thread_of_one_call(addr: std::net::SocketAddr) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /thread HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut answer))
        .await
        .unwrap()
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    answer.split("\r\n\r\n").nth(1).unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_run_on_every_core_and_stop_with_the_host() {
    let limits = LimitsConfig {
        max_concurrent_calls: 64,
        max_queued_calls: 64,
        queue_timeout: Duration::from_secs(5),
    };
    let server = ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        admin_listen: "127.0.0.1:0".parse().unwrap(),
        ..ServerConfig::default()
    };
    let host = HostBuilder::new(server)
        .mount(
            "thread",
            Mount::Exact("/thread".into()),
            &limits,
            handler(|_request| async {
                let name = std::thread::current()
                    .name()
                    .unwrap_or("unnamed")
                    .to_owned();
                Response::new(full(name))
            }),
        )
        .bind()
        .await
        .unwrap();
    let addr = host.local_addr();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(host.run(async move {
        let _ = stopped.await;
    }));

    let mut threads = BTreeSet::new();
    for _ in 0..40 {
        threads.insert(thread_of_one_call(addr).await);
    }
    // Two workers, two cores; the kernel spreads 40 connections over both listeners (all
    // on one would take odds of 2 in 2^40).
    assert_eq!(
        threads,
        BTreeSet::from(["wharf-core-0".to_owned(), "wharf-core-1".to_owned()])
    );

    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .unwrap()
        .unwrap();
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "the service address still takes connections after shutdown"
    );
}
