//! `wharf bench SCENARIO ...`: the load lab (SPEC §7) on the command line.
//!
//! This file only turns flags into a [`wharf_bench::Bench`], runs it and prints the result:
//! the table (or `--json`) on stdout, the progress bar on stderr, `--report FILE.html` to a
//! file. The scenarios, the client and the reports live in the `wharf-bench` crate.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use wharf_bench::limits;
use wharf_bench::{
    Bench, BurstConfig, ColdStartConfig, FirstCallConfig, IdleConfig, ResponsivenessConfig,
    Scenario, Target, ThroughputConfig,
};

/// How to read targets, templates and results (shown by `wharf bench --help`).
const BENCH_HELP: &str = "\
Targets: any http:// server (wharf, nginx, the testbed). Give one with the scenario's URL
flags (--url, or --slow/--fast), or several with --target NAME=URL, repeated; for
responsiveness --target NAME=SLOW_URL,FAST_URL. Several targets are measured interleaved,
every other round in reverse: round 1 runs A then B, round 2 B then A, round 3 A then B, ...
(--rounds); the report gives medians over rounds and each target's ratio to the first.

URL templates: the placeholder written '{' 'n' '}' (three characters, no quotes or spaces;
clap's help cannot print it literally) in a URL's path or query is replaced by the call's
number. Ending a proxied URL with %26i%3D and the placeholder makes every call's URL distinct
(no cache hits, no coalescing); bench/compare.sh does this for its slow calls.

Counts have a range, given in each flag's help (e.g. --connections 1 to 100000): a larger one
is refused, naming the flag, before anything runs. Durations read back in the settings line in
seconds or milliseconds (--timeout 1m shows as timeout=60s).

Errors: refused connections, timeouts (--timeout, per call), non-2xx statuses and broken
responses are counted as errors, never as fast responses; latencies are of successful calls.

The client shares this machine with the targets: the report gives its own CPU load and warns
when it nears saturation. Compare targets by ratios within one run, not absolute figures.

Examples (a testbed on 127.0.0.1:9000, wharf on 127.0.0.1:8080):
  wharf bench responsiveness --slow http://127.0.0.1:9000/slow?ms=6000 --fast http://127.0.0.1:9000/fast
  wharf bench throughput --target testbed=http://127.0.0.1:9000/fast --target nginx=http://127.0.0.1:8081/fast --rounds 3
  wharf bench cold-start --url http://127.0.0.1:8080/healthz --cmd 'wharf serve' --runs 10 --report cold.html";

/// Flags of `wharf bench`; the scenario is a subcommand.
#[derive(Debug, Args)]
#[command(after_long_help = BENCH_HELP)]
pub(crate) struct BenchArgs {
    /// The experiment to run.
    #[command(subcommand)]
    pub(crate) scenario: ScenarioArgs,
    /// A target NAME=URL (responsiveness: NAME=SLOW_URL,FAST_URL); repeat to compare.
    #[arg(long = "target", value_name = "NAME=URL", global = true)]
    pub(crate) targets: Vec<String>,
    /// Interleaved rounds (each measures every target once), 1 to 1000 [default: 1;
    /// cold-start: --runs].
    #[arg(long, value_parser = rounds, allow_negative_numbers = true, global = true)]
    pub(crate) rounds: Option<u32>,
    /// Print the results as JSON on stdout instead of the table.
    #[arg(long, global = true)]
    pub(crate) json: bool,
    /// Also write a self-contained HTML report with latency plots to this file.
    #[arg(long, value_name = "FILE.html", global = true)]
    pub(crate) report: Option<PathBuf>,
    /// No progress bar (it is drawn only when stderr is a terminal anyway).
    #[arg(long, short, global = true)]
    pub(crate) quiet: bool,
    /// Bound on each call, from connect to the last body byte.
    #[arg(long, value_parser = duration, default_value = "60s", global = true)]
    pub(crate) timeout: Duration,
}

/// The scenarios.
#[derive(Debug, Subcommand)]
pub(crate) enum ScenarioArgs {
    /// N slow calls in flight, then M fast calls: do slow calls slow fast ones down? (seed 002)
    ///
    /// Each call opens its own connection. Reports avg/p50/p95/p99/max and errors of each
    /// class, and slow_responses: fast calls that succeeded but finished after the first slow
    /// call had (0 is right; M means fast calls queued behind slow ones; none, with a note,
    /// when no slow or no fast call succeeded).
    Responsiveness {
        /// The slow URL (e.g. http://127.0.0.1:9000/slow?ms=6000).
        #[arg(long)]
        slow: Option<String>,
        /// The fast URL (e.g. http://127.0.0.1:9000/fast).
        #[arg(long)]
        fast: Option<String>,
        /// Calls to the slow URL, started together (1 to 100000).
        #[arg(long, default_value_t = 25, value_parser = at_once, allow_negative_numbers = true)]
        slow_calls: u32,
        /// Calls to the fast URL, started together after --delay (1 to 100000).
        #[arg(long, default_value_t = 25, value_parser = at_once, allow_negative_numbers = true)]
        fast_calls: u32,
        /// Pause between starting the slow calls and the fast ones.
        #[arg(long, value_parser = duration, default_value = "500ms")]
        delay: Duration,
    },
    /// The first call on a new connection, or to a just-started server (--cmd), vs warm
    /// calls on a keep-alive connection (seed 000).
    ///
    /// Reports connect_ms, first_request_ms, the warm median and first_over_warm (about 1 is
    /// right); then 5 calls on a new connection each give warm_new_p50_ms and
    /// first_with_connect_over_warm_new (the connect and the first request over it). With
    /// --cmd the command is started each round, the first request is the very first it
    /// serves (with --prime-calls: the first after those), and it is stopped (SIGTERM,
    /// SIGKILL after 5s) at the end of the round.
    FirstCall {
        /// The URL to call.
        #[arg(long)]
        url: Option<String>,
        /// Start this command first (shell words, no shell); one per --target, in order.
        #[arg(long)]
        cmd: Vec<String>,
        /// Keep-alive calls after the first one, for the warm median (1 to 1000000).
        #[arg(long, default_value_t = 50, value_parser = warm_calls, allow_negative_numbers = true)]
        warm_calls: u32,
        /// Calls made before the timed first one, on a connection of their own (closed
        /// after them); the first call then goes on a new connection. With 1 and a cached
        /// URL, the first call is the first hit after the fill (0 to 1000000).
        #[arg(long, default_value_t = 0, value_parser = prime_calls, allow_negative_numbers = true)]
        prime_calls: u32,
        /// With --cmd: how long the command may take until its port accepts.
        #[arg(long, value_parser = duration, default_value = "60s")]
        start_timeout: Duration,
        /// With --cmd: pause between connection attempts.
        #[arg(long, value_parser = duration, default_value = "5ms")]
        poll: Duration,
    },
    /// The first call after idle gaps vs warm calls, on the same keep-alive connection and on
    /// a new one (seed 001).
    ///
    /// Each gap is waited twice per round, once per kind of call (once with
    /// --new-connection-only), so a round lasts about twice the sum of the gaps. Reports each
    /// call's time and its ratio to the warm median (about 1 is right). The warm calls are
    /// made before the first gap and again after the last; the ratio divides by the faster
    /// phase's median, and a round whose two phases differ by more than 2x gets a note.
    Idle {
        /// The URL to call.
        #[arg(long)]
        url: Option<String>,
        /// The idle gaps, comma-separated: each above zero, each once.
        #[arg(long, value_parser = duration, value_delimiter = ',', default_value = "20s,120s")]
        gaps: Vec<Duration>,
        /// Divide every gap by 10 (20s,120s becomes 2s,12s).
        #[arg(long)]
        quick: bool,
        /// Warm calls on one keep-alive connection per warm phase (the keep-alive baseline;
        /// 1 to 1000000).
        #[arg(long, default_value_t = 20, value_parser = warm_calls, allow_negative_numbers = true)]
        warm_calls: u32,
        /// Time only the call on a new connection after each gap, so each gap is waited once
        /// per round: for gaps past the targets' keep-alive timeouts, where a kept connection
        /// can only be found closed.
        #[arg(long)]
        new_connection_only: bool,
    },
    /// K new connections opened at once, one call each: is a burst served at once? (seed 002)
    ///
    /// Reports served (and whether all were), errors, latency percentiles and makespan_ms
    /// (from the start to the last successful call's end; none when no call succeeded).
    /// Raises the open-files limit to its maximum.
    Burst {
        /// The URL to call.
        #[arg(long)]
        url: Option<String>,
        /// Connections opened at once (1 to 100000).
        #[arg(long, default_value_t = 2000, value_parser = at_once, allow_negative_numbers = true)]
        connections: u32,
    },
    /// Exec a command, time to its first 2xx response; stop it; repeat (seed 003).
    ///
    /// The URL is polled on a new connection each time until a 2xx arrives; refusals and
    /// non-2xx answers mean "not yet". Nothing may answer at the URL before the command starts.
    /// The command is stopped with SIGTERM (SIGKILL after 5s); it should be the server itself
    /// (or exec it). Reports exec_to_first_ok_ms, exec_to_listen_ms, stop_ms: median [min-max].
    ColdStart {
        /// The URL to poll.
        #[arg(long)]
        url: Option<String>,
        /// The command (shell words, no shell); one per --target, in order.
        #[arg(long)]
        cmd: Vec<String>,
        /// Starts per target (interleaved across targets; 1 to 1000).
        #[arg(long, default_value_t = 10, value_parser = rounds, allow_negative_numbers = true)]
        runs: u32,
        /// How long a start may take until its first 2xx.
        #[arg(long, value_parser = duration, default_value = "60s")]
        start_timeout: Duration,
        /// Pause between polls.
        #[arg(long, value_parser = duration, default_value = "5ms")]
        poll: Duration,
    },
    /// Closed loop at fixed concurrency on keep-alive connections: requests/s and latency.
    /// The connections are dealt out to one client thread per CPU this process may use, each
    /// keeping its own (as wrk's threads do).
    Throughput {
        /// The URL to call.
        #[arg(long)]
        url: Option<String>,
        /// Connections, each with one call in flight at a time (1 to 10000).
        #[arg(long, default_value_t = 64, value_parser = concurrency, allow_negative_numbers = true)]
        concurrency: u32,
        /// The measured window.
        #[arg(long, value_parser = duration, default_value = "10s")]
        duration: Duration,
        /// Load before the window, not recorded.
        #[arg(long, value_parser = duration, default_value = "2s")]
        warmup: Duration,
        /// The processes serving a target (e.g. nginx's master and workers): their CPU time
        /// over the window is reported per call (server_cpu_us_per_call) and as cores kept
        /// busy (server_cores). Repeat per target.
        #[arg(long = "server-pids", value_name = "NAME=PID[,PID...]")]
        server_pids: Vec<String>,
    },
}

/// Parses `500ms`, `20s`, `2m` (the config's duration syntax).
fn duration(text: &str) -> Result<Duration, String> {
    wharf_config::parse_duration(text).map_err(|e| format!("{text:?}: {e}"))
}

// The count flags' parsers: each reads a whole number within its `wharf_bench::limits`
// range (why each maximum, there). The flags allow negative numbers so that
// `--connections -5` reaches the parser ("must be a whole number from 1 to ...") rather than
// clap's "unexpected argument '-5'".

/// `--rounds`, `--runs`.
fn rounds(text: &str) -> Result<u32, String> {
    limits::ROUNDS.parse(text)
}

/// Calls started at once, a connection each: `--connections`, `--slow-calls`, `--fast-calls`.
fn at_once(text: &str) -> Result<u32, String> {
    limits::CONNECTIONS_AT_ONCE.parse(text)
}

/// `throughput --concurrency`.
fn concurrency(text: &str) -> Result<u32, String> {
    limits::CONCURRENCY.parse(text)
}

/// `--warm-calls` of `first-call` and `idle`.
fn warm_calls(text: &str) -> Result<u32, String> {
    limits::WARM_CALLS.parse(text)
}

/// `first-call --prime-calls`.
fn prime_calls(text: &str) -> Result<u32, String> {
    limits::PRIME_CALLS.parse(text)
}

/// The targets from `--target` and the scenario's own URL flags (not both).
fn targets(specs: &[String], own: Option<Target>) -> anyhow::Result<Vec<Target>> {
    match (own, specs.is_empty()) {
        (Some(_), false) => bail!("give the scenario's URL flags or --target, not both"),
        (Some(target), true) => Ok(vec![target]),
        (None, true) => bail!("no target: give the scenario's URL (--url) or --target NAME=URL"),
        (None, false) => specs
            .iter()
            .map(|spec| Target::parse(spec).map_err(anyhow::Error::from))
            .collect(),
    }
}

/// Gives the i-th `--cmd` to the i-th target.
fn with_commands(targets: Vec<Target>, cmds: &[String]) -> anyhow::Result<Vec<Target>> {
    if cmds.len() != targets.len() {
        bail!(
            "{} --cmd for {} target(s): give one command per target, in order",
            cmds.len(),
            targets.len()
        );
    }
    targets
        .into_iter()
        .zip(cmds)
        .map(|(target, cmd)| Ok(target.with_command(wharf_bench::split_command(cmd)?)))
        .collect()
}

/// Gives each `--server-pids NAME=PID[,PID...]` to the target of that name.
fn with_server_pids(mut targets: Vec<Target>, specs: &[String]) -> anyhow::Result<Vec<Target>> {
    for spec in specs {
        let Some((name, list)) = spec.split_once('=') else {
            bail!("--server-pids {spec:?}: expected NAME=PID[,PID...]");
        };
        let pids = list
            .split(',')
            .map(|pid| {
                pid.trim()
                    .parse::<u32>()
                    .with_context(|| format!("--server-pids {spec:?}: {pid:?} is not a process id"))
            })
            .collect::<anyhow::Result<Vec<u32>>>()?;
        let Some(target) = targets.iter_mut().find(|t| t.name == name.trim()) else {
            bail!("--server-pids {spec:?}: no target is named {name:?}");
        };
        if !target.server_pids.is_empty() {
            bail!("--server-pids: target {name:?} is given twice");
        }
        target.server_pids = pids;
    }
    Ok(targets)
}

/// The target named `target` for a single `--url`.
fn single(url: Option<String>) -> Option<Target> {
    url.map(|url| Target::new("target", url))
}

/// Builds the run the flags describe.
fn bench(args: &BenchArgs) -> anyhow::Result<Bench> {
    let specs = &args.targets;
    let mut rounds = args.rounds.unwrap_or(1);
    let (scenario, targets) = match &args.scenario {
        ScenarioArgs::Responsiveness {
            slow,
            fast,
            slow_calls,
            fast_calls,
            delay,
        } => {
            let own = match (slow, fast) {
                (Some(slow), Some(fast)) => {
                    Some(Target::new("target", slow.clone()).with_fast_url(fast.clone()))
                }
                (None, None) => None,
                _ => bail!("responsiveness needs both --slow and --fast"),
            };
            let config = ResponsivenessConfig {
                slow_calls: *slow_calls,
                fast_calls: *fast_calls,
                delay: *delay,
            };
            (Scenario::Responsiveness(config), targets(specs, own)?)
        }
        ScenarioArgs::FirstCall {
            url,
            cmd,
            warm_calls,
            prime_calls,
            start_timeout,
            poll,
        } => {
            let mut found = targets(specs, single(url.clone()))?;
            if !cmd.is_empty() {
                found = with_commands(found, cmd)?;
            }
            let config = FirstCallConfig {
                warm_calls: *warm_calls,
                prime_calls: *prime_calls,
                start_timeout: *start_timeout,
                poll_interval: *poll,
                ..FirstCallConfig::default()
            };
            (Scenario::FirstCall(config), found)
        }
        ScenarioArgs::Idle {
            url,
            gaps,
            quick,
            warm_calls,
            new_connection_only,
        } => {
            let mut config = IdleConfig {
                gaps: gaps.clone(),
                warm_calls: *warm_calls,
                keep_alive: !*new_connection_only,
                ..IdleConfig::default()
            };
            if *quick {
                config = config.quick();
            }
            (Scenario::Idle(config), targets(specs, single(url.clone()))?)
        }
        ScenarioArgs::Burst { url, connections } => {
            let config = BurstConfig {
                connections: *connections,
            };
            (
                Scenario::Burst(config),
                targets(specs, single(url.clone()))?,
            )
        }
        ScenarioArgs::ColdStart {
            url,
            cmd,
            runs,
            start_timeout,
            poll,
        } => {
            if args.rounds.is_some() {
                bail!("cold-start: use --runs (each run is one interleaved round)");
            }
            rounds = *runs;
            let found = with_commands(targets(specs, single(url.clone()))?, cmd)?;
            let config = ColdStartConfig {
                start_timeout: *start_timeout,
                poll_interval: *poll,
            };
            (Scenario::ColdStart(config), found)
        }
        ScenarioArgs::Throughput {
            url,
            concurrency,
            duration,
            warmup,
            server_pids,
        } => {
            let config = ThroughputConfig {
                concurrency: *concurrency,
                duration: *duration,
                warmup: *warmup,
            };
            let found = targets(specs, single(url.clone()))?;
            (
                Scenario::Throughput(config),
                with_server_pids(found, server_pids)?,
            )
        }
    };
    let mut bench = Bench::new(scenario, targets);
    bench.rounds = rounds;
    bench.timeout = args.timeout;
    bench.progress = !args.quiet;
    Ok(bench)
}

/// Runs the scenario the flags describe and prints its report.
pub(crate) async fn run(args: BenchArgs) -> anyhow::Result<()> {
    let bench = bench(&args)?;
    // A run can take minutes: a report path that cannot be written is found now, not after.
    if let Some(path) = &args.report {
        wharf_bench::report::html::check_writable(path).context(
            "bench --report (give a file in a directory that exists and can be written)",
        )?;
    }
    let report = wharf_bench::run(&bench)
        .await
        .with_context(|| format!("bench {}", bench.scenario.name()))?;
    let text = if args.json {
        let mut json = wharf_bench::report::json::render(&report);
        json.push('\n');
        json
    } else {
        wharf_bench::report::table::render(&report)
    };
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .context("bench: writing the results to stdout")?;
    if let Some(path) = &args.report {
        wharf_bench::report::html::write(&report, path)?;
        if !args.quiet {
            eprintln!("wharf bench: report written to {}", path.display());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two() -> Vec<Target> {
        vec![
            Target::new("a", "http://h:1/"),
            Target::new("b", "http://h:1/"),
        ]
    }

    #[test]
    fn the_help_gives_the_round_order_the_runner_uses() {
        // `round_order` in wharf-bench reverses every other round (bench/README.md).
        let help = BENCH_HELP.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            help.contains("round 1 runs A then B, round 2 B then A, round 3 A then B"),
            "{help}"
        );
    }

    #[test]
    fn every_count_flag_is_read_within_its_limit_and_its_help_says_so() {
        use clap::Args as _;
        let command = BenchArgs::augment_args(clap::Command::new("bench"));
        let flags = [
            (None, "rounds", limits::ROUNDS),
            (
                Some("responsiveness"),
                "slow_calls",
                limits::CONNECTIONS_AT_ONCE,
            ),
            (
                Some("responsiveness"),
                "fast_calls",
                limits::CONNECTIONS_AT_ONCE,
            ),
            (Some("first-call"), "warm_calls", limits::WARM_CALLS),
            (Some("first-call"), "prime_calls", limits::PRIME_CALLS),
            (Some("idle"), "warm_calls", limits::WARM_CALLS),
            (Some("burst"), "connections", limits::CONNECTIONS_AT_ONCE),
            (Some("cold-start"), "runs", limits::ROUNDS),
            (Some("throughput"), "concurrency", limits::CONCURRENCY),
        ];
        for (scenario, id, limit) in flags {
            let owner = scenario.map_or(&command, |name| {
                command.find_subcommand(name).expect("a scenario")
            });
            let arg = owner
                .get_arguments()
                .find(|a| a.get_id() == id)
                .unwrap_or_else(|| panic!("{scenario:?} has no {id}"));
            let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
            let range = format!("{} to {}", limit.min, limit.max);
            assert!(
                help.contains(&range),
                "{scenario:?} --{id}: {help:?} lacks {range}"
            );
            assert!(arg.is_allow_negative_numbers_set(), "{scenario:?} --{id}");
            // The flag's parser is the limit's: one past the maximum is refused, by name.
            let flag = format!("--{}", arg.get_long().expect("a long flag"));
            let too_many = (limit.max + 1).to_string();
            let words = ["bench", scenario.unwrap_or("burst"), &flag, &too_many];
            let error = command.clone().try_get_matches_from(words).unwrap_err();
            let text = error.to_string();
            assert!(
                text.contains(&flag) && text.contains(&format!("at most {}", limit.max)),
                "{words:?}: {text}"
            );
        }
    }

    #[test]
    fn server_pids_go_to_the_target_named() {
        let found = with_server_pids(two(), &["b=12,34".into()]).unwrap();
        assert!(found[0].server_pids.is_empty());
        assert_eq!(found[1].server_pids, vec![12, 34]);
    }

    #[test]
    fn bad_server_pids_are_refused_with_the_flag() {
        for (spec, says) in [
            ("c=1", "no target is named"),
            ("a=1,x", "\"x\" is not a process id"),
            ("a", "expected NAME=PID"),
        ] {
            let error = with_server_pids(two(), &[spec.into()]).unwrap_err();
            assert!(format!("{error:#}").contains(says), "{spec}: {error:#}");
        }
        let error = with_server_pids(two(), &["a=1".into(), "a=2".into()]).unwrap_err();
        assert!(error.to_string().contains("given twice"), "{error}");
    }
}
