//! The scenarios: [`Scenario`] (which one, with its settings) and what one round of any of
//! them yields (`Round`).
//!
//! A scenario runs one *round* against one target at a time; the runner interleaves rounds
//! across targets (A B A B …) and the report combines them. A round is generic: latency
//! classes (an HDR histogram and error counts each, e.g. `slow` and `fast`), scalar metrics
//! (e.g. `slow_responses`), completion timelines for the plots and notes. Each scenario's file
//! holds its settings type and its `round` function.

pub mod burst;
pub mod cold_start;
pub mod first_call;
pub mod idle;
pub mod responsiveness;
pub mod throughput;

pub(crate) mod process;

use std::ops::RangeInclusive;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::client::{fresh_call, stamped_fresh_call, CallError, Endpoint, Req};
use crate::progress::Progress;
use crate::report::{Better, Setting, Timeline, TimelinePoint, Unit};
use crate::stats::{ErrorCounts, LatencyHistogram};
use crate::BenchError;

/// Which experiment to run, with its settings.
#[derive(Debug, Clone)]
pub enum Scenario {
    /// N slow calls in flight, then M fast calls (seed 002).
    Responsiveness(responsiveness::ResponsivenessConfig),
    /// The first call on a new connection (or to a just-started server) vs warm calls (seed 000).
    FirstCall(first_call::FirstCallConfig),
    /// The first call after idle gaps vs warm calls (seed 001).
    Idle(idle::IdleConfig),
    /// K new connections at once, one call each (seed 002's burst).
    Burst(burst::BurstConfig),
    /// Exec a command, time to its first good response (seed 003).
    ColdStart(cold_start::ColdStartConfig),
    /// Closed loop at fixed concurrency on keep-alive connections.
    Throughput(throughput::ThroughputConfig),
}

impl Scenario {
    /// The scenario's name as on the command line (`first-call`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            Scenario::Responsiveness(_) => "responsiveness",
            Scenario::FirstCall(_) => "first-call",
            Scenario::Idle(_) => "idle",
            Scenario::Burst(_) => "burst",
            Scenario::ColdStart(_) => "cold-start",
            Scenario::Throughput(_) => "throughput",
        }
    }

    /// The settings, for the reports.
    pub(crate) fn settings(&self) -> Vec<Setting> {
        match self {
            Scenario::Responsiveness(c) => c.settings(),
            Scenario::FirstCall(c) => c.settings(),
            Scenario::Idle(c) => c.settings(),
            Scenario::Burst(c) => c.settings(),
            Scenario::ColdStart(c) => c.settings(),
            Scenario::Throughput(c) => c.settings(),
        }
    }

    /// Progress units of one round against one target.
    pub(crate) fn units(&self) -> u64 {
        match self {
            Scenario::Responsiveness(c) => c.units(),
            Scenario::FirstCall(c) => c.units(),
            Scenario::Idle(c) => c.units(),
            Scenario::Burst(c) => c.units(),
            Scenario::ColdStart(c) => c.units(),
            Scenario::Throughput(c) => c.units(),
        }
    }

    /// Simultaneous connections a round may hold open (to check the file limit).
    pub(crate) fn connections(&self) -> u64 {
        match self {
            Scenario::Responsiveness(c) => u64::from(c.slow_calls) + u64::from(c.fast_calls),
            Scenario::Burst(c) => u64::from(c.connections),
            Scenario::Throughput(c) => u64::from(c.concurrency),
            Scenario::FirstCall(_) | Scenario::Idle(_) | Scenario::ColdStart(_) => 2,
        }
    }

    /// Whether its calls are timed to their responses' kernel-stamped arrival
    /// ([`StampedCall`]).
    pub(crate) fn stamps_arrivals(&self) -> bool {
        matches!(self, Scenario::Responsiveness(_) | Scenario::Burst(_))
    }

    /// Refuses settings that cannot run; `target` is checked for what the scenario needs.
    pub(crate) fn check(&self, target: &crate::Target) -> Result<(), BenchError> {
        let refuse = |what: &str| {
            Err(BenchError::Target {
                target: target.name.clone(),
                what: what.to_owned(),
            })
        };
        // Only responsiveness calls a second URL: elsewhere one would be silently ignored.
        if let (Some(fast), false) = (
            &target.fast_url,
            matches!(self, Scenario::Responsiveness(_)),
        ) {
            return refuse(&format!(
                "{} takes one URL per target: {:?} and {:?} given (give each URL its own \
                 --target NAME=URL)",
                self.name(),
                target.url,
                fast
            ));
        }
        match self {
            Scenario::Responsiveness(c) => {
                if target.fast_url.is_none() {
                    return refuse("responsiveness needs a fast URL (NAME=SLOW_URL,FAST_URL)");
                }
                c.check()
            }
            Scenario::ColdStart(c) => {
                if target.command.as_ref().is_none_or(Vec::is_empty) {
                    return refuse("cold-start needs a command (--cmd)");
                }
                c.check()
            }
            Scenario::FirstCall(c) => c.check(),
            Scenario::Idle(c) => c.check(),
            Scenario::Burst(c) => c.check(),
            Scenario::Throughput(c) => c.check(),
        }
    }

    /// Runs one round against `target`.
    pub(crate) async fn round(&self, target: &Prepared, ctx: &Ctx) -> Result<Round, BenchError> {
        match self {
            Scenario::Responsiveness(c) => responsiveness::round(c, target, ctx).await,
            Scenario::FirstCall(c) => first_call::round(c, target, ctx).await,
            Scenario::Idle(c) => idle::round(c, target, ctx).await,
            Scenario::Burst(c) => burst::round(c, target, ctx).await,
            Scenario::ColdStart(c) => cold_start::round(c, target, ctx).await,
            Scenario::Throughput(c) => throughput::round(c, target, ctx).await,
        }
    }
}

/// A target with its URLs resolved.
#[derive(Debug)]
pub(crate) struct Prepared {
    /// The target's name.
    pub(crate) name: String,
    /// The main URL (the slow one in `responsiveness`).
    pub(crate) main: Arc<Endpoint>,
    /// The fast URL of `responsiveness`.
    pub(crate) fast: Option<Arc<Endpoint>>,
    /// The command of `cold-start` (and optionally `first-call`).
    pub(crate) command: Option<Vec<String>>,
    /// The processes serving the target (`throughput` reports their CPU time per call).
    pub(crate) server_pids: Vec<u32>,
}

/// What every round gets from the runner.
#[derive(Debug)]
pub(crate) struct Ctx {
    /// Bound on each call, connect to last body byte.
    pub(crate) timeout: Duration,
    /// The run's progress bar.
    pub(crate) progress: Progress,
}

/// What one round against one target measured.
#[derive(Debug, Default)]
pub(crate) struct Round {
    /// Latency classes, in display order.
    pub(crate) classes: Vec<ClassRound>,
    /// Scalar results, in display order.
    pub(crate) metrics: Vec<MetricRound>,
    /// Completions over time, for the plots.
    pub(crate) timelines: Vec<Timeline>,
    /// Things the reader must know about this round.
    pub(crate) notes: Vec<String>,
}

impl Round {
    /// Adds a metric.
    pub(crate) fn metric(&mut self, name: &str, value: Option<f64>, unit: Unit, better: Better) {
        self.metrics.push(MetricRound {
            name: name.to_owned(),
            value,
            unit,
            better,
        });
    }
}

/// One latency class of one round: successes in the histogram, failures counted.
#[derive(Debug, Default)]
pub(crate) struct ClassRound {
    pub(crate) name: String,
    pub(crate) latencies: LatencyHistogram,
    pub(crate) errors: ErrorCounts,
}

impl ClassRound {
    /// An empty class.
    pub(crate) fn new(name: &str) -> ClassRound {
        ClassRound {
            name: name.to_owned(),
            ..ClassRound::default()
        }
    }

    /// Records one call: its latency if it succeeded, its error otherwise.
    pub(crate) fn record(&mut self, latency: Duration, result: &Result<(), CallError>) {
        match result {
            Ok(()) => self.latencies.record(latency),
            Err(error) => self.errors.record(error),
        }
    }

    /// Calls `numbers` of `endpoint` one after another, each on a new connection with its
    /// connect timed in: the warm new-connection baseline of `first-call` and `idle`.
    pub(crate) async fn fresh_calls(
        name: &str,
        endpoint: &Endpoint,
        numbers: RangeInclusive<u64>,
        ctx: &Ctx,
    ) -> ClassRound {
        let mut class = ClassRound::new(name);
        for n in numbers {
            let begin = Instant::now();
            let result = fresh_call(endpoint, endpoint.request(n), ctx.timeout).await;
            class.record(begin.elapsed(), &result);
            ctx.progress.inc(1);
        }
        class
    }

    /// Adds every call of `other` (latencies and errors) to this class.
    pub(crate) fn absorb(&mut self, other: &ClassRound) {
        self.latencies.merge(&other.latencies);
        self.errors.add(&other.errors);
    }

    /// A class made of `outcomes`.
    pub(crate) fn from_outcomes(name: &str, outcomes: &[Outcome]) -> ClassRound {
        let mut class = ClassRound::new(name);
        for o in outcomes {
            class.record(o.finished - o.started, &o.result);
        }
        class
    }
}

/// One scalar result of one round.
#[derive(Debug)]
pub(crate) struct MetricRound {
    pub(crate) name: String,
    pub(crate) value: Option<f64>,
    pub(crate) unit: Unit,
    pub(crate) better: Better,
}

/// One timed call.
#[derive(Debug)]
pub(crate) struct Outcome {
    /// When the call began (before connecting, for a call on a new connection).
    pub(crate) started: Instant,
    /// When its last body byte was read (for a [`StampedCall`], when it arrived), or it
    /// failed.
    pub(crate) finished: Instant,
    /// Success (2xx, whole body) or why not.
    pub(crate) result: Result<(), CallError>,
}

impl Outcome {
    /// A call whose task was lost (panicked or cancelled).
    pub(crate) fn lost(at: Instant) -> Outcome {
        Outcome {
            started: at,
            finished: at,
            result: Err(CallError::Lost),
        }
    }
}

/// A call on a connection of its own, timed by the kernel: its outcome, finished when its
/// response's last byte arrived, and when the client read that response.
///
/// Calls that many tasks start at once (`burst`, `responsiveness`) use it: the client, busy
/// starting the later calls, reads the earlier ones' responses late, and that wait is the
/// client's, not the target's (`client/stamped.rs`).
#[derive(Debug)]
pub(crate) struct StampedCall {
    pub(crate) outcome: Outcome,
    /// When the client had read the whole response (or the call failed).
    pub(crate) read: Instant,
}

impl StampedCall {
    /// Makes the call (`stamped_fresh_call`) and times it from now.
    pub(crate) async fn run(endpoint: &Endpoint, req: Req, timeout: Duration) -> StampedCall {
        let started = Instant::now();
        let started_wall = SystemTime::now();
        let result = stamped_fresh_call(endpoint, req, timeout).await;
        let read = Instant::now();
        // The arrival on the monotonic clock: the start plus the stamped span (a clock step
        // between the two readings is cut to the span to the read).
        let finished = match &result {
            Ok(arrived) => {
                let span = arrived.duration_since(started_wall).unwrap_or_default();
                started + span.min(read - started)
            }
            Err(_) => read,
        };
        StampedCall {
            outcome: Outcome {
                started,
                finished,
                result: result.map(drop),
            },
            read,
        }
    }

    /// A call whose task was lost (panicked or cancelled).
    pub(crate) fn lost(at: Instant) -> StampedCall {
        StampedCall {
            outcome: Outcome::lost(at),
            read: at,
        }
    }
}

/// The `q` quantile of the successful `calls`' latencies counted to the client's read (ms),
/// by the nearest-rank method; `None` when none succeeded.
pub(crate) fn read_quantile_ms(calls: &[StampedCall], q: f64) -> Option<f64> {
    let mut read_ms: Vec<f64> = calls
        .iter()
        .filter(|c| c.outcome.result.is_ok())
        .map(|c| (c.read - c.outcome.started).as_secs_f64() * 1000.0)
        .collect();
    read_ms.sort_by(f64::total_cmp);
    nearest_rank(&read_ms, q)
}

/// The `q` quantile of sorted `values` by the nearest-rank method; `None` when empty.
pub(crate) fn nearest_rank(sorted: &[f64], q: f64) -> Option<f64> {
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len().max(1)) - 1).copied()
}

/// Points kept per timeline (the plots need no more).
const TIMELINE_POINTS: usize = 200;

/// The cumulative count of successful calls over time since `origin`.
pub(crate) fn timeline(name: &str, origin: Instant, outcomes: &[Outcome]) -> Timeline {
    let mut seconds: Vec<f64> = outcomes
        .iter()
        .filter(|o| o.result.is_ok())
        .map(|o| o.finished.saturating_duration_since(origin).as_secs_f64())
        .collect();
    seconds.sort_by(f64::total_cmp);
    let step = seconds.len().div_ceil(TIMELINE_POINTS).max(1);
    let mut points: Vec<TimelinePoint> = seconds
        .iter()
        .enumerate()
        .filter(|(i, _)| (i + 1) % step == 0 || i + 1 == seconds.len())
        .map(|(i, &s)| TimelinePoint {
            seconds: s,
            completed: i as u64 + 1,
        })
        .collect();
    points.insert(
        0,
        TimelinePoint {
            seconds: 0.0,
            completed: 0,
        },
    );
    Timeline {
        name: name.to_owned(),
        points,
    }
}

/// Awaits every call task; a task that ended without a result gives `lost()` (a lost call).
pub(crate) async fn join_all<T>(
    tasks: Vec<tokio::task::JoinHandle<T>>,
    lost: impl Fn() -> T,
) -> Vec<T> {
    let mut outcomes = Vec::with_capacity(tasks.len());
    for task in tasks {
        outcomes.push(task.await.unwrap_or_else(|_| lost()));
    }
    outcomes
}

/// `d` as the reports write it, as it could be given back on the command line: whole
/// seconds in `s` (`20s`, `60s`, `120s`), else milliseconds (`500ms`, `1500ms`). One unit
/// per kind of value, whatever was typed: `--timeout 1m` reads back `timeout=60s`. The
/// `idle` figures are named with it too (`keepalive_after_120s_ms`). Only a duration with a
/// fraction of a millisecond is written otherwise (`1.5ms`), which the command line does not
/// take back: one from the API, or a tenth of a gap under `--quick` (`--gaps 15ms`).
pub(crate) fn human(d: Duration) -> String {
    if d.subsec_nanos() % 1_000_000 != 0 {
        return format!("{d:?}");
    }
    let ms = d.as_millis();
    if ms % 1000 == 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// `value / base`, when both are known and `base` is not zero.
pub(crate) fn ratio(value: Option<f64>, base: Option<f64>) -> Option<f64> {
    match (value, base) {
        (Some(v), Some(b)) if b > 0.0 => Some(v / b),
        _ => None,
    }
}

/// A setting for the reports.
pub(crate) fn setting(name: &str, value: impl ToString) -> Setting {
    Setting {
        name: name.to_owned(),
        value: value.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles() {
        let hundred: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(nearest_rank(&hundred, 0.99), Some(99.0));
        assert_eq!(nearest_rank(&hundred, 0.5), Some(50.0));
        assert_eq!(nearest_rank(&[7.0], 0.99), Some(7.0));
        assert_eq!(nearest_rank(&[], 0.99), None);
    }

    #[test]
    fn read_quantiles_count_successful_calls_to_their_read() {
        let origin = Instant::now();
        let calls: Vec<StampedCall> = (1..=100u64)
            .map(|i| StampedCall {
                outcome: Outcome {
                    started: origin,
                    finished: origin + Duration::from_millis(i),
                    result: if i == 100 {
                        Err(CallError::Lost)
                    } else {
                        Ok(())
                    },
                },
                // Read 1000 ms after the start, whatever the arrival.
                read: origin + Duration::from_millis(1000 + i),
            })
            .collect();
        assert_eq!(read_quantile_ms(&calls, 0.5).map(f64::round), Some(1050.0));
        // The failed call (read at 1100 ms) is not counted.
        assert_eq!(read_quantile_ms(&calls, 1.0).map(f64::round), Some(1099.0));
        assert_eq!(read_quantile_ms(&calls[99..], 0.99), None);
    }

    #[test]
    fn durations_read_as_written() {
        assert_eq!(human(Duration::from_millis(500)), "500ms");
        assert_eq!(human(Duration::from_millis(1500)), "1500ms");
        assert_eq!(human(Duration::from_secs(20)), "20s");
        // Whole minutes stay in seconds, as the flags' defaults are written (`60s`).
        assert_eq!(human(Duration::from_secs(60)), "60s");
        assert_eq!(human(Duration::from_secs(120)), "120s");
        assert_eq!(human(Duration::from_secs(150)), "150s");
        assert_eq!(human(Duration::from_secs(3600)), "3600s");
        assert_eq!(human(Duration::ZERO), "0s");
        assert_eq!(human(Duration::from_micros(1500)), "1.5ms");
        // Each reads back to the same duration.
        for d in [500, 1500, 20_000, 60_000, 150_000, 3_600_000].map(Duration::from_millis) {
            assert_eq!(parse_back(&human(d)), d, "{d:?}");
        }
    }

    /// A duration as the command line reads it (`ms` or `s`), for the test above.
    fn parse_back(text: &str) -> Duration {
        match text.strip_suffix("ms") {
            Some(ms) => Duration::from_millis(ms.parse().unwrap()),
            None => Duration::from_secs(text.strip_suffix('s').unwrap().parse().unwrap()),
        }
    }

    #[test]
    fn timelines_are_cumulative_and_short() {
        let origin = Instant::now();
        let outcomes: Vec<Outcome> = (0..1000u64)
            .map(|i| Outcome {
                started: origin,
                finished: origin + Duration::from_millis(i),
                result: if i % 10 == 0 {
                    Err(CallError::Lost)
                } else {
                    Ok(())
                },
            })
            .collect();
        let t = timeline("x", origin, &outcomes);
        assert!(t.points.len() <= TIMELINE_POINTS + 2, "{}", t.points.len());
        assert_eq!(t.points.last().unwrap().completed, 900);
        assert!(t.points.windows(2).all(|w| w[0].seconds <= w[1].seconds));
    }
}
