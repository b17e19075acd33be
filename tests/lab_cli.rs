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
