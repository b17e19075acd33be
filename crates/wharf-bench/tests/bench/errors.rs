//! Failures are counted as errors and never as fast responses.

use std::time::Duration;

use wharf_bench::{BurstConfig, ResponsivenessConfig, Scenario, Target, ThroughputConfig};
use wharf_test_support::{canned_server, AfterAnswer};

use crate::support::{bench, class, closed_port, metric, run, testbed};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_port_reports_errors_not_fast_responses() {
    let tb = testbed().await;
    let port = closed_port();
    let target = Target::new("dead-fast", tb.url("/slow?ms=200"))
        .with_fast_url(format!("http://127.0.0.1:{port}/fast"));
    let config = ResponsivenessConfig {
        slow_calls: 3,
        fast_calls: 5,
        delay: Duration::from_millis(20),
    };
    let report = run(&bench(Scenario::Responsiveness(config), vec![target])).await;
    let t = &report.targets[0];
    let fast = class(t, "fast");
    assert_eq!(fast.ok, 0);
    assert_eq!((fast.errors.total, fast.errors.connect), (5, 5));
    assert_eq!(fast.latency_ms.p50, None, "errors are no latencies");
    assert_eq!(fast.total.ok, 0);
    assert!(fast.percentiles.is_empty());
    assert!(fast.errors.first.as_deref().unwrap().contains("connect"));
    assert_eq!(class(t, "slow").ok, 3);
    assert_eq!(metric(t, "slow_responses").value, Some(0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_target_fails_every_call_of_every_scenario() {
    let url = format!("http://127.0.0.1:{}/fast", closed_port());
    let report = run(&bench(
        Scenario::Burst(BurstConfig { connections: 10 }),
        vec![Target::new("dead", &url)],
    ))
    .await;
    let t = &report.targets[0];
    assert_eq!(class(t, "calls").ok, 0);
    assert_eq!(class(t, "calls").errors.connect, 10);
    assert_eq!(metric(t, "served").value, Some(0.0));
    assert_eq!(metric(t, "all_served").value, Some(0.0));

    let config = ThroughputConfig {
        concurrency: 2,
        duration: Duration::from_millis(300),
        warmup: Duration::ZERO,
    };
    let report = run(&bench(
        Scenario::Throughput(config),
        vec![Target::new("dead", &url)],
    ))
    .await;
    let t = &report.targets[0];
    assert_eq!(metric(t, "requests_per_s").value, Some(0.0));
    assert!(metric(t, "errors").value.unwrap() > 0.0);
    assert_eq!(class(t, "requests").ok, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_2xx_and_timeouts_are_errors() {
    let tb = testbed().await;
    let config = ThroughputConfig {
        concurrency: 2,
        duration: Duration::from_millis(300),
        warmup: Duration::ZERO,
    };
    let report = run(&bench(
        Scenario::Throughput(config),
        vec![Target::new("broken", tb.url("/status/503"))],
    ))
    .await;
    let requests = class(&report.targets[0], "requests");
    assert_eq!(requests.ok, 0);
    assert!(requests.errors.status > 0);
    assert_eq!(requests.errors.status, requests.errors.total);

    let mut slow = bench(
        Scenario::Burst(BurstConfig { connections: 3 }),
        vec![Target::new("slow", tb.url("/slow?ms=2000"))],
    );
    slow.timeout = Duration::from_millis(200);
    let report = run(&slow).await;
    let calls = class(&report.targets[0], "calls");
    assert_eq!((calls.ok, calls.errors.timeout), (0, 3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_body_is_an_error_not_a_response() {
    // Declares 100 bytes, sends 10, closes.
    let server = canned_server(
        b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789",
        AfterAnswer::Close,
    )
    .await;
    let url = server.url("/");
    let report = run(&bench(
        Scenario::Burst(BurstConfig { connections: 5 }),
        vec![Target::new("truncating", &url)],
    ))
    .await;
    let calls = class(&report.targets[0], "calls");
    assert_eq!(calls.ok, 0);
    assert_eq!((calls.errors.total, calls.errors.other), (5, 5));
    assert_eq!(calls.latency_ms.p50, None, "errors are no latencies");
    let first = calls.errors.first.as_deref().unwrap();
    assert!(
        first.contains("closed after 10 of 100 body bytes"),
        "{first}"
    );

    // The same on keep-alive connections: each failed call reconnects, none succeeds.
    let config = ThroughputConfig {
        concurrency: 2,
        duration: Duration::from_millis(300),
        warmup: Duration::ZERO,
    };
    let report = run(&bench(
        Scenario::Throughput(config),
        vec![Target::new("truncating", &url)],
    ))
    .await;
    let t = &report.targets[0];
    let requests = class(t, "requests");
    assert_eq!(requests.ok, 0);
    assert!(requests.errors.other > 0, "{:?}", requests.errors);
    assert_eq!(requests.errors.other, requests.errors.total);
    assert_eq!(metric(t, "requests_per_s").value, Some(0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_testbed_truncate_endpoint_is_an_error() {
    let tb = testbed().await;
    for path in ["/truncate?bytes=10", "/truncate?bytes=10&chunked=1"] {
        let report = run(&bench(
            Scenario::Burst(BurstConfig { connections: 3 }),
            vec![Target::new("truncate", tb.url(path))],
        ))
        .await;
        let calls = class(&report.targets[0], "calls");
        assert_eq!((calls.ok, calls.errors.other), (0, 3), "{path}: {calls:?}");
    }
}
