//! Several targets interleaved; the table, JSON and HTML renderings.

use std::time::Duration;

use wharf_bench::report::{html, json, table};
use wharf_bench::{FirstCallConfig, ResponsivenessConfig, Scenario, Target};

use crate::support::{bench, run, testbed};

/// Two targets (the same testbed under two names, the second with a slower "slow" URL), two
/// rounds of a small responsiveness run.
async fn two_target_report() -> (wharf_bench::Report, wharf_testbed::TestbedHandle) {
    let tb = testbed().await;
    let config = ResponsivenessConfig {
        slow_calls: 3,
        fast_calls: 3,
        delay: Duration::from_millis(20),
    };
    let mut b = bench(
        Scenario::Responsiveness(config),
        vec![
            Target::new("a", tb.url("/slow?ms=100")).with_fast_url(tb.url("/fast")),
            Target::new("b", tb.url("/slow?ms=200")).with_fast_url(tb.url("/fast")),
        ],
    );
    b.rounds = 2;
    (run(&b).await, tb)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_output_parses_and_has_the_fields() {
    let (report, tb) = two_target_report().await;
    assert_eq!(tb.hits("/slow"), 12, "2 rounds × 2 targets × 3 calls");
    let doc: serde_json::Value = serde_json::from_str(&json::render(&report)).unwrap();
    assert_eq!(doc["scenario"], "responsiveness");
    assert_eq!(doc["rounds"], 2);
    assert!(doc["started_unix_ms"].as_u64().unwrap() > 0);
    assert!(doc["client"]["busy"].as_f64().is_some());
    assert!(doc["client"]["cores"].as_u64().unwrap() >= 1);
    assert_eq!(doc["settings"][0]["name"], "slow_calls");
    // The per-call bound is shown last, after the scenario's own settings.
    let settings = doc["settings"].as_array().unwrap();
    assert_eq!(settings.len(), 4, "{settings:?}");
    assert_eq!(settings[3]["name"], "timeout");
    assert_eq!(settings[3]["value"], "5s");
    let notes = doc["notes"].as_array().unwrap();
    assert!(notes.iter().any(|n| n.as_str().unwrap().contains("ratios")));
    let targets = doc["targets"].as_array().unwrap();
    assert_eq!(targets.len(), 2);
    assert_eq!(targets[0]["name"], "a");
    let slow_b = &targets[1]["classes"][0];
    assert_eq!(slow_b["name"], "slow");
    assert_eq!(slow_b["ok"], 3);
    assert_eq!(slow_b["errors"]["total"], 0);
    assert_eq!(slow_b["total"]["ok"], 6);
    assert_eq!(slow_b["per_round"].as_array().unwrap().len(), 2);
    assert!(slow_b["latency_ms"]["p95"].as_f64().unwrap() >= 200.0);
    // b's slow calls take about twice a's.
    let ratio = slow_b["ratio_to_first"]["p50"].as_f64().unwrap();
    assert!(ratio > 1.2 && ratio < 4.0, "{ratio}");
    assert!(targets[0]["classes"][0].get("ratio_to_first").is_none());
    assert!(slow_b["percentiles"].as_array().unwrap().len() >= 2);
    let metric = &targets[1]["metrics"][0];
    assert_eq!(metric["name"], "slow_responses");
    assert_eq!(metric["unit"], "count");
    assert_eq!(metric["value"], 0.0);
    assert_eq!(metric["per_round"].as_array().unwrap().len(), 2);
    assert!(targets[1]["timelines"].as_array().unwrap().len() == 2);
    assert!(targets[1]["client"]["wall_seconds"].as_f64().unwrap() > 0.0);
    // How busy the client's cores were is a share of their time, on a machine with at least
    // the client's cores.
    for client in [&doc["client"], &targets[1]["client"]] {
        let cores = client["cores_busy"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&cores), "{client}");
        assert!(client["machine_cores"].as_u64().unwrap() >= client["cores"].as_u64().unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_shows_every_target_with_ratios() {
    let (report, _tb) = two_target_report().await;
    let text = table::render(&report);
    assert!(text.starts_with("wharf bench responsiveness: 2 rounds interleaved over a, b"));
    assert!(
        text.contains("settings: slow_calls=3 fast_calls=3 delay=20ms timeout=5s\n"),
        "{text}"
    );
    let p50 = text.lines().find(|l| l.starts_with("slow p50 ms")).unwrap();
    assert!(p50.contains('×'), "{p50}");
    assert!(text.contains("slow_responses"));
    assert!(text.contains("client cpu"));
    assert!(text.contains("client cores busy"));
    assert!(text.contains("notes:"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_settings_give_durations_as_the_command_line_takes_them() {
    // A minute is `60s` (as `--timeout` and `--start-timeout` are written by default), not
    // `1m`; under a second, milliseconds.
    let tb = testbed().await;
    let config = FirstCallConfig {
        warm_calls: 2,
        warm_new_connections: 1,
        ..FirstCallConfig::default()
    };
    let mut b = bench(
        Scenario::FirstCall(config),
        vec![Target::new("t", tb.url("/fast"))],
    );
    b.timeout = Duration::from_secs(60);
    let text = table::render(&run(&b).await);
    assert!(
        text.contains(
            "settings: warm_calls=2 prime_calls=0 warm_new_connections=1 start_timeout=60s \
             poll_interval=5ms timeout=60s\n"
        ),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn html_report_is_one_file_with_svg_plots() {
    let (report, _tb) = two_target_report().await;
    let path = std::env::temp_dir().join(format!(
        "wharf-bench-test-{}-{}.html",
        std::process::id(),
        report.started_unix_ms
    ));
    html::write(&report, &path).unwrap();
    let page = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert!(page.starts_with("<!doctype html>"));
    assert!(page.contains("<svg"));
    // A percentile plot per class, and the timeline.
    assert_eq!(page.matches("<svg").count(), 3, "slow, fast, timeline");
    assert!(page.contains("latency by percentile"));
    assert!(!page.contains("<script"), "no scripts");
    assert!(!page.contains("src=\"http"), "no external resources");
    assert!(page.trim_end().ends_with("</html>"));
}
