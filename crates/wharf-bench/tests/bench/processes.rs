//! `cold-start` and `first-call --cmd`: the command is a shell that waits [`STARTUP`], then
//! execs a small HTTP server (python3's http.server, present on these machines).

use std::time::Duration;

use wharf_bench::{BenchError, ColdStartConfig, FirstCallConfig, Scenario, Target};

use crate::support::{bench, class, closed_port, metric, run, testbed};

/// The child's simulated start-up time.
const STARTUP: Duration = Duration::from_millis(150);

/// A command that starts a small HTTP server on `port` after [`STARTUP`]:
/// Python's http.server (HTTP/1.1, so warm calls keep their connection), exec'd so that
/// SIGTERM reaches the server itself.
fn child_command(port: u16) -> Vec<String> {
    vec![
        "sh".into(),
        "-c".into(),
        format!(
            "sleep {}; exec python3 -m http.server {port} --bind 127.0.0.1 --protocol HTTP/1.1",
            STARTUP.as_secs_f64()
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_start_times_exec_to_first_good_response() {
    let port = closed_port();
    let target =
        Target::new("child", format!("http://127.0.0.1:{port}/")).with_command(child_command(port));
    let mut b = bench(
        Scenario::ColdStart(ColdStartConfig::default()),
        vec![target],
    );
    b.rounds = 2;
    let report = run(&b).await;
    let t = &report.targets[0];
    let first_ok = class(t, "first_ok");
    assert_eq!((first_ok.total.ok, first_ok.total.errors.total), (2, 0));
    let start = metric(t, "exec_to_first_ok_ms");
    assert!(
        start.min.unwrap() >= STARTUP.as_millis() as f64,
        "{start:?}"
    );
    assert!(start.max.unwrap() < 10_000.0, "{start:?}");
    assert!(metric(t, "exec_to_listen_ms").value.unwrap() <= start.value.unwrap());
    assert!(metric(t, "attempts").value.unwrap() >= 2.0);
    assert_eq!(metric(t, "killed").value, Some(0.0), "SIGTERM was enough");
    // One start per round: one time in the table, not six equal figures.
    let text = wharf_bench::report::table::render(&report);
    assert!(text.contains("\nfirst_ok ms "), "{text}");
    assert!(!text.contains("first_ok p95"), "{text}");
    // Stopped: the port is free again.
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_call_can_start_the_command() {
    let port = closed_port();
    let target =
        Target::new("child", format!("http://127.0.0.1:{port}/")).with_command(child_command(port));
    let config = FirstCallConfig {
        warm_calls: 10,
        ..FirstCallConfig::default()
    };
    let report = run(&bench(Scenario::FirstCall(config), vec![target])).await;
    let t = &report.targets[0];
    assert_eq!(class(t, "first").ok, 1);
    assert_eq!(class(t, "warm").ok, 10);
    assert!(metric(t, "exec_to_connect_ms").value.unwrap() >= STARTUP.as_millis() as f64);
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_start_refuses_a_url_that_already_answers() {
    let tb = testbed().await;
    let target = Target::new("busy", tb.url("/fast")).with_command(vec!["true".into()]);
    let result = wharf_bench::run(&bench(
        Scenario::ColdStart(ColdStartConfig::default()),
        vec![target],
    ))
    .await;
    assert!(
        matches!(result, Err(BenchError::AlreadyListening { .. })),
        "{result:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_start_of_a_command_that_exits_is_an_error_in_the_report() {
    let port = closed_port();
    let target =
        Target::new("quits", format!("http://127.0.0.1:{port}/")).with_command(vec!["true".into()]);
    let report = run(&bench(
        Scenario::ColdStart(ColdStartConfig::default()),
        vec![target],
    ))
    .await;
    let t = &report.targets[0];
    assert_eq!(class(t, "first_ok").ok, 0);
    assert_eq!(class(t, "first_ok").errors.total, 1);
    assert_eq!(metric(t, "exec_to_first_ok_ms").value, None);
    assert!(
        report.notes.iter().any(|n| n.contains("exited")),
        "{:?}",
        report.notes
    );
}
