//! Each scenario against the testbed: counts add up, nothing fails.

use std::time::Duration;

use wharf_bench::{
    BenchError, BurstConfig, FirstCallConfig, IdleConfig, ResponsivenessConfig, Scenario, Target,
    ThroughputConfig,
};
use wharf_test_support::{canned_server, AfterAnswer};

use crate::support::{bench, class, metric, run, testbed};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responsiveness_against_the_testbed_has_no_slow_responses() {
    let tb = testbed().await;
    // Fast calls have 1.4 s to finish before the first slow one: ample on a loaded machine.
    let target = Target::new("testbed", tb.url("/slow?ms=1500")).with_fast_url(tb.url("/fast"));
    let config = ResponsivenessConfig {
        slow_calls: 5,
        fast_calls: 5,
        delay: Duration::from_millis(100),
    };
    let report = run(&bench(Scenario::Responsiveness(config), vec![target])).await;
    let t = &report.targets[0];
    let (slow, fast) = (class(t, "slow"), class(t, "fast"));
    assert_eq!((slow.ok, slow.errors.total), (5, 0));
    assert_eq!((fast.ok, fast.errors.total), (5, 0));
    assert_eq!(metric(t, "slow_responses").value, Some(0.0));
    // The slow calls took their 500 ms; the fast ones far less.
    assert!(
        slow.latency_ms.p50.unwrap() >= 500.0,
        "{:?}",
        slow.latency_ms
    );
    assert!(
        fast.latency_ms.max.unwrap() < 400.0,
        "{:?}",
        fast.latency_ms
    );
    // Timed to the kernel's stamp of each response's arrival, no later than its read.
    let fast_p99_read = metric(t, "fast_p99_read_ms").value.unwrap();
    assert!(
        fast.latency_ms.p99.unwrap() <= fast_p99_read,
        "{:?} vs {fast_p99_read}",
        fast.latency_ms
    );
    assert_eq!(tb.hits("/slow"), 5);
    assert_eq!(tb.hits("/fast"), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responsiveness_counts_fast_calls_that_finish_after_a_slow_one() {
    // The "fast" URL is slower than the slow one: every fast call finishes after the first
    // slow call, as behind a server that queues fast calls behind slow ones.
    let tb = testbed().await;
    let target = Target::new("queued", tb.url("/slow?ms=50")).with_fast_url(tb.url("/slow?ms=500"));
    let config = ResponsivenessConfig {
        slow_calls: 3,
        fast_calls: 4,
        delay: Duration::from_millis(10),
    };
    let report = run(&bench(Scenario::Responsiveness(config), vec![target])).await;
    assert_eq!(
        metric(&report.targets[0], "slow_responses").value,
        Some(4.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throughput_for_one_second_serves_requests_without_errors() {
    let tb = testbed().await;
    let config = ThroughputConfig {
        concurrency: 8,
        duration: Duration::from_secs(1),
        warmup: Duration::from_millis(200),
    };
    let report = run(&bench(
        Scenario::Throughput(config),
        vec![Target::new("testbed", tb.url("/fast"))],
    ))
    .await;
    let t = &report.targets[0];
    let requests = class(t, "requests");
    assert!(requests.ok > 0);
    assert_eq!(requests.errors.total, 0, "{:?}", requests.errors);
    let rps = metric(t, "requests_per_s").value.unwrap();
    assert!(
        (rps - requests.ok as f64).abs() < 1.0,
        "{rps} vs {}",
        requests.ok
    );
    assert_eq!(metric(t, "errors").value, Some(0.0));
    // Warm-up calls and calls cut at the end reached the testbed too.
    assert!(tb.hits("/fast") >= requests.ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burst_of_50_is_served_whole() {
    let tb = testbed().await;
    let report = run(&bench(
        Scenario::Burst(BurstConfig { connections: 50 }),
        vec![Target::new("testbed", tb.url("/fast"))],
    ))
    .await;
    let t = &report.targets[0];
    assert_eq!(class(t, "calls").ok, 50);
    assert_eq!(class(t, "calls").errors.total, 0);
    assert_eq!(metric(t, "served").value, Some(50.0));
    assert_eq!(metric(t, "all_served").value, Some(1.0));
    let makespan = metric(t, "makespan_ms").value.unwrap();
    assert!(makespan > 0.0);
    // Counted from the signal, the last call ends at the makespan; the last start is before.
    let from_signal = metric(t, "p99_from_signal_ms").value.unwrap();
    assert!(
        from_signal > 0.0 && from_signal <= makespan,
        "{from_signal} vs {makespan}"
    );
    assert!(metric(t, "last_start_ms").value.unwrap() < makespan);
    // Timed to the kernel's stamp of each response's arrival, which is no later than the
    // client's read of it.
    let p99 = class(t, "calls").latency_ms.p99.unwrap();
    let p99_read = metric(t, "p99_read_ms").value.unwrap();
    assert!(p99 > 0.0 && p99 <= p99_read, "{p99} vs {p99_read}");
    // The run held the kernel's stamping on, so no note says calls were timed to reads.
    assert!(
        !report
            .notes
            .iter()
            .any(|note| note.contains("timed to when")),
        "{:?}",
        report.notes
    );
    assert_eq!(tb.hits("/fast"), 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_templates_number_the_calls() {
    let tb = testbed().await;
    let report = run(&bench(
        Scenario::Burst(BurstConfig { connections: 5 }),
        vec![Target::new("testbed", tb.url("/bytes/{n}"))],
    ))
    .await;
    assert_eq!(class(&report.targets[0], "calls").ok, 5);
    for n in 0..5 {
        assert_eq!(tb.hits(&format!("/bytes/{n}")), 1, "/bytes/{n}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_call_compares_with_warm_calls() {
    let tb = testbed().await;
    let config = FirstCallConfig {
        warm_calls: 20,
        warm_new_connections: 4,
        ..FirstCallConfig::default()
    };
    let report = run(&bench(
        Scenario::FirstCall(config),
        vec![Target::new("testbed", tb.url("/fast"))],
    ))
    .await;
    let t = &report.targets[0];
    assert_eq!(class(t, "first").ok, 1);
    assert_eq!(class(t, "warm").ok, 20);
    assert_eq!(class(t, "warm new connection").ok, 4);
    // One round: each ratio is that round's own figures divided, so a ratio built from the
    // wrong terms (the first call without its connect, the keep-alive warm median) fails.
    let value = |name: &str| metric(t, name).value.unwrap();
    let (connect, first) = (value("connect_ms"), value("first_request_ms"));
    let (warm, warm_new) = (value("warm_p50_ms"), value("warm_new_p50_ms"));
    assert!(connect > 0.0 && first > 0.0 && warm > 0.0 && warm_new > 0.0);
    assert_close(value("first_over_warm"), first / warm);
    assert_close(
        value("first_with_connect_over_warm_new"),
        (connect + first) / warm_new,
    );
    assert_eq!(tb.hits("/fast"), 25);
}

/// Equal up to floating-point rounding.
fn assert_close(actual: f64, expected: f64) {
    assert!(
        (actual - expected).abs() <= 1e-9 * expected.abs(),
        "{actual} != {expected}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throughput_reports_the_server_cpu_per_call() {
    // The testbed runs in this process: its CPU time is this process's.
    let tb = testbed().await;
    let config = ThroughputConfig {
        concurrency: 4,
        duration: Duration::from_millis(400),
        warmup: Duration::from_millis(100),
    };
    let target = Target::new("testbed", tb.url("/fast")).with_server_pids(vec![std::process::id()]);
    let report = run(&bench(Scenario::Throughput(config.clone()), vec![target])).await;
    let t = &report.targets[0];
    let calls = class(t, "requests").ok;
    assert!(calls > 0);
    let per_call = metric(t, "server_cpu_us_per_call").value.unwrap();
    let cores = metric(t, "server_cores").value.unwrap();
    assert!(
        per_call > 0.0 && cores > 0.0,
        "{per_call} us per call, {cores} cores"
    );
    // As much CPU as the window's calls took, within what the window can hold.
    let cpu_s = per_call * calls as f64 / 1e6;
    assert!(
        cpu_s <= 0.4 * 1.5 * std::thread::available_parallelism().map_or(1, usize::from) as f64,
        "{cpu_s}"
    );

    // Without server processes the metrics are not there; a process that does not exist
    // is refused before anything runs.
    let plain = run(&bench(
        Scenario::Throughput(config.clone()),
        vec![Target::new("testbed", tb.url("/fast"))],
    ))
    .await;
    assert!(plain.targets[0]
        .metrics
        .iter()
        .all(|m| m.name != "server_cpu_us_per_call"));
    let gone = Target::new("gone", tb.url("/fast")).with_server_pids(vec![1 << 30]);
    let result = wharf_bench::run(&bench(Scenario::Throughput(config), vec![gone])).await;
    assert!(
        matches!(&result, Err(BenchError::Target { what, .. }) if what.contains("no process")),
        "{result:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_call_after_prime_calls_goes_on_a_new_connection() {
    let config = FirstCallConfig {
        warm_calls: 5,
        prime_calls: 2,
        warm_new_connections: 3,
        ..FirstCallConfig::default()
    };
    // A keep-alive server answering every request with a short 200, counting connections.
    let server = canned_server(
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
        AfterAnswer::KeepAlive,
    )
    .await;
    let url = server.url("/");
    let report = run(&bench(
        Scenario::FirstCall(config),
        vec![Target::new("counted", url)],
    ))
    .await;
    let t = &report.targets[0];
    assert_eq!(class(t, "prime").ok, 2);
    assert_eq!(class(t, "first").ok, 1);
    assert_eq!(class(t, "warm").ok, 5);
    assert_eq!(class(t, "warm new connection").ok, 3);
    assert!(metric(t, "prime_ms").value.unwrap() > 0.0);
    assert!(metric(t, "connect_ms").value.is_some());
    // The prime calls' connection, the first call's (kept for the warm calls), then one per
    // warm new-connection call.
    assert_eq!(server.connections(), 2 + 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_times_the_call_after_each_gap() {
    let tb = testbed().await;
    let config = IdleConfig {
        gaps: vec![Duration::from_millis(100), Duration::from_millis(200)],
        warm_calls: 5,
        warm_new_connections: 2,
        keep_alive: true,
    };
    let report = run(&bench(
        Scenario::Idle(config),
        vec![Target::new("testbed", tb.url("/fast"))],
    ))
    .await;
    let t = &report.targets[0];
    // The warm calls twice: before the first gap and after the last.
    assert_eq!(class(t, "warm keep-alive").ok, 2 * 5);
    assert_eq!(class(t, "warm new connection").ok, 2 * 2);
    assert_eq!(class(t, "after gap, keep-alive").ok, 2);
    assert_eq!(class(t, "after gap, new connection").ok, 2);
    for name in [
        "warm_keepalive_ms",
        "warm_new_conn_ms",
        "keepalive_after_100ms_ms",
        "keepalive_after_100ms_ratio",
        "new_conn_after_200ms_ms",
        "new_conn_after_200ms_ratio",
    ] {
        assert!(metric(t, name).value.unwrap() > 0.0, "{name}");
    }
    assert!(t.classes.iter().all(|c| c.errors.total == 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_without_keep_alive_times_only_new_connections() {
    let tb = testbed().await;
    let config = IdleConfig {
        gaps: vec![Duration::from_millis(100)],
        warm_calls: 3,
        warm_new_connections: 2,
        keep_alive: false,
    };
    let report = run(&bench(
        Scenario::Idle(config),
        vec![Target::new("testbed", tb.url("/fast"))],
    ))
    .await;
    let t = &report.targets[0];
    assert_eq!(class(t, "after gap, keep-alive").ok, 0);
    assert_eq!(class(t, "after gap, new connection").ok, 1);
    assert!(metric(t, "new_conn_after_100ms_ratio").value.unwrap() > 0.0);
    assert!(
        t.metrics.iter().all(|m| !m.name.starts_with("keepalive_")),
        "no keep-alive figures: {:?}",
        t.metrics.iter().map(|m| &m.name).collect::<Vec<_>>()
    );
    // Both warm phases and the one call after the gap: no keep-alive probe.
    assert_eq!(tb.hits("/fast"), 2 * (3 + 2) + 1);
}
