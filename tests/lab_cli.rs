//! `wharf testbed` and `wharf bench` as a user runs them: the built binary, one timing the
//! other, and the testbed stopped by a signal.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::send_signal;

/// A `wharf testbed` process on an ephemeral port, killed if a test ends without stopping it.
struct TestbedProcess {
    child: Child,
    url: String,
}

impl TestbedProcess {
    fn start() -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_wharf"))
            .args(["testbed", "--listen", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // The line scripts read to learn the port.
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .trim()
            .strip_prefix("testbed listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_owned();
        Self { child, url }
    }

    /// Sends SIGTERM and waits up to `within` for the process to exit; its exit status.
    fn terminate(&mut self, within: Duration) -> std::process::ExitStatus {
        send_signal(self.child.id(), "TERM");
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "still running {within:?} after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for TestbedProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The entry named `name` in the `list` ("classes", "metrics") of a `--json` report's one target.
fn named<'r>(report: &'r serde_json::Value, list: &str, name: &str) -> &'r serde_json::Value {
    let entries = report["targets"][0][list].as_array().unwrap();
    entries
        .iter()
        .find(|entry| entry["name"] == name)
        .unwrap_or_else(|| panic!("no {list} entry {name:?} in {entries:?}"))
}

/// The `ok` and error counts of `class` over all rounds in a `--json` report's one target.
fn counts(report: &serde_json::Value, class: &str) -> (u64, u64) {
    let total = &named(report, "classes", class)["total"];
    (
        total["ok"].as_u64().unwrap(),
        total["errors"]["total"].as_u64().unwrap(),
    )
}

/// The per-round values of `metric` in a `--json` report's one target.
fn per_round(report: &serde_json::Value, metric: &str) -> Vec<f64> {
    named(report, "metrics", metric)["per_round"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect()
}

#[test]
fn bench_idle_times_every_call_of_a_testbed_process_and_the_testbed_stops_on_sigterm() {
    let mut testbed = TestbedProcess::start();
    let output = Command::new(env!("CARGO_BIN_EXE_wharf"))
        .args(["bench", "idle", "--gaps", "200ms", "--warm-calls", "4"])
        .args(["--rounds", "2", "--json", "--quiet", "--target"])
        .arg(format!("testbed={}/fast", testbed.url))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "bench failed: {stderr}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["scenario"], "idle");
    assert_eq!(report["rounds"], 2);
    // Durations as they would be given back on the command line: the default 60 s per-call
    // timeout is `60s`, not `1m`.
    let settings: Vec<String> = report["settings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            format!(
                "{}={}",
                s["name"].as_str().unwrap(),
                s["value"].as_str().unwrap()
            )
        })
        .collect();
    assert!(settings.contains(&"gaps=200ms".to_owned()), "{settings:?}");
    assert!(settings.contains(&"timeout=60s".to_owned()), "{settings:?}");
    // Per round: the warm calls and 5 warm new connections (the default) before the gap and
    // again after it, one call after the gap on the kept connection and one on a new
    // connection.
    assert_eq!(counts(&report, "warm keep-alive"), (16, 0));
    assert_eq!(counts(&report, "warm new connection"), (20, 0));
    assert_eq!(counts(&report, "after gap, keep-alive"), (2, 0));
    assert_eq!(counts(&report, "after gap, new connection"), (2, 0));
    // Each round's ratios divide its timed calls by that round's warm baseline of their kind.
    for (timed, warm) in [
        ("keepalive_after_200ms", "warm_keepalive_ms"),
        ("new_conn_after_200ms", "warm_new_conn_ms"),
    ] {
        let ms = per_round(&report, &format!("{timed}_ms"));
        let ratios = per_round(&report, &format!("{timed}_ratio"));
        let warm = per_round(&report, warm);
        assert_eq!((ms.len(), ratios.len(), warm.len()), (2, 2, 2));
        for round in 0..2 {
            assert!(warm[round] > 0.0, "{timed}: warm baseline {warm:?}");
            let expected = ms[round] / warm[round];
            assert!(
                (ratios[round] - expected).abs() <= 1e-9 * expected,
                "{timed} round {round}: ratio {} against {} ms / {} ms",
                ratios[round],
                ms[round],
                warm[round]
            );
        }
    }

    let status = testbed.terminate(Duration::from_secs(10));
    assert!(status.success(), "testbed exited with {status}");
}

#[test]
fn bench_refuses_bad_input_before_any_call() {
    // None of these may start measuring: no report on stdout, a non-zero exit and an error
    // naming the bad value. Port 1 on 127.0.0.1 stands for a target (it is never called).
    let no_dir = std::env::temp_dir()
        .join(format!("wharf-lab-cli-no-such-dir-{}", std::process::id()))
        .join("r.html");
    let no_dir = no_dir.to_str().unwrap();
    for (args, says) in [
        (
            vec!["--target", "a=http://127.0.0.1:99999/fast"],
            "port 99999 is out of range",
        ),
        (
            vec![
                "--target",
                "a=http://127.0.0.1:1/fast,http://127.0.0.1:1/bytes/5",
            ],
            "burst takes one URL per target",
        ),
        (
            vec!["--timeout", "0s", "--target", "a=http://127.0.0.1:1/fast"],
            "timeout must be above zero",
        ),
        (
            vec!["--report", no_dir, "--target", "a=http://127.0.0.1:1/fast"],
            no_dir,
        ),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_wharf"))
            .args(["bench", "burst", "--connections", "1", "--quiet"])
            .args(&args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?} was accepted: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(output.stdout.is_empty(), "{args:?} measured before failing");
    }
}

#[test]
fn bench_refuses_counts_out_of_range_and_zero_gaps_naming_the_flag() {
    // Every count flag of every scenario has a maximum; a negative count, a zero gap and a
    // gap given twice are refused too. Each message names the flag, the value and the
    // bound. The targets' port 99999 makes a run that got past these checks fail at once
    // (instead of measuring), with a message that says nothing of them.
    let one = ["--target", "a=http://127.0.0.1:99999/fast"];
    let two = [
        "--target",
        "a=http://127.0.0.1:99999/slow,http://127.0.0.1:99999/fast",
    ];
    let cases: [(&[&str], &[&str], &[&str]); 16] = [
        (
            &["burst", "--connections", "100001"],
            &one,
            &["--connections", "100001", "at most 100000"],
        ),
        (
            &["burst", "--connections", "10000000000"],
            &one,
            &["--connections", "10000000000", "at most 100000"],
        ),
        (
            &["burst", "--connections", "-5"],
            &one,
            &["--connections", "'-5'", "whole number from 1 to 100000"],
        ),
        (
            &["responsiveness", "--slow-calls", "100001"],
            &two,
            &["--slow-calls", "100001", "at most 100000"],
        ),
        (
            &["responsiveness", "--fast-calls", "-1"],
            &two,
            &["--fast-calls", "'-1'", "whole number from 1 to 100000"],
        ),
        (
            &["throughput", "--concurrency", "10001"],
            &one,
            &["--concurrency", "10001", "at most 10000"],
        ),
        (
            &["first-call", "--warm-calls", "1000001"],
            &one,
            &["--warm-calls", "1000001", "at most 1000000"],
        ),
        (
            &["first-call", "--prime-calls", "-2"],
            &one,
            &["--prime-calls", "'-2'", "whole number from 0 to 1000000"],
        ),
        (
            &["first-call", "--prime-calls", "1000001"],
            &one,
            &["--prime-calls", "1000001", "at most 1000000"],
        ),
        (
            &["idle", "--warm-calls", "1000001"],
            &one,
            &["--warm-calls", "1000001", "at most 1000000"],
        ),
        (
            &["cold-start", "--cmd", "true", "--runs", "1001"],
            &one,
            &["--runs", "1001", "at most 1000"],
        ),
        (
            &["burst", "--connections", "1", "--rounds", "1001"],
            &one,
            &["--rounds", "1001", "at most 1000"],
        ),
        (
            &["burst", "--connections", "1", "--rounds", "-3"],
            &one,
            &["--rounds", "'-3'", "whole number from 1 to 1000"],
        ),
        (
            &["idle", "--gaps", "0s"],
            &one,
            &["gap of 0s", "above zero"],
        ),
        (
            &["idle", "--gaps", "20s,0ms"],
            &one,
            &["gap of 0s", "above zero"],
        ),
        (&["idle", "--gaps", "2s,2000ms"], &one, &["gap 2s", "twice"]),
    ];
    for (scenario, target, says) in cases {
        let output = Command::new(env!("CARGO_BIN_EXE_wharf"))
            .arg("bench")
            .args(scenario)
            .arg("--quiet")
            .args(target)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !output.status.success(),
            "{scenario:?} was accepted: {stderr}"
        );
        for said in says {
            assert!(
                stderr.contains(said),
                "{scenario:?}: no {said:?} in {stderr}"
            );
        }
        assert!(
            output.stdout.is_empty(),
            "{scenario:?} measured before failing"
        );
    }
    // The largest counts pass these checks (and fail at the bad port, before any call).
    for scenario in [
        &["burst", "--connections", "100000", "--rounds", "1000"][..],
        &["throughput", "--concurrency", "10000"],
        &[
            "first-call",
            "--warm-calls",
            "1000000",
            "--prime-calls",
            "1000000",
        ],
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_wharf"))
            .arg("bench")
            .args(scenario)
            .arg("--quiet")
            .args(one)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("port 99999 is out of range"),
            "{scenario:?}: {stderr}"
        );
    }
}
