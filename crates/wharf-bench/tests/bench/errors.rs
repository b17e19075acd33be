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
    // No fast call served: no count of fast calls held up, rather than a perfect 0.
    assert_eq!(metric(t, "slow_responses").value, None);
    assert!(
        t.notes.iter().any(|n| n.contains("no fast call succeeded")),
        "{:?}",
        t.notes
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_slow_responses_without_fast_or_slow_calls_served() {
    let tb = testbed().await;
    let config = ResponsivenessConfig {
        slow_calls: 2,
        fast_calls: 3,
        delay: Duration::from_millis(20),
    };
    for (slow, fast, note) in [
        // Every fast call answered 500: errors, and no slow_responses.
        ("/slow?ms=200", "/status/500", "no fast call succeeded"),
        // Every slow call failed: no fast call can have waited behind one.
        ("/status/500", "/fast", "no slow call succeeded"),
    ] {
        let target = Target::new("t", tb.url(slow)).with_fast_url(tb.url(fast));
        let report = run(&bench(
            Scenario::Responsiveness(config.clone()),
            vec![target],
        ))
        .await;
        let t = &report.targets[0];
        let m = metric(t, "slow_responses");
        assert_eq!(
            (m.value, &m.per_round[..]),
            (None, &[None][..]),
            "{slow} {fast}"
        );
        assert!(t.notes.iter().any(|n| n.contains(note)), "{:?}", t.notes);
    }
    // Both served: the count is there (0 against the testbed).
    let target = Target::new("t", tb.url("/slow?ms=200")).with_fast_url(tb.url("/fast"));
    let report = run(&bench(Scenario::Responsiveness(config), vec![target])).await;
    assert_eq!(
        metric(&report.targets[0], "slow_responses").value,
        Some(0.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_with_no_call_served_has_no_makespan() {
    let tb = testbed().await;
    let closed = format!("http://127.0.0.1:{}/fast", closed_port());
    // Refused connects and 304s end at once; neither may pass for a burst served fast.
    for url in [closed, tb.url("/status/304")] {
        let report = run(&bench(
            Scenario::Burst(BurstConfig { connections: 4 }),
            vec![Target::new("failing", &url)],
        ))
        .await;
        let t = &report.targets[0];
        assert_eq!(class(t, "calls").errors.total, 4, "{url}");
        assert_eq!(metric(t, "makespan_ms").value, None, "{url}");
        assert_eq!(metric(t, "p99_from_signal_ms").value, None, "{url}");
        assert_eq!(metric(t, "p99_read_ms").value, None, "{url}");
        // When the client started its calls is its own fact, whatever their outcome.
        assert!(metric(t, "last_start_ms").value.is_some(), "{url}");
        assert!(
            t.notes.iter().any(|n| n.contains("no makespan_ms")),
            "{url}: {:?}",
            t.notes
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_makespan_ends_at_the_last_call_served() {
    let tb = testbed().await;
    // "mixed": call 0 asks for no delay and is served at once, call 1 for 1 s and times out
    // after 300 ms, later than the served call ends: the timeout must not stretch the
    // makespan. "timing-out": every call times out, so there is no makespan (nor ratio).
    let mut b = bench(
        Scenario::Burst(BurstConfig { connections: 2 }),
        vec![
            Target::new("mixed", tb.url("/slow?ms={n}000")),
            Target::new("timing-out", tb.url("/slow?ms=2000")),
        ],
    );
    b.timeout = Duration::from_millis(300);
    let report = run(&b).await;
    let mixed = &report.targets[0];
    let calls = class(mixed, "calls");
    assert_eq!((calls.ok, calls.errors.timeout), (1, 1));
    let makespan = metric(mixed, "makespan_ms").value.unwrap();
    assert!(makespan < 200.0, "{makespan}");
    let timed_out = &report.targets[1];
    assert_eq!(class(timed_out, "calls").errors.timeout, 2);
    let m = metric(timed_out, "makespan_ms");
    assert_eq!((m.value, m.ratio_to_first), (None, None));
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
