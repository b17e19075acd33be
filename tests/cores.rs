//! The data plane's cores (`crates/wharf-host/src/cores.rs`), seen from outside: TCP
//! sessions run on the core threads (not on the multi-threaded runtime's workers), new
//! connections are spread over every core, and after shutdown the service address takes
//! no more connections.

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::net::TcpStream;
use wharf_config::{Config, LimitsConfig};
use wharf_host::body::full;
use wharf_host::{handler, Mount};

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_run_on_every_core_and_stop_with_the_host() {
    let config = Config::from_toml_str(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n",
        "test.toml",
    )
    .unwrap();
    let limits = LimitsConfig {
        max_concurrent_calls: 64,
        max_queued_calls: 64,
        queue_timeout: Duration::from_secs(5),
    };
    // A service that answers with the name of the thread it ran on.
    let builder = wharf::build_host(&config).unwrap().mount(
        "thread",
        Mount::Exact("/thread".into()),
        &limits,
        handler(|_request| async {
            let name = std::thread::current()
                .name()
                .unwrap_or("unnamed")
                .to_owned();
            http::Response::new(full(name))
        }),
    );
    let wharf = spawn_host(builder).await;
    let request = b"GET /thread HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n";

    let mut threads = BTreeSet::new();
    for _ in 0..40 {
        let answer = raw_exchange(wharf.addr, request, Duration::from_secs(5)).await;
        let answer = String::from_utf8_lossy(&answer).into_owned();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        threads.insert(answer.split("\r\n\r\n").nth(1).unwrap_or("").to_owned());
    }
    // Two workers, two cores; the kernel spreads 40 connections over both listeners (all
    // on one would take odds of 2 in 2^40).
    assert_eq!(
        threads,
        BTreeSet::from(["wharf-core-0".to_owned(), "wharf-core-1".to_owned()])
    );

    let addr = wharf.addr;
    tokio::time::timeout(Duration::from_secs(10), wharf.stop())
        .await
        .unwrap();
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "the service address still takes connections after shutdown"
    );
}
