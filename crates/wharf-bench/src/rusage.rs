//! The client's own resources: how busy it was (`CpuClock`, [`ClientLoad`]) and how many
//! sockets it may open ([`raise_nofile_limit`]).
//!
//! The client must not be the bottleneck. Its CPU time (all threads of this process, from
//! `CLOCK_PROCESS_CPUTIME_ID`) over the wall time of a measurement, divided by the cores,
//! says how close it came to saturating the machine; the reports print it and warn above
//! [`SATURATED`]. When a server runs in the same process (the tests' testbed) its CPU time is
//! counted too. A `LoadMeter` also samples the busiest [`WINDOW`] of a measurement, since a
//! burst can saturate the client for a moment in a round that is idle on average.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
use rustix::time::{clock_gettime, ClockId};
use serde::Serialize;

/// Share of all cores above which the client is said to be near saturation.
pub const SATURATED: f64 = 0.8;

/// The window over which the busiest moment of a measurement is found (`peak_busy`).
pub const WINDOW: Duration = Duration::from_millis(250);

/// A point in the process's CPU time and in wall time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CpuClock {
    cpu: Duration,
    wall: Instant,
}

impl CpuClock {
    /// Now.
    pub(crate) fn now() -> CpuClock {
        CpuClock {
            cpu: process_cpu_time(),
            wall: Instant::now(),
        }
    }

    /// CPU and wall time spent since `self`.
    pub(crate) fn load(&self) -> ClientLoad {
        let cpu = process_cpu_time().saturating_sub(self.cpu);
        ClientLoad::new(cpu.as_secs_f64(), self.wall.elapsed().as_secs_f64())
    }
}

/// Measures the client's load over a measurement, and its busiest [`WINDOW`], with a task
/// that reads the CPU clock once a window.
#[derive(Debug)]
pub(crate) struct LoadMeter {
    start: CpuClock,
    /// The highest `busy` of a window so far, as `f64` bits.
    peak: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl LoadMeter {
    /// Starts measuring now.
    pub(crate) fn start() -> LoadMeter {
        let peak = Arc::new(AtomicU64::new(0f64.to_bits()));
        let task = tokio::spawn({
            let peak = Arc::clone(&peak);
            async move {
                let mut window = CpuClock::now();
                loop {
                    tokio::time::sleep(WINDOW).await;
                    let busy = window.load().busy;
                    window = CpuClock::now();
                    let _ = peak.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                        (busy > f64::from_bits(old)).then_some(busy.to_bits())
                    });
                }
            }
        });
        LoadMeter {
            start: CpuClock::now(),
            peak,
            task,
        }
    }

    /// Stops measuring: the load since [`LoadMeter::start`], with its busiest window (the
    /// whole measurement's when it was shorter than a window).
    pub(crate) fn finish(self) -> ClientLoad {
        self.task.abort();
        let mut load = self.start.load();
        load.peak_busy = f64::from_bits(self.peak.load(Ordering::Relaxed)).max(load.busy);
        load
    }
}

/// CPU time used by every thread of this process so far.
fn process_cpu_time() -> Duration {
    let t = clock_gettime(ClockId::ProcessCPUTime);
    Duration::new(
        u64::try_from(t.tv_sec).unwrap_or(0),
        u32::try_from(t.tv_nsec).unwrap_or(0),
    )
}

/// The cores this process may use.
pub(crate) fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// How busy the client (this process) was during a measurement.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ClientLoad {
    /// CPU time of all the process's threads, in seconds.
    pub cpu_seconds: f64,
    /// Wall time, in seconds.
    pub wall_seconds: f64,
    /// The cores available to the process.
    pub cores: usize,
    /// `cpu_seconds / (wall_seconds × cores)`: 1.0 means every core was busy all the time.
    pub busy: f64,
    /// `busy` of the busiest [`WINDOW`] (at least `busy`).
    pub peak_busy: f64,
}

impl ClientLoad {
    /// The load of `cpu_seconds` spent over `wall_seconds` on this machine's cores.
    pub(crate) fn new(cpu_seconds: f64, wall_seconds: f64) -> ClientLoad {
        let cores = cores();
        let busy = if wall_seconds > 0.0 {
            cpu_seconds / (wall_seconds * cores as f64)
        } else {
            0.0
        };
        ClientLoad {
            cpu_seconds,
            wall_seconds,
            cores,
            busy,
            peak_busy: busy,
        }
    }

    /// Two measurements together (the busiest window of either).
    pub(crate) fn plus(&self, other: &ClientLoad) -> ClientLoad {
        let mut sum = ClientLoad::new(
            self.cpu_seconds + other.cpu_seconds,
            self.wall_seconds + other.wall_seconds,
        );
        sum.peak_busy = self.peak_busy.max(other.peak_busy).max(sum.busy);
        sum
    }

    /// Whether the client came near saturating the machine on average ([`SATURATED`]).
    pub fn saturated(&self) -> bool {
        self.busy >= SATURATED
    }

    /// E.g. `"12% of 2 cores on average, 85% at the busiest 250ms"`.
    pub fn describe(&self) -> String {
        format!(
            "{:.0}% of {} cores on average, {:.0}% at the busiest {}ms",
            self.busy * 100.0,
            self.cores,
            self.peak_busy * 100.0,
            WINDOW.as_millis()
        )
    }
}

/// Raises this process's soft limit on open files to its hard limit, so thousands of
/// simultaneous connections can be opened, and returns the soft limit now in force (`None`:
/// unlimited).
///
/// Failure to raise it is not an error: calls that run out of descriptors are counted as
/// connect errors, and the scenarios note when they need more than the limit.
pub fn raise_nofile_limit() -> Option<u64> {
    let limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        let raised = Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        if setrlimit(Resource::Nofile, raised).is_ok() {
            return limit.maximum;
        }
    }
    limit.current
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_clock_counts_busy_time() {
        let start = CpuClock::now();
        let spin = Instant::now();
        let mut x = 0u64;
        while spin.elapsed() < Duration::from_millis(50) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let load = start.load();
        assert!(load.cpu_seconds > 0.02, "{load:?}");
        assert_eq!(load.peak_busy, load.busy);
        assert!(load.busy > 0.0 && load.busy <= 1.01, "{load:?}");
        assert!(load.describe().contains("cores"));
    }

    #[tokio::test]
    async fn load_meter_reports_a_peak() {
        let meter = LoadMeter::start();
        tokio::time::sleep(Duration::from_millis(30)).await;
        let load = meter.finish();
        assert!(load.peak_busy >= load.busy, "{load:?}");
        assert!(load.wall_seconds >= 0.03, "{load:?}");
    }

    #[test]
    fn nofile_limit_is_at_least_the_default() {
        let limit = raise_nofile_limit();
        assert!(limit.is_none_or(|l| l >= 256), "{limit:?}");
    }
}
