//! Shared helpers: a testbed, a closed port, and finding a class or metric in a report.

use std::time::Duration;

use wharf_bench::report::{ClassReport, MetricReport, TargetReport};
use wharf_bench::{Bench, Report, Scenario, Target};
use wharf_testbed::TestbedHandle;

/// A testbed on an ephemeral port.
pub(crate) async fn testbed() -> TestbedHandle {
    wharf_testbed::spawn("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

/// A port nothing listens on (bound, then released).
pub(crate) fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A one-round bench with a short per-call timeout.
pub(crate) fn bench(scenario: Scenario, targets: Vec<Target>) -> Bench {
    let mut bench = Bench::new(scenario, targets);
    bench.timeout = Duration::from_secs(5);
    bench
}

/// Runs `bench`, bounded so a hang fails the test instead of stalling it.
pub(crate) async fn run(bench: &Bench) -> Report {
    tokio::time::timeout(Duration::from_secs(30), wharf_bench::run(bench))
        .await
        .expect("the run finishes within 30s")
        .unwrap()
}

/// The class `name` of `target`.
pub(crate) fn class<'a>(target: &'a TargetReport, name: &str) -> &'a ClassReport {
    target
        .classes
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no class {name} in {}", target.name))
}

/// The metric `name` of `target`.
pub(crate) fn metric<'a>(target: &'a TargetReport, name: &str) -> &'a MetricReport {
    target
        .metrics
        .iter()
        .find(|m| m.name == name)
        .unwrap_or_else(|| panic!("no metric {name} in {}", target.name))
}
