//! The load lab behind `wharf bench` (SPEC §7): the seeds' experiments against any HTTP
//! target, several targets compared side by side.
//!
//! A run is a [`Bench`]: one [`Scenario`] with its settings, one or more [`Target`]s and a
//! number of rounds. [`run`] resolves every target first, then runs the rounds interleaved,
//! every other round in reverse order (round 1: A, B, C; round 2: C, B, A; round 3: A, B, C;
//! …) so that slow drifts of the machine hit every target alike, and no target always runs
//! right after the same one, and returns a [`Report`]: medians over rounds, ratios to the
//! first target, the client's own CPU load, notes. [`report::table`], [`report::json`] and
//! [`report::html`] render it.
//!
//! - [`client`]: the lean HTTP/1.1 client of its own (`httparse` for heads), calls run in
//!   the caller's task, one connection per call or keep-alive;
//! - [`stats`]: HDR histograms, latency figures, error counts, medians;
//! - [`scenarios`]: `responsiveness`, `first-call`, `idle`, `burst`, `cold-start`,
//!   `throughput`, a file each;
//! - [`rusage`]: the client's CPU load, the open-files limit;
//! - [`limits`]: the range of every count a run takes (calls, connections, rounds).
//!
//! Calls that fail (connect errors, timeouts, non-2xx statuses, broken responses) are
//! counted as errors and never recorded as latencies, so they can never pass for fast
//! responses. The figures are only comparable as ratios between targets measured in one
//! interleaved run on one machine; the reports say so.
//!
//! ```no_run
//! # async fn demo() -> Result<(), wharf_bench::BenchError> {
//! use wharf_bench::{Bench, Scenario, Target, ThroughputConfig};
//! let bench = Bench::new(
//!     Scenario::Throughput(ThroughputConfig::default()),
//!     vec![Target::new("testbed", "http://127.0.0.1:9000/fast")],
//! );
//! let report = wharf_bench::run(&bench).await?;
//! print!("{}", wharf_bench::report::table::render(&report));
//! # Ok(())
//! # }
//! ```

// The load generator is a client of whatever target it is given, not a gateway's way to
// its upstreams: the connect and resolve rules of clippy.toml are not for it.
#![allow(clippy::disallowed_methods)]

pub mod client;
mod error;
pub mod limits;
mod progress;
pub mod report;
pub mod rusage;
pub mod scenarios;
pub mod server_cpu;
pub mod stats;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use client::{CallError, CALL_NUMBER};
pub use error::BenchError;
pub use report::Report;
pub use rusage::{raise_nofile_limit, ClientLoad};
pub use scenarios::burst::BurstConfig;
pub use scenarios::cold_start::ColdStartConfig;
pub use scenarios::first_call::FirstCallConfig;
pub use scenarios::idle::IdleConfig;
pub use scenarios::responsiveness::ResponsivenessConfig;
pub use scenarios::throughput::ThroughputConfig;
pub use scenarios::Scenario;
pub use stats::{ErrorCounts, Latency};

use crate::client::{stamping_on, Endpoint, StampingOn};
use crate::progress::Progress;
use crate::report::TargetRounds;
use crate::rusage::{CoreTicks, CpuClock, LoadMeter};
use crate::scenarios::{Ctx, Prepared};

/// Default bound on one call, connect to last body byte.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// One thing to measure: a named URL (template), with what some scenarios need besides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Its name in the reports.
    pub name: String,
    /// The scenario's main URL (the slow one in `responsiveness`); `{n}` is replaced by the
    /// call's number.
    pub url: String,
    /// The fast URL of `responsiveness`.
    pub fast_url: Option<String>,
    /// The command `cold-start` (or `first-call`) starts: program, then arguments.
    pub command: Option<Vec<String>>,
    /// The processes that serve it, whose CPU time `throughput` reports per call (none:
    /// not reported).
    pub server_pids: Vec<u32>,
}

impl Target {
    /// A target with one URL.
    pub fn new(name: impl Into<String>, url: impl Into<String>) -> Target {
        Target {
            name: name.into(),
            url: url.into(),
            fast_url: None,
            command: None,
            server_pids: Vec::new(),
        }
    }

    /// The same target with the fast URL of `responsiveness`.
    pub fn with_fast_url(mut self, url: impl Into<String>) -> Target {
        self.fast_url = Some(url.into());
        self
    }

    /// The same target with a command to start (program, then arguments).
    pub fn with_command(mut self, words: Vec<String>) -> Target {
        self.command = Some(words);
        self
    }

    /// The same target with the processes that serve it (see [`Target::server_pids`]).
    pub fn with_server_pids(mut self, pids: Vec<u32>) -> Target {
        self.server_pids = pids;
        self
    }

    /// Parses `NAME=URL` or, for `responsiveness`, `NAME=SLOW_URL,FAST_URL` (the second URL
    /// starts at the first `,http://`). A third URL is refused; a second one is refused by
    /// the scenarios that take one URL per target when the run starts ([`run`]).
    ///
    /// ```
    /// let t = wharf_bench::Target::parse("wharf=http://h:1/slow,http://h:1/fast").unwrap();
    /// assert_eq!(t.name, "wharf");
    /// assert_eq!(t.fast_url.as_deref(), Some("http://h:1/fast"));
    /// ```
    pub fn parse(spec: &str) -> Result<Target, BenchError> {
        let (name, urls) = spec
            .split_once('=')
            .ok_or_else(|| BenchError::Settings(format!("target {spec:?}: expected NAME=URL")))?;
        let name = name.trim();
        if name.is_empty() || urls.is_empty() {
            return Err(BenchError::Settings(format!(
                "target {spec:?}: expected NAME=URL"
            )));
        }
        let Some(i) = second_url(urls) else {
            return Ok(Target::new(name, urls));
        };
        let (slow, fast) = (&urls[..i], &urls[i + 1..]);
        // A third URL would otherwise be read as part of the fast URL's path.
        if second_url(fast).is_some() {
            return Err(BenchError::Settings(format!(
                "target {spec:?}: more than two URLs, expected NAME=URL or \
                 NAME=SLOW_URL,FAST_URL (responsiveness)"
            )));
        }
        Ok(Target::new(name, slow).with_fast_url(fast))
    }
}

/// Where the second URL of a `--target` list starts: its separating comma, if any.
fn second_url(urls: &str) -> Option<usize> {
    [",http://", ",https://"]
        .iter()
        .filter_map(|sep| urls.find(sep))
        .min()
}

/// Splits a command line into words as a POSIX shell would (quotes, backslashes), without
/// running a shell.
///
/// ```
/// let words = wharf_bench::split_command("wharf serve --config 'my dir/a.toml'").unwrap();
/// assert_eq!(words, ["wharf", "serve", "--config", "my dir/a.toml"]);
/// ```
pub fn split_command(line: &str) -> Result<Vec<String>, BenchError> {
    match shlex::split(line) {
        Some(words) if !words.is_empty() => Ok(words),
        _ => Err(BenchError::Settings(format!(
            "command {line:?}: empty or unbalanced quotes"
        ))),
    }
}

/// `words` as one shell-quoted line, for the reports (the inverse of [`split_command`]).
pub fn join_command(words: &[String]) -> String {
    shlex::try_join(words.iter().map(String::as_str)).unwrap_or_else(|_| words.join(" "))
}

/// The order in which round `round` (from 1) measures `targets` targets: as given in odd
/// rounds, reversed in even ones, so that a drift within a round, or the wake of the
/// previous target's load, does not always fall on the same target.
fn round_order(round: u32, targets: usize) -> Vec<usize> {
    if round % 2 == 1 {
        (0..targets).collect()
    } else {
        (0..targets).rev().collect()
    }
}

/// A benchmark run: scenario, targets, rounds.
#[derive(Debug, Clone)]
pub struct Bench {
    /// The experiment and its settings.
    pub scenario: Scenario,
    /// What to measure; ratios are to the first.
    pub targets: Vec<Target>,
    /// Interleaved rounds (each measures every target once); 1 to [`limits::ROUNDS`]'s
    /// maximum (1000).
    pub rounds: u32,
    /// Bound on each call, connect to last body byte (default [`DEFAULT_TIMEOUT`]).
    pub timeout: Duration,
    /// Draw a progress bar on stderr (only ever drawn when stderr is a terminal).
    pub progress: bool,
}

impl Bench {
    /// One round, the default timeout, no progress bar.
    pub fn new(scenario: Scenario, targets: Vec<Target>) -> Bench {
        Bench {
            scenario,
            targets,
            rounds: 1,
            timeout: DEFAULT_TIMEOUT,
            progress: false,
        }
    }
}

/// Runs `bench`: checks and resolves the targets, raises the open-files limit, runs the
/// rounds interleaved and builds the report.
///
/// Failed calls do not make this fail: they are counted in the report. It fails when the run
/// cannot be done (bad settings or URLs, a command that does not start, a cold-start URL that
/// already answers).
pub async fn run(bench: &Bench) -> Result<Report, BenchError> {
    check(bench)?;
    let mut notes = Vec::new();
    let limit = raise_nofile_limit();
    let needed = bench.scenario.connections();
    if let Some(limit) = limit.filter(|&l| l < needed + 64) {
        notes.push(format!(
            "the open-files limit is {limit}, below the {needed} connections this run may \
             hold: calls beyond it fail as connect errors (raise `ulimit -n`)"
        ));
    }
    let _stamping = if bench.scenario.stamps_arrivals() {
        hold_stamping_on(&mut notes).await
    } else {
        None
    };
    let mut prepared = Vec::with_capacity(bench.targets.len());
    for target in &bench.targets {
        let fast = match &target.fast_url {
            Some(url) => Some(Arc::new(Endpoint::resolve(&target.name, url).await?)),
            None => None,
        };
        prepared.push(Prepared {
            name: target.name.clone(),
            main: Arc::new(Endpoint::resolve(&target.name, &target.url).await?),
            fast,
            command: target.command.clone(),
            server_pids: target.server_pids.clone(),
        });
    }
    let units = bench.scenario.units() * u64::from(bench.rounds) * prepared.len() as u64;
    let ctx = Ctx {
        timeout: bench.timeout,
        progress: if bench.progress {
            Progress::new(units, true)
        } else {
            Progress::hidden()
        },
    };
    let started_unix_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let (whole, whole_cores) = (CpuClock::now(), CoreTicks::now());
    let mut collected: Vec<TargetRounds> = prepared
        .iter()
        .zip(&bench.targets)
        .map(|(p, t)| TargetRounds {
            name: p.name.clone(),
            urls: std::iter::once(p.main.url().to_owned())
                .chain(p.fast.as_ref().map(|f| f.url().to_owned()))
                .collect(),
            command: t.command.as_deref().map(join_command),
            rounds: Vec::new(),
        })
        .collect();
    for round in 1..=bench.rounds {
        for index in round_order(round, prepared.len()) {
            let (target, out) = (&prepared[index], &mut collected[index]);
            ctx.progress.message(format!(
                "{} round {round}/{} · {}",
                bench.scenario.name(),
                bench.rounds,
                target.name
            ));
            let meter = LoadMeter::start();
            let result = bench.scenario.round(target, &ctx).await;
            let load = meter.finish();
            match result {
                Ok(measured) => out.rounds.push((measured, load)),
                Err(error) => {
                    ctx.progress.finish();
                    return Err(error);
                }
            }
        }
    }
    ctx.progress.finish();
    let mut client = whole.load().with_cores(whole_cores);
    client.peak_busy = collected
        .iter()
        .flat_map(|t| t.rounds.iter().map(|(_, load)| load.peak_busy))
        .fold(client.busy, f64::max);
    notes.extend(client_notes(&client, &collected));
    // The per-call bound last: scripts may read the scenario's own settings by position.
    let mut settings = bench.scenario.settings();
    settings.push(scenarios::setting(
        "timeout",
        scenarios::human(bench.timeout),
    ));
    let report = Report {
        scenario: bench.scenario.name().to_owned(),
        settings,
        rounds: bench.rounds,
        started_unix_ms,
        client,
        targets: Vec::new(),
        notes: Vec::new(),
    };
    Ok(report::build(report, collected, notes))
}

/// Has the kernel stamp received segments for the run's length, so that its first calls'
/// arrivals are stamped too (`client/stamped.rs`). Where it does not, the calls are timed to
/// their reads, later than their arrivals, and a note says so.
async fn hold_stamping_on(notes: &mut Vec<String>) -> Option<StampingOn> {
    let why = match tokio::task::spawn_blocking(|| stamping_on(Duration::from_secs(2))).await {
        Ok(Ok(Some(stamping))) => return Some(stamping),
        Ok(Ok(None)) => "the kernel did not stamp received segments within 2 s".to_owned(),
        Ok(Err(e)) => format!("receive timestamps could not be switched on ({e})"),
        Err(e) => format!("switching receive timestamps on failed ({e})"),
    };
    notes.push(format!(
        "{why}: calls are timed to when the client read their responses, not to their arrival"
    ));
    None
}

fn check(bench: &Bench) -> Result<(), BenchError> {
    if bench.targets.is_empty() {
        return Err(BenchError::Settings("no target to measure".into()));
    }
    if bench.rounds == 0 {
        return Err(BenchError::Settings("rounds must be at least 1".into()));
    }
    // Cold-start's runs are its rounds (`--runs`).
    let rounds_flag = match bench.scenario {
        Scenario::ColdStart(_) => "--runs",
        _ => "--rounds",
    };
    limits::ROUNDS.check(rounds_flag, bench.rounds)?;
    // A zero bound does not fail every call: a call whose socket happens to be ready at the
    // first poll still passes, so the results would depend on luck.
    if bench.timeout.is_zero() {
        return Err(BenchError::Settings(
            "the per-call timeout must be above zero (e.g. --timeout 60s)".into(),
        ));
    }
    for (i, target) in bench.targets.iter().enumerate() {
        if bench.targets[..i].iter().any(|t| t.name == target.name) {
            return Err(BenchError::Settings(format!(
                "two targets are named {:?}",
                target.name
            )));
        }
        bench.scenario.check(target)?;
        if let Some(pid) = target
            .server_pids
            .iter()
            .find(|&&pid| !server_cpu::exists(pid))
        {
            return Err(BenchError::Target {
                target: target.name.clone(),
                what: format!("no process {pid} to read the server's CPU time from"),
            });
        }
    }
    Ok(())
}

/// What the reader must know about the client's own load, and how to read the figures.
fn client_notes(client: &ClientLoad, targets: &[TargetRounds]) -> Vec<String> {
    let mut notes = vec![format!(
        "client (this process) CPU: {}; client and targets share this machine's {} cores, \
         so compare targets by their ratios within one interleaved run, not by absolute figures",
        client.describe(),
        client.machine_cores.max(client.cores)
    )];
    for target in targets {
        let busiest = target.rounds.iter().map(|(_, load)| *load).reduce(|a, b| {
            if b.peak_busy > a.peak_busy {
                b
            } else {
                a
            }
        });
        if let Some(load) = target.client_load().filter(ClientLoad::pinned_cores_full) {
            notes.push(format!(
                "WARNING: the client's {} of {} cores were full while measuring {} ({}): \
                 what shares them with the client (an upstream pinned beside it, other load) \
                 took the rest, so the figures may measure those cores, not the target",
                load.cores,
                load.machine_cores,
                target.name,
                load.describe()
            ));
        }
        if let Some(load) = busiest {
            if load.saturated() {
                notes.push(format!(
                    "WARNING: the client was near saturation while measuring {} ({}): the \
                     figures may measure the client, not the target",
                    target.name,
                    load.describe()
                ));
            } else if load.peak_busy >= rusage::SATURATED {
                notes.push(format!(
                    "the client was briefly near saturation while measuring {} ({}): bursts \
                     may have been slowed by the client itself",
                    target.name,
                    load.describe()
                ));
            }
        }
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_other_round_measures_the_targets_in_reverse() {
        assert_eq!(round_order(1, 3), [0, 1, 2]);
        assert_eq!(round_order(2, 3), [2, 1, 0]);
        assert_eq!(round_order(3, 3), [0, 1, 2]);
        assert_eq!(round_order(4, 1), [0]);
    }

    #[test]
    fn target_specs() {
        let t = Target::parse("a=http://h/x?u=1,2").unwrap();
        assert_eq!((t.name.as_str(), t.url.as_str()), ("a", "http://h/x?u=1,2"));
        assert_eq!(t.fast_url, None);
        assert!(Target::parse("http://h/x").is_err());
        assert!(Target::parse("=http://h/x").is_err());
        assert!(split_command("a 'b").is_err());
        let words = split_command("nginx -g 'daemon off;'").unwrap();
        assert_eq!(words[2], "daemon off;");
        assert_eq!(split_command(&join_command(&words)).unwrap(), words);
        assert!(split_command("  ").is_err());
        // A third URL is refused, not read into the fast URL's path.
        let error = Target::parse("a=http://h/s,http://h/f,https://h/x").unwrap_err();
        assert!(error.to_string().contains("more than two URLs"), "{error}");
        let t = Target::parse("a=http://h/s,https://h/f").unwrap();
        assert_eq!(t.fast_url.as_deref(), Some("https://h/f"));
    }

    #[tokio::test]
    async fn a_second_url_is_refused_where_it_would_be_ignored() {
        let two = Target::parse("a=http://127.0.0.1:1/fast,http://127.0.0.1:1/bytes/5").unwrap();
        for scenario in [
            Scenario::Burst(BurstConfig::default()),
            Scenario::Throughput(ThroughputConfig::default()),
            Scenario::Idle(IdleConfig::default()),
            Scenario::FirstCall(FirstCallConfig::default()),
            Scenario::ColdStart(ColdStartConfig::default()),
        ] {
            let name = scenario.name();
            let mut target = two.clone();
            target.command = Some(vec!["true".into()]);
            let error = run(&Bench::new(scenario, vec![target])).await.unwrap_err();
            let text = error.to_string();
            assert!(
                matches!(error, BenchError::Target { .. })
                    && text.starts_with(&format!("target a: {name} takes one URL per target"))
                    && text.contains("/bytes/5"),
                "{name}: {text}"
            );
        }
    }

    #[tokio::test]
    async fn a_zero_timeout_is_refused() {
        let mut bench = Bench::new(
            Scenario::Burst(BurstConfig { connections: 1 }),
            vec![Target::new("a", "http://127.0.0.1:1/")],
        );
        bench.timeout = Duration::ZERO;
        let error = run(&bench).await.unwrap_err();
        assert!(
            matches!(&error, BenchError::Settings(why) if why.contains("timeout must be above zero")),
            "{error}"
        );
    }

    #[tokio::test]
    async fn counts_above_their_maximum_are_refused_naming_the_flag() {
        // Port 99999 fails a run that passes the checks at once, before any call.
        let bench = |scenario: Scenario, rounds| {
            let mut target = Target::new("a", "http://127.0.0.1:99999/");
            match scenario {
                Scenario::Responsiveness(_) => target.fast_url = Some(target.url.clone()),
                Scenario::ColdStart(_) => target.command = Some(vec!["true".into()]),
                _ => {}
            }
            let mut bench = Bench::new(scenario, vec![target]);
            bench.rounds = rounds;
            bench
        };
        let responsiveness = |slow_calls, fast_calls| {
            Scenario::Responsiveness(ResponsivenessConfig {
                slow_calls,
                fast_calls,
                ..ResponsivenessConfig::default()
            })
        };
        let first_call = |warm_calls, prime_calls, warm_new_connections| {
            Scenario::FirstCall(FirstCallConfig {
                warm_calls,
                prime_calls,
                warm_new_connections,
                ..FirstCallConfig::default()
            })
        };
        let idle = |warm_calls, warm_new_connections| {
            Scenario::Idle(IdleConfig {
                warm_calls,
                warm_new_connections,
                ..IdleConfig::default()
            })
        };
        let burst = |connections| Scenario::Burst(BurstConfig { connections });
        let throughput = |concurrency| {
            Scenario::Throughput(ThroughputConfig {
                concurrency,
                ..ThroughputConfig::default()
            })
        };
        let cold_start = Scenario::ColdStart(ColdStartConfig::default());
        // (scenario, rounds, what the refusal says)
        let refused = [
            (
                burst(100_001),
                1,
                "--connections 100001 is too many: at most 100000",
            ),
            (
                burst(u32::MAX),
                1,
                "--connections 4294967295 is too many: at most 100000",
            ),
            (
                responsiveness(100_001, 1),
                1,
                "--slow-calls 100001 is too many: at most 100000",
            ),
            (
                responsiveness(1, 100_001),
                1,
                "--fast-calls 100001 is too many: at most 100000",
            ),
            (
                throughput(10_001),
                1,
                "--concurrency 10001 is too many: at most 10000",
            ),
            (
                first_call(1_000_001, 0, 1),
                1,
                "--warm-calls 1000001 is too many: at most 1000000",
            ),
            (
                first_call(1, 1_000_001, 1),
                1,
                "--prime-calls 1000001 is too many: at most 1000000",
            ),
            (
                first_call(1, 0, 10_001),
                1,
                "warm_new_connections 10001 is too many: at most 10000",
            ),
            (
                idle(1_000_001, 1),
                1,
                "--warm-calls 1000001 is too many: at most 1000000",
            ),
            (
                idle(1, 10_001),
                1,
                "warm_new_connections 10001 is too many: at most 10000",
            ),
            (burst(1), 1001, "--rounds 1001 is too many: at most 1000"),
            (
                cold_start.clone(),
                1001,
                "--runs 1001 is too many: at most 1000",
            ),
        ];
        for (scenario, rounds, says) in refused {
            let error = run(&bench(scenario, rounds)).await.unwrap_err();
            assert!(
                matches!(&error, BenchError::Settings(why) if why.starts_with(says)),
                "{says}: {error}"
            );
        }
        // Each maximum itself passes the checks (the run then fails at the port).
        let accepted = [
            (burst(100_000), 1000),
            (responsiveness(100_000, 100_000), 1),
            (throughput(10_000), 1),
            (first_call(1_000_000, 1_000_000, 10_000), 1),
            (idle(1_000_000, 10_000), 1),
            (cold_start, 1000),
        ];
        for (scenario, rounds) in accepted {
            let name = scenario.name();
            let error = run(&bench(scenario, rounds)).await.unwrap_err();
            assert!(matches!(error, BenchError::Url { .. }), "{name}: {error}");
        }
    }

    #[tokio::test]
    async fn refuses_unusable_runs() {
        let mut bench = Bench::new(Scenario::Burst(BurstConfig::default()), vec![]);
        assert!(matches!(run(&bench).await, Err(BenchError::Settings(_))));
        bench.targets = vec![Target::new("a", "http://127.0.0.1:1/"); 2];
        assert!(matches!(run(&bench).await, Err(BenchError::Settings(_))));
        bench.scenario = Scenario::Responsiveness(ResponsivenessConfig::default());
        bench.targets.truncate(1);
        assert!(matches!(run(&bench).await, Err(BenchError::Target { .. })));
        bench.scenario = Scenario::ColdStart(ColdStartConfig::default());
        assert!(matches!(run(&bench).await, Err(BenchError::Target { .. })));
        bench.scenario = Scenario::FirstCall(FirstCallConfig {
            warm_new_connections: 0,
            ..FirstCallConfig::default()
        });
        assert!(matches!(
            run(&bench).await,
            Err(BenchError::Settings(why)) if why.contains("new-connection")
        ));
    }
}
